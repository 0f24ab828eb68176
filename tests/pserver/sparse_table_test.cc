#include "pserver/sparse_table.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "glog/logging.h"
#include "gtest/gtest.h"

namespace strata::pserver {
namespace {

RowInitializer Init(const std::string& type = "normal", double scale = 0.1, uint32_t table = 3,
                    uint64_t seed = 42) {
  auto init = RowInitializer::Create(type, scale, table, seed);
  CHECK(init.ok()) << init.status();
  return *init;
}

std::shared_ptr<const RowOptimizer> Opt(const std::string& type, double lr = 0.1) {
  RowOptimizerSection c;
  c.type = type;
  c.learning_rate = lr;
  auto opt = RowOptimizer::Create(c);
  CHECK(opt.ok());
  return std::shared_ptr<const RowOptimizer>(std::move(*opt));
}

std::unique_ptr<SparseTable> Table(SparseTableOptions o, const RowInitializer& init) {
  o.initializer = &init;
  auto t = SparseTable::Create(o);
  CHECK(t.ok()) << t.status();
  return std::move(*t);
}

SparseTableOptions Options(int dim, const std::string& opt = "sgd") {
  SparseTableOptions o;
  o.dim = dim;
  o.optimizer = Opt(opt);
  return o;
}

TEST(RowInitializerTest, RowsDependOnlyOnSeedTableAndKey) {
  const RowInitializer a = Init(), b = Init();
  std::vector<float> x(16), y(16), z(16), short_row(4);
  a.Fill(12345, 16, x.data());
  b.Fill(12345, 16, y.data());
  EXPECT_EQ(x, y);
  b.Fill(12346, 16, z.data());
  EXPECT_NE(x, z);
  // Element j does not depend on the row's width.
  a.Fill(12345, 4, short_row.data());
  EXPECT_EQ(std::vector<float>(x.begin(), x.begin() + 4), short_row);
  Init("normal", 0.1, 4).Fill(12345, 16, z.data());  // another table
  EXPECT_NE(x, z);
  Init("normal", 0.1, 3, 43).Fill(12345, 16, z.data());  // another seed
  EXPECT_NE(x, z);
}

TEST(RowInitializerTest, DistributionsHaveTheirScale) {
  const int n = 200000;
  std::vector<float> v(n);
  for (const char* type : {"uniform", "normal"}) {
    const RowInitializer init = Init(type, 0.5);
    double sum = 0, sq = 0, max_abs = 0;
    for (int k = 0; k < n / 8; ++k) {
      init.Fill(k, 8, v.data() + 8 * k);
    }
    for (float x : v) {
      sum += x;
      sq += x * x;
      max_abs = std::max(max_abs, std::abs(static_cast<double>(x)));
    }
    const double mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
    EXPECT_NEAR(mean, 0, 0.01) << type;
    if (std::string(type) == "uniform") {
      EXPECT_NEAR(sd, 0.5 / std::sqrt(3.0), 0.01);
      EXPECT_LE(max_abs, 0.5);
    } else {
      EXPECT_NEAR(sd, 0.5, 0.01);
    }
  }
  std::vector<float> zeros(8, 1.f);
  Init("zeros").Fill(7, 8, zeros.data());
  EXPECT_EQ(zeros, std::vector<float>(8, 0.f));
  EXPECT_FALSE(RowInitializer::Create("glorot_uniform", 1, 0, 0).ok());
}

TEST(SparseTableTest, RowsStartFromTheirInitialValuesWhereverTheyAreCreated) {
  const RowInitializer init = Init();
  auto server_a = Table(Options(8), init);
  auto server_b = Table(Options(8), init);
  const std::vector<uint64_t> keys = {5, 1ull << 40, 77};
  // Server b sees other keys first: the rows do not depend on order.
  std::vector<uint64_t> other = {1, 2, 3, 4};
  std::vector<float> zero_grad(8 * other.size(), 0.f);
  server_b->Update(other.data(), other.size(), zero_grad.data(), 1.f);

  std::vector<float> before_a(8 * keys.size()), before_b(8 * keys.size());
  server_a->Lookup(keys.data(), keys.size(), before_a.data());
  server_b->Lookup(keys.data(), keys.size(), before_b.data());
  EXPECT_EQ(before_a, before_b);
  EXPECT_EQ(server_a->rows(), 0u);  // a lookup creates nothing

  std::vector<float> grad(8 * keys.size(), 1.f);
  server_a->Update(keys.data(), keys.size(), grad.data(), 0.5f);
  server_b->Update(keys.data(), keys.size(), grad.data(), 0.5f);
  std::vector<float> after_a(8 * keys.size()), after_b(8 * keys.size());
  server_a->Lookup(keys.data(), keys.size(), after_a.data());
  server_b->Lookup(keys.data(), keys.size(), after_b.data());
  EXPECT_EQ(after_a, after_b);
  for (size_t i = 0; i < after_a.size(); ++i) {
    EXPECT_FLOAT_EQ(after_a[i], before_a[i] - 0.1f * 0.5f);  // sgd, lr 0.1
  }
  EXPECT_EQ(server_a->rows(), 3u);
  EXPECT_EQ(server_a->stats().admitted, 3u);
  EXPECT_EQ(server_a->UpdateCountForTesting(77), 1u);
}

TEST(SparseTableTest, MinCountAdmissionCountsPushesAndRejectsUntilThen) {
  const RowInitializer init = Init();
  SparseTableOptions o = Options(4);
  o.admit_min_count = 3;
  auto t = Table(o, init);
  const uint64_t key = 99;
  std::vector<float> g(4, 1.f), row(4);
  t->Lookup(&key, 1, row.data());
  EXPECT_EQ(row, std::vector<float>(4, 0.f));  // not admitted: contributes nothing
  t->Update(&key, 1, g.data(), 1.f);
  t->Update(&key, 1, g.data(), 1.f);
  EXPECT_EQ(t->rows(), 0u);
  EXPECT_EQ(t->stats().rejected, 2u);
  EXPECT_EQ(t->stats().pending_keys, 1u);
  t->Update(&key, 1, g.data(), 1.f);  // the third push makes the row
  ASSERT_NE(t->Find(key), nullptr);
  EXPECT_EQ(t->stats().admitted, 1u);
  EXPECT_EQ(t->stats().pending_keys, 0u);
  std::vector<float> expected(4);
  init.Fill(key, 4, expected.data());
  for (int j = 0; j < 4; ++j) EXPECT_FLOAT_EQ(t->Find(key)[j], expected[j] - 0.1f);
}

TEST(SparseTableTest, PendingCountsAreBounded) {
  const RowInitializer init = Init();
  SparseTableOptions o = Options(1);
  o.admit_min_count = 2;
  o.max_pending_keys = 100;
  auto t = Table(o, init);
  float g = 1.f;
  for (uint64_t k = 0; k < 1000; ++k) t->Update(&k, 1, &g, 1.f);
  EXPECT_LE(t->stats().pending_keys, 100u);
  EXPECT_EQ(t->rows(), 0u);
  EXPECT_EQ(t->stats().rejected, 1000u);
}

TEST(SparseTableTest, ProbabilityAdmissionAdmitsAboutThatShare) {
  const RowInitializer init = Init();
  SparseTableOptions o = Options(1);
  o.admit_probability = 0.25;
  auto t = Table(o, init);
  const int n = 20000;
  float g = 1.f;
  for (uint64_t k = 0; k < n; ++k) t->Update(&k, 1, &g, 1.f);
  // Binomial(20000, 0.25): mean 5000, sd 61.
  EXPECT_NEAR(static_cast<double>(t->rows()), 5000.0, 400.0);
  EXPECT_EQ(t->stats().admitted + t->stats().rejected, static_cast<uint64_t>(n));
  // A key not admitted reads as zeros, not as its initial values.
  uint64_t missing = 0;
  while (t->Find(missing) != nullptr) ++missing;
  float v = 1.f;
  t->Lookup(&missing, 1, &v);
  EXPECT_EQ(v, 0.f);
}

TEST(SparseTableTest, IdleRowsAreEvicted) {
  const RowInitializer init = Init();
  SparseTableOptions o = Options(2);
  o.idle_updates = 10;
  auto t = Table(o, init);
  std::vector<uint64_t> cold(500);
  for (size_t i = 0; i < cold.size(); ++i) cold[i] = 1000 + i;
  std::vector<float> g(2 * cold.size(), 0.f);
  t->Update(cold.data(), cold.size(), g.data(), 1.f);
  const uint64_t hot = 7;
  for (int step = 0; step < 40; ++step) t->Update(&hot, 1, g.data(), 1.f);
  // 40 updates of one key sweep at least 64 rows each: every cold row was
  // looked at after it went idle.
  EXPECT_EQ(t->rows(), 1u);
  EXPECT_NE(t->Find(hot), nullptr);
  EXPECT_EQ(t->stats().evicted_idle, 500u);
}

TEST(SparseTableTest, CapacityEvictsTheLeastFrequentlyUpdatedFirst) {
  const RowInitializer init = Init();
  SparseTableOptions o = Options(2);
  o.capacity_rows = 100;
  auto t = Table(o, init);
  std::vector<float> g(2 * 200, 0.f);
  // Keys 0..49 updated 5 times: the frequent ones.
  std::vector<uint64_t> frequent(50);
  for (uint64_t k = 0; k < 50; ++k) frequent[k] = k;
  for (int r = 0; r < 5; ++r) t->Update(frequent.data(), frequent.size(), g.data(), 1.f);
  // 200 keys seen once each.
  std::vector<uint64_t> rare(200);
  for (uint64_t k = 0; k < 200; ++k) rare[k] = 10000 + k;
  for (uint64_t k : rare) t->Update(&k, 1, g.data(), 1.f);
  EXPECT_LE(t->rows(), 100u);
  for (uint64_t k : frequent) EXPECT_NE(t->Find(k), nullptr) << k;
  EXPECT_EQ(t->stats().evicted_capacity, 250u - t->rows());
  // The newest rare keys survive rather than the longest idle.
  EXPECT_NE(t->Find(rare.back()), nullptr);
  EXPECT_EQ(t->Find(rare.front()), nullptr);
}

// Random updates and evictions against a plain map: every row keeps its
// values through the index's growth, backward-shift deletions and the
// moves of the last row.
TEST(SparseTableTest, IndexStaysConsistentThroughGrowthAndRemovals) {
  const RowInitializer init = Init("zeros");
  SparseTableOptions o = Options(3);
  o.capacity_rows = 3000;
  o.idle_updates = 200;
  auto t = Table(o, init);
  std::map<uint64_t, std::vector<float>> model;
  std::mt19937_64 rng(1);
  std::vector<float> g(3 * 64);
  for (int step = 0; step < 2000; ++step) {
    std::vector<uint64_t> keys;
    for (int i = 0; i < 64; ++i) keys.push_back(rng() % 20000);
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    for (size_t i = 0; i < keys.size(); ++i) {
      for (int j = 0; j < 3; ++j) g[3 * i + j] = static_cast<float>(rng() % 7) - 3.f;
      auto& row = model.try_emplace(keys[i], std::vector<float>(3, 0.f)).first->second;
      for (int j = 0; j < 3; ++j) row[j] -= 0.1f * g[3 * i + j];
    }
    t->Update(keys.data(), keys.size(), g.data(), 1.f);
    for (auto it = model.begin(); it != model.end();) {
      it = t->Find(it->first) == nullptr ? model.erase(it) : std::next(it);
    }
    ASSERT_EQ(t->rows(), model.size()) << "step " << step;
  }
  for (const auto& [key, row] : model) {
    const float* v = t->Find(key);
    ASSERT_NE(v, nullptr);
    for (int j = 0; j < 3; ++j) EXPECT_FLOAT_EQ(v[j], row[j]) << key;
  }
  EXPECT_GT(t->stats().evicted_capacity + t->stats().evicted_idle, 0u);
}

// docs/sparse.md states the bytes of a row: row data + optimizer slots +
// SparseTable::kRowOverheadBytes. What is allocated stays within 1.25x of
// it at any size.
TEST(SparseTableTest, MemoryPerRowIsWithinAQuarterOfTheStatedBytes) {
  const RowInitializer init = Init();
  for (const auto& [dim, opt] :
       std::vector<std::pair<int, std::string>>{{16, "adagrad"}, {1, "sgd"}, {8, "adam"}}) {
    auto t = Table(Options(dim, opt), init);
    const size_t slots = opt == "sgd" ? 0 : opt == "adagrad" ? 1 : 2;
    EXPECT_EQ(t->stated_bytes_per_row(), (4 * dim * (1 + slots) + 7) / 8 * 8 + 32);
    std::vector<float> g(dim * 1000, 0.f);
    std::vector<uint64_t> keys(1000);
    double worst = 0;
    for (uint64_t base = 0; base < 300000; base += 1000) {
      for (uint64_t i = 0; i < 1000; ++i) keys[i] = (base + i) * 0x9e3779b97f4a7c15ull;
      t->Update(keys.data(), keys.size(), g.data(), 1.f);
      if (t->rows() >= 20000) {
        worst = std::max(worst, static_cast<double>(t->stats().memory_bytes) / t->rows() /
                                    t->stated_bytes_per_row());
      }
    }
    EXPECT_EQ(t->rows(), 300000u);
    EXPECT_LE(worst, 1.25) << "dim " << dim << " " << opt;
  }
}

}  // namespace
}  // namespace strata::pserver
