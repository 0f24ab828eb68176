#include "common/crc32c.h"

#include <random>
#include <string>

#include "gtest/gtest.h"

namespace strata {
namespace {

// Check values from RFC 3720 (iSCSI), appendix B.4, and the usual "123456789".
TEST(Crc32cTest, MatchesPublishedValues) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending(32, 0);
  for (int i = 0; i < 32; ++i) ascending[i] = static_cast<char>(i);
  EXPECT_EQ(Crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(Crc32c(""), 0u);
}

TEST(Crc32cTest, ExtendEqualsWholeAndPortableEqualsFast) {
  std::mt19937 rng(7);
  std::string data(1000, 0);
  for (char& c : data) c = static_cast<char>(rng());
  const uint32_t whole = Crc32c(data);
  for (size_t cut : {0, 1, 7, 8, 9, 500, 999, 1000}) {
    uint32_t c = Crc32cExtend(0, data.data(), cut);
    EXPECT_EQ(Crc32cExtend(c, data.data() + cut, data.size() - cut), whole) << cut;
  }
  for (size_t n : {0, 1, 3, 8, 15, 16, 17, 1000}) {
    EXPECT_EQ(Crc32cPortableForTesting(0, data.data(), n), Crc32cExtend(0, data.data(), n)) << n;
  }
}

TEST(Crc32cTest, DetectsAFlippedBit) {
  std::string data(4096, 'x');
  const uint32_t c = Crc32c(data);
  data[1234] ^= 0x10;
  EXPECT_NE(Crc32c(data), c);
}

}  // namespace
}  // namespace strata
