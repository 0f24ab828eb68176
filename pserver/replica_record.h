// The records of a partition's replication stream (docs/reliability.md):
// what a primary sends its backups so that they hold the same state.
//
// An update record is what the primary applied, after aggregation: the
// gradient (dense: the partition's floats; sparse: keys and rows), the
// scale the optimizer applied it with, and the pushes it came from (for
// de-duplication and the update ledger). A backup applies it with the same
// code and reaches the same state. A copy record is the whole partition
// (the streams of a full checkpoint file, docs/checkpoint-format.md), sent
// to a new backup before the updates that follow it.
#ifndef STRATA_PSERVER_REPLICA_RECORD_H_
#define STRATA_PSERVER_REPLICA_RECORD_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/checkpoint_format.h"

namespace strata::pserver {

struct ReplicaUpdate {
  float scale = 0;  // the optimizer's gradient scale (1 / samples)
  // The chunk of the partition it updates (cluster.chunk_bytes; 0 for a
  // sparse partition or one of a single chunk) and that chunk's version
  // after it, which is also the optimizer's update number.
  uint32_t chunk = 0;
  uint64_t version = 0;
  // The pushes summed into the gradient: (sender node id, push seq).
  std::vector<std::pair<uint32_t, uint64_t>> pushes;
  std::vector<uint64_t> keys;  // sparse only
  std::vector<float> grads;    // dense: the chunk's floats; sparse: keys * dim
};

// [u32 pushes][u32 keys][f32 scale][u32 grads][u32 chunk][u64 version]
// then (u32 sender, u64 seq) per push, the keys, the grads; little-endian.
std::string EncodeReplicaUpdate(const ReplicaUpdate& u);
// DataLoss naming the sizes when `bytes` is not a whole record.
absl::StatusOr<ReplicaUpdate> DecodeReplicaUpdate(absl::string_view bytes);

// A copy: [u32 n] then n times (u32 block type, u64 size, bytes).
std::string EncodeReplicaCopy(const std::map<storage::BlockType, std::string>& streams);
// A stream of a copy given as the parts it is the concatenation of.
struct CopyStream {
  storage::BlockType type;
  std::vector<absl::string_view> parts;
};
// The bytes of a copy of `streams`.
size_t ReplicaCopySize(const std::vector<CopyStream>& streams);
// Writes the copy of `streams` (in their order) into *out, each byte copied
// once. A primary makes it under its partition's lock: when *out is at
// least that large already (allocated, its pages touched, before the
// lock), it is written in place and only cut to its size.
void EncodeReplicaCopy(const std::vector<CopyStream>& streams, std::string* out);
absl::StatusOr<std::map<storage::BlockType, std::string>> DecodeReplicaCopy(
    absl::string_view bytes);

}  // namespace strata::pserver

#endif  // STRATA_PSERVER_REPLICA_RECORD_H_
