#include "worker/wide_deep.h"

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "common/model_spec.h"
#include "gtest/gtest.h"
#include "worker/device.h"

namespace strata::worker {
namespace {

// A small wide & deep model with random parameters and a batch whose
// examples share some keys (so gradients of repeated keys are sums).
struct Fixture {
  ModelSection model;
  std::unique_ptr<Device> device = NewCpuDevice(1);
  std::unique_ptr<WideDeep> net;
  int batch = 5;
  size_t unique = 7;
  std::vector<float> dense, labels, wide_rows, emb_rows;
  std::vector<uint32_t> slot;

  Fixture() {
    model.type = "wide_deep";
    model.embedding_dim = 3;
    model.hidden = {6, 4};
    net = std::make_unique<WideDeep>(model, Activation::kTanh, device.get());
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.f, 0.3f);
    for (auto& table : net->params()) {
      for (float& v : table) v = normal(rng);
    }
    dense.resize(batch * kCtrDenseFeatures);
    for (float& v : dense) v = normal(rng) * 3;
    labels = {1, 0, 0, 1, 1};
    slot.resize(batch * kCtrFields);
    for (auto& s : slot) s = rng() % unique;
    wide_rows.resize(unique);
    for (float& v : wide_rows) v = normal(rng);
    emb_rows.resize(unique * model.embedding_dim);
    for (float& v : emb_rows) v = normal(rng);
  }

  // The summed loss, recomputed from scratch.
  double Loss() {
    std::vector<float> probs(batch);
    EXPECT_TRUE(net->Predict(dense.data(), slot.data(), batch, wide_rows.data(), emb_rows.data(),
                             probs.data())
                    .ok());
    double loss = 0;
    for (int b = 0; b < batch; ++b) {
      loss -= labels[b] * std::log(probs[b]) + (1 - labels[b]) * std::log(1 - probs[b]);
    }
    return loss;
  }
};

// Central differences in float: compare with a tolerance fit for them.
void ExpectGradient(Fixture& fx, float* param, float analytic, const std::string& what) {
  const float h = 1e-2f;
  const float saved = *param;
  *param = saved + h;
  const double up = fx.Loss();
  *param = saved - h;
  const double down = fx.Loss();
  *param = saved;
  const double numeric = (up - down) / (2 * h);
  EXPECT_NEAR(analytic, numeric, 2e-3 + 2e-2 * std::abs(numeric)) << what;
}

TEST(WideDeepTest, GradientsMatchFiniteDifferences) {
  Fixture fx;
  std::vector<float> wide_grad, emb_grad;
  const absl::StatusOr<double> step =
      fx.net->TrainStep(fx.dense.data(), fx.slot.data(), fx.labels.data(), fx.batch,
                        fx.wide_rows.data(), fx.emb_rows.data(), fx.unique, &wide_grad, &emb_grad);
  ASSERT_TRUE(step.ok()) << step.status();
  const double loss = *step;
  EXPECT_NEAR(loss, fx.Loss(), 1e-4);
  ASSERT_EQ(wide_grad.size(), fx.unique);
  ASSERT_EQ(emb_grad.size(), fx.unique * fx.model.embedding_dim);
  const auto grads = fx.net->grads();  // a copy: Loss() below runs forwards only
  for (size_t u = 0; u < fx.unique; ++u) {
    ExpectGradient(fx, &fx.wide_rows[u], wide_grad[u], "wide row " + std::to_string(u));
    for (int k = 0; k < fx.model.embedding_dim; ++k) {
      const size_t i = u * fx.model.embedding_dim + k;
      ExpectGradient(fx, &fx.emb_rows[i], emb_grad[i], "embedding " + std::to_string(i));
    }
  }
  auto& params = fx.net->params();
  ASSERT_EQ(params.size(), grads.size());
  EXPECT_TRUE(params[WideDeep::kWideTable].empty());
  EXPECT_TRUE(params[WideDeep::kEmbeddingTable].empty());
  for (size_t t = WideDeep::kWideDenseTable; t < params.size(); ++t) {
    // A few elements of every dense table.
    for (size_t i = 0; i < params[t].size(); i += std::max<size_t>(1, params[t].size() / 5)) {
      ExpectGradient(fx, &params[t][i], grads[t][i],
                     "table " + std::to_string(t) + " element " + std::to_string(i));
    }
  }
}

TEST(WideDeepTest, ARepeatedKeysGradientIsTheSumOverItsOccurrences) {
  Fixture fx;
  // Every feature of every example is key 0: its wide gradient is the sum
  // over all 5 x 26 occurrences of (p - y).
  std::fill(fx.slot.begin(), fx.slot.end(), 0);
  std::vector<float> wide_grad, emb_grad, probs(fx.batch);
  ASSERT_TRUE(fx.net
                  ->Predict(fx.dense.data(), fx.slot.data(), fx.batch, fx.wide_rows.data(),
                            fx.emb_rows.data(), probs.data())
                  .ok());
  ASSERT_TRUE(fx.net
                  ->TrainStep(fx.dense.data(), fx.slot.data(), fx.labels.data(), fx.batch,
                              fx.wide_rows.data(), fx.emb_rows.data(), fx.unique, &wide_grad,
                              &emb_grad)
                  .ok());
  double expected = 0;
  for (int b = 0; b < fx.batch; ++b) expected += kCtrFields * (probs[b] - fx.labels[b]);
  EXPECT_NEAR(wide_grad[0], expected, 1e-4);
  for (size_t u = 1; u < fx.unique; ++u) EXPECT_EQ(wide_grad[u], 0.f);
}

TEST(DeduplicateKeysTest, DistinctKeysInFirstSeenOrderAndEachFeaturesPlace) {
  const std::vector<uint64_t> keys = {7, 3, 7, 9, 3, 3, 1ull << 63};
  absl::flat_hash_map<uint64_t, uint32_t> index;
  std::vector<uint64_t> unique;
  std::vector<uint32_t> slot;
  DeduplicateKeys(keys.data(), keys.size(), &index, &unique, &slot);
  EXPECT_EQ(unique, (std::vector<uint64_t>{7, 3, 9, 1ull << 63}));
  EXPECT_EQ(slot, (std::vector<uint32_t>{0, 1, 0, 2, 1, 1, 3}));
  // The scratch index is reset between batches.
  const std::vector<uint64_t> next = {9, 9};
  DeduplicateKeys(next.data(), next.size(), &index, &unique, &slot);
  EXPECT_EQ(unique, (std::vector<uint64_t>{9}));
  EXPECT_EQ(slot, (std::vector<uint32_t>{0, 0}));
}

}  // namespace
}  // namespace strata::worker
