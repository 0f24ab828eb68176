// A multi-layer perceptron trained with softmax cross-entropy. Parameters are
// laid out exactly as the tables of common/model_spec.h: for layer i,
// weight {in, out} (row-major, y = x W + b) then bias {out}.
#ifndef STRATA_WORKER_MLP_H_
#define STRATA_WORKER_MLP_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"

#include "worker/device.h"

namespace strata::worker {

// Not thread-safe. The Device is borrowed and must outlive the Mlp.
class Mlp {
 public:
  Mlp(std::vector<int> layers, Activation activation, Device* device);

  // One tensor per table, in ModelTables() order. Callers fill params()
  // (from a pull) before TrainStep/Evaluate.
  std::vector<std::vector<float>>& params() { return params_; }
  const std::vector<std::vector<float>>& grads() const { return grads_; }

  // Forward and backward on x[batch x layers[0]] with labels y[batch].
  // grads() becomes d(sum of per-example losses)/d params. Returns the
  // summed loss.
  double TrainStep(const float* x, const int32_t* y, int batch);
  // TrainStep with hooks for overlapping communication, in terms of
  // parameter tables and element prefixes (a weight table is computed in
  // blocks of rows, see SetPartitionStarts):
  //   need_params(t, end)   forward: elements [0, end) of table t are read
  //                         next (wait for them);
  //   after_forward()       the forward pass is done;
  //   grads_ready(t, end)   backward: gradient elements [0, end) of table t
  //                         are final (send them);
  //   params_released(t)    backward: table t's parameters are not read
  //                         again in this step (the next step's may land).
  // For each table, `end` only grows. Any hook's error stops the step.
  struct Hooks {
    std::function<absl::Status(int table, uint64_t end)> need_params;
    std::function<absl::Status()> after_forward;
    std::function<absl::Status(int table, uint64_t end)> grads_ready;
    std::function<absl::Status(int table)> params_released;
  };
  absl::StatusOr<double> TrainStep(const float* x, const int32_t* y, int batch,
                                   const Hooks& hooks);

  // Where the partitions of parameter table t begin (element offsets). A
  // weight table's forward and backward are then computed in blocks of rows
  // cut at those partitions (at most kMaxRowBlocks per layer), so a block
  // can start as soon as its parameters arrive and its gradient can be sent
  // while the next block computes. Bias tables are never cut.
  static constexpr int kMaxRowBlocks = 8;
  void SetPartitionStarts(int table, const std::vector<uint64_t>& starts);
  // Row boundaries of layer i's weight blocks: {0, ..., layers[i]}.
  const std::vector<int>& row_blocks(int layer) const { return row_blocks_[layer]; }
  int num_layers() const { return static_cast<int>(layers_.size()) - 1; }

  // Forward only: adds the summed loss to *loss_sum and the number of
  // correct predictions to *correct.
  void Evaluate(const float* x, const int32_t* y, int batch, double* loss_sum,
                int64_t* correct);

 private:
  absl::Status Forward(const float* x, int batch, const Hooks& hooks);

  const std::vector<int> layers_;
  const Activation activation_;
  Device* const device_;
  std::vector<std::vector<float>> params_;
  std::vector<std::vector<float>> grads_;
  std::vector<std::vector<float>> acts_;  // per layer output, batch-sized
  std::vector<std::vector<int>> row_blocks_;  // per layer
  std::vector<float> delta_, delta_prev_;
};

}  // namespace strata::worker

#endif  // STRATA_WORKER_MLP_H_
