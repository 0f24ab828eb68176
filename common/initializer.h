// Deterministic parameter initialisation (pservers; a worker training
// alone): the value of element i of table t
// depends only on (seed, t, i), so it does not matter which pserver holds
// which slice or when it was created.
#ifndef STRATA_COMMON_INITIALIZER_H_
#define STRATA_COMMON_INITIALIZER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace strata {

struct InitSpec {
  std::string init;  // "glorot_uniform" | "zeros"
  uint64_t fan_in = 0;
  uint64_t fan_out = 0;
  uint32_t table_id = 0;
  uint64_t seed = 0;
};

// Fills out[0..n) with elements [offset, offset + n) of the table.
// InvalidArgument for an unknown initializer.
absl::Status InitializeSlice(const InitSpec& spec, uint64_t offset, uint64_t n,
                             float* out);

}  // namespace strata

#endif  // STRATA_COMMON_INITIALIZER_H_
