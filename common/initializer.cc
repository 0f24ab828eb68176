#include "common/initializer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/hash.h"

namespace strata {
absl::Status InitializeSlice(const InitSpec& spec, uint64_t offset, uint64_t n, float* out) {
  // worker: a table declared by a training script, whose first worker
  // writes the initial values (docs/python.md); zeros until then.
  if (spec.init == "zeros" || spec.init == "worker") {
    for (uint64_t i = 0; i < n; ++i) out[i] = 0.f;
    return absl::OkStatus();
  }
  if (spec.init == "glorot_uniform" || spec.init == "torch_default") {
    // torch_default: what nn.Linear and nn.Conv*d give their weights and
    // biases, U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
    const double limit =
        spec.init == "torch_default"
            ? 1.0 / std::sqrt(static_cast<double>(std::max<uint64_t>(spec.fan_in, 1)))
            : std::sqrt(6.0 / static_cast<double>(spec.fan_in + spec.fan_out));
    const uint64_t base = SplitMix64(spec.seed ^ SplitMix64(spec.table_id + 1));
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t r = SplitMix64(base + offset + i);
      const double u = static_cast<double>(r >> 11) * 0x1.0p-53;  // [0, 1)
      out[i] = static_cast<float>((2.0 * u - 1.0) * limit);
    }
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown initializer '", spec.init, "'"));
}

absl::StatusOr<RowInitializer> RowInitializer::Create(const std::string& type, double scale,
                                                      uint32_t table_id, uint64_t seed) {
  Kind kind;
  if (type == "zeros") {
    kind = Kind::kZeros;
  } else if (type == "uniform") {
    kind = Kind::kUniform;
  } else if (type == "normal") {
    kind = Kind::kNormal;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown sparse initializer '", type,
                                                   "' (expected zeros, uniform or normal)"));
  }
  if (!(scale >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sparse initializer scale must be >= 0, got ", scale));
  }
  // A different stream from the dense tables' (InitializeSlice).
  return RowInitializer(kind, scale, SplitMix64(seed ^ SplitMix64(0x5a5a0000ull + table_id)));
}

void RowInitializer::Fill(uint64_t key, int dim, float* out) const {
  if (kind_ == Kind::kZeros) {
    for (int j = 0; j < dim; ++j) out[j] = 0.f;
    return;
  }
  const uint64_t row = SplitMix64(base_ ^ SplitMix64(key));
  auto unit = [row](uint64_t i) {  // uniform in [0, 1)
    return static_cast<double>(SplitMix64(row + i) >> 11) * 0x1.0p-53;
  };
  if (kind_ == Kind::kUniform) {
    for (int j = 0; j < dim; ++j) out[j] = static_cast<float>((2.0 * unit(j) - 1.0) * scale_);
    return;
  }
  // Box-Muller: two uniforms per element (the second of a pair is not kept,
  // so element j does not depend on dim).
  constexpr double kTwoPi = 6.283185307179586;
  for (int j = 0; j < dim; ++j) {
    const double u1 = 1.0 - unit(2 * static_cast<uint64_t>(j));  // (0, 1]
    const double u2 = unit(2 * static_cast<uint64_t>(j) + 1);
    out[j] = static_cast<float>(scale_ * std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2));
  }
}

}  // namespace strata
