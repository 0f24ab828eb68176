#include "common/initializer.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace strata {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

absl::Status InitializeSlice(const InitSpec& spec, uint64_t offset, uint64_t n,
                             float* out) {
  if (spec.init == "zeros") {
    for (uint64_t i = 0; i < n; ++i) out[i] = 0.f;
    return absl::OkStatus();
  }
  if (spec.init == "glorot_uniform") {
    const double limit =
        std::sqrt(6.0 / static_cast<double>(spec.fan_in + spec.fan_out));
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

}  // namespace strata
