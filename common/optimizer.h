// Optimizers, run server-side by pserver partitions (state beside the
// parameters) and by a worker training alone (--local, the baseline of the
// benchmarks).
// The math follows the common frameworks' definitions (PyTorch's SGD with
// momentum and Adam, L2 weight decay added to the gradient).
#ifndef STRATA_COMMON_OPTIMIZER_H_
#define STRATA_COMMON_OPTIMIZER_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/config.h"

namespace strata {

// Not thread-safe: a partition applies updates under its own lock.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update of params[0..n) with the gradient grad_scale * grad[0..n)
  // (a partition passes its summed gradient and 1/samples, so no scaled
  // copy is made). Loops are vectorised (AVX2 where the CPU has it).
  // REQUIRES: n == the size given to Create; params and grad do not overlap.
  void Apply(float* params, const float* grad, float grad_scale, size_t n) {
    ApplyRange(0, params, grad, grad_scale, n, updates_ + 1);
  }
  // Apply with grad_scale 1.
  void Apply(float* params, const float* grad, size_t n) { Apply(params, grad, 1.f, n); }
  // One update of a part of the parameters: params[0..n) are the
  // parameters [offset, offset + n) of those given to Create, updated with
  // grad_scale * grad[0..n) as their `update`th update (1-based). A
  // partition that applies an update chunk by chunk, as its bytes arrive,
  // calls it once per chunk with the same `update`: in any order and at any
  // chunk size, the chunks of one update give bit for bit what Apply gives.
  // REQUIRES: offset + n <= the size given to Create; update >= 1.
  void ApplyRange(size_t offset, float* params, const float* grad, float grad_scale, size_t n,
                  uint64_t update) {
    updates_ = std::max(updates_, update);
    Update(offset, params, grad, grad_scale, n, update);
  }
  // The newest update applied (to any part), 0 before the first. Saved
  // and restored with the state only where the math uses it (Adam's bias
  // correction): a caller that numbers chunked updates keeps its own count.
  uint64_t updates() const { return updates_; }
  virtual const char* name() const = 0;
  // Bytes of optimizer state per parameter.
  virtual size_t state_bytes_per_param() const = 0;
  // The state carried between updates (momentum's velocity; Adam's step
  // count and moments), for checkpoints: RestoreState(SaveState()) makes
  // the next updates bit-identical to those of the saved optimizer.
  std::string SaveState() const;
  // The same as views of its parts, whose concatenation is SaveState():
  // for copying it once, straight into a buffer (a replica copy made under
  // a partition's lock). Valid until the next update.
  virtual std::vector<absl::string_view> StateViews() const = 0;
  // InvalidArgument when `state` is not a SaveState of this optimizer for
  // this many parameters.
  virtual absl::Status RestoreState(absl::string_view state) = 0;

  // sgd | momentum | adam for `n` parameters. InvalidArgument for others.
  static absl::StatusOr<std::unique_ptr<Optimizer>> Create(const OptimizerSection& config,
                                                           size_t n);

 protected:
  // The kernel of ApplyRange.
  virtual void Update(size_t offset, float* params, const float* grad, float grad_scale, size_t n,
                      uint64_t update) = 0;
  uint64_t updates_ = 0;
};

}  // namespace strata

#endif  // STRATA_COMMON_OPTIMIZER_H_
