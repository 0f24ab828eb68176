#include "common/huge_pages.h"

#include <string>

#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(HugePagesTest, ResizeLargeStringGivesZeroedBytesOfAnySize) {
  for (size_t n : {size_t{0}, size_t{5}, size_t{8} << 20, (size_t{20} << 20) + 3}) {
    std::string s = "old contents";
    ResizeLargeString(&s, n);
    ASSERT_EQ(s.size(), n);
    EXPECT_EQ(s.find_first_not_of('\0'), std::string::npos) << n;
  }
}

TEST(HugePagesTest, AdviceOnRangesWithoutAWholeHugePageDoesNothing) {
  std::string small(4096, 'x');
  AdviseHugePages(small.data(), small.size());
  AdviseHugePages(small.data() + 1, 0);
  EXPECT_EQ(small, std::string(4096, 'x'));
}

}  // namespace
}  // namespace strata
