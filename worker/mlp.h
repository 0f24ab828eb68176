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
  // TrainStep with hooks for overlapping communication: before_layer(i)
  // runs before layer i's forward (wait for its parameters), after_forward()
  // once the forward pass is done, after_backward(i) once layer i's
  // gradients are complete (send them). Any hook's error stops the step.
  struct Hooks {
    std::function<absl::Status(int layer)> before_layer;
    std::function<absl::Status()> after_forward;
    std::function<absl::Status(int layer)> after_backward;
  };
  absl::StatusOr<double> TrainStep(const float* x, const int32_t* y, int batch,
                                   const Hooks& hooks);
  int num_layers() const { return static_cast<int>(layers_.size()) - 1; }

  // Forward only: adds the summed loss to *loss_sum and the number of
  // correct predictions to *correct.
  void Evaluate(const float* x, const int32_t* y, int batch, double* loss_sum,
                int64_t* correct);

 private:
  absl::Status Forward(const float* x, int batch,
                       const std::function<absl::Status(int)>& before_layer);

  const std::vector<int> layers_;
  const Activation activation_;
  Device* const device_;
  std::vector<std::vector<float>> params_;
  std::vector<std::vector<float>> grads_;
  std::vector<std::vector<float>> acts_;  // per layer output, batch-sized
  std::vector<float> delta_, delta_prev_;
};

}  // namespace strata::worker

#endif  // STRATA_WORKER_MLP_H_
