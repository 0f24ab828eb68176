#include "common/model_spec.h"

#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(ModelSpecTest, MlpHasWeightAndBiasPerLayerInOrder) {
  ModelSection m;
  m.layers = {784, 256, 10};
  const std::vector<TableSpec> t = ModelTables(m);
  ASSERT_EQ(t.size(), 4u);
  EXPECT_EQ(t[0].name, "fc0.weight");
  EXPECT_EQ(t[0].shape, (std::vector<uint64_t>{784, 256}));
  EXPECT_EQ(t[0].num_elements(), 784u * 256u);
  EXPECT_EQ(t[0].init, "glorot_uniform");
  EXPECT_EQ(t[0].fan_in, 784u);
  EXPECT_EQ(t[0].fan_out, 256u);
  EXPECT_EQ(t[1].name, "fc0.bias");
  EXPECT_EQ(t[1].shape, (std::vector<uint64_t>{256}));
  EXPECT_EQ(t[1].init, "zeros");
  EXPECT_EQ(t[2].name, "fc1.weight");
  EXPECT_EQ(t[2].num_elements(), 2560u);
  EXPECT_EQ(t[3].name, "fc1.bias");
  EXPECT_EQ(t[3].num_elements(), 10u);
}

TEST(ModelSpecTest, DefaultModelHas235146Parameters) {
  // 784*256 + 256 + 256*128 + 128 + 128*10 + 10
  uint64_t n = 0;
  for (const auto& t : ModelTables(ModelSection{})) n += t.num_elements();
  EXPECT_EQ(n, 235146u);
}

}  // namespace
}  // namespace strata
