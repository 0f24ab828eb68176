// The FileSystem of storage/file_system.h on an S3-compatible object store,
// for paths "s3://bucket/key", and a FileSystem that sends such paths to it
// and every other path to the local one. Checkpoints, datasets and the
// CLI then work on either without knowing which (docs/storage.md).
//
// Directories are implicit (key prefixes up to '/'). A file is written in
// memory up to `part_bytes` and then as a multipart upload whose parts go
// up `parallel_parts` at a time while the writer goes on; the object
// appears, whole, only when Close() returns OK (Sync() makes nothing
// durable before that). A large read is ranged GETs, `parallel_parts` at a
// time. RenameFile is a server-side copy and a delete (not atomic);
// WriteFileAtomic is one PUT (atomic).
#ifndef STRATA_STORAGE_S3_FILE_SYSTEM_H_
#define STRATA_STORAGE_S3_FILE_SYSTEM_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "common/config.h"
#include "storage/file_system.h"
#include "storage/s3_client.h"

namespace strata::storage {

struct S3FileSystemOptions {
  S3ClientOptions client;
  uint64_t part_bytes = 16 << 20;  // multipart part size, >= 5 MiB
  int parallel_parts = 4;          // parts (or ranges) in flight per file, >= 1
};

// Thread-safe. InvalidArgument for bad options.
absl::StatusOr<std::unique_ptr<FileSystem>> NewS3FileSystem(S3FileSystemOptions options);

// Paths starting "s3://" go to `s3`, others to `local`. `s3` may be null:
// s3:// paths are then an error naming the path and the missing config.
std::unique_ptr<FileSystem> NewRoutingFileSystem(std::unique_ptr<FileSystem> local,
                                                 std::unique_ptr<FileSystem> s3);

// What a daemon or the CLI reads and writes through: local paths, and
// s3:// paths when the config has an s3 section. The keys are loaded here
// (credentials_file, or AWS_* from `getenv`, which main passes as ::getenv),
// so a missing key or unreadable file is an error at start. `described`
// (optional) gets a line for the daemon's log: the endpoint, the access key
// id and where it came from (never the secret).
absl::StatusOr<std::unique_ptr<FileSystem>> NewFileSystemForConfig(
    const S3Section& s3, const std::function<const char*(const char*)>& getenv,
    std::string* described = nullptr);

// With checkpoints on, makes sure the checkpoint root can be used before
// anything starts (mkdir -p locally; on an object store, that the bucket is
// there and the keys are accepted). The error names checkpoint.dir.
absl::Status CheckCheckpointRoot(FileSystem* fs, const CheckpointSection& checkpoint);

inline bool IsS3Path(absl::string_view path) {
  return path.size() >= 5 && path.substr(0, 5) == "s3://";
}

}  // namespace strata::storage

#endif  // STRATA_STORAGE_S3_FILE_SYSTEM_H_
