// Per-row optimizers of sparse (embedding) tables: each row of `dim` floats
// carries its own optimizer state beside its values, and is updated only
// when a batch touches it ("lazy" updates: rows a batch does not touch keep
// their values and state unchanged).
//
// The math, per element w of a row with gradient g (already scaled by the
// caller's 1/samples and with weight_decay * w added, except for ftrl):
//   sgd      w -= lr * g
//   adagrad  a += g^2;  w -= lr * g / (sqrt(a) + eps)      (PyTorch Adagrad;
//            a starts at initial_accumulator)
//   adam     m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//            w -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps),
//            t = the row's own update count (1 on its first update)
//   ftrl     FTRL-Proximal (McMahan et al., "Ad Click Prediction: a View
//            from the Trenches", KDD 2013, Algorithm 1) with alpha = lr:
//            sigma = (sqrt(n + g^2) - sqrt(n)) / alpha;  z += g - sigma w;
//            n += g^2;  w = 0 if |z| <= l1, else
//            w = -(z - sign(z) l1) / ((beta + sqrt(n)) / alpha + l2)
#ifndef STRATA_COMMON_ROW_OPTIMIZER_H_
#define STRATA_COMMON_ROW_OPTIMIZER_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "common/config.h"

namespace strata {

// Immutable after Create: thread-safe (the state lives in the rows).
class RowOptimizer {
 public:
  virtual ~RowOptimizer() = default;
  virtual const char* name() const = 0;
  // Floats of state per element: sgd 0, adagrad 1, adam 2, ftrl 2.
  virtual int slots() const = 0;
  // The state of a new row: slots() * dim floats, slot-major (slot s of
  // element j at state[s * dim + j]).
  virtual void InitState(float* state, int dim) const = 0;
  // One update of the row w[0..dim) with the gradient grad_scale * g[0..dim);
  // `t` is the row's update count including this one (>= 1).
  virtual void Apply(float* w, float* state, const float* g, float grad_scale, int dim,
                     uint32_t t) const = 0;

  // InvalidArgument naming the type for anything but sgd, adagrad, adam,
  // ftrl (the section's values are validated by the config parser).
  static absl::StatusOr<std::unique_ptr<RowOptimizer>> Create(const RowOptimizerSection& config);
};

}  // namespace strata

#endif  // STRATA_COMMON_ROW_OPTIMIZER_H_
