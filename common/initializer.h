// Deterministic parameter initialisation (pservers; a worker training
// alone): the value of element i of table t
// depends only on (seed, t, i), so it does not matter which pserver holds
// which slice or when it was created.
#ifndef STRATA_COMMON_INITIALIZER_H_
#define STRATA_COMMON_INITIALIZER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata {

struct InitSpec {
  std::string init;  // "glorot_uniform" | "torch_default" | "zeros" | "worker" (zeros:
                     // the script's first worker writes the values)
  uint64_t fan_in = 0;
  uint64_t fan_out = 0;
  uint32_t table_id = 0;
  uint64_t seed = 0;
};

// Fills out[0..n) with elements [offset, offset + n) of the table.
// InvalidArgument for an unknown initializer.
absl::Status InitializeSlice(const InitSpec& spec, uint64_t offset, uint64_t n, float* out);

// The initial values of a sparse table's rows: element j of the row of `key`
// depends only on (seed, table_id, key, j), so a row is the same whichever
// pserver creates it and whenever it is created (or created again after an
// eviction). Immutable: thread-safe.
class RowInitializer {
 public:
  enum class Kind { kZeros, kUniform, kNormal };
  // `type`: zeros | uniform (in [-scale, scale)) | normal (mean 0, stddev
  // scale). InvalidArgument naming the type otherwise.
  static absl::StatusOr<RowInitializer> Create(const std::string& type, double scale,
                                               uint32_t table_id, uint64_t seed);
  // out[0..dim) = the initial row of `key`.
  void Fill(uint64_t key, int dim, float* out) const;
  Kind kind() const { return kind_; }

 private:
  RowInitializer(Kind kind, double scale, uint64_t base)
      : kind_(kind), scale_(scale), base_(base) {}
  Kind kind_;
  double scale_;
  uint64_t base_;  // mixes seed and table id
};

}  // namespace strata

#endif  // STRATA_COMMON_INITIALIZER_H_
