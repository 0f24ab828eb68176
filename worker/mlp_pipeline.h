// model.stages > 1 in a job: the MLP trainer's steps as one stage of a
// pipeline (worker/pipeline.h). Which stage this worker is, and which
// worker comes next, follow from the cluster view (PipelineSeats,
// common/aggregation.h): worker index i is stage i % K of group i / K. The
// group's first stage, its leader, holds the data tasks; the others follow
// its steps as its micro-batches come. Every stage pulls its own tables
// from the pservers at the leader's step and pushes their gradient, summed
// over the step's micro-batches, for that step; the pservers count a
// group's pushes as one member of the bsp step set, so a step completes
// once every group has pushed every table.
#ifndef STRATA_WORKER_MLP_PIPELINE_H_
#define STRATA_WORKER_MLP_PIPELINE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/aggregation.h"
#include "worker/device.h"
#include "worker/mlp.h"
#include "worker/pipeline.h"
#include "worker/trainer.h"

namespace strata::worker {

// Training thread only. `ctx`, `device` and `whole` are borrowed: `whole`
// is the trainer's model of every layer, whose tensors pulls land in (and
// which evaluates); a stage computes on a model of its own layers.
class MlpPipeline {
 public:
  MlpPipeline(TrainerContext* ctx, Device* device, Mlp* whole);
  ~MlpPipeline();
  MlpPipeline(const MlpPipeline&) = delete;
  MlpPipeline& operator=(const MlpPipeline&) = delete;

  // Takes this worker's seat in the view held now (a new stage when it
  // changed): nullopt when it has none (fewer workers than a whole group).
  absl::StatusOr<std::optional<PipelineSeat>> Seat();
  // The leader: one step on x[n] with labels y[n] at the worker's next
  // step. Sets *version and *correct; adds the time spent waiting for the
  // pservers to *comm. Returns the step's summed loss.
  absl::StatusOr<double> LeaderStep(const float* x, const int32_t* y, int n, uint64_t* version,
                                    int64_t* correct, absl::Duration* comm);
  // The leader, before its task is reported done: returns once the stages
  // after it have pushed their part of its last step.
  absl::Status Flush();
  // A stage after the first: the leader's steps as they come, until none
  // has come for `idle` (or the seat is not a follower's any more).
  absl::Status Follow(absl::Duration idle);

 private:
  // The stage's tables at min_version into its model (*version: the
  // lowest pulled), and its summed gradient pushed for `version`.
  absl::Status PullStage(uint64_t min_version, uint64_t* version, absl::Duration* comm);
  absl::Status PushStage(uint64_t version, int n, absl::Duration* comm);
  // After a failed step: the stage goes (its held requests answered with
  // an error); the next Seat makes it anew, with a new connection.
  void DropStage();
  // The stage's tables: [first_table, end_table).
  int first_table() const { return 2 * bounds_[seat_->stage]; }
  int end_table() const { return 2 * bounds_[seat_->stage + 1]; }

  TrainerContext* const ctx_;
  Device* const device_;
  Mlp* const whole_;
  const int micro_batches_;
  std::vector<int> bounds_;  // StageBounds
  std::optional<PipelineSeat> seat_;
  uint64_t seated_epoch_ = 0;             // the view epoch seat_ is of
  std::unique_ptr<Mlp> model_;            // the stage's layers
  std::shared_ptr<PipelineStage> stage_;  // shared with the worker's listener
  std::vector<std::vector<float>> push_;  // the stage's tables' sums, in model order
  uint64_t next_op_ = 1;                  // the leader's next step attempt
};

}  // namespace strata::worker

#endif  // STRATA_WORKER_MLP_PIPELINE_H_
