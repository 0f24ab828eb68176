// Dense tables synchronised by allreduce among the workers (`model.
// dense_sync: allreduce`, docs/architecture.md "Collectives"), with the
// optimizer run on the workers, sharded: Strata's ring (transport/
// ring_allreduce.h) sums the step's gradients by reduce-scatter; the
// member that holds a segment's sum applies the optimizer to it (its
// shard: 1/W of the tables' optimizer state), and the all-gather carries
// the new parameters round. The member after it in the ring keeps a
// replica of that shard: the first hop of the all-gather brings it the
// summed gradient, which it applies to its copy of the state (the same
// math, bit for bit) before passing the parameters on. So no traffic is
// added, and one lost member loses no optimizer state.
//
// Membership. The ring is a list of members (node ids and data-plane
// addresses, in the order the caller gives: the cluster view's training
// workers). Form() makes a ring of them and brings every member to the
// same state: the members agree, through the new ring, on the last step
// any of them completed, take the parameters from one that completed it,
// undo a step that was cut short, and re-split the optimizer state for the
// new ring (each old shard from its owner, or from its replica when the
// owner is gone). A step that fails (a member died or left, DeadlineExceeded
// or Unavailable naming the peer) leaves this member in that step: the
// caller forms a new ring of the members left and learns from Form which
// step to go on from (the failed one again, with the same gradients, or the
// next one when another member completed it).
//
// Each ring is numbered by an epoch the caller gives (the view's), rising
// from ring to ring; messages of a ring this member has not formed yet
// wait for it, those of an older one are refused.
//
// A step overlaps the backward pass (Options::bucket_bytes): its first
// exchange goes as soon as the step starts (StartStep), and the flat space
// is reduced in buckets (each cut by the members' shards, ring_allreduce.h)
// as the backward pass makes their gradients final (GradsReady), on a
// thread of this member's, while the model goes on computing; the
// optimizer's shards are the same whatever the buckets.
//
// Thread safety: Handle() and Abort() from any thread (the transport's);
// the rest from one thread (the training thread). Between StartStep and
// FinishStep (or AbandonStep) that thread calls GradsReady only.
#ifndef STRATA_WORKER_DENSE_SYNC_H_
#define STRATA_WORKER_DENSE_SYNC_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/config.h"
#include "common/optimizer.h"
#include "transport/ring_allreduce.h"
#include "transport/transport.h"

namespace strata::worker {

class DenseSync {
 public:
  struct Member {
    uint32_t node_id = 0;
    std::string address;  // the member's data-plane listener
  };
  // A checkpoint's optimizer state (Options::checkpoint_state): its
  // state_vectors() vectors of total() floats, one after the other.
  struct CheckpointState {
    uint64_t seq = 0;
    uint64_t step = 0;
    std::vector<float> state;
  };
  struct Options {
    uint32_t node_id = 0;  // this member's
    OptimizerSection optimizer;
    size_t chunk_bytes = 256 << 10;
    // Each wait for a member's part of a step (transport/ring_allreduce.h).
    absl::Duration timeout = absl::Seconds(30);
    // Buckets of about this many bytes, reduced as the backward pass
    // makes them (StartStep); 0: the whole flat space at once. Every
    // member of a ring must have the same.
    size_t bucket_bytes = 0;
    // By table, the floats of one row (a weight's output width; empty or
    // 0: 1): a bucket starts at a whole row, where the backward pass
    // finishes a block of rows.
    std::vector<size_t> row_floats;
    // Where the optimizer state of a segment comes from when its owner
    // and its replica left together: the newest checkpoint's state over
    // the flat space, read only then (the worker reads its checkpoint
    // root's newest manifest and ring shards; worker.cc). Unset, or an
    // error: that state starts again from zero (logged).
    std::function<absl::StatusOr<CheckpointState>()> checkpoint_state;
    // Tests: this step's ring call succeeds here but Step reports it
    // failed (Unavailable), as when the last acknowledgement of a step the
    // others completed never came.
    std::optional<uint64_t> fail_after_step_for_testing;
  };
  // `table_sizes`: the floats of each allreduce table, in the order every
  // member uses. `transport` is borrowed and must outlive this; its
  // listener hands kCollective requests to Handle().
  static absl::StatusOr<std::unique_ptr<DenseSync>> Create(transport::Transport* transport,
                                                           Options options,
                                                           std::vector<size_t> table_sizes);
  DenseSync(const DenseSync&) = delete;
  DenseSync& operator=(const DenseSync&) = delete;
  // A step still in flight is abandoned (its ring aborted).
  ~DenseSync();

  // Any thread: a kCollective request, for the ring of its epoch (the
  // operation's high 32 bits).
  void Handle(transport::Message request, std::shared_ptr<transport::Responder> responder);
  // Any thread: training is over (the master chose the worker that
  // evaluates), the job is over, or this worker stops. Fails the current
  // ring's call in progress, and its later ones, with `why` (Cancelled): a member idling
  // in a step that a departed member will never finish ends it at once,
  // not at the timeout. No ring is formed after it (Form is Cancelled).
  void Abort(const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu_);
  bool over() const { return over_.load(); }
  // Any thread (the heartbeat's, on a new view): the current ring's call
  // in progress, and its later ones, fail (Unavailable) when `members`
  // (the workers in the job, ALIVE or FINISHED, in view `epoch`, newer
  // than the ring's) leaves out a member of it: a member that died without
  // breaking a connection this member waits on (the one it receives
  // from, in a ring of 2) ends the wait now, not at the timeout. A ring of
  // an older view formed after it is failed as it starts. The next ring
  // forms as usual.
  void AbortIfLeft(uint64_t epoch, const std::vector<uint32_t>& members) ABSL_LOCKS_EXCLUDED(mu_);

  // What Form agreed.
  struct Formed {
    // The step to train next: one past the last step any member completed
    // (0 when none did).
    uint64_t next_step = 0;
    // Optimizer-state floats of shards whose owner and replica were both
    // gone: taken from the newest checkpoint (Options::checkpoint_state;
    // `state_checkpoint` names it), else started again from zero.
    size_t lost_state = 0;
    std::optional<uint64_t> state_checkpoint;
    // This member's parameters were the ring's already: it had completed
    // the last step any member completed (or restored a checkpoint that
    // the ring took), so a gradient it computed on them counts.
    bool own_params = false;
  };
  // Forms the ring of `members` (this node among them, every member with
  // the same list) for `epoch` (above every earlier one), and writes the
  // agreed parameters into `params` (one buffer per table). A member that
  // was in no ring before brings its `params` as they are: when no member
  // has completed a step, the parameters of the first member are everyone's
  // (so a job starts from one initialisation). Errors as Step's: form again.
  absl::StatusOr<Formed> Form(uint64_t epoch, const std::vector<Member>& members,
                              const std::vector<float*>& params);

  // A checkpoint the ring is asked for (the master's RingCheckpointRequest:
  // seq 0 is none): every step carries the newest each member has heard
  // of, so that all members learn of it at the same step; each member
  // takes its Snapshot after the step that brings the ring's updates to
  // `cut` (docs/checkpoint-format.md, "Allreduce tables").
  struct CheckpointAsk {
    uint64_t id = 0;  // each try at a cut has a higher one (0: none)
    uint64_t seq = 0;
    uint64_t cut = 0;
  };
  struct StepResult {
    uint64_t samples = 0;    // over every member
    uint64_t max_epoch = 0;  // the highest `epoch_seen` of any member
    CheckpointAsk ask;       // the newest `ask` (by id) of any member
  };
  // Step `step` (every member calls it with the same one): sums `grads`
  // (per table: the gradient summed over this member's `samples`, which may
  // be 0) over the ring, applies the optimizer to the mean, and writes the
  // new parameters into `params`. `epoch_seen`: the newest view this member
  // knows, so that all members learn the newest (and form its ring at the
  // same step). On an error `params` are as they were; the caller forms a
  // ring again.
  absl::StatusOr<StepResult> Step(uint64_t step, const std::vector<const float*>& grads,
                                  uint64_t samples, uint64_t epoch_seen,
                                  const std::vector<float*>& params, CheckpointAsk ask);
  absl::StatusOr<StepResult> Step(uint64_t step, const std::vector<const float*>& grads,
                                  uint64_t samples, uint64_t epoch_seen,
                                  const std::vector<float*>& params) {
    return Step(step, grads, samples, epoch_seen, params, CheckpointAsk{});
  }

  // Step in three parts, overlapping the backward pass: StartStep as the
  // step's compute begins (its arguments as Step's; the first exchange
  // goes at once, on this member's step thread), GradsReady as the
  // backward pass makes gradients final, FinishStep once it is done (the
  // gradients in full: what GradsReady did not give is taken from there),
  // which returns what Step would. Errors as Step's; StartStep's own
  // (FailedPrecondition, InvalidArgument) leave no step in flight.
  absl::Status StartStep(uint64_t step, uint64_t samples, uint64_t epoch_seen, CheckpointAsk ask);
  // Elements [0, end) of table `table`'s gradient, `grad`, are final
  // (copied now): the buckets they complete are reduced while the caller
  // computes, all but the step's last, which waits for FinishStep (so
  // that no member completes a step this member may yet abandon).
  void GradsReady(size_t table, const float* grad, size_t end);
  absl::StatusOr<StepResult> FinishStep(const std::vector<const float*>& grads,
                                        const std::vector<float*>& params);
  // The step in flight cannot be finished (the caller's compute failed):
  // it fails here (form a ring again), its ring aborted with `why`.
  void AbandonStep(const absl::Status& why);
  bool stepping() const { return in_flight_ != nullptr; }
  // The samples StartStep was given for the step in flight (0: none).
  uint64_t begun_samples() const { return in_flight_ != nullptr ? in_flight_->samples : 0; }
  bool overlaps() const { return options_.bucket_bytes > 0; }
  size_t buckets() const { return buckets_.size(); }
  // Where table `table`'s buckets start (table offsets above 0): where a
  // backward pass that reports gradients block by block should cut its
  // blocks.
  std::vector<uint64_t> BucketStarts(size_t table) const;

  // This member's part of a checkpoint, now (between steps): the shard it
  // owns of the flat space, its parameters and its optimizer state.
  struct Snapshot {
    uint32_t rank = 0, ring_size = 0;
    uint64_t ring_epoch = 0;
    uint64_t begin = 0, end = 0, total = 0;
    uint64_t step = 0;  // the last step completed
    uint64_t updates = 0;
    uint32_t state_vectors = 0;
    bool state_count = false;  // `state` starts with the update count
    std::vector<float> values;
    std::string state;  // Optimizer::SaveState of the shard
  };
  // FailedPrecondition before a ring is formed or after a failed step.
  absl::StatusOr<Snapshot> TakeSnapshot() const;

  // A job resumed from a checkpoint (storage/ring_checkpoint.h): before
  // this member's first Form, the checkpoint's state: `values` (the flat
  // space, also written into `params`) and the optimizer's `state`
  // (state_vectors() vectors over the flat space) after `updates`
  // updates, the last step being `step`. The first ring brings it in
  // unless a member holds newer state (a ring that went on without this
  // worker). InvalidArgument when the sizes are not this model's.
  absl::Status Restore(uint64_t step, uint64_t updates, std::vector<float> values,
                       std::vector<float> state, const std::vector<float*>& params);
  uint32_t state_vectors() const { return static_cast<uint32_t>(state_vectors_); }
  // The newest checkpoint ask (its id) this member has answered; Form
  // makes it the least of the ring's members', so that a ring formed
  // during a checkpoint answers it again as a whole (DenseRing).
  uint64_t answered() const { return answered_; }
  void set_answered(uint64_t id) { answered_ = id; }
  size_t total() const { return total_; }

  // Form's first part: the ring of `epoch` made and installed (this
  // member its `rank`), the messages that came for it early handed to it
  // and those of rings this member skipped refused; Cancelled after an
  // Abort.
  absl::StatusOr<std::shared_ptr<transport::RingAllreduce>> StartRing(
      uint64_t epoch, const std::vector<Member>& members, uint32_t rank) ABSL_LOCKS_EXCLUDED(mu_);
  // The current ring (0 before the first Form) and this member's place.
  uint64_t epoch() const { return epoch_; }
  uint32_t rank() const { return rank_; }
  uint32_t size() const { return static_cast<uint32_t>(members_.size()); }
  // This member's shard of the flat parameter space: [begin, end).
  std::pair<size_t, size_t> shard() const { return Segment(OwnedSegment(rank_)); }
  // Floats of optimizer state held here (the shard and its replica).
  size_t state_floats() const;
  // The last step this member completed.
  std::optional<uint64_t> completed() const { return completed_; }
  // The samples over the ring of the step that failed here (until the
  // next Form), when its first exchange went through: with 0, no member
  // can have moved a parameter in it; with more, another may have
  // completed it. Empty when its first exchange did not go through (then
  // no member completed it) or no step failed.
  std::optional<uint64_t> cut_short_samples() const { return cut_short_samples_; }
  // Optimizer updates applied (steps with samples), the same at every
  // member of a ring.
  uint64_t updates() const { return updates_; }

 private:
  DenseSync(transport::Transport* transport, Options options, std::vector<size_t> table_sizes);

  // Rank r owns segment r + 1 (ring_allreduce.h); segment s of the flat
  // space in a ring of `w`.
  uint32_t OwnedSegment(uint32_t rank) const { return (rank + 1) % size(); }
  std::pair<size_t, size_t> Segment(uint32_t s) const { return SegmentOf(s, size()); }
  std::pair<size_t, size_t> SegmentOf(uint32_t s, uint32_t w) const {
    return {total_ * s / w, total_ * (s + 1) / w};
  }
  // The operation id of call `call` of the current ring.
  uint64_t Op(uint64_t call) const { return (epoch_ << 32) | call; }
  // A member of the current ring that the newest view AbortIfLeft was
  // given (newer than the ring) leaves out (0: none), and the error that
  // fails the ring for it.
  uint32_t GoneLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status LeftError(uint32_t gone, uint64_t ring_epoch, uint64_t view) const;
  // A fresh optimizer for `n` floats, its state from `state` when given.
  absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(size_t n,
                                                           const std::string* state) const;
  // Form's contribution of this member's shards of the last ring's split
  // to `all` (K state vectors over the flat space): each old segment's
  // state from its owner when `holder` (node id) says it is in the new
  // ring and current, else from its replica's holder. Returns the ranges
  // of the flat space whose segments neither holds (lost).
  std::vector<std::pair<size_t, size_t>> PutOldShards(const std::function<bool(uint32_t)>& holder,
                                                      float* all) const;
  // The lost ranges' state into `all` from the newest checkpoint: its seq,
  // or nullopt (none, or it could not be read: logged).
  std::optional<uint64_t> PutCheckpointState(const std::vector<std::pair<size_t, size_t>>& lost,
                                             float* all) const;
  // Form's first exchange: what this member holds, into its slot.
  void PutFormSlot(float* slot) const;
  // Form's last part: this member's optimizer shards of a ring of `w`
  // (its own segment and its replica of the one before), from `all` (K
  // state vectors over the flat space, as summed), `updates` applied.
  absl::Status TakeShards(const std::vector<float>& all, uint32_t rank, uint32_t w,
                          uint64_t updates);
  // A step in flight (StartStep to FinishStep).
  struct InFlight {
    uint64_t step = 0, samples = 0, epoch_seen = 0;
    CheckpointAsk ask;
    std::shared_ptr<transport::RingAllreduce> ring;
    // Guarded by step_mu_: by table, the gradient floats in buf_;
    // everything is there; the caller gave up; the step thread is done.
    std::vector<size_t> ready;
    bool all_ready = false, abandoned = false, done = false;
    bool threaded = false;                // run on the step thread
    std::optional<uint64_t> ctl_samples;  // the first exchange's sum, once it went through
    absl::StatusOr<StepResult> result = StepResult{};
  };
  // The checks before a step (Step's errors other than the ring's).
  absl::Status CanStep(uint64_t step, std::shared_ptr<transport::RingAllreduce>* ring) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // A step in flight on `ring` (CanStep's), its exchanges on the step
  // thread when `threaded`, else on FinishStep's caller (Step).
  void Begin(uint64_t step, uint64_t samples, uint64_t epoch_seen, CheckpointAsk ask,
             std::shared_ptr<transport::RingAllreduce> ring, bool threaded);
  // A step's exchanges (the step thread's, or Step's caller's), each
  // bucket once GradsReady has brought it; the result into `f`.
  void RunStep(InFlight* f);
  // Whether every gradient of bucket b is in buf_.
  bool BucketReady(const InFlight& f, size_t b) const;
  // The step thread: runs the step handed to it.
  void StepThread();
  // The buckets of the flat space, in the order they are reduced (the
  // tables from last to first, as a backward pass makes them; a table's
  // pieces from first to last), neighbours merged up to bucket_bytes.
  void CutBuckets();
  // Flat params -> the caller's tables, and back.
  void CopyOut(const std::vector<float>& flat, const std::vector<float*>& params) const;
  void CopyIn(const std::vector<float*>& params, std::vector<float>* flat) const;

  transport::Transport* const transport_;
  const Options options_;
  const std::vector<size_t> table_sizes_;
  size_t total_ = 0;                                // floats over all tables
  std::vector<size_t> offsets_;                     // each table's first float in the flat space
  std::vector<std::pair<size_t, size_t>> buckets_;  // [begin, end) of the flat space
  size_t state_vectors_ = 0;                        // per-parameter state floats of the optimizer
  bool state_has_count_ = false;                    // its saved state starts with its update count

  // The ring; swapped by Form while Handle reads it.
  mutable absl::Mutex mu_;
  std::shared_ptr<transport::RingAllreduce> ring_ ABSL_GUARDED_BY(mu_);
  uint64_t ring_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uint32_t> ring_nodes_ ABSL_GUARDED_BY(mu_);  // its members' node ids
  // The newest view AbortIfLeft was given, and its workers in the job.
  uint64_t newest_view_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uint32_t> newest_view_members_ ABSL_GUARDED_BY(mu_);
  // Requests for a ring not formed yet, by epoch (answered once it is).
  std::map<uint64_t,
           std::vector<std::pair<transport::Message, std::shared_ptr<transport::Responder>>>>
      early_ ABSL_GUARDED_BY(mu_);
  size_t early_bytes_ ABSL_GUARDED_BY(mu_) = 0;

  // Training thread only.
  uint64_t epoch_ = 0;
  uint64_t calls_ = 0;  // operations of the current ring
  uint32_t rank_ = 0;
  std::vector<Member> members_;
  // The ring the optimizer state is split by (the last formed: members
  // and epoch), and the two shards held: owned, and the previous rank's
  // replica.
  uint64_t state_epoch_ = 0;
  std::vector<Member> state_members_;
  std::unique_ptr<Optimizer> primary_, replica_;
  // Their state before the step in progress (undone when Form finds that
  // step cut short everywhere).
  std::string primary_before_, replica_before_;
  std::vector<float> params_;  // the agreed parameters, flat
  std::vector<float> buf_;     // a step's sums, then its new parameters
  std::vector<float> scratch_;
  uint64_t updates_ = 0;  // optimizer updates applied (steps with samples)
  bool formed_ = false;   // the last Form went through (Step may run)
  std::optional<uint64_t> completed_;
  std::optional<uint64_t> in_step_;  // a step that failed here
  std::optional<uint64_t> cut_short_samples_;
  // Restore's optimizer state over the flat space, until a Form takes it.
  bool restored_ = false;
  std::vector<float> restored_state_;
  uint64_t answered_ = 0;
  std::atomic<bool> over_{false};  // Abort

  // The step in flight (training thread) and the thread that runs it.
  std::unique_ptr<InFlight> in_flight_;
  absl::Mutex step_mu_;
  InFlight* handed_ ABSL_GUARDED_BY(step_mu_) = nullptr;  // to the step thread
  bool quit_ ABSL_GUARDED_BY(step_mu_) = false;
  std::thread step_thread_;
};

}  // namespace strata::worker

#endif  // STRATA_WORKER_DENSE_SYNC_H_
