// Server-side optimizers. State lives beside the parameters of one partition.
// The math follows the common frameworks' definitions (PyTorch's SGD with
// momentum and Adam, L2 weight decay added to the gradient).
#ifndef STRATA_PSERVER_OPTIMIZER_H_
#define STRATA_PSERVER_OPTIMIZER_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/config.h"

namespace strata::pserver {

// Not thread-safe: a partition applies updates under its own lock.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update of params[0..n) with gradient grad[0..n) (already averaged
  // over the samples of the step). REQUIRES: n == the size given to Create.
  virtual void Apply(float* params, const float* grad, size_t n) = 0;
  virtual const char* name() const = 0;
  // Bytes of optimizer state per parameter.
  virtual size_t state_bytes_per_param() const = 0;

  // sgd | momentum | adam for `n` parameters. InvalidArgument for others.
  static absl::StatusOr<std::unique_ptr<Optimizer>> Create(
      const OptimizerSection& config, size_t n);
};

}  // namespace strata::pserver

#endif  // STRATA_PSERVER_OPTIMIZER_H_
