// Gzip (RFC 1952) of a string, for tests of readers that take gzipped input.
// Link zlib (ZLIB::ZLIB; strata::storage brings it).
#ifndef STRATA_TESTS_TESTING_GZIP_H_
#define STRATA_TESTS_TESTING_GZIP_H_

#include <zlib.h>

#include <cstring>
#include <string>

#include "gtest/gtest.h"

namespace strata::testing {

// zlib's deflate with the gzip wrapper, at the best compression.
inline std::string Gzip(const std::string& raw) {
  z_stream zs;
  std::memset(&zs, 0, sizeof(zs));
  EXPECT_EQ(
      deflateInit2(&zs, Z_BEST_COMPRESSION, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY),
      Z_OK);
  std::string out(deflateBound(&zs, raw.size()) + 64, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(raw.data()));
  zs.avail_in = static_cast<uInt>(raw.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_GZIP_H_
