#include "worker/wide_deep.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/model_spec.h"
#include "glog/logging.h"

namespace strata::worker {

void DeduplicateKeys(const uint64_t* keys, size_t n,
                     absl::flat_hash_map<uint64_t, uint32_t>* index,
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
      device_(device) {
  CHECK_EQ(model.type, "wide_deep");
  for (const TableSpec& t : ModelTables(model)) {
    params_.emplace_back(t.num_elements(), 0.f);
    grads_.emplace_back(t.num_elements(), 0.f);
  }
  acts_.resize(layers_.size() - 1);
}

void WideDeep::Forward(const float* dense, const uint32_t* slot, int batch,
                       const float* wide_rows, const float* emb_rows) {
  const int width = layers_[0];
  const int emb_width = kCtrFields * dim_;
  // The deep part's input: the examples' embeddings, then their dense features.
  input_.resize(static_cast<size_t>(batch) * width);
  for (int b = 0; b < batch; ++b) {
    float* in = input_.data() + static_cast<size_t>(b) * width;
    for (int f = 0; f < kCtrFields; ++f) {
      std::memcpy(in + f * dim_, emb_rows + static_cast<size_t>(slot[b * kCtrFields + f]) * dim_,
                  sizeof(float) * dim_);
    }
    std::memcpy(in + emb_width, dense + static_cast<size_t>(b) * kCtrDenseFeatures,
                sizeof(float) * kCtrDenseFeatures);
  }
  const float* x = input_.data();
  const size_t n_layers = layers_.size() - 1;
  for (size_t i = 0; i < n_layers; ++i) {
    const int din = layers_[i], dout = layers_[i + 1];
    const int wt = kFirstDeepTable + static_cast<int>(2 * i);
    acts_[i].resize(static_cast<size_t>(batch) * dout);
    device_->Gemm(false, false, batch, dout, din, 1.f, x, params_[wt].data(), 0.f,
                  acts_[i].data());
    device_->AddBias(batch, dout, params_[wt + 1].data(), acts_[i].data());
    if (i + 1 < n_layers) {
      device_->ActivationForward(activation_, static_cast<int64_t>(batch) * dout,
                                 acts_[i].data());
    }
    x = acts_[i].data();
  }
  // The wide part, added to the deep part's single output.
  const float* v = params_[kWideDenseTable].data();
  logits_.resize(batch);
  for (int b = 0; b < batch; ++b) {
    double z = acts_.back()[b];
    for (int f = 0; f < kCtrFields; ++f) z += wide_rows[slot[b * kCtrFields + f]];
    const float* xd = dense + static_cast<size_t>(b) * kCtrDenseFeatures;
    for (int j = 0; j < kCtrDenseFeatures; ++j) z += v[j] * xd[j];
    logits_[b] = static_cast<float>(z);
  }
}

void WideDeep::Predict(const float* dense, const uint32_t* slot, int batch,
                       const float* wide_rows, const float* emb_rows, float* probs) {
  Forward(dense, slot, batch, wide_rows, emb_rows);
  for (int b = 0; b < batch; ++b) probs[b] = 1.f / (1.f + std::exp(-logits_[b]));
}

double WideDeep::TrainStep(const float* dense, const uint32_t* slot, const float* labels,
                           int batch, const float* wide_rows, const float* emb_rows,
                           size_t unique, std::vector<float>* wide_grad,
                           std::vector<float>* emb_grad) {
  Forward(dense, slot, batch, wide_rows, emb_rows);
  // Binary cross-entropy on the logit z: softplus(z) - y z, whose gradient
  // is sigmoid(z) - y.
  double loss = 0;
  delta_.resize(batch);
  for (int b = 0; b < batch; ++b) {
    const double z = logits_[b];
    const double softplus = z > 0 ? z + std::log1p(std::exp(-z)) : std::log1p(std::exp(z));
    loss += softplus - labels[b] * z;
    delta_[b] = static_cast<float>(1.0 / (1.0 + std::exp(-z)) - labels[b]);
  }
  // Wide part: each occurrence of a key adds its example's delta.
  wide_grad->assign(unique, 0.f);
  std::vector<float>& gv = grads_[kWideDenseTable];
  std::fill(gv.begin(), gv.end(), 0.f);
  for (int b = 0; b < batch; ++b) {
    for (int f = 0; f < kCtrFields; ++f) (*wide_grad)[slot[b * kCtrFields + f]] += delta_[b];
    const float* xd = dense + static_cast<size_t>(b) * kCtrDenseFeatures;
    for (int j = 0; j < kCtrDenseFeatures; ++j) gv[j] += delta_[b] * xd[j];
  }
  // Deep part, back to its input.
  for (size_t li = layers_.size() - 1; li-- > 0;) {
    const int din = layers_[li], dout = layers_[li + 1];
    const int wt = kFirstDeepTable + static_cast<int>(2 * li);
    const float* in = li == 0 ? input_.data() : acts_[li - 1].data();
    device_->ColumnSum(batch, dout, delta_.data(), grads_[wt + 1].data());
    device_->Gemm(true, false, din, dout, batch, 1.f, in, delta_.data(), 0.f,
                  grads_[wt].data());
    delta_prev_.resize(static_cast<size_t>(batch) * din);
    device_->Gemm(false, true, batch, din, dout, 1.f, delta_.data(), params_[wt].data(), 0.f,
                  delta_prev_.data());
    if (li > 0) {
      device_->ActivationBackward(activation_, static_cast<int64_t>(batch) * din,
                                  acts_[li - 1].data(), delta_prev_.data());
    }
    delta_.swap(delta_prev_);
  }
  // delta_ is now d loss / d input: scatter-add the embeddings' part into
  // the unique keys' rows.
  const int width = layers_[0];
  emb_grad->assign(unique * dim_, 0.f);
  for (int b = 0; b < batch; ++b) {
    const float* d = delta_.data() + static_cast<size_t>(b) * width;
    for (int f = 0; f < kCtrFields; ++f) {
      float* g = emb_grad->data() + static_cast<size_t>(slot[b * kCtrFields + f]) * dim_;
      for (int k = 0; k < dim_; ++k) g[k] += d[f * dim_ + k];
    }
  }
  return loss;
}

}  // namespace strata::worker
