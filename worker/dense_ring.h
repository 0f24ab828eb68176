// The worker's side of `model.dense_sync: allreduce` (docs/reliability.md,
// "Dense tables by allreduce"): keeps this worker's DenseSync (dense_sync.h)
// in the ring of the cluster view's training workers, re-forming it as the
// view changes, and runs the steps through it.
//
// The ring is the view's workers that are ALIVE or FINISHED, by node id: a
// worker that has run out of data tasks stays in it, stepping with no
// samples (IdleFor), so that the others' steps go on and the parameters it
// evaluates with are the job's; one JOINING (a scale, a restart) comes in
// when it leases its first task, and a DEAD or DRAINED one leaves. Every
// step carries the newest view epoch each member knows (its heartbeats
// bring it), so all members learn of a new view at the same step and form
// its ring there. A step that fails (a member died, or went on to a newer
// ring) is retried on the ring of the next view: its gradients again, or
// nothing when another member completed it (Form says which).
//
// Hierarchical (cluster.aggregation node; docs/architecture.md,
// "Collectives"): the ring is one member per host, which steps the sum of
// its host's workers from its aggregation thread (host_aggregator.h);
// the host's other workers post their gradients and read the parameters
// it publishes, as with the pservers.
//
// Thread safety: one thread only (the training thread; the host
// aggregator's when hierarchical).
#ifndef STRATA_WORKER_DENSE_RING_H_
#define STRATA_WORKER_DENSE_RING_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/strata.pb.h"
#include "worker/dense_sync.h"

namespace strata::worker {

class DenseRing {
 public:
  struct Hooks {
    // The master's view now.
    std::function<absl::StatusOr<proto::ClusterView>()> fetch_view;
    // The newest view epoch this worker has heard of (its heartbeats').
    std::function<uint64_t()> epoch_seen;
    std::function<bool()> stopping;
    // Ring checkpoints (docs/checkpoint-format.md, "Allreduce tables"):
    // the newest the master has asked of this worker (id 0: none), and
    // this member's part of one, once the ring has reached its cut: its
    // shard (`snapshot`, the callee's to move from), or null with `error`
    // when it could not take it, or null with OK when the ring was past
    // the cut when it learned of it. Either may be empty (no checkpoints).
    std::function<DenseSync::CheckpointAsk()> checkpoint_ask;
    std::function<void(const DenseSync::CheckpointAsk& ask, DenseSync::Snapshot* snapshot,
                       const absl::Status& error)>
        checkpoint_cut;
  };
  // `sync` and `tables` (the model's tables: what Form and the steps write
  // into; their storage stays put) are borrowed; `ring_tables`: the indices
  // of those kept by the ring, in the order of `sync`'s tables (the others,
  // sparse tables on the pservers, are left alone). A ring that cannot be
  // formed within `reform_timeout` of a failure is an error (Unavailable):
  // the worker exits, and its restart makes a new view.
  // `by_host`: the ring is hierarchical (cluster.aggregation node): one
  // member per host (RingLeadersByHost), which steps its host's sum.
  DenseRing(DenseSync* sync, uint32_t node_id, std::vector<std::vector<float>>* tables,
            std::vector<size_t> ring_tables, Hooks hooks, absl::Duration reform_timeout,
            bool by_host = false);

  // The ring's members in `view`: its ALIVE and FINISHED workers, by node
  // id; `by_host`: each host's lowest of them.
  static std::vector<DenseSync::Member> MembersOf(const proto::ClusterView& view,
                                                  bool by_host = false);

  // Joins the ring of the view now when this worker is in it and in no
  // ring yet (before its first evaluation; TrainStep and IdleFor join by
  // themselves). OK when the view leaves it out (FailedPrecondition from
  // TrainStep then). Once training is over (over()): OK when this worker
  // holds the ring's last parameters (it was in the ring, and its last
  // step completed, or was ended by the Abort before its first exchange
  // went through or with no samples in it); else FailedPrecondition (it cannot evaluate the trained
  // model: no ring forms again to bring it).
  absl::Status Join();

  struct Done {
    uint64_t step = 0;     // the step done
    uint64_t samples = 0;  // over every member
  };
  // One step of `samples` with `grads` (the gradients summed over them, one
  // per table of the model, as `tables`; those of the ring's tables are
  // read): the parameters after it are in the ring's tables. Retried
  // across re-formed rings until done. A worker in no ring joins first;
  // when the ring has trained already, its values were not the ring's and
  // it brings no gradient to this step. FailedPrecondition when the view
  // has no ring with this worker in it.
  absl::StatusOr<Done> TrainStep(const std::vector<std::vector<float>>& grads, uint64_t samples);

  // A step overlapping the backward pass (DenseSync::StartStep; the
  // ring's buckets, dense_sync.h): true when this worker's step has
  // started (it is in a formed ring); the caller then hands the gradients
  // as the backward pass makes them (GradsReady, by model table) and
  // ends the step with TrainStep (the same samples). False: TrainStep
  // does it all after the backward pass.
  bool BeginStep(uint64_t samples);
  void GradsReady(size_t model_table, const float* grad, uint64_t end);
  // The step begun cannot be finished (the caller's compute failed): the
  // ring breaks, and the next step forms one again.
  void AbandonStep(const absl::Status& why);
  // Where the model's table `model_table` is cut into the ring's buckets
  // (table offsets): where its backward pass should report its blocks.
  std::vector<uint64_t> BucketStarts(size_t model_table) const;

  // Steps with no samples for about `duration`, at least once (this
  // worker has no task, the others may), and joins the ring of a newer
  // view on the way. A step
  // that fails is not retried here (the caller asks the master what to do
  // first: the job may be over); the next call re-forms.
  absl::Status IdleFor(absl::Duration duration);

  bool in_ring() const { return in_ring_; }
  // Training is over (DenseSync::Abort): no ring forms again; IdleFor
  // only waits, Join says whether this worker holds the ring's
  // parameters, TrainStep fails.
  bool over() const { return sync_->over(); }
  // The step to train next.
  uint64_t next_step() const { return next_step_; }
  // Optimizer updates the ring has applied (its steps with samples).
  uint64_t updates() const { return sync_->updates(); }
  // (Any thread: the metrics' HTTP thread reads them.)
  uint64_t steps_failed() const { return steps_failed_.load(); }
  uint64_t rings_formed() const { return rings_formed_.load(); }
  uint64_t steps_overlapped() const { return steps_overlapped_.load(); }  // BeginStep's
  // Reform ran out of its time: no ring of a newer view formed within
  // reform_timeout of a failure (the caller ends the worker; its restart
  // makes a new view).
  bool gave_up() const { return gave_up_; }

 private:
  // The checkpoint asked of this worker now (none without the hook).
  DenseSync::CheckpointAsk Ask() const {
    return hooks_.checkpoint_ask ? hooks_.checkpoint_ask() : DenseSync::CheckpointAsk{};
  }
  // One try at a step: on an error the ring is marked broken.
  absl::StatusOr<DenseSync::StepResult> StepOnce(const std::vector<const float*>& grads,
                                                 uint64_t samples);
  // After a step that saw a newer view: forms its ring if its members are
  // not this ring's.
  absl::Status FollowView(uint64_t epoch);
  // After a step: this member's part of the checkpoint the step carried,
  // once the ring's updates have reached its cut.
  void CheckpointAfterStep(const DenseSync::CheckpointAsk& ask);
  // Forms the ring of the first view past the broken ring's epoch (and
  // past each epoch tried), within reform_timeout.
  absl::Status Reform();
  // Forms the ring of `view` (this worker in it); false when Form failed.
  bool FormOf(const proto::ClusterView& view);

  DenseSync* const sync_;
  const uint32_t node_id_;
  const std::vector<size_t> ring_tables_;
  std::vector<float*> params_;   // the ring's tables
  std::vector<int> sync_index_;  // by model table: its index among the ring's (-1: none)
  const Hooks hooks_;
  const absl::Duration reform_timeout_;
  const bool by_host_;
  std::vector<std::vector<float>> zeros_;  // an idle step's gradients
  std::vector<uint32_t> members_;          // the ring's node ids
  bool in_ring_ = false;
  bool broken_ = false;         // the last step or Form failed
  bool ended_ = false;          // ... ended by DenseSync::Abort (a step: no parameter moved)
  bool own_params_ = false;     // the last Form found this worker's values the ring's
  uint64_t checked_epoch_ = 0;  // the newest view whose ring was looked at
  uint64_t next_step_ = 0;
  std::atomic<uint64_t> steps_failed_{0};
  std::atomic<uint64_t> rings_formed_{0};
  std::atomic<uint64_t> steps_overlapped_{0};
  bool gave_up_ = false;
};

}  // namespace strata::worker

#endif  // STRATA_WORKER_DENSE_RING_H_
