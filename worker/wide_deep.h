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
void DeduplicateKeys(const uint64_t* keys, size_t n,
                     absl::flat_hash_map<uint64_t, uint32_t>* index,
                     std::vector<uint64_t>* unique, std::vector<uint32_t>* slot);

// Not thread-safe. The Device is borrowed and must outlive the model.
class WideDeep {
 public:
  static constexpr int kWideTable = 0;       // sparse, dim 1
  static constexpr int kEmbeddingTable = 1;  // sparse, dim embedding_dim
  static constexpr int kWideDenseTable = 2;  // dense, 13
  static constexpr int kFirstDeepTable = 3;  // deep.fc0.weight, deep.fc0.bias, ...

  // REQUIRES: model.type == "wide_deep" and a valid activation.
  WideDeep(const ModelSection& model, Activation activation, Device* device);

  // One tensor per table in ModelTables order; the sparse tables' are empty
  // (their rows come with each batch). Callers fill params() from a pull.
  std::vector<std::vector<float>>& params() { return params_; }
  const std::vector<std::vector<float>>& grads() const { return grads_; }
  int dim() const { return dim_; }

  // Forward and backward over `batch` examples: dense[b * 13 + j],
  // slot[b * 26 + f] < unique, labels 0/1; wide_rows[unique] and
  // emb_rows[unique * dim] the rows of the unique keys. Sets grads() (dense
  // tables) and *wide_grad / *emb_grad (per unique key, summed over the
  // batch) to d(sum of losses)/d(parameters). Returns the summed loss.
  double TrainStep(const float* dense, const uint32_t* slot, const float* labels, int batch,
                   const float* wide_rows, const float* emb_rows, size_t unique,
                   std::vector<float>* wide_grad, std::vector<float>* emb_grad);
  // Forward only: probs[b] = the predicted click probability.
  void Predict(const float* dense, const uint32_t* slot, int batch, const float* wide_rows,
               const float* emb_rows, float* probs);

 private:
  // Fills input_, acts_ and logits_ (wide + deep) for the batch.
  void Forward(const float* dense, const uint32_t* slot, int batch, const float* wide_rows,
               const float* emb_rows);

  const int dim_;
  const std::vector<int> layers_;  // deep widths: [26 * dim + 13, hidden..., 1]
  const Activation activation_;
  Device* const device_;
  std::vector<std::vector<float>> params_;
  std::vector<std::vector<float>> grads_;
  std::vector<float> input_;               // batch x layers_[0]
  std::vector<std::vector<float>> acts_;   // per deep layer, batch x width
  std::vector<float> logits_;              // batch
  std::vector<float> delta_, delta_prev_;
};

}  // namespace strata::worker

#endif  // STRATA_WORKER_WIDE_DEEP_H_
