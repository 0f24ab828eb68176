// model.stages > 1 in a job: a worker's steps as one stage of a pipeline
// (worker/pipeline.h), for any model family that cuts its model into
// stages (the MLP trainer's layers, a PyTorch script's nn.Sequential).
// Which stage this worker is, and which worker comes next, follow from the
// cluster view (PipelineSeats, common/aggregation.h): worker index i is
// stage i % K of group i / K. The group's first stage, its leader, holds
// the data tasks; the others follow its steps as its micro-batches come.
// Every stage pulls its own tables from the pservers at the leader's step
// and pushes their gradient, summed over the step's micro-batches, for
// that step; the pservers count a group's pushes as one member of the bsp
// step set, so a step completes once every group has pushed every table.
#ifndef STRATA_WORKER_PIPELINE_RUNNER_H_
#define STRATA_WORKER_PIPELINE_RUNNER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/aggregation.h"
#include "worker/pipeline.h"
#include "worker/trainer.h"

namespace strata::worker {

// One thread at a time (the worker's training thread, or the script's in
// its place). `ctx` is borrowed.
class PipelineRunner {
 public:
  // A stage's model, as the family makes it for a seat.
  struct Stage {
    std::shared_ptr<StageModel> model;
    int first_table = 0;  // its tables: [first_table, end_table)
    int end_table = 0;
    std::string layers;  // what it holds, for the log ("layers 0..1")
  };
  using MakeStage = std::function<absl::StatusOr<Stage>(int stage)>;
  // `params`: the whole model's tables, which the stage's pulls land in
  // (borrowed).
  PipelineRunner(TrainerContext* ctx, std::vector<std::vector<float>>* params, MakeStage make);
  ~PipelineRunner();
  PipelineRunner(const PipelineRunner&) = delete;
  PipelineRunner& operator=(const PipelineRunner&) = delete;

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
  int micro_batches() const { return micro_batches_; }

 private:
  // The stage's tables at min_version into params_ (*version: the lowest
  // pulled), then its model's BeginStep; and its summed gradient pushed
  // for `version`.
  absl::Status PullStage(uint64_t min_version, uint64_t* version, absl::Duration* comm);
  absl::Status PushStage(uint64_t version, int n, absl::Duration* comm);
  // After a failed step: the stage goes (its held requests answered with
  // an error); the next Seat makes it anew, with a new connection.
  void DropStage();

  TrainerContext* const ctx_;
  std::vector<std::vector<float>>* const params_;
  const MakeStage make_;
  const int micro_batches_;
  std::optional<PipelineSeat> seat_;
  uint64_t seated_epoch_ = 0;             // the view epoch seat_ is of
  Stage made_;                            // the seat's
  std::shared_ptr<PipelineStage> stage_;  // shared with the worker's listener
  uint64_t next_op_ = 1;                  // the leader's next step attempt
};

}  // namespace strata::worker

#endif  // STRATA_WORKER_PIPELINE_RUNNER_H_
