// A partition's checkpoint files (docs/checkpoint-format.md): writing a
// snapshot out, and loading a partition back from its chain of files.
#ifndef STRATA_PSERVER_PARTITION_FILES_H_
#define STRATA_PSERVER_PARTITION_FILES_H_

#include <string>

#include "absl/status/statusor.h"
#include "proto/checkpoint.pb.h"
#include "pserver/partition.h"
#include "storage/file_system.h"

namespace strata::pserver {

// "ckpt-00000007/p00012.blk": partition 12's file of checkpoint 7,
// relative to the checkpoint root.
std::string PartitionFileName(uint64_t seq, uint32_t partition);

// Writes `snap` as its checkpoint's file under `root` (synced; the
// directory is synced by the caller once all files are there). Returns
// the manifest's entry for the file. Disk errors name the file.
absl::StatusOr<proto::CheckpointFile> WritePartitionFile(storage::FileSystem* fs,
                                                         const std::string& root,
                                                         const PartitionSnapshot& snap,
                                                         int zstd_level);

// Loads `entry`'s files (a full image, then deltas) into `partition`,
// checking each file against the manifest's size and crc32c and every
// block's checksum. DataLoss / InvalidArgument naming the file.
// REQUIRES: `partition` is new and serves nothing yet.
absl::Status LoadPartition(storage::FileSystem* fs, const std::string& root,
                           const proto::CheckpointPartition& entry, uint64_t seq,
                           Partition* partition);

}  // namespace strata::pserver

#endif  // STRATA_PSERVER_PARTITION_FILES_H_
