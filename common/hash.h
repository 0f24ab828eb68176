// The 64-bit mixing every deterministic choice in Strata is built on:
// initial values, feature keys, key routing, the sparse index, the data
// generator. Results (checkpoints, placements, data sets) depend on these
// exact formulas: they never change.
#ifndef STRATA_COMMON_HASH_H_
#define STRATA_COMMON_HASH_H_

#include <cstdint>

namespace strata {

// The splitmix64 finalizer (Steele, Lea, Flood 2014): a bijection on 64 bits.
constexpr uint64_t Fmix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// splitmix64's output for the state x: Fmix64(x + the golden gamma).
constexpr uint64_t SplitMix64(uint64_t x) { return Fmix64(x + 0x9e3779b97f4a7c15ull); }

}  // namespace strata

#endif  // STRATA_COMMON_HASH_H_
