// Which pushes a partition has applied, chunk by chunk: push
// de-duplication ((sender, seq) applied at most once, each chunk of it at
// most once) and the update ledger (gradients accepted per sender,
// docs/reliability.md). A partition of one chunk (sparse, or dense within
// cluster.chunk_bytes) resolves each push at once.
#ifndef STRATA_PSERVER_PUSH_LEDGER_H_
#define STRATA_PSERVER_PUSH_LEDGER_H_

#include <cstdint>
#include <map>
#include <vector>

#include "proto/checkpoint.pb.h"

namespace strata::pserver {

// Not thread-safe: its partition's lock guards it.
class PushLedger {
 public:
  explicit PushLedger(uint32_t chunks) : chunks_(chunks) {}

  // True when chunk `chunk` of push (sender, seq) was resolved before, or
  // the push is not newer than the sender's last complete one.
  bool Seen(uint32_t sender, uint64_t seq, uint32_t chunk) const;
  // Chunk `chunk` of push (sender, seq) is done with: applied (`applied`)
  // or refused for good (a stale gradient). Once every chunk is, the push
  // is complete: it becomes the sender's last seq, partial pushes older
  // than it are forgotten, and it counts in the ledger if every chunk was
  // applied.
  void Resolve(uint32_t sender, uint64_t seq, uint32_t chunk, bool applied);

  const std::map<uint32_t, uint64_t>& applied_by_sender() const { return applied_by_sender_; }

  // Into / from a partition's checkpoint header: last_seq,
  // applied_by_sender and partial_pushes. Load drops partial pushes whose
  // chunks do not fit this partition's (a checkpoint cut into other chunks).
  void Save(proto::CheckpointPartitionHeader* h) const;
  void Load(const proto::CheckpointPartitionHeader& h);

 private:
  struct Partial {
    std::vector<bool> done;
    uint32_t resolved = 0;
    bool applied = true;
  };
  const uint32_t chunks_;
  std::map<uint32_t, uint64_t> last_seq_;
  std::map<uint32_t, std::map<uint64_t, Partial>> partial_;  // sender -> seq -> chunks
  std::map<uint32_t, uint64_t> applied_by_sender_;
};

}  // namespace strata::pserver

#endif  // STRATA_PSERVER_PUSH_LEDGER_H_
