// The files of a checkpoint that hold the tables kept by allreduce among
// the workers (model.dense_sync allreduce; docs/checkpoint-format.md,
// "Allreduce tables"): each ring member writes its shard of the flat space
// of those tables (their floats one after another, in table order) — the
// parameters of the shard and the optimizer state it owns — and a reader
// puts the shards back together into the whole state, whatever the ring's
// size was and will be.
//
//   <root>/ckpt-00000007/ring-9-00002.blk   rank 2's shard of checkpoint 7 (ring epoch 9)
#ifndef STRATA_STORAGE_RING_CHECKPOINT_H_
#define STRATA_STORAGE_RING_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/checkpoint.pb.h"
#include "storage/file_system.h"

namespace strata::storage {

// "ckpt-00000007/ring-9-00002.blk" (ring epoch 9, rank 2), relative to the
// checkpoint root. (A ring formed anew during a checkpoint writes its own.)
std::string RingShardFileName(uint64_t seq, uint64_t ring_epoch, uint32_t rank);

// Writes a shard's file (`header`'s seq and rank name it) under `root`,
// synced with its directory: the shard's parameters, `values` (end -
// begin floats), and the optimizer state it owns, `state` (as
// Optimizer::SaveState wrote it). Returns the file for the manifest.
absl::StatusOr<proto::CheckpointFile> WriteRingShard(FileSystem* fs, const std::string& root,
                                                     const proto::CheckpointRingShardHeader& header,
                                                     const std::vector<float>& values,
                                                     const std::string& state, int zstd_level);

// The allreduce tables' state of a checkpoint, put back together.
struct RingState {
  uint64_t step = 0;          // the ring's last step in it
  uint64_t updates = 0;       // optimizer updates applied
  std::vector<float> values;  // the flat space: `floats` parameters
  // The optimizer's state over the flat space: `state_vectors` vectors of
  // `floats` each, one after another (its update count is `updates`).
  uint32_t state_vectors = 0;
  std::vector<float> state;
};
// Reads the shards `shards` (paths under `root`; size and crc32c checked
// first) of a flat space of `floats` floats, for a job named `job` whose
// dense optimizer is `optimizer`. The shards must tile [0, floats), agree
// on the step, the update count and the state's layout. Errors name the
// file and what is wrong: DataLoss for a torn or corrupt file or shards
// that do not fit together, FailedPrecondition for another job or
// optimizer.
absl::StatusOr<RingState> ReadRingState(FileSystem* fs, const std::string& root,
                                        const std::vector<proto::CheckpointRingShard>& shards,
                                        uint64_t floats, const std::string& job,
                                        const std::string& optimizer);

// The newest complete checkpoint under `root` whose manifest holds the
// ring's shards, read as ReadRingState reads them (its seq in *seq).
// Manifests that cannot be read, of no ring shards, or whose shards do
// not read back are passed over for an older one; NotFound when none has
// ring shards, else the newest one's error. (A shard's optimizer state lost with its
// owner and its replica comes from it: worker/dense_sync.h.) `cached`
// (optional): a state read before, of checkpoint `cached_seq` (as the
// caller kept it: its values may be dropped); when that is still the one
// to read, a copy of it is returned without reading (a ring's forming
// that timed out while reading tries again, and must not read it all
// again).
absl::StatusOr<RingState> ReadNewestRingState(FileSystem* fs, const std::string& root,
                                              uint64_t floats, const std::string& job,
                                              const std::string& optimizer, uint64_t* seq,
                                              const RingState* cached = nullptr,
                                              uint64_t cached_seq = 0);

}  // namespace strata::storage

#endif  // STRATA_STORAGE_RING_CHECKPOINT_H_
