#include "worker/wide_deep.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/model_spec.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace strata::worker {

void DeduplicateKeys(const uint64_t* keys, size_t n, absl::flat_hash_map<uint64_t, uint32_t>* index,
                     std::vector<uint64_t>* unique, std::vector<uint32_t>* slot) {
  index->clear();
  unique->clear();
  slot->resize(n);
  for (size_t i = 0; i < n; ++i) {
    auto [it, added] = index->try_emplace(keys[i], static_cast<uint32_t>(unique->size()));
    if (added) unique->push_back(keys[i]);
    (*slot)[i] = it->second;
  }
}

WideDeep::WideDeep(const ModelSection& model, Activation activation, Device* device)
    : dim_(model.embedding_dim),
      layers_(DeepLayers(model)),
      activation_(activation),
      device_(device),
      host_(device->host_memory()) {
  CHECK_EQ(model.type, "wide_deep");
  for (const TableSpec& t : ModelTables(model)) {
    params_.emplace_back(t.num_elements(), 0.f);
    grads_.emplace_back(t.num_elements(), 0.f);
  }
  for (size_t i = 0; i + 1 < layers_.size(); ++i) acts_.emplace_back(device_);
  for (DeviceArray<float>* a :
       {&d_dense_, &d_labels_, &d_wide_rows_, &d_emb_rows_, &emb_in_, &wide_in_, &ones_, &delta_,
        &delta_prev_, &d_wide_grad_, &d_emb_grad_, &d_probs_}) {
    *a = DeviceArray<float>(device_);
  }
  d_slot_ = DeviceArray<uint32_t>(device_);
  PinModelTensors(device_, &params_, &grads_);
}

WideDeep::~WideDeep() { UnpinModelTensors(device_, &params_, &grads_); }

template <typename T>
absl::Status WideDeep::ToDevice(const T* host, size_t n, DeviceArray<T>* a, const T** out) {
  if (host_) {
    *out = host;
    return absl::OkStatus();
  }
  STRATA_RETURN_IF_ERROR(a->Reserve(n));
  device_->ComputeAfter(device_->Upload(a->data(), host, n * sizeof(T)));
  *out = a->data();
  return absl::OkStatus();
}

absl::Status WideDeep::Forward(const float* dense, const uint32_t* slot, const float* labels,
                               int batch, const float* wide_rows, const float* emb_rows,
                               size_t unique) {
  const size_t b = static_cast<size_t>(batch);
  const int emb_width = kCtrFields * dim_;
  STRATA_RETURN_IF_ERROR(ToDevice(dense, b * kCtrDenseFeatures, &d_dense_, &dense_));
  STRATA_RETURN_IF_ERROR(ToDevice(slot, b * kCtrFields, &d_slot_, &slot_));
  if (labels != nullptr) STRATA_RETURN_IF_ERROR(ToDevice(labels, b, &d_labels_, &labels_));
  STRATA_RETURN_IF_ERROR(ToDevice(wide_rows, unique, &d_wide_rows_, &wide_rows_));
  STRATA_RETURN_IF_ERROR(ToDevice(emb_rows, unique * dim_, &d_emb_rows_, &emb_rows_));
  if (!host_) {
    STRATA_RETURN_IF_ERROR(ReserveModelArrays(device_, params_, grads_, &d_params_, &d_grads_));
    for (size_t t = 0; t < params_.size(); ++t) {
      if (params_[t].empty()) continue;  // a sparse table: rows come per batch
      device_->ComputeAfter(device_->Upload(d_params_[t].data(), params_[t].data(),
                                            params_[t].size() * sizeof(float)));
    }
  }
  if (ones_.capacity() == 0) {
    STRATA_RETURN_IF_ERROR(ones_.Reserve(kCtrFields));
    static const std::vector<float> kOnes(kCtrFields, 1.f);
    device_->ComputeAfter(device_->Upload(ones_.data(), kOnes.data(), kCtrFields * sizeof(float)));
  }
  STRATA_RETURN_IF_ERROR(emb_in_.Reserve(b * emb_width));
  STRATA_RETURN_IF_ERROR(wide_in_.Reserve(b * kCtrFields));
  // The deep part's input is [embeddings of the 26 fields, 13 dense
  // features]; its first product is taken in those two parts, so the input
  // is never put together.
  device_->GatherRows(batch, kCtrFields, dim_, emb_rows_, slot_, emb_in_.data(), emb_width);
  const size_t n_layers = layers_.size() - 1;
  for (size_t i = 0; i < n_layers; ++i) {
    const int din = layers_[i], dout = layers_[i + 1];
    const int wt = kFirstDeepTable + static_cast<int>(2 * i);
    STRATA_RETURN_IF_ERROR(acts_[i].Reserve(b * dout));
    float* out = acts_[i].data();
    if (i == 0) {
      device_->Gemm(false, false, batch, dout, emb_width, 1.f, emb_in_.data(), DParam(wt), 0.f,
                    out);
      device_->Gemm(false, false, batch, dout, kCtrDenseFeatures, 1.f, dense_,
                    DParam(wt) + static_cast<size_t>(emb_width) * dout, 1.f, out);
    } else {
      device_->Gemm(false, false, batch, dout, din, 1.f, acts_[i - 1].data(), DParam(wt), 0.f, out);
    }
    device_->AddBias(batch, dout, DParam(wt + 1), out);
    if (i + 1 < n_layers) {
      device_->ActivationForward(activation_, static_cast<int64_t>(batch) * dout, out);
    }
  }
  // The wide part, added to the deep part's single output: the fields'
  // weights summed (a product with ones) and v . dense.
  float* logits = acts_.back().data();
  device_->GatherRows(batch, kCtrFields, 1, wide_rows_, slot_, wide_in_.data(), kCtrFields);
  device_->Gemm(false, false, batch, 1, kCtrFields, 1.f, wide_in_.data(), ones_.data(), 1.f,
                logits);
  device_->Gemm(false, false, batch, 1, kCtrDenseFeatures, 1.f, dense_, DParam(kWideDenseTable),
                1.f, logits);
  return absl::OkStatus();
}

absl::Status WideDeep::Predict(const float* dense, const uint32_t* slot, int batch,
                               const float* wide_rows, const float* emb_rows, float* probs) {
  // Every key of the batch is among its rows: `unique` is only the extent
  // of the rows to copy, the largest slot + 1.
  size_t unique = 0;
  for (size_t i = 0; i < static_cast<size_t>(batch) * kCtrFields; ++i) {
    unique = std::max<size_t>(unique, slot[i] + 1);
  }
  STRATA_RETURN_IF_ERROR(Forward(dense, slot, nullptr, batch, wide_rows, emb_rows, unique));
  if (host_) {
    device_->Sigmoid(batch, acts_.back().data(), probs);
    return absl::OkStatus();
  }
  STRATA_RETURN_IF_ERROR(d_probs_.Reserve(batch));
  device_->Sigmoid(batch, acts_.back().data(), d_probs_.data());
  device_->Download(probs, d_probs_.data(), batch * sizeof(float));
  return device_->Synchronize();  // (and every fence of the batch forgotten)
}

absl::StatusOr<double> WideDeep::TrainStep(const float* dense, const uint32_t* slot,
                                           const float* labels, int batch, const float* wide_rows,
                                           const float* emb_rows, size_t unique,
                                           std::vector<float>* wide_grad,
                                           std::vector<float>* emb_grad) {
  STRATA_RETURN_IF_ERROR(Forward(dense, slot, labels, batch, wide_rows, emb_rows, unique));
  const size_t b = static_cast<size_t>(batch);
  const int emb_width = kCtrFields * dim_;
  const int widest = *std::max_element(layers_.begin(), layers_.end());
  STRATA_RETURN_IF_ERROR(delta_.Reserve(b * widest));
  STRATA_RETURN_IF_ERROR(delta_prev_.Reserve(b * widest));
  // Binary cross-entropy on the logit z: softplus(z) - y z, whose gradient
  // is sigmoid(z) - y.
  last_correct_ = 0;
  const double loss = device_->SigmoidCrossEntropy(batch, acts_.back().data(), labels_,
                                                   delta_.data(), &last_correct_);
  // Wide part: each occurrence of a key adds its example's delta (spread
  // over the fields by a product with ones, then scatter-added).
  wide_grad->assign(unique, 0.f);
  emb_grad->assign(unique * dim_, 0.f);
  float* wg = wide_grad->data();
  float* eg = emb_grad->data();
  if (!host_) {
    STRATA_RETURN_IF_ERROR(d_wide_grad_.Reserve(unique));
    STRATA_RETURN_IF_ERROR(d_emb_grad_.Reserve(unique * dim_));
    wg = d_wide_grad_.data();
    eg = d_emb_grad_.data();
    device_->Zero(wg, unique * sizeof(float));
    device_->Zero(eg, unique * dim_ * sizeof(float));
  }
  device_->Gemm(false, false, batch, kCtrFields, 1, 1.f, delta_.data(), ones_.data(), 0.f,
                wide_in_.data());
  device_->ScatterAddRows(batch, kCtrFields, 1, wide_in_.data(), kCtrFields, slot_, wg);
  device_->Gemm(true, false, kCtrDenseFeatures, 1, batch, 1.f, dense_, delta_.data(), 0.f,
                DGrad(kWideDenseTable));
  // Deep part, back to its input's embeddings.
  for (size_t li = layers_.size() - 1; li-- > 0;) {
    const int din = layers_[li], dout = layers_[li + 1];
    const int wt = kFirstDeepTable + static_cast<int>(2 * li);
    device_->ColumnSum(batch, dout, delta_.data(), DGrad(wt + 1));
    if (li == 0) {
      // The first weight's rows: the embeddings' part, then the dense one;
      // the input's gradient is wanted for the embeddings only.
      device_->Gemm(true, false, emb_width, dout, batch, 1.f, emb_in_.data(), delta_.data(), 0.f,
                    DGrad(wt));
      device_->Gemm(true, false, kCtrDenseFeatures, dout, batch, 1.f, dense_, delta_.data(), 0.f,
                    DGrad(wt) + static_cast<size_t>(emb_width) * dout);
      device_->Gemm(false, true, batch, emb_width, dout, 1.f, delta_.data(), DParam(wt), 0.f,
                    delta_prev_.data());
    } else {
      device_->Gemm(true, false, din, dout, batch, 1.f, acts_[li - 1].data(), delta_.data(), 0.f,
                    DGrad(wt));
      device_->Gemm(false, true, batch, din, dout, 1.f, delta_.data(), DParam(wt), 0.f,
                    delta_prev_.data());
      device_->ActivationBackward(activation_, static_cast<int64_t>(batch) * din,
                                  acts_[li - 1].data(), delta_prev_.data());
    }
    std::swap(delta_, delta_prev_);
  }
  // delta_ is now d loss / d (the embeddings' input): scatter-added into
  // the unique keys' rows.
  device_->ScatterAddRows(batch, kCtrFields, dim_, delta_.data(), emb_width, slot_, eg);
  if (!host_) {
    for (size_t t = 0; t < grads_.size(); ++t) {
      if (grads_[t].empty()) continue;
      device_->Download(grads_[t].data(), d_grads_[t].data(), grads_[t].size() * sizeof(float));
    }
    device_->Download(wide_grad->data(), wg, unique * sizeof(float));
    device_->Download(emb_grad->data(), eg, unique * dim_ * sizeof(float));
    STRATA_RETURN_IF_ERROR(device_->Synchronize());
  }
  return loss;
}

}  // namespace strata::worker
