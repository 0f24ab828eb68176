// ParamClient's sparse path against real sparse partitions (pserver's
// Partition + SparseTable) behind a TCP transport: keys grouped by virtual
// partition, pulls landing in place in key order, pushes applied once.
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/model_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pserver/partition.h"
#include "tests/testing/status_matchers.h"
#include "transport/transport.h"
#include "worker/param_client.h"
#include "worker/row_cache.h"

namespace strata::worker {
namespace {

using ::strata::testing::IsOk;
using ::testing::ElementsAre;
using ::testing::FloatNear;
using transport::Message;

constexpr uint32_t kParts = 4;
constexpr int kDims[] = {1, 3};  // table 0 (like "wide"), table 1 ("embedding")

// Sparse partitions of two tables (ids: table * kParts + virtual index),
// zeros at first, SGD with lr 1, served on one TCP transport.
class SparseServer {
 public:
  explicit SparseServer(Consistency consistency) {
    RowOptimizerSection c;
    c.type = "sgd";
    c.learning_rate = 1.0;
    auto init = *RowInitializer::Create("zeros", 0, 0, 0);
    for (uint32_t t = 0; t < 2; ++t) {
      for (uint32_t v = 0; v < kParts; ++v) {
        pserver::SparseTableOptions o;
        o.dim = kDims[t];
        o.optimizer = std::shared_ptr<const RowOptimizer>(std::move(*RowOptimizer::Create(c)));
        o.initializer = &init;
        const uint32_t id = t * kParts + v;
        parts_[id] = std::make_unique<pserver::Partition>(
            id, "t", std::move(*pserver::SparseTable::Create(o)), consistency);
        parts_[id]->SetStepWorkers({5});
      }
    }
    transport_ = *transport::CreateTransport(transport::TransportOptions());
    EXPECT_THAT(transport_->Listen("127.0.0.1", 0,
                                   [this](Message m, std::shared_ptr<transport::Responder> r) {
                                     {
                                       absl::MutexLock l(&mu_);
                                       requests_.emplace_back(m.header.type, m.header.partition);
                                     }
                                     pserver::Partition* p = parts_.at(m.header.partition).get();
                                     if (m.header.type == transport::MessageType::kPullRequest) {
                                       p->Pull(m, std::move(r));
                                     } else {
                                       p->Push(m, std::move(r));
                                     }
                                   }),
                IsOk());
  }
  ~SparseServer() { transport_->Shutdown(); }

  proto::ClusterView View() const {
    proto::ClusterView view;
    view.set_epoch(1);
    view.set_ready(true);
    auto* m = view.add_members();
    m->set_id(1);
    m->set_role(proto::PSERVER);
    m->set_data_address(transport_->listen_address());
    for (uint32_t t = 0; t < 2; ++t) {
      auto* table = view.add_tables();
      table->set_id(t);
      table->set_sparse(true);
      table->set_dim(kDims[t]);
      table->set_partitions(kParts);
      for (uint32_t v = 0; v < kParts; ++v) {
        auto* p = view.add_partitions();
        p->set_id(t * kParts + v);
        p->set_table_id(t);
        p->set_offset(v);
        p->set_owner(1);
      }
    }
    return view;
  }
  std::vector<std::pair<transport::MessageType, uint32_t>> TakeRequests() {
    absl::MutexLock l(&mu_);
    return std::move(requests_);
  }

 private:
  std::map<uint32_t, std::unique_ptr<pserver::Partition>> parts_;
  std::unique_ptr<transport::Transport> transport_;
  absl::Mutex mu_;
  std::vector<std::pair<transport::MessageType, uint32_t>> requests_ ABSL_GUARDED_BY(mu_);
};

class SparseClientTest : public ::testing::TestWithParam<Consistency> {
 protected:
  SparseClientTest() : server_(GetParam()) {
    transport_ = *transport::CreateTransport(transport::TransportOptions());
    client_ = std::make_unique<ParamClient>(
        transport_.get(), 5,
        []() -> absl::StatusOr<proto::ClusterView> { return absl::UnavailableError("none"); },
        absl::Seconds(10));
    client_->SetView(server_.View());
  }
  ~SparseClientTest() override { transport_->Shutdown(); }

  SparseServer server_;
  std::unique_ptr<transport::Transport> transport_;
  std::unique_ptr<ParamClient> client_;
};

TEST_P(SparseClientTest, KeysAreGroupedByTheirVirtualPartition) {
  const std::vector<uint64_t> keys = {11, 22, 33, 44, 55, 66, 77, 88, 99};
  ParamClient::SparseKeys grouped;
  std::vector<uint32_t> perm;
  ASSERT_THAT(client_->GroupKeys(keys, &grouped, &perm), IsOk());
  ASSERT_EQ(grouped.begin.size(), kParts + 1);
  EXPECT_EQ(grouped.begin.back(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint32_t at = perm[i];
    EXPECT_EQ(grouped.keys[at], keys[i]);
    const uint32_t v = SparsePartitionOf(keys[i], kParts);
    EXPECT_GE(at, grouped.begin[v]);
    EXPECT_LT(at, grouped.begin[v + 1]);
  }
  EXPECT_EQ(client_->SparseDim(1), 3);
  EXPECT_EQ(client_->SparseDim(7), 0);
}

TEST_P(SparseClientTest, PushedRowsComeBackInKeyOrder) {
  const bool bsp = GetParam() == Consistency::kBsp;
  // Keys that all fall in one virtual partition, and one in another.
  std::vector<uint64_t> keys;
  for (uint64_t k = 1; keys.size() < 3; ++k) {
    if (SparsePartitionOf(k, kParts) == 0) keys.push_back(k);
  }
  ParamClient::SparseKeys grouped;
  std::vector<uint32_t> perm;
  ASSERT_THAT(client_->GroupKeys(keys, &grouped, &perm), IsOk());
  // Gradient rows of table 1 (dim 3) summed over 2 samples: row i = i+1.
  std::vector<float> grads(keys.size() * 3);
  for (size_t i = 0; i < keys.size(); ++i) {
    for (int j = 0; j < 3; ++j) grads[perm[i] * 3 + j] = static_cast<float>(i + 1);
  }
  PushResult result;
  auto push = client_->StartSparsePush(1, &grouped, grads.data(), 0, 2, bsp, &result);
  push->IssueAll();
  ASSERT_THAT(push->Finish(), IsOk());
  // bsp: every virtual partition of the table got a push (empty or not),
  // so every partition's step completes; asp: only the one with keys.
  std::set<uint32_t> pushed;
  for (const auto& [type, partition] : server_.TakeRequests()) pushed.insert(partition);
  EXPECT_EQ(pushed.size(), bsp ? kParts : 1u);

  std::vector<float> rows(keys.size() * 3, -7.f);
  auto pull = client_->StartSparsePull(1, &grouped, rows.data(), bsp ? 1 : 0, bsp);
  pull->IssueAll();
  ASSERT_THAT(pull->Finish(), IsOk());
  // bsp: the pull waits for the step on every virtual partition (a barrier
  // before the next push to each), also those without keys.
  std::set<uint32_t> pulled;
  for (const auto& [type, partition] : server_.TakeRequests()) pulled.insert(partition);
  EXPECT_EQ(pulled.size(), bsp ? kParts : 1u);
  for (size_t i = 0; i < keys.size(); ++i) {
    // SGD lr 1 from zeros over the mean of 2 samples: -(i + 1) / 2.
    const float want = -static_cast<float>(i + 1) / 2.f;
    EXPECT_THAT(std::vector<float>(rows.begin() + perm[i] * 3, rows.begin() + perm[i] * 3 + 3),
                ElementsAre(FloatNear(want, 1e-6f), FloatNear(want, 1e-6f), FloatNear(want, 1e-6f)))
        << "key " << keys[i];
  }
}

TEST_P(SparseClientTest, AViewWithAnEmptySparseTableIsRefusedNamingIt) {
  proto::ClusterView view = server_.View();
  view.set_epoch(2);
  view.mutable_tables(1)->set_dim(0);
  client_->SetView(view);
  ParamClient::SparseKeys grouped;
  std::vector<uint32_t> perm;
  ASSERT_THAT(client_->GroupKeys({1, 2, 3}, &grouped, &perm), IsOk());
  std::vector<float> rows(3);
  auto pull = client_->StartSparsePull(0, &grouped, rows.data(), 0);
  const absl::Status s = pull->Finish();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("sparse table 1"), std::string::npos) << s;
  EXPECT_NE(s.message().find("dim 0"), std::string::npos) << s;
}

INSTANTIATE_TEST_SUITE_P(Consistency, SparseClientTest,
                         ::testing::Values(Consistency::kAsp, Consistency::kBsp));

TEST(RowCacheTest, ServesFreshRowsAndForgetsStaleOnes) {
  RowCache cache(/*capacity=*/2, /*staleness_steps=*/1, {1, 2});
  const uint64_t keys[] = {10, 20};
  const float wide[] = {1.f, 2.f};
  const float emb[] = {1.f, 1.5f, 2.f, 2.5f};
  cache.Insert(keys, 2, {wide, emb}, /*now=*/5);
  std::vector<float> w(3, 0.f), e(6, 0.f);
  std::vector<uint8_t> hit;
  EXPECT_EQ(cache.Lookup({20, 30, 10}, 6, {w.data(), e.data()}, &hit), 2u);
  EXPECT_THAT(hit, ElementsAre(1, 0, 1));
  EXPECT_THAT(w, ElementsAre(2.f, 0.f, 1.f));
  EXPECT_THAT(e, ElementsAre(2.f, 2.5f, 0.f, 0.f, 1.f, 1.5f));
  // Step 7 is two steps after 5: beyond the staleness bound.
  EXPECT_EQ(cache.Lookup({10}, 7, {w.data(), e.data()}, &hit), 0u);
  // Full: a new key goes in only once the stale ones are dropped.
  const uint64_t more[] = {30};
  cache.Insert(more, 1, {wide, emb}, 7);
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_EQ(cache.hits(), 2u);
  EXPECT_EQ(cache.misses(), 2u);
}

TEST(RowCacheTest, ACacheFullOfFreshRowsTakesNoMore) {
  RowCache cache(1, 10, {1, 1});
  const uint64_t a[] = {1}, b[] = {2};
  const float v[] = {3.f};
  cache.Insert(a, 1, {v, v}, 1);
  cache.Insert(b, 1, {v, v}, 2);
  std::vector<float> w(1), e(1);
  std::vector<uint8_t> hit;
  EXPECT_EQ(cache.Lookup({1}, 2, {w.data(), e.data()}, &hit), 1u);
  EXPECT_EQ(cache.Lookup({2}, 2, {w.data(), e.data()}, &hit), 0u);
}

}  // namespace
}  // namespace strata::worker
