// A Wide & Deep click-through-rate model (Cheng et al., 2016) over CTR
// examples of 13 dense and 26 categorical features (docs/sparse.md):
//   wide  = sum over fields f of w[key_f] + sum over j of v_j * x_j
//   deep  = MLP([e[key_0], ..., e[key_25], x_0..x_12]) -> 1
//   p     = sigmoid(wide + deep), trained with binary cross-entropy.
// w (dim 1) and e (dim embedding_dim) are the sparse tables "wide" and
// "embedding"; v and the MLP are dense tables, laid out as in
// common/model_spec.h (ModelTables for model.type wide_deep).
//
// A batch names its features by slots into its unique keys: slot[b * 26 + f]
// is the index, in the batch's unique keys, of example b's field-f key; the
// caller pulls the rows of those keys and gets the gradient of each unique
// key's row back, summed over its occurrences.
#ifndef STRATA_WORKER_WIDE_DEEP_H_
#define STRATA_WORKER_WIDE_DEEP_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/config.h"
#include "worker/device.h"

namespace strata::worker {

// The distinct keys of keys[0..n) in first-seen order (*unique) and, for
// each keys[i], its place among them (slot[i]): a batch's rows are pulled
// once per distinct key, and the gradients of a key's occurrences summed
// into one row. `index` is scratch space (reused across batches).
void DeduplicateKeys(const uint64_t* keys, size_t n, absl::flat_hash_map<uint64_t, uint32_t>* index,
                     std::vector<uint64_t>* unique, std::vector<uint32_t>* slot);

// Not thread-safe. The Device is borrowed and must outlive the model.
//
// Every step runs on the device's own operations (embedding gather and
// scatter-add, sigmoid cross-entropy, products), so the CPU runs the code a
// GPU does; on a GPU the batch, its rows and the dense parameters are
// copied there and the gradients back.
class WideDeep {
 public:
  static constexpr int kWideTable = 0;       // sparse, dim 1
  static constexpr int kEmbeddingTable = 1;  // sparse, dim embedding_dim
  static constexpr int kWideDenseTable = 2;  // dense, 13
  static constexpr int kFirstDeepTable = 3;  // deep.fc0.weight, deep.fc0.bias, ...

  // REQUIRES: model.type == "wide_deep" and a valid activation.
  WideDeep(const ModelSection& model, Activation activation, Device* device);
  ~WideDeep();

  // One tensor per table in ModelTables order; the sparse tables' are empty
  // (their rows come with each batch). Callers fill params() from a pull.
  std::vector<std::vector<float>>& params() { return params_; }
  const std::vector<std::vector<float>>& grads() const { return grads_; }
  int dim() const { return dim_; }

  // Forward and backward over `batch` examples: dense[b * 13 + j],
  // slot[b * 26 + f] < unique, labels 0/1; wide_rows[unique] and
  // emb_rows[unique * dim] the rows of the unique keys. Sets grads() (dense
  // tables) and *wide_grad / *emb_grad (per unique key, summed over the
  // batch) to d(sum of losses)/d(parameters). Returns the summed loss;
  // fails only when the device does.
  absl::StatusOr<double> TrainStep(const float* dense, const uint32_t* slot, const float* labels,
                                   int batch, const float* wide_rows, const float* emb_rows,
                                   size_t unique, std::vector<float>* wide_grad,
                                   std::vector<float>* emb_grad);
  // Forward only: probs[b] = the predicted click probability.
  // Examples of the last TrainStep predicted right (logit > 0 iff clicked).
  int64_t last_correct() const { return last_correct_; }
  absl::Status Predict(const float* dense, const uint32_t* slot, int batch, const float* wide_rows,
                       const float* emb_rows, float* probs);

 private:
  // The batch on the device (copied there on a GPU); then the forward pass:
  // acts_ per deep layer, the logits (wide + deep) in acts_.back().
  absl::Status Forward(const float* dense, const uint32_t* slot, const float* labels, int batch,
                       const float* wide_rows, const float* emb_rows, size_t unique);
  // A host array on the device: itself on the CPU, else copied into `a`.
  template <typename T>
  absl::Status ToDevice(const T* host, size_t n, DeviceArray<T>* a, const T** out);
  float* DParam(int t) { return host_ ? params_[t].data() : d_params_[t].data(); }
  float* DGrad(int t) { return host_ ? grads_[t].data() : d_grads_[t].data(); }

  const int dim_;
  const std::vector<int> layers_;  // deep widths: [26 * dim + 13, hidden..., 1]
  const Activation activation_;
  Device* const device_;
  const bool host_;
  std::vector<std::vector<float>> params_;
  std::vector<std::vector<float>> grads_;
  std::vector<DeviceArray<float>> d_params_, d_grads_;  // GPU only
  // The batch as the device reads it.
  const float* dense_ = nullptr;
  const uint32_t* slot_ = nullptr;
  const float* labels_ = nullptr;
  const float* wide_rows_ = nullptr;
  const float* emb_rows_ = nullptr;
  DeviceArray<float> d_dense_, d_labels_, d_wide_rows_, d_emb_rows_;
  DeviceArray<uint32_t> d_slot_;
  DeviceArray<float> emb_in_;   // batch x 26 * dim: the gathered embeddings
  DeviceArray<float> wide_in_;  // batch x 26: the gathered wide weights, then their deltas
  DeviceArray<float> ones_;     // 26 ones
  std::vector<DeviceArray<float>> acts_;  // per deep layer, batch x width
  DeviceArray<float> delta_, delta_prev_;
  DeviceArray<float> d_wide_grad_, d_emb_grad_, d_probs_;  // GPU only
  int64_t last_correct_ = 0;
};

}  // namespace strata::worker

#endif  // STRATA_WORKER_WIDE_DEEP_H_
