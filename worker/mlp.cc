#include "worker/mlp.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace strata::worker {

namespace {

// A hook that is not set does nothing.
template <typename Fn, typename... Args>
absl::Status CallHook(const Fn& hook, Args... args) {
  return hook ? hook(args...) : absl::OkStatus();
}

}  // namespace

Mlp::Mlp(std::vector<int> layers, Activation activation, Device* device)
    : layers_(std::move(layers)),
      activation_(activation),
      device_(device),
      host_(device->host_memory()) {
  for (size_t i = 0; i + 1 < layers_.size(); ++i) {
    params_.emplace_back(static_cast<size_t>(layers_[i]) * layers_[i + 1], 0.f);
    params_.emplace_back(layers_[i + 1], 0.f);
    row_blocks_.push_back({0, layers_[i]});
  }
  for (const auto& p : params_) grads_.emplace_back(p.size(), 0.f);
  param_fence_.assign(params_.size(), 0);
  for (size_t i = 0; i + 1 < layers_.size(); ++i) acts_.emplace_back(device_);
  delta_ = DeviceArray<float>(device_);
  delta_prev_ = DeviceArray<float>(device_);
  for (InputSlot& in : inputs_) {
    in.x = DeviceArray<float>(device_);
    in.y = DeviceArray<int32_t>(device_);
  }
  // Pulls land in params_ and pushes leave from grads_: pinned, their
  // copies to and from the GPU run beside the compute.
  PinModelTensors(device_, &params_, &grads_);
}

Mlp::~Mlp() {
  if (host_) return;
  UnpinModelTensors(device_, &params_, &grads_);
  for (InputSlot& in : inputs_) {
    if (!in.stage_x.empty()) device_->UnpinHost(in.stage_x.data());
    if (!in.stage_y.empty()) device_->UnpinHost(in.stage_y.data());
  }
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

void Mlp::SetRecompute(int every) {
  recompute_every_ = every >= 2 ? every : 0;
  slots_.clear();
  for (int s = 0; s < recompute_every_; ++s) slots_.emplace_back(device_);
  // Layers no longer kept give their buffers back.
  for (size_t i = 0; i < acts_.size(); ++i) {
    if (!Kept(i)) acts_[i] = DeviceArray<float>(device_);
  }
  valid_segment_ = -1;
}

bool Mlp::Kept(size_t i) const {
  return recompute_every_ < 2 || (i + 1) % recompute_every_ == 0 || i + 2 == layers_.size();
}

float* Mlp::Act(size_t i) {
  return Kept(i) ? acts_[i].data() : slots_[i % recompute_every_].data();
}

Mlp::ActivationMemory Mlp::activation_memory() const {
  ActivationMemory m;
  for (size_t i = 0; i < acts_.size(); ++i) {
    if (Kept(i)) m.held += acts_[i].bytes();
    m.without_recompute += static_cast<uint64_t>(batch_) * layers_[i + 1] * sizeof(float);
  }
  for (const auto& s : slots_) m.held += s.bytes();
  return m;
}

absl::Status Mlp::Prepare(const float* x, const int32_t* y, int batch) {
  batch_ = batch;
  if (loss_pending_) {  // left by a step that stopped: not this step's
    (void)device_->TakePendingLoss(nullptr);
    loss_pending_ = false;
  }
  valid_segment_ = -1;
  const size_t n_layers = layers_.size() - 1;
  const size_t b = static_cast<size_t>(batch);
  for (size_t i = 0; i < n_layers; ++i) {
    DeviceArray<float>& a = Kept(i) ? acts_[i] : slots_[i % recompute_every_];
    STRATA_RETURN_IF_ERROR(a.Reserve(b * layers_[i + 1]));
  }
  const int widest = *std::max_element(layers_.begin(), layers_.end());
  STRATA_RETURN_IF_ERROR(delta_.Reserve(b * widest));
  STRATA_RETURN_IF_ERROR(delta_prev_.Reserve(b * widest));
  if (host_) {
    x_ = x;
    y_ = y;
    return absl::OkStatus();
  }
  // Gradients left by a step a hook's error stopped are settled first.
  // (A step that ended well ended synchronized; a prefetch's copy may be
  // on its way, and is not waited for.)
  if (!pending_grads_.empty()) {
    STRATA_RETURN_IF_ERROR(device_->Synchronize());
    pending_grads_.clear();
  }
  STRATA_RETURN_IF_ERROR(ReserveModelArrays(device_, params_, grads_, &d_params_, &d_grads_));
  // The batch: prefetched, or copied up now.
  int slot;
  if (!prefetched_.empty()) {
    slot = prefetched_.front();
    prefetched_.erase(prefetched_.begin());
    if (inputs_[slot].batch != batch) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a batch of ", batch, " examples after one of ", inputs_[slot].batch, " was prefetched"));
    }
  } else {
    slot = next_slot_;
    next_slot_ ^= 1;
    STRATA_RETURN_IF_ERROR(Stage(&inputs_[slot], x, y, batch));
  }
  device_->ComputeAfter(inputs_[slot].fx);
  device_->ComputeAfter(inputs_[slot].fy);
  x_ = inputs_[slot].x.data();
  y_ = inputs_[slot].y.data();
  return absl::OkStatus();
}

absl::Status Mlp::Stage(InputSlot* in, const float* x, const int32_t* y, int batch) {
  // Through pinned staging, so that the copy is asynchronous; the slot's
  // last copies out of it are done first. (Its device arrays are free: the
  // step that read them ended synchronized.)
  STRATA_RETURN_IF_ERROR(device_->Wait(in->fx));
  STRATA_RETURN_IF_ERROR(device_->Wait(in->fy));
  const size_t b = static_cast<size_t>(batch);
  const size_t nx = b * layers_[0];
  if (in->stage_x.size() < nx) {
    if (!in->stage_x.empty()) device_->UnpinHost(in->stage_x.data());
    if (!in->stage_y.empty()) device_->UnpinHost(in->stage_y.data());
    in->stage_x.assign(nx, 0.f);
    in->stage_y.assign(b, 0);
    (void)device_->PinHost(in->stage_x.data(), nx * sizeof(float));
    (void)device_->PinHost(in->stage_y.data(), b * sizeof(int32_t));
  }
  std::memcpy(in->stage_x.data(), x, nx * sizeof(float));
  if (y != nullptr) std::memcpy(in->stage_y.data(), y, b * sizeof(int32_t));
  STRATA_RETURN_IF_ERROR(in->x.Reserve(nx));
  STRATA_RETURN_IF_ERROR(in->y.Reserve(b));
  // (The step that takes the batch waits for these, not the compute issued
  // before it.)
  in->fx = device_->Upload(in->x.data(), in->stage_x.data(), nx * sizeof(float));
  in->fy = device_->Upload(in->y.data(), in->stage_y.data(), b * sizeof(int32_t));
  in->batch = batch;
  return absl::OkStatus();
}

absl::Status Mlp::Prefetch(const float* x, const int32_t* y, int batch) {
  if (host_) return absl::OkStatus();
  if (prefetched_.size() >= 2) {
    return absl::FailedPreconditionError("two batches are prefetched already");
  }
  const int slot = next_slot_;
  next_slot_ ^= 1;
  STRATA_RETURN_IF_ERROR(Stage(&inputs_[slot], x, y, batch));
  prefetched_.push_back(slot);
  return absl::OkStatus();
}

void Mlp::UploadParams(int t, uint64_t begin, uint64_t end) {
  const Device::Fence f = device_->Upload(d_params_[t].data() + begin, params_[t].data() + begin,
                                          (end - begin) * sizeof(float));
  device_->ComputeAfter(f);
  param_fence_[t] = f;
}

absl::Status Mlp::LayerForward(size_t i, const float* in, int batch, float* out,
                               const Hooks* hooks) {
  const int din = layers_[i], dout = layers_[i + 1];
  const int wt = static_cast<int>(2 * i);
  // out = in W, summed over the weight's row blocks as they become ready.
  const std::vector<int>& blocks = row_blocks_[i];
  for (size_t k = 0; k + 1 < blocks.size(); ++k) {
    const int r0 = blocks[k], r1 = blocks[k + 1];
    if (hooks != nullptr) {
      const uint64_t end = static_cast<uint64_t>(r1) * dout;
      STRATA_RETURN_IF_ERROR(CallHook(hooks->need_params, wt, end));
      if (!host_) UploadParams(wt, static_cast<uint64_t>(r0) * dout, end);
    }
    device_->GemmStrided(false, false, batch, dout, r1 - r0, 1.f, in + r0, din,
                         DParam(wt) + static_cast<size_t>(r0) * dout, dout, k == 0 ? 0.f : 1.f, out,
                         dout);
  }
  if (hooks != nullptr) {
    STRATA_RETURN_IF_ERROR(CallHook(hooks->need_params, wt + 1, static_cast<uint64_t>(dout)));
    if (!host_) UploadParams(wt + 1, 0, static_cast<uint64_t>(dout));
  }
  device_->AddBias(batch, dout, DParam(wt + 1), out);
  if (i + 2 < layers_.size() || activate_output_) {
    device_->ActivationForward(activation_, static_cast<int64_t>(batch) * dout, out);
  }
  return absl::OkStatus();
}

absl::Status Mlp::Forward(int batch, const Hooks& hooks) {
  const size_t n_layers = layers_.size() - 1;
  const float* in = x_;
  for (size_t i = 0; i < n_layers; ++i) {
    STRATA_RETURN_IF_ERROR(LayerForward(i, in, batch, Act(i), &hooks));
    in = Act(i);
    if (!Kept(i)) valid_segment_ = static_cast<int>(i) / recompute_every_;
  }
  return absl::OkStatus();
}

absl::Status Mlp::Recompute(size_t layer, int batch) {
  const size_t start = layer - layer % recompute_every_;
  const float* in = start == 0 ? x_ : Act(start - 1);  // a kept layer's
  for (size_t i = start; i <= layer; ++i) {
    STRATA_RETURN_IF_ERROR(LayerForward(i, in, batch, Act(i), nullptr));
    in = Act(i);
  }
  valid_segment_ = static_cast<int>(layer) / recompute_every_;
  return absl::OkStatus();
}

absl::Status Mlp::DownloadGrads(int t, uint64_t begin, uint64_t end, const Hooks& hooks) {
  if (host_) return CallHook(hooks.grads_ready, t, end);
  const Device::Fence f = device_->Download(grads_[t].data() + begin, d_grads_[t].data() + begin,
                                            (end - begin) * sizeof(float));
  pending_grads_.push_back({t, end, f});
  return Drain(/*wait=*/false, hooks);
}

absl::Status Mlp::Drain(bool wait, const Hooks& hooks) {
  size_t done = 0;
  absl::Status s;
  for (; done < pending_grads_.size(); ++done) {
    const PendingGrad& p = pending_grads_[done];
    if (!wait && !device_->Done(p.fence)) break;
    // (Done, or waited for: Wait then says whether the device is healthy,
    // so that a gradient is never announced after a failed kernel.)
    s = device_->Wait(p.fence);
    if (!s.ok()) break;
    s = CallHook(hooks.grads_ready, p.table, p.end);
    if (!s.ok()) {
      ++done;
      break;
    }
  }
  pending_grads_.erase(pending_grads_.begin(), pending_grads_.begin() + done);
  return s;
}

absl::Status Mlp::ReleaseParams(int t, const Hooks& hooks) {
  // The copy engine may read the host parameters until their upload is done.
  if (!host_) STRATA_RETURN_IF_ERROR(device_->Wait(param_fence_[t]));
  return CallHook(hooks.params_released, t);
}

absl::StatusOr<double> Mlp::TrainStep(const float* x, const int32_t* y, int batch) {
  return TrainStep(x, y, batch, Hooks());
}

absl::StatusOr<double> Mlp::TrainStep(const float* x, const int32_t* y, int batch,
                                      const Hooks& hooks) {
  return Step(x, y, batch, hooks, nullptr, nullptr, false);
}

absl::StatusOr<double> Mlp::StageStep(const float* x, const int32_t* y, int batch,
                                      const float* out_grad, float* in_grad, bool accumulate) {
  return Step(x, y, batch, Hooks(), out_grad, in_grad, accumulate);
}

absl::StatusOr<double> Mlp::Step(const float* x, const int32_t* y, int batch, const Hooks& hooks,
                                 const float* out_grad, float* in_grad, bool accumulate) {
  STRATA_RETURN_IF_ERROR(Prepare(x, y, batch));
  STRATA_RETURN_IF_ERROR(Forward(batch, hooks));
  STRATA_RETURN_IF_ERROR(CallHook(hooks.after_forward));
  const size_t n_layers = layers_.size() - 1;
  const int classes = layers_.back();
  if (out_grad != nullptr) {
    // A stage before the last: the next stage's gradient of this output,
    // through the output's activation.
    const size_t n = static_cast<size_t>(batch) * classes;
    device_->ComputeAfter(device_->Upload(delta_.data(), out_grad, n * sizeof(float)));
    device_->ActivationBackward(activation_, static_cast<int64_t>(n), Act(n_layers - 1),
                                delta_.data());
  } else {
    // The loss stays on the device until the step's end: nothing waits
    // for the forward pass before the backward one is queued.
    device_->SoftmaxCrossEntropyPending(batch, classes, Act(n_layers - 1), y_, delta_.data());
    loss_pending_ = true;
  }
  for (size_t li = n_layers; li-- > 0;) {
    const int din = layers_[li], dout = layers_[li + 1];
    const int wt = static_cast<int>(2 * li);
    if (li > 0 && !Kept(li - 1) && valid_segment_ != static_cast<int>(li - 1) / recompute_every_) {
      STRATA_RETURN_IF_ERROR(Recompute(li - 1, batch));
    }
    const float* in = li == 0 ? x_ : Act(li - 1);
    // db = colsum(delta); the bias is not read in the backward pass.
    // (Accumulating: the sum goes through delta_prev_, free until below.)
    if (accumulate) {
      device_->ColumnSum(batch, dout, delta_.data(), delta_prev_.data());
      device_->AddBias(1, dout, delta_prev_.data(), DGrad(wt + 1));
    } else {
      device_->ColumnSum(batch, dout, delta_.data(), DGrad(wt + 1));
    }
    STRATA_RETURN_IF_ERROR(DownloadGrads(wt + 1, 0, static_cast<uint64_t>(dout), hooks));
    STRATA_RETURN_IF_ERROR(ReleaseParams(wt + 1, hooks));
    // dW = in^T delta, block of rows by block of rows.
    const std::vector<int>& blocks = row_blocks_[li];
    for (size_t k = 0; k + 1 < blocks.size(); ++k) {
      const int r0 = blocks[k], r1 = blocks[k + 1];
      device_->GemmStrided(true, false, r1 - r0, dout, batch, 1.f, in + r0, din, delta_.data(),
                           dout, accumulate ? 1.f : 0.f, DGrad(wt) + static_cast<size_t>(r0) * dout,
                           dout);
      STRATA_RETURN_IF_ERROR(DownloadGrads(wt, static_cast<uint64_t>(r0) * dout,
                                           static_cast<uint64_t>(r1) * dout, hooks));
    }
    if (li == 0) {
      if (in_grad != nullptr) {
        // (A stage after the first: the previous stage's output gradient.)
        device_->Gemm(false, true, batch, din, dout, 1.f, delta_.data(), DParam(wt), 0.f,
                      delta_prev_.data());
        (void)device_->Download(in_grad, delta_prev_.data(),
                                static_cast<size_t>(batch) * din * sizeof(float));
      }
      STRATA_RETURN_IF_ERROR(ReleaseParams(wt, hooks));
      break;
    }
    // delta_prev = delta W^T (the last read of W), then through the
    // activation of layer li-1.
    device_->Gemm(false, true, batch, din, dout, 1.f, delta_.data(), DParam(wt), 0.f,
                  delta_prev_.data());
    STRATA_RETURN_IF_ERROR(ReleaseParams(wt, hooks));
    device_->ActivationBackward(activation_, static_cast<int64_t>(batch) * din, Act(li - 1),
                                delta_prev_.data());
    std::swap(delta_, delta_prev_);
  }
  STRATA_RETURN_IF_ERROR(Drain(/*wait=*/true, hooks));
  last_correct_ = 0;
  double loss = 0;
  if (loss_pending_) loss = device_->TakePendingLoss(&last_correct_);
  loss_pending_ = false;
  // (Also the wait for in_grad's copy.)
  if (!host_) STRATA_RETURN_IF_ERROR(device_->Synchronize());
  return loss;
}

absl::StatusOr<const float*> Mlp::ForwardOnly(const float* x, const int32_t* y, int batch) {
  DropPrefetched();  // (a step after it copies its own batch up)
  STRATA_RETURN_IF_ERROR(Prepare(x, y, batch));
  if (!host_) {
    // The parameters as they are in params() now.
    for (size_t t = 0; t < params_.size(); ++t)
      UploadParams(static_cast<int>(t), 0, params_[t].size());
  }
  const size_t n_layers = layers_.size() - 1;
  const float* in = x_;
  for (size_t i = 0; i < n_layers; ++i) {
    STRATA_RETURN_IF_ERROR(LayerForward(i, in, batch, Act(i), nullptr));
    in = Act(i);
  }
  return in;
}

absl::Status Mlp::ForwardOutput(const float* x, int batch, float* out) {
  STRATA_ASSIGN_OR_RETURN(const float* output, ForwardOnly(x, nullptr, batch));
  (void)device_->Download(out, output, static_cast<size_t>(batch) * layers_.back() * sizeof(float));
  return device_->Synchronize();
}

absl::Status Mlp::Evaluate(const float* x, const int32_t* y, int batch, double* loss_sum,
                           int64_t* correct) {
  STRATA_ASSIGN_OR_RETURN(const float* logits, ForwardOnly(x, y, batch));
  *loss_sum += device_->SoftmaxCrossEntropy(batch, layers_.back(), logits, y_, nullptr, correct);
  return device_->Synchronize();
}

}  // namespace strata::worker
