#include "worker/mlp.h"

#include <algorithm>

#include "common/status_macros.h"

namespace strata::worker {

namespace {

// A hook that is not set does nothing.
template <typename Fn, typename... Args>
absl::Status CallHook(const Fn& hook, Args... args) {
  return hook ? hook(args...) : absl::OkStatus();
}

}  // namespace

Mlp::Mlp(std::vector<int> layers, Activation activation, Device* device)
    : layers_(std::move(layers)), activation_(activation), device_(device) {
  for (size_t i = 0; i + 1 < layers_.size(); ++i) {
    params_.emplace_back(static_cast<size_t>(layers_[i]) * layers_[i + 1], 0.f);
    params_.emplace_back(layers_[i + 1], 0.f);
    row_blocks_.push_back({0, layers_[i]});
  }
  for (const auto& p : params_) grads_.emplace_back(p.size(), 0.f);
  acts_.resize(layers_.size() - 1);
}

void Mlp::SetPartitionStarts(int table, const std::vector<uint64_t>& starts) {
  if (table < 0 || table % 2 != 0 || table / 2 >= num_layers()) return;
  const int layer = table / 2;
  const int rows = layers_[layer];
  const uint64_t cols = static_cast<uint64_t>(layers_[layer + 1]);
  std::vector<int> cuts;
  for (uint64_t s : starts) {
    const uint64_t r = s / cols;  // a partition starting mid-row: its row's block
    if (r > 0 && r < static_cast<uint64_t>(rows)) cuts.push_back(static_cast<int>(r));
  }
  std::sort(cuts.begin(), cuts.end());
  const int min_rows = (rows + kMaxRowBlocks - 1) / kMaxRowBlocks;
  std::vector<int> blocks = {0};
  for (int c : cuts) {
    if (c - blocks.back() >= min_rows && rows - c >= 1) blocks.push_back(c);
  }
  blocks.push_back(rows);
  row_blocks_[layer] = std::move(blocks);
}

absl::Status Mlp::Forward(const float* x, int batch, const Hooks& hooks) {
  const size_t n_layers = layers_.size() - 1;
  const float* in = x;
  for (size_t i = 0; i < n_layers; ++i) {
    const int din = layers_[i], dout = layers_[i + 1];
    const int wt = static_cast<int>(2 * i);
    acts_[i].resize(static_cast<size_t>(batch) * dout);
    float* out = acts_[i].data();
    // out = x W, summed over the weight's row blocks as they become ready.
    const std::vector<int>& blocks = row_blocks_[i];
    for (size_t k = 0; k + 1 < blocks.size(); ++k) {
      const int r0 = blocks[k], r1 = blocks[k + 1];
      STRATA_RETURN_IF_ERROR(CallHook(hooks.need_params, wt, static_cast<uint64_t>(r1) * dout));
      device_->GemmStrided(false, false, batch, dout, r1 - r0, 1.f, in + r0, din,
                           params_[wt].data() + static_cast<size_t>(r0) * dout, dout,
                           k == 0 ? 0.f : 1.f, out, dout);
    }
    STRATA_RETURN_IF_ERROR(CallHook(hooks.need_params, wt + 1, static_cast<uint64_t>(dout)));
    device_->AddBias(batch, dout, params_[wt + 1].data(), out);
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
  STRATA_RETURN_IF_ERROR(Forward(x, batch, hooks));
  STRATA_RETURN_IF_ERROR(CallHook(hooks.after_forward));
  const size_t n_layers = layers_.size() - 1;
  const int classes = layers_.back();
  delta_.resize(static_cast<size_t>(batch) * classes);
  const double loss = device_->SoftmaxCrossEntropy(
      batch, classes, acts_.back().data(), y, delta_.data(), nullptr);
  for (size_t li = n_layers; li-- > 0;) {
    const int din = layers_[li], dout = layers_[li + 1];
    const int wt = static_cast<int>(2 * li);
    const float* in = li == 0 ? x : acts_[li - 1].data();
    // db = colsum(delta); the bias is not read in the backward pass.
    device_->ColumnSum(batch, dout, delta_.data(), grads_[wt + 1].data());
    STRATA_RETURN_IF_ERROR(CallHook(hooks.grads_ready, wt + 1, static_cast<uint64_t>(dout)));
    STRATA_RETURN_IF_ERROR(CallHook(hooks.params_released, wt + 1));
    // dW = in^T delta, block of rows by block of rows.
    const std::vector<int>& blocks = row_blocks_[li];
    for (size_t k = 0; k + 1 < blocks.size(); ++k) {
      const int r0 = blocks[k], r1 = blocks[k + 1];
      device_->GemmStrided(true, false, r1 - r0, dout, batch, 1.f, in + r0, din,
                           delta_.data(), dout, 0.f,
                           grads_[wt].data() + static_cast<size_t>(r0) * dout, dout);
      STRATA_RETURN_IF_ERROR(CallHook(hooks.grads_ready, wt, static_cast<uint64_t>(r1) * dout));
    }
    if (li == 0) {
      STRATA_RETURN_IF_ERROR(CallHook(hooks.params_released, wt));
      break;
    }
    // delta_prev = delta W^T (the last read of W), then through the
    // activation of layer li-1.
    delta_prev_.resize(static_cast<size_t>(batch) * din);
    device_->Gemm(false, true, batch, din, dout, 1.f, delta_.data(),
                  params_[wt].data(), 0.f, delta_prev_.data());
    STRATA_RETURN_IF_ERROR(CallHook(hooks.params_released, wt));
    device_->ActivationBackward(activation_, static_cast<int64_t>(batch) * din,
                                acts_[li - 1].data(), delta_prev_.data());
    delta_.swap(delta_prev_);
  }
  return loss;
}

void Mlp::Evaluate(const float* x, const int32_t* y, int batch, double* loss_sum,
                   int64_t* correct) {
  (void)Forward(x, batch, Hooks());  // no hook: cannot fail
  *loss_sum += device_->SoftmaxCrossEntropy(batch, layers_.back(),
                                            acts_.back().data(), y, nullptr, correct);
}

}  // namespace strata::worker
