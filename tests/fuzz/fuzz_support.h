// What the fuzz targets of tests/fuzz share. Header only: each target is one
// .cc file plus this.
#ifndef STRATA_TESTS_FUZZ_FUZZ_SUPPORT_H_
#define STRATA_TESTS_FUZZ_FUZZ_SUPPORT_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "glog/logging.h"

namespace strata::fuzz {

// Keeps the parsers' warnings (a skipped bad line, a refused record) off
// stderr: at a million inputs they would cost more than the parsing.
// LOG(FATAL) still prints and aborts. Call from LLVMFuzzerInitialize.
inline void QuietLogs() { FLAGS_minloglevel = google::GLOG_FATAL; }

inline std::string AsString(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

// FNV-1a of the input: a deterministic source of the choices a target
// makes beside the bytes themselves (a byte range, an option), so that
// every input replays the same way.
inline uint64_t InputHash(const uint8_t* data, size_t size) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < size; ++i) {
    h ^= data[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace strata::fuzz

#endif  // STRATA_TESTS_FUZZ_FUZZ_SUPPORT_H_
