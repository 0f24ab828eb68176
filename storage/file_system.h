// All file I/O goes through FileSystem so tests can use an in-memory or a
// fault-injecting version (cf. leveldb's Env).
#ifndef STRATA_STORAGE_FILE_SYSTEM_H_
#define STRATA_STORAGE_FILE_SYSTEM_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata::storage {

// Implementations are thread-safe. Errors name the path and, for the POSIX
// version, the errno text ("open /x/y: No such file or directory").
class FileSystem {
 public:
  virtual ~FileSystem() = default;

  // Whole file contents. NotFound when it does not exist.
  virtual absl::StatusOr<std::string> ReadFile(const std::string& path) = 0;
  // Publishes `contents` at `path` atomically: write "path.tmp", fsync,
  // rename over `path`, fsync the directory. Readers see the old file or
  // the whole new one, never a torn one.
  virtual absl::Status WriteFileAtomic(const std::string& path,
                                       const std::string& contents) = 0;
  virtual absl::StatusOr<uint64_t> FileSize(const std::string& path) = 0;
  virtual bool Exists(const std::string& path) = 0;
  // mkdir -p.
  virtual absl::Status CreateDirs(const std::string& path) = 0;
};

std::unique_ptr<FileSystem> NewPosixFileSystem();
// A private in-memory file system (directories are implicit).
std::unique_ptr<FileSystem> NewMemoryFileSystem();

}  // namespace strata::storage

#endif  // STRATA_STORAGE_FILE_SYSTEM_H_
