// CRC-32C (Castagnoli), the checksum of every checkpoint block and manifest
// (docs/checkpoint-format.md), as in iSCSI, ext4 and leveldb. Uses the
// SSE4.2 crc32 instruction where the CPU has it, a table otherwise; both
// give the same values.
#ifndef STRATA_COMMON_CRC32C_H_
#define STRATA_COMMON_CRC32C_H_

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace strata {

// The CRC-32C of data[0..n) continuing from `crc`, the value of an earlier
// call over the bytes before (0 to start). Extend(Extend(0, a), b) equals
// the CRC of a followed by b. Thread-safe.
uint32_t Crc32cExtend(uint32_t crc, const char* data, size_t n);

// The table version, whatever the CPU (for tests comparing the two).
uint32_t Crc32cPortableForTesting(uint32_t crc, const char* data, size_t n);

inline uint32_t Crc32c(absl::string_view data) { return Crc32cExtend(0, data.data(), data.size()); }

}  // namespace strata

#endif  // STRATA_COMMON_CRC32C_H_
