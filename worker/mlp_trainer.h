// The MLP family's trainer: a multilayer perceptron on labeled image data
// (Fashion-MNIST's idx files), its steps pipelined with the pservers
// (docs/performance.md).
#ifndef STRATA_WORKER_MLP_TRAINER_H_
#define STRATA_WORKER_MLP_TRAINER_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "storage/idx_reader.h"
#include "worker/device.h"
#include "worker/mlp.h"
#include "worker/pipeline_runner.h"
#include "worker/trainer.h"

namespace strata::worker {

// Owns the model and the training set. Training thread only.
class MlpTrainer : public Trainer {
 public:
  // Loads the training set named by ctx's config. Errors name the data
  // file. `ctx` and `device` are borrowed: both outlive the trainer (the
  // Worker owns them).
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(TrainerContext* ctx, Device* device);
  MlpTrainer(const MlpTrainer&) = delete;
  MlpTrainer& operator=(const MlpTrainer&) = delete;

  std::string_view family() const override { return "mlp"; }
  bool AggregatesOnHost(SparseLayout*) const override { return true; }
  std::string DescribeData() const override;
  int64_t loaded_examples() const override { return train_.num_examples; }
  std::vector<std::vector<float>>& params() override { return model_->params(); }
  const std::vector<std::vector<float>>& grads() const override { return model_->grads(); }
  absl::StatusOr<int64_t> TrainTask(const proto::DataTask& task,
                                    std::vector<std::unique_ptr<Optimizer>>* local) override;
  absl::StatusOr<EvalMetrics> Evaluate(std::optional<uint64_t> min_version) override;
  bool pipelined() const override { return pipeline_ != nullptr; }
  absl::Status Follow(absl::Duration idle) override;

 private:
  MlpTrainer(TrainerContext* ctx, Device* device, storage::LabeledDataset train);
  // One step with node-local aggregation: parameters from the host's
  // segment, the gradient posted there (the same outputs as below).
  absl::StatusOr<double> AggregatedStep(const float* x, const int32_t* y, int n, uint64_t* version,
                                        absl::Duration* comm);
  // One step with model.dense_sync allreduce: compute, then the ring's
  // step (dense_ring.h), whose parameters come back into the model.
  absl::StatusOr<double> AllreduceStep(const float* x, const int32_t* y, int n, uint64_t* version,
                                       absl::Duration* comm);
  // One step on a batch of `n` against the pservers: pull, compute, push,
  // the communication overlapping the computation. Sets *version to the
  // step's version and adds the time spent waiting to *comm.
  absl::StatusOr<double> PipelinedStep(const float* x, const int32_t* y, int n, absl::Time t0,
                                       uint64_t* version, absl::Duration* comm);
  // With activation recomputation, logs once what it saves.
  void LogActivationMemoryOnce();
  // Test-set accuracy and mean loss of the model's current parameters.
  absl::StatusOr<std::pair<double, double>> TestAccuracy();

  TrainerContext* const ctx_;  // the Worker, which owns this trainer
  storage::LabeledDataset train_;
  std::unique_ptr<Mlp> model_;
  // model.stages > 1: this worker's stage (pipeline_runner.h), an
  // MlpStage of its layers; model_ then holds the pulled tables and
  // evaluates.
  std::unique_ptr<PipelineRunner> pipeline_;
  bool activation_memory_logged_ = false;
  // Allreduce: the model's row blocks are cut where the ring's buckets are.
  bool blocks_cut_ = false;
};

}  // namespace strata::worker

#endif  // STRATA_WORKER_MLP_TRAINER_H_
