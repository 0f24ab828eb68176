// All file I/O goes through FileSystem so tests can use an in-memory or a
// fault-injecting version (cf. leveldb's Env): storage/faulty_file_system.h.
#ifndef STRATA_STORAGE_FILE_SYSTEM_H_
#define STRATA_STORAGE_FILE_SYSTEM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace strata::storage {

// A file being written, from NewWritableFile. Not thread-safe: one writer.
// The destructor closes the file without reporting errors; call Close() to
// see them.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  // Appends at the end. A failure may leave part of `data` written.
  virtual absl::Status Append(absl::string_view data) = 0;
  // Makes everything appended so far durable (fsync).
  virtual absl::Status Sync() = 0;
  // Idempotent. Appending after Close is FailedPrecondition.
  virtual absl::Status Close() = 0;
  // Cuts the file to its first `size` bytes (a torn record off the end) and
  // appends carry on from there. The default is Unimplemented (an object
  // store's upload cannot be cut).
  virtual absl::Status Truncate(uint64_t size);
};

// An exclusive lock on a file, from FileSystem::LockFile; released when it
// is destroyed (or when the process dies).
class FileLock {
 public:
  virtual ~FileLock() = default;
};

// Implementations are thread-safe. Errors name the path and, for the POSIX
// version, the errno text ("open /x/y: No such file or directory"); disk
// full is ResourceExhausted.
class FileSystem {
 public:
  virtual ~FileSystem() = default;

  // Whole file contents. NotFound when it does not exist.
  virtual absl::StatusOr<std::string> ReadFile(const std::string& path) = 0;
  virtual absl::StatusOr<uint64_t> FileSize(const std::string& path) = 0;
  // Up to `n` bytes at `offset` (fewer at the end of the file; none past
  // it). The default reads the whole file; the POSIX and object-store
  // versions read only the range.
  virtual absl::StatusOr<std::string> ReadFileRange(const std::string& path, uint64_t offset,
                                                    uint64_t n);
  virtual bool Exists(const std::string& path) = 0;
  virtual bool IsDirectory(const std::string& path) = 0;
  // mkdir -p.
  virtual absl::Status CreateDirs(const std::string& path) = 0;
  // Creates `path`, or truncates it when it exists. Its directory entry is
  // durable only after SyncDir of the parent.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) = 0;
  // Opens `path` to append to what it holds, creating it (empty) when
  // missing. The default is Unimplemented (an object store has no appends).
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewAppendableFile(const std::string& path);
  // Takes an exclusive lock on the file `path` (creating it), held while the
  // returned lock lives, and writes this process's pid into it. Another
  // holder, in this process or another, makes it FailedPrecondition naming
  // the file and the holder's pid ("lock /d/LOCK: held by pid 123"). Locks
  // are advisory: only other LockFile calls see them. The default is
  // Unimplemented.
  virtual absl::StatusOr<std::unique_ptr<FileLock>> LockFile(const std::string& path);
  // Atomically replaces `to` with the file `from` (rename(2)).
  virtual absl::Status RenameFile(const std::string& from, const std::string& to) = 0;
  // Makes the directory's entries (creations, renames, deletions) durable.
  virtual absl::Status SyncDir(const std::string& dir) = 0;
  // Names of the entries of `dir` (files and directories), sorted; NotFound
  // when it does not exist.
  virtual absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) = 0;
  virtual absl::Status DeleteFile(const std::string& path) = 0;
  // Removes an empty directory.
  virtual absl::Status DeleteDir(const std::string& path) = 0;

  // Publishes `contents` at `path` atomically: write "path.tmp", fsync,
  // rename over `path`, fsync the directory. Readers see the old file or
  // the whole new one, never a torn one. On failure the temp file is
  // removed (best effort) and `path` is untouched. An object store
  // overrides it with one PUT, which is atomic there.
  virtual absl::Status WriteFileAtomic(const std::string& path, absl::string_view contents);
  // Removes `path` and everything under it; OK when it does not exist.
  virtual absl::Status DeleteRecursively(const std::string& path);
};

// "a/b" -> "a", "b" -> ".", "/b" -> "/".
std::string ParentDir(const std::string& path);
// "a" + "b" -> "a/b" (no doubled slash).
std::string JoinPath(absl::string_view dir, absl::string_view name);

std::unique_ptr<FileSystem> NewPosixFileSystem();
// A private in-memory file system (directories are implicit).
std::unique_ptr<FileSystem> NewMemoryFileSystem();

}  // namespace strata::storage

#endif  // STRATA_STORAGE_FILE_SYSTEM_H_
