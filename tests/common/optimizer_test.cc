#include "common/optimizer.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace strata {
namespace {

using ::strata::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr double kTol = 1e-6;

// Three parameters and three steps of gradients shared by every case.
const std::vector<float> kInitial = {1.0f, -2.0f, 0.5f};
const std::vector<std::vector<float>> kGrads = {
    {0.5f, -1.0f, 2.0f},
    {1.0f, 1.0f, -1.0f},
    {-0.25f, 0.5f, 0.0f},
};

OptimizerSection Section(const std::string& type, double lr) {
  OptimizerSection c;
  c.type = type;
  c.learning_rate = lr;
  c.momentum = 0.9;
  c.beta1 = 0.9;
  c.beta2 = 0.999;
  c.epsilon = 1e-8;
  c.weight_decay = 0.0;
  return c;
}

// Applies kGrads one step at a time and checks the parameters after each
// step against `expected[step]`.
void RunSteps(const OptimizerSection& c, const std::vector<std::vector<double>>& expected) {
  auto opt = Optimizer::Create(c, kInitial.size());
  ASSERT_TRUE(opt.ok()) << opt.status();
  std::vector<float> p = kInitial;
  for (size_t step = 0; step < kGrads.size(); ++step) {
    (*opt)->Apply(p.data(), kGrads[step].data(), p.size());
    for (size_t i = 0; i < p.size(); ++i) {
      EXPECT_NEAR(p[i], expected[step][i], kTol)
          << c.type << " step " << step + 1 << " param " << i;
    }
  }
}

TEST(OptimizerTest, SgdSubtractsLearningRateTimesGradient) {
  // p -= 0.1 * g
  // step 1: 1 - 0.05 = 0.95;  -2 + 0.1 = -1.9;   0.5 - 0.2 = 0.3
  // step 2: 0.95 - 0.1 = 0.85; -1.9 - 0.1 = -2.0; 0.3 + 0.1 = 0.4
  // step 3: 0.85 + 0.025 = 0.875; -2.0 - 0.05 = -2.05; 0.4 - 0 = 0.4
  RunSteps(Section("sgd", 0.1), {{0.95, -1.9, 0.3}, {0.85, -2.0, 0.4}, {0.875, -2.05, 0.4}});
}

TEST(OptimizerTest, SgdAddsWeightDecayToGradient) {
  // p -= 0.1 * (g + 0.1 * p)
  // step 1: 1 - 0.1*(0.5 + 0.1)      = 0.94
  //         -2 - 0.1*(-1 - 0.2)      = -1.88
  //         0.5 - 0.1*(2 + 0.05)     = 0.295
  // step 2: 0.94 - 0.1*(1 + 0.094)   = 0.8306
  //         -1.88 - 0.1*(1 - 0.188)  = -1.9612
  //         0.295 - 0.1*(-1 + 0.0295) = 0.39205
  // step 3: 0.8306 - 0.1*(-0.25 + 0.08306)  = 0.847294
  //         -1.9612 - 0.1*(0.5 - 0.19612)   = -1.991588
  //         0.39205 - 0.1*(0 + 0.039205)    = 0.3881295
  OptimizerSection c = Section("sgd", 0.1);
  c.weight_decay = 0.1;
  RunSteps(c, {{0.94, -1.88, 0.295}, {0.8306, -1.9612, 0.39205}, {0.847294, -1.991588, 0.3881295}});
}

TEST(OptimizerTest, MomentumAccumulatesVelocity) {
  // v = 0.9 v + g; p -= 0.1 v
  // step 1: v = (0.5, -1, 2);            p = (0.95, -1.9, 0.3)
  // step 2: v = (0.45+1, -0.9+1, 1.8-1) = (1.45, 0.1, 0.8)
  //         p = (0.95-0.145, -1.9-0.01, 0.3-0.08) = (0.805, -1.91, 0.22)
  // step 3: v = (1.305-0.25, 0.09+0.5, 0.72+0) = (1.055, 0.59, 0.72)
  //         p = (0.805-0.1055, -1.91-0.059, 0.22-0.072) = (0.6995, -1.969,
  //         0.148)
  RunSteps(Section("momentum", 0.1),
           {{0.95, -1.9, 0.3}, {0.805, -1.91, 0.22}, {0.6995, -1.969, 0.148}});
}

TEST(OptimizerTest, MomentumWithWeightDecay) {
  // v = 0.9 v + g + 0.01 p; p -= 0.1 v
  // step 1: v = (0.5+0.01, -1-0.02, 2+0.005) = (0.51, -1.02, 2.005)
  //         p = (0.949, -1.898, 0.2995)
  // step 2: v0 = 0.459 + 1 + 0.00949 = 1.46849      -> p0 = 0.802151
  //         v1 = -0.918 + 1 - 0.01898 = 0.06302     -> p1 = -1.904302
  //         v2 = 1.8045 - 1 + 0.002995 = 0.807495   -> p2 = 0.2187505
  // step 3: v0 = 1.321641 - 0.25 + 0.00802151 = 1.07966251  -> p0 = 0.694184749
  //         v1 = 0.056718 + 0.5 - 0.01904302 = 0.53767498   -> p1 =
  //         -1.958069498 v2 = 0.7267455 + 0 + 0.002187505 = 0.728933005  -> p2
  //         = 0.1458571995
  OptimizerSection c = Section("momentum", 0.1);
  c.weight_decay = 0.01;
  RunSteps(c, {{0.949, -1.898, 0.2995},
               {0.802151, -1.904302, 0.2187505},
               {0.694184749, -1.958069498, 0.1458571995}});
}

TEST(OptimizerTest, AdamWithBiasCorrection) {
  // lr 0.01, b1 0.9, b2 0.999, eps 1e-8.
  // step 1: m^ = g, v^ = g^2, so p -= 0.01 * sign(g): (0.99, -1.99, 0.49)
  // step 2, param 0: m = 0.9*0.05 + 0.1*1 = 0.145, v = 0.999*0.00025 + 0.001
  //   = 0.00124975; m^ = 0.145/0.19 = 0.76315789, v^ = 0.00124975/0.001999
  //   = 0.62518759, sqrt = 0.79068805; p0 = 0.99 - 0.01*0.96518195 = 0.98034818
  // Other entries computed the same way (python3, double precision).
  RunSteps(Section("adam", 0.01), {{0.9900000002, -1.9900000001, 0.4900000000},
                                   {0.9803481801, -1.9905263159, 0.4873366297},
                                   {0.9744621128, -1.9930406589, 0.4852778367}});
}

TEST(OptimizerTest, AdamWithWeightDecayAddsL2ToGradient) {
  // g' = g + 0.1 p. Step 1 is still p -= 0.01 * sign(g') (same as above).
  // step 2, param 0: g' = 1 + 0.099 = 1.099, m = 0.9*0.06 + 0.1099 = 0.1639,
  //   v = 0.999*0.00036 + 0.001*1.207801 = 0.001567441; m^ = 0.86263158,
  //   v^ = 0.78411256, sqrt = 0.88550130; p0 = 0.99 - 0.01*0.97417313
  //   = 0.98025827
  OptimizerSection c = Section("adam", 0.01);
  c.weight_decay = 0.1;
  RunSteps(c, {{0.9900000002, -1.9900000001, 0.4900000000},
               {0.9802582689, -1.9885605105, 0.4870549657},
               {0.9735529802, -1.9887775902, 0.4846412009}});
}

TEST(OptimizerTest, MomentumKeepsVelocityPerParameter) {
  // Opposite gradients on two parameters: a shared velocity would cancel.
  auto together = Optimizer::Create(Section("momentum", 0.1), 2);
  ASSERT_TRUE(together.ok());
  std::vector<float> p = {1.0f, 1.0f};
  const std::vector<float> g = {1.0f, -1.0f};
  (*together)->Apply(p.data(), g.data(), 2);
  (*together)->Apply(p.data(), g.data(), 2);
  // v after two steps: +-(0.9 + 1) = +-1.9; p = 1 -+ 0.1 -+ 0.19
  EXPECT_NEAR(p[0], 0.71, kTol);
  EXPECT_NEAR(p[1], 1.29, kTol);
}

TEST(OptimizerTest, NamesAndStateBytes) {
  struct Case {
    const char* type;
    size_t state_bytes;
  };
  for (const Case& c : {Case{"sgd", 0}, Case{"momentum", 4}, Case{"adam", 8}}) {
    auto opt = Optimizer::Create(Section(c.type, 0.1), 3);
    ASSERT_TRUE(opt.ok()) << c.type << ": " << opt.status();
    EXPECT_STREQ((*opt)->name(), c.type);
    EXPECT_EQ((*opt)->state_bytes_per_param(), c.state_bytes) << c.type;
  }
}

// A partition applying a push chunk by chunk (issue 30): the chunks of one
// update, in any order and at any chunk size — larger than the parameters,
// not dividing them, one float — give bit for bit what whole updates give,
// Adam's bias correction included, even when a chunk runs ahead to the next
// update before another has had this one.
TEST(OptimizerTest, ApplyRangeInChunksIsBitIdenticalToWholeUpdates) {
  const size_t n = 37;
  std::vector<std::vector<float>> grads(3, std::vector<float>(n));
  for (size_t s = 0; s < grads.size(); ++s) {
    for (size_t i = 0; i < n; ++i)
      grads[s][i] = 0.01f * static_cast<float>((i * 7 + s * 3) % 11) - 0.05f;
  }
  for (const char* type : {"sgd", "momentum", "adam"}) {
    OptimizerSection c = Section(type, 0.05);
    c.weight_decay = 0.01;
    std::vector<float> whole(n, 0.5f);
    auto ref = Optimizer::Create(c, n);
    ASSERT_TRUE(ref.ok());
    for (const auto& g : grads) (*ref)->Apply(whole.data(), g.data(), 0.5f, n);
    for (size_t chunk : {size_t{64}, size_t{10}, size_t{1}}) {
      std::vector<float> p(n, 0.5f);
      auto opt = Optimizer::Create(c, n);
      ASSERT_TRUE(opt.ok());
      // The chunks from the last to the first; each chunk takes all three
      // updates before the next chunk has its first.
      for (size_t begin = (n - 1) / chunk * chunk;; begin -= chunk) {
        const size_t len = std::min(chunk, n - begin);
        for (uint64_t u = 1; u <= grads.size(); ++u) {
          (*opt)->ApplyRange(begin, p.data() + begin, grads[u - 1].data() + begin, 0.5f, len, u);
        }
        if (begin == 0) break;
      }
      EXPECT_EQ(p, whole) << type << ", chunks of " << chunk;
      EXPECT_EQ((*opt)->updates(), 3u) << type;
      // Its state carries on as the whole-update optimizer's does.
      EXPECT_EQ((*opt)->SaveState(), (*ref)->SaveState()) << type << ", chunks of " << chunk;
    }
  }
}

TEST(OptimizerTest, UnknownTypeIsInvalidArgumentNamingIt) {
  EXPECT_THAT(Optimizer::Create(Section("adagrad", 0.1), 3),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("'adagrad'"), HasSubstr("sgd"))));
  EXPECT_THAT(Optimizer::Create(Section("", 0.1), 3),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("''")));
}

}  // namespace
}  // namespace strata
