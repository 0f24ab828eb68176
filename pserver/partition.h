// One parameter partition on a pserver: values, optimizer state, BSP
// aggregation, waiting pulls and push de-duplication. A dense partition is
// a slice of a dense table; a sparse one holds the rows of a sparse table
// whose keys hash to it (docs/sparse.md).
#ifndef STRATA_PSERVER_PARTITION_H_
#define STRATA_PSERVER_PARTITION_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/config.h"
#include "common/optimizer.h"
#include "proto/checkpoint.pb.h"
#include "pserver/push_ledger.h"
#include "pserver/replica_record.h"
#include "pserver/sparse_table.h"
#include "storage/checkpoint_format.h"
#include "transport/transport.h"

namespace strata::pserver {

struct PartitionStats {
  // The version every chunk has reached (the partition's version).
  uint64_t version = 0;
  // The newest chunk's version: above `version` while an update is
  // applied chunk by chunk (cluster.chunk_bytes).
  uint64_t newest_chunk_version = 0;
  uint32_t chunks = 1;
  uint64_t pushes_applied = 0;    // gradients accepted (each counted once, by its chunk 0)
  uint64_t updates_applied = 0;   // optimizer steps
  uint64_t duplicate_pushes = 0;  // (worker, seq) seen before: acked, not applied
  uint64_t rejected_pushes = 0;   // stale step, bad size, ...
  uint64_t pulls_served = 0;
  // bsp: chunks whose step has pushes in it, not applied yet (their
  // pushes are acknowledged but not in applied_by_sender until it is).
  uint32_t open_chunks = 0;
};

// A partition's state copied for a checkpoint (docs/checkpoint-format.md),
// written out by the pserver's checkpoint thread while training goes on.
struct PartitionSnapshot {
  proto::CheckpointPartitionHeader header;
  // Nothing changed since the baseline (a dense partition at the same
  // version): no file, the previous ones stand.
  bool unchanged = false;
  std::string values;           // dense: fp32 values
  std::string optimizer_state;  // dense: Optimizer::SaveState
  std::string rows;             // sparse: row records
  std::string removed;          // sparse: keys removed since the baseline
  std::string pending;          // sparse: admission counts
  uint64_t raw_bytes = 0;       // a full uncompressed dump of the state now
  absl::Duration stall;         // how long the copy held the partition
};

struct SnapshotRequest {
  std::string job;
  uint64_t seq = 0;       // the checkpoint
  uint64_t base_seq = 0;  // incremental over this checkpoint; 0 = full
  // bsp: the cut. The snapshot is taken when the partition reaches this
  // version (at once when it is there); FailedPrecondition when it is
  // past it. Otherwise taken at once, at whatever version.
  bool at_version = false;
  uint64_t version = 0;
};

// Where a primary's replication records go (docs/reliability.md). The
// PServer's implementation keeps one ordered stream per backup node.
class ReplicaSink {
 public:
  virtual ~ReplicaSink() = default;
  // Queues `record` (a kReplicate message for `backup`) behind every record
  // queued for that backup before; resends until the backup holds it or the
  // backup leaves the view. When it holds it, the sink calls
  // partition->OnReplicaAck(backup, record.header.seq). Never blocks; called
  // with the partition's lock held. A sink that keeps the partition past
  // the call (ReplicaStreams) shares its ownership (weak_from_this), so the
  // partition must then be owned by a std::shared_ptr.
  virtual void Send(class Partition* partition, uint32_t backup, transport::Message record) = 0;
};

// How a partition's pushes and pulls synchronize: job.consistency and,
// for ssp, job.staleness (docs/consistency.md). Made from a Consistency
// alone where the staleness does not matter.
struct SyncMode {
  SyncMode(Consistency c, uint32_t staleness_steps = 0)  // NOLINT(google-explicit-constructor)
      : consistency(c), staleness(staleness_steps) {}
  Consistency consistency;
  uint32_t staleness;
};

enum class PartitionRole {
  kPrimary,  // serves pulls and pushes, forwards updates to its backups
  kBackup,   // holds a copy kept up to date by the primary's records
};

// Thread-safe: any transport thread may call Pull/Push concurrently.
// Responses are sent while the partition lock is held: pull responses go
// out straight from the values (no copy), which must not change meanwhile.
// The PServer owns its partitions through std::shared_ptr: a request in
// flight, a replication record or a checkpoint holds its partition, which
// is freed when the last of them lets go after it moved away.
class Partition : public std::enable_shared_from_this<Partition> {
 public:
  // `values` are the initial parameters (moved in); `optimizer` owned.
  // Pushes and pulls may address it by chunks of `chunk_floats` floats
  // (the view's chunk_bytes / 4; 0 = the whole partition is one chunk).
  Partition(uint32_t id, std::string table, std::vector<float> values,
            std::unique_ptr<Optimizer> optimizer, SyncMode sync, uint64_t chunk_floats = 0);
  // A sparse partition over `rows` (owned).
  Partition(uint32_t id, std::string table, std::unique_ptr<SparseTable> rows, SyncMode sync);
  // A backup starts without state of its own: it is useless until the
  // primary's copy arrives (ApplyReplica).
  void MakeBackup();
  // Requests still waiting here (a bsp pull for a version not reached,
  // acks held for the backups or for the step) are answered UNAVAILABLE
  // with REASON_NOT_SERVED, not dropped: the partition moved away, and
  // their senders retry at its new owner (a push applied there already is
  // known by its seq).
  ~Partition();
  Partition(const Partition&) = delete;
  Partition& operator=(const Partition&) = delete;

  // kPullRequest: answers with the values once version >= header.version
  // (BSP); SSP once the slowest worker of the step set that pushed here
  // has pushed header.version - staleness steps (a pull is at clock
  // header.version: its sender pushed the steps before it), answered
  // with the clock its sender is at (the slowest's, when that is ahead:
  // a joining worker starts there); ASP answers at once. Sparse (kFlagSparse): the rows of the keys
  // in the payload, in their order. A chunk's pull (kFlagChunk) waits only
  // for that chunk's version and is answered with its floats.
  void Pull(const transport::Message& request, std::shared_ptr<transport::Responder> responder);
  // kPushRequest: payload is the gradient summed over header.count samples
  // for step header.version. Applied at most once per (sender, seq). BSP:
  // accumulated until every worker of the step set has pushed, then averaged
  // over all samples and applied once; ASP: averaged and applied at once.
  // Sparse (kFlagSparse): n keys then their n gradient rows; in BSP the
  // rows of a key pushed by several workers are summed.
  // A chunk's push (kFlagChunk) carries that chunk's gradient; each chunk
  // is applied on its own (BSP: once every worker of the step pushed it),
  // and de-duplicated per (sender, seq, chunk). The partition's version is
  // the version all its chunks have reached.
  void Push(const transport::Message& request, std::shared_ptr<transport::Responder> responder);

  // The workers a BSP step waits for (live, training workers of the current
  // view). Completes the pending step if everyone left in it has pushed.
  // SSP: the workers whose clocks hold pulls back (one that left holds
  // nothing; one holds from its first push here on).
  // Node-local aggregation (common/aggregation.h): `workers` are step-set
  // members, and `member_of` maps a worker to the member it pushes for (its
  // host's); a push then counts for that member, once a step: another
  // worker's push for a member already in the step (an aggregating worker
  // taking over mid-step) is dropped as a stale gradient.
  void SetStepWorkers(const std::set<uint32_t>& workers,
                      const std::map<uint32_t, uint32_t>& member_of = {});

  // Replication (docs/reliability.md).
  // Primary: the backups of the current view. A new one is sent a copy of
  // the partition, then every update after it; once it holds the copy and
  // every record sent until it acknowledged the copy, it is sent a marker
  // (kFlagReplicaCaughtUp) and reports itself in sync. Updates (push acks,
  // the versions pulls see) are released once every backup holds them,
  // except `move_target` (a move's target, 0: none): it catches up
  // without holding anything back (training does not wait for a move's
  // copy) and is waited for once caught up. Any other new backup is
  // waited for from its copy on: what the primary acknowledges is on it,
  // so it may take over (a backup whose old copy is kept meanwhile,
  // PServer::shadows_, takes over without the new one). A backup no
  // longer in the list stops holding anything back. `sink` is borrowed
  // and outlives the partition.
  void SetBackups(const std::vector<uint32_t>& backups, ReplicaSink* sink,
                  uint32_t move_target = 0);
  // The sink's report that `backup` holds the records up to `index`.
  void OnReplicaAck(uint32_t backup, uint64_t index);
  // Backup: applies a kReplicate record (in stream order) and answers it.
  void ApplyReplica(const transport::Message& record,
                    std::shared_ptr<transport::Responder> responder);
  // Backup -> primary (its primary died). In bsp it serves from the last
  // update it holds; pushes of the step in progress come again.
  void Promote();
  PartitionRole role() const;
  // A backup that holds the primary's copy and has caught up (the
  // primary counts it: it holds every acknowledged update; it can be
  // promoted).
  bool synced() const;
  // A backup that took the primary's copy in (caught up or not).
  bool holds_copy() const;
  // A partition restored from a checkpoint while the job runs: its version
  // becomes `version` (the step the others have reached).
  void FastForward(uint64_t version);
  // Gradients accepted from each sender: the update ledger.
  std::map<uint32_t, uint64_t> applied_by_sender() const;
  // SSP: each sender's clock (steps pushed), the lowest over the chunks
  // (0 for a chunk it has not pushed to); empty in bsp and asp.
  std::map<uint32_t, uint64_t> ssp_clocks() const;

  uint32_t id() const { return id_; }
  const std::string& table() const { return table_; }
  // Dense: elements. Sparse: 0.
  uint64_t length() const { return length_; }
  // Dense: the floats a pull with this header is answered with (a chunk's
  // or the whole partition's; 0 for a chunk it does not have).
  uint64_t PullFloats(const transport::MessageHeader& h) const;
  bool sparse() const { return sparse_; }
  int sparse_dim() const { return dim_; }
  PartitionStats stats() const;
  // Sparse partitions only (zeros for a dense one).
  SparseTableStats sparse_stats() const;
  // A copy of the current values.
  std::vector<float> ValuesForTesting() const;
  // Sparse: the rows of `keys` as SparseTable::Lookup gives them (empty for
  // a dense partition).
  std::vector<float> RowsForTesting(const std::vector<uint64_t>& keys) const;

  // Checkpoints. Takes a snapshot as `req` says and hands it to `done`,
  // which is called with the partition lock held (possibly before this
  // returns) and must only hand it over. The snapshot is incremental when
  // req.base_seq is the checkpoint of this partition's last snapshot or
  // restore, else full; it becomes the baseline of the next one.
  using SnapshotDone = std::function<void(absl::StatusOr<PartitionSnapshot>)>;
  void RequestSnapshot(const SnapshotRequest& req, SnapshotDone done);
  // Drops a snapshot still waiting for its version (done is called with
  // Cancelled).
  void CancelSnapshot(uint64_t seq);
  // Applies one file of a checkpoint (its streams, from ReadBlockFile): a
  // full image, then the deltas written after it, in order. `path` is for
  // errors. InvalidArgument naming the file when it does not fit this
  // partition (table, range, dim, optimizer). REQUIRES: the partition
  // serves nothing yet.
  absl::Status ApplyCheckpointFile(const std::map<storage::BlockType, std::string>& streams,
                                   const std::string& path);
  // After the last file: the restored state is the baseline of checkpoint
  // `seq`'s successors.
  void FinishRestore(uint64_t seq);

 private:
  using Reply = std::pair<std::shared_ptr<transport::Responder>, transport::Message>;
  // The part of a partition that pushes and pulls address on their own:
  // elements [begin, end) of a dense partition (a sparse one is a single
  // chunk), its version and its BSP step in progress.
  struct Chunk {
    uint64_t begin = 0;
    uint64_t end = 0;
    uint64_t version = 0;
    std::set<uint32_t> contributors;  // pushed this step
    // SSP: each sender's clock here: the steps it pushed (its highest + 1).
    absl::flat_hash_map<uint32_t, uint64_t> clocks;
    std::vector<std::pair<uint32_t, uint64_t>> pushes;  // their (sender, seq)
    double count_sum = 0;                               // samples summed
    // Node-local aggregation: pushes of a host already in the step (a new
    // aggregating worker's), refused, their answers held until the step
    // completes: were the partition to go away first, they are told to
    // retry at its new owner, which may not have the old push.
    std::vector<Reply> covered;
  };
  // A dense partition of `length` floats cut into chunks of `chunk_floats`
  // (>= 1, as chunk_floats_); a sparse one (length 0) is one chunk.
  static std::vector<Chunk> MakeChunks(uint64_t length, uint64_t chunk_floats);
  // Where a push's answer waits: sent at once, until the last replication
  // record is held by every backup, or until the BSP step is replicated.
  enum class Hold { kNone, kRecord, kStep, kCovered };  // kCovered: covered_chunk_'s step
  // One chunk of a push: applied (ASP) or added to the step (BSP), or the
  // reason it is not. Raises *hold to what its answer must wait for.
  absl::Status PushChunkLocked(const transport::MessageHeader& h, uint32_t c, const char* data,
                               size_t sparse_n, Hold* hold) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // BSP: applies chunk c's step once every worker of the step set pushed it.
  void MaybeCompleteChunkStepLocked(uint32_t c, std::vector<Reply>* replies)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The partition's version catches up with its chunks'; true when it
  // moved (bsp snapshots waiting for it are taken).
  bool AdvanceLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t NewestChunkVersionLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds a sparse push's rows to the BSP step's sums.
  void AccumulateSparseLocked(const uint64_t* keys, const float* grads, size_t n)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why a request does not fit this partition (kind, chunk, payload
  // size), or OK with the chunks it addresses: [*first, *end).
  absl::Status CheckRequest(const transport::Message& request, uint32_t* first,
                            uint32_t* end) const;
  transport::Message PullResponseLocked(const transport::Message& req) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Called with mu_ held (pull responses borrow values_).
  static void Send(std::vector<Reply>* replies);
  // An empty acknowledgement of `request` (s OK) or its error response.
  static transport::Message Answer(const transport::MessageHeader& request,
                                   transport::MessageType type, const absl::Status& s);
  PartitionSnapshot SnapshotLocked(const SnapshotRequest& req) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the bsp snapshots waiting for the version now reached.
  void TakeDueSnapshotsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t RawBytesLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Replication: sends `update` (just applied to its chunk, which was at
  // version `before`) to every backup, and holds `replies` back until the
  // counted ones all have it (none counted: they stay in `replies`).
  // `flags`: the record's header flags besides kFlagSparse
  // (kFlagInitialValues: `update` holds values to take, not a gradient).
  void ReplicateLocked(const ReplicaUpdate& update, uint64_t before, std::vector<Reply>* replies,
                       uint32_t flags = 0) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A push of initial values (transport::kFlagInitialValues) for chunks
  // [first, end): taken while the partition is untrained, replicated.
  absl::Status InitialValuesLocked(const transport::MessageHeader& h, uint32_t first, uint32_t end,
                                   const char* data, Hold* hold) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases the held updates every backup has acknowledged.
  void ReleaseLocked(std::vector<Reply>* replies) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a pull of chunks [first, end) may be answered now.
  bool PullReadyLocked(const transport::MessageHeader& h, uint32_t first, uint32_t end) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // SSP: the lowest clock of the step set's workers on chunks [first,
  // end), among those that pushed there; nullopt when none did.
  std::optional<uint64_t> SlowestClockLocked(uint32_t first, uint32_t end) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The chunks a request addresses (one, or the whole partition).
  std::pair<uint32_t, uint32_t> ChunkRangeOf(const transport::MessageHeader& h) const;
  // Answers the waiting pulls that may be answered now (bsp: a version
  // now released; ssp: the slowest worker caught up).
  void ServeWaitingPullsLocked(std::vector<Reply>* replies) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The header fields every snapshot and copy shares (not job, seq, full).
  void FillHeaderLocked(proto::CheckpointPartitionHeader* h) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The whole state as a replica copy record's payload (a full checkpoint
  // file's streams), written into *out (in place when it is large enough:
  // CopyBufferBytes); the values and optimizer state copied once.
  void EncodeCopyLocked(std::string* out) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The streams of that copy: views of the partition's state, and of
  // *header (and for a sparse one *rows, *pending) filled here.
  std::vector<CopyStream> CopyStreamsLocked(std::string* header, std::string* rows,
                                            std::string* pending) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A buffer size for the copy SetBackups will make for the new ones of
  // `backups` (a little more than the copy), 0 when it makes none or
  // cannot tell (sparse). Takes mu_.
  size_t CopyBufferBytes(const std::vector<uint32_t>& backups) const ABSL_LOCKS_EXCLUDED(mu_);
  // Applies a decoded update record as the primary applied it.
  absl::Status ApplyUpdateLocked(const ReplicaUpdate& u) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes a record of initial values (kFlagInitialValues) as the chunk's.
  absl::Status TakeValuesLocked(const ReplicaUpdate& u) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ApplyStreamsLocked(const std::map<storage::BlockType, std::string>& streams,
                                  const std::string& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The version pulls may see: the last one every backup holds, of chunk
  // c or of the whole partition.
  uint64_t ServedChunkVersionLocked(uint32_t c) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t ServedVersionLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What a pull of chunks [first, end) may see.
  uint64_t ServedForLocked(uint32_t first, uint32_t end) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint32_t id_;
  const std::string table_;
  const uint64_t length_;
  const bool sparse_;
  const int dim_;                // sparse: floats per row
  const uint64_t chunk_floats_;  // dense: floats per chunk (the last may be shorter)
  const uint32_t num_chunks_;    // chunks_.size()
  const Consistency consistency_;
  const uint64_t staleness_;  // ssp

  mutable absl::Mutex mu_;
  std::vector<float> values_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Optimizer> optimizer_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<SparseTable> rows_ ABSL_GUARDED_BY(mu_);  // sparse only
  std::vector<float> grad_sum_ ABSL_GUARDED_BY(mu_);        // BSP step accumulator
  std::vector<Chunk> chunks_ ABSL_GUARDED_BY(mu_);          // >= 1; set once
  PushLedger ledger_ ABSL_GUARDED_BY(mu_);
  // Sparse BSP step accumulator: key -> its place in step_keys_/step_grads_.
  absl::flat_hash_map<uint64_t, uint32_t> step_slot_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> step_keys_ ABSL_GUARDED_BY(mu_);
  std::vector<float> step_grads_ ABSL_GUARDED_BY(mu_);
  std::set<uint32_t> step_workers_ ABSL_GUARDED_BY(mu_);         // step-set members
  std::map<uint32_t, uint32_t> member_of_ ABSL_GUARDED_BY(mu_);  // worker -> member
  uint32_t covered_chunk_ ABSL_GUARDED_BY(mu_) = 0;              // with Hold::kCovered
  uint32_t MemberLocked(uint32_t sender) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = member_of_.find(sender);
    return it != member_of_.end() ? it->second : sender;
  }
  // BSP pulls of a version not reached yet (sparse ones keep their keys).
  std::vector<std::pair<transport::Message, std::shared_ptr<transport::Responder>>> waiting_pulls_
      ABSL_GUARDED_BY(mu_);
  PartitionStats stats_ ABSL_GUARDED_BY(mu_);
  // Changes to the values (chunk updates applied, restores), for the
  // checkpoint baseline: the checkpoint of the last snapshot or restore,
  // and the changes then.
  uint64_t changes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t baseline_seq_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t baseline_changes_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::pair<SnapshotRequest, SnapshotDone>> waiting_snapshots_ ABSL_GUARDED_BY(mu_);

  // Replication.
  PartitionRole role_ ABSL_GUARDED_BY(mu_) = PartitionRole::kPrimary;
  bool synced_ ABSL_GUARDED_BY(mu_) = true;     // a backup holds the primary's copy
  bool caught_up_ ABSL_GUARDED_BY(mu_) = true;  // and the primary counts it
  ReplicaSink* sink_ ABSL_GUARDED_BY(mu_) = nullptr;
  // Primary: the index of the last record sent; backup: of the last applied.
  uint64_t record_index_ ABSL_GUARDED_BY(mu_) = 0;
  // Primary: each backup's highest acknowledged record.
  std::map<uint32_t, uint64_t> backup_acked_ ABSL_GUARDED_BY(mu_);
  // Primary: the backups still catching up: the record of their copy,
  // and once it is acknowledged, the last record sent then, which they
  // must acknowledge to be sent the caught-up marker.
  struct CatchUp {
    uint64_t copy = 0;
    std::optional<uint64_t> until;
  };
  std::map<uint32_t, CatchUp> catching_up_ ABSL_GUARDED_BY(mu_);
  // Primary: the move's target among the backups (0: none), not waited
  // for while it catches up.
  uint32_t move_target_ ABSL_GUARDED_BY(mu_) = 0;
  // The lowest record every counted backup holds (UINT64_MAX: none is
  // counted, nothing waits).
  uint64_t HeldByAllLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Updates sent but not yet held by every backup: record index, the
  // chunk it updates and that chunk's version before it, and the replies
  // held back until then.
  struct Held {
    uint64_t index;
    uint32_t chunk;
    uint64_t before;
    std::vector<Reply> replies;
  };
  std::vector<Held> held_ ABSL_GUARDED_BY(mu_);
  // Bsp: acks of the pushes of the step in progress, held until the step's
  // update is replicated (a primary dying before then loses nothing
  // acknowledged: the pushes come again).
  std::vector<Reply> step_acks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata::pserver

#endif  // STRATA_PSERVER_PARTITION_H_
