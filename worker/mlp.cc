#include "worker/mlp.h"

#include <algorithm>

namespace strata::worker {

Mlp::Mlp(std::vector<int> layers, Activation activation, Device* device)
    : layers_(std::move(layers)), activation_(activation), device_(device) {
  for (size_t i = 0; i + 1 < layers_.size(); ++i) {
    params_.emplace_back(static_cast<size_t>(layers_[i]) * layers_[i + 1], 0.f);
    params_.emplace_back(layers_[i + 1], 0.f);
  }
  for (const auto& p : params_) grads_.emplace_back(p.size(), 0.f);
  acts_.resize(layers_.size() - 1);
}

absl::Status Mlp::Forward(const float* x, int batch,
                          const std::function<absl::Status(int)>& before_layer) {
  const size_t n_layers = layers_.size() - 1;
  const float* in = x;
  for (size_t i = 0; i < n_layers; ++i) {
    if (before_layer) {
      absl::Status s = before_layer(static_cast<int>(i));
      if (!s.ok()) return s;
    }
    const int din = layers_[i], dout = layers_[i + 1];
    acts_[i].resize(static_cast<size_t>(batch) * dout);
    float* out = acts_[i].data();
    device_->Gemm(false, false, batch, dout, din, 1.f, in, params_[2 * i].data(), 0.f, out);
    device_->AddBias(batch, dout, params_[2 * i + 1].data(), out);
    if (i + 1 < n_layers) {
      device_->ActivationForward(activation_, static_cast<int64_t>(batch) * dout, out);
    }
    in = out;
  }
  return absl::OkStatus();
}

double Mlp::TrainStep(const float* x, const int32_t* y, int batch) {
  return *TrainStep(x, y, batch, Hooks());  // no hooks: cannot fail
}

absl::StatusOr<double> Mlp::TrainStep(const float* x, const int32_t* y, int batch,
                                      const Hooks& hooks) {
  absl::Status s = Forward(x, batch, hooks.before_layer);
  if (!s.ok()) return s;
  if (hooks.after_forward) {
    s = hooks.after_forward();
    if (!s.ok()) return s;
  }
  const size_t n_layers = layers_.size() - 1;
  const int classes = layers_.back();
  delta_.resize(static_cast<size_t>(batch) * classes);
  const double loss = device_->SoftmaxCrossEntropy(
      batch, classes, acts_.back().data(), y, delta_.data(), nullptr);
  for (size_t li = n_layers; li-- > 0;) {
    const int din = layers_[li], dout = layers_[li + 1];
    const float* in = li == 0 ? x : acts_[li - 1].data();
    // dW = in^T delta ; db = colsum(delta)
    device_->Gemm(true, false, din, dout, batch, 1.f, in, delta_.data(), 0.f,
                  grads_[2 * li].data());
    device_->ColumnSum(batch, dout, delta_.data(), grads_[2 * li + 1].data());
    if (hooks.after_backward) {
      s = hooks.after_backward(static_cast<int>(li));
      if (!s.ok()) return s;
    }
    if (li == 0) break;
    // delta_prev = delta W^T, then through the activation of layer li-1.
    delta_prev_.resize(static_cast<size_t>(batch) * din);
    device_->Gemm(false, true, batch, din, dout, 1.f, delta_.data(),
                  params_[2 * li].data(), 0.f, delta_prev_.data());
    device_->ActivationBackward(activation_, static_cast<int64_t>(batch) * din,
                                acts_[li - 1].data(), delta_prev_.data());
    delta_.swap(delta_prev_);
  }
  return loss;
}

void Mlp::Evaluate(const float* x, const int32_t* y, int batch, double* loss_sum,
                   int64_t* correct) {
  (void)Forward(x, batch, nullptr);  // no hook: cannot fail
  *loss_sum += device_->SoftmaxCrossEntropy(batch, layers_.back(),
                                            acts_.back().data(), y, nullptr, correct);
}

}  // namespace strata::worker
