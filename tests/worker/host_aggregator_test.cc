// Node-local aggregation's segment (worker/host_aggregator.h): what the
// workers of a host post is what the aggregating worker sums, the
// parameters it publishes are what they read, across processes.
#include "worker/host_aggregator.h"

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/dense_sync_testing.h"

namespace strata::worker {
namespace {

using ::strata::testing::IsOk;
using ::strata::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Optional;

std::string UniqueName(const char* what) {
  return HostSegment::NameFor(static_cast<uint64_t>(getpid()) << 16 | (rand() & 0xffff), what);
}

TEST(HostSegmentTest, SumsWhatEveryWorkerPostedForTheStepOnly) {
  const std::string name = UniqueName("sum");
  auto a = HostSegment::Open(name, {2, 1}, 4);
  ASSERT_THAT(a, IsOk());
  auto b = HostSegment::Open(name, {2, 1}, 4);  // another worker's mapping
  ASSERT_THAT(b, IsOk());
  std::vector<std::vector<float>> sum;
  EXPECT_EQ((*a)->Sum(0, {3, 4}, &sum), std::nullopt);  // nothing posted
  ASSERT_THAT((*a)->Post(3, 0, 2, {{1.f, 2.f}, {3.f}}), IsOk());
  EXPECT_EQ((*a)->Sum(0, {3, 4}, &sum), std::nullopt);  // 4 has not posted
  ASSERT_THAT((*b)->Post(4, 1, 5, {{9.f, 9.f}, {9.f}}), IsOk());
  EXPECT_EQ((*a)->Sum(0, {3, 4}, &sum), std::nullopt);  // 4 posted another step
  ASSERT_THAT((*b)->Post(4, 0, 5, {{10.f, 20.f}, {30.f}}), IsOk());
  EXPECT_THAT((*a)->Sum(0, {3, 4}, &sum), Optional(7u));
  EXPECT_THAT(sum, ElementsAre(ElementsAre(11.f, 22.f), ElementsAre(33.f)));
  // Only the workers asked for.
  EXPECT_THAT((*b)->Sum(0, {4}, &sum), Optional(5u));
  EXPECT_THAT(sum, ElementsAre(ElementsAre(10.f, 20.f), ElementsAre(30.f)));
}

// A CTR model's rows: each worker posts its batch's distinct keys and
// their gradient rows per sparse table; the sum merges them per key (a key
// two workers share is one row, their rows added), beside the dense sum.
TEST(HostSegmentTest, SparseRowsAreMergedPerKey) {
  const std::string name = UniqueName("rows");
  SparseLayout layout;
  layout.tables = {0, 1};
  layout.dims = {1, 2};
  layout.max_keys = 3;
  auto a = HostSegment::Open(name, {0, 0, 2}, 4, layout);
  ASSERT_THAT(a, IsOk());
  auto b = HostSegment::Open(name, {0, 0, 2}, 4, layout);
  ASSERT_THAT(b, IsOk());
  const std::vector<uint64_t> keys_a = {7, 9}, keys_b = {9, 11, 7};
  const std::vector<float> wide_a = {1, 2}, emb_a = {1, 1, 2, 2};
  const std::vector<float> wide_b = {10, 20, 30}, emb_b = {10, 10, 20, 20, 30, 30};
  SparseGrads ga{keys_a.data(), keys_a.size(), {wide_a.data(), emb_a.data()}};
  SparseGrads gb{keys_b.data(), keys_b.size(), {wide_b.data(), emb_b.data()}};
  ASSERT_THAT((*a)->Post(1, 3, 2, {{}, {}, {1.f, 2.f}}, &ga), IsOk());
  ASSERT_THAT((*b)->Post(2, 3, 3, {{}, {}, {3.f, 4.f}}, &gb), IsOk());
  std::vector<std::vector<float>> sum;
  MergedRows merged;
  EXPECT_THAT((*a)->Sum(3, {1, 2}, &sum, &merged), Optional(5u));
  EXPECT_THAT(sum[2], ElementsAre(4.f, 6.f));
  EXPECT_THAT(merged.keys, ElementsAre(7u, 9u, 11u));
  ASSERT_EQ(merged.rows.size(), 2u);
  EXPECT_THAT(merged.rows[0], ElementsAre(31.f, 12.f, 20.f));
  EXPECT_THAT(merged.rows[1], ElementsAre(31.f, 31.f, 12.f, 12.f, 20.f, 20.f));
  // Summed again (a later step, fewer keys): nothing of the last is left.
  const std::vector<uint64_t> one = {5};
  const std::vector<float> w1 = {0.5f}, e1 = {0.25f, 0.75f};
  SparseGrads g1{one.data(), one.size(), {w1.data(), e1.data()}};
  ASSERT_THAT((*a)->Post(1, 4, 1, {{}, {}, {0.f, 0.f}}, &g1), IsOk());
  EXPECT_THAT((*a)->Sum(4, {1}, &sum, &merged), Optional(1u));
  EXPECT_THAT(merged.keys, ElementsAre(5u));
  EXPECT_THAT(merged.rows[0], ElementsAre(0.5f));
  EXPECT_THAT(merged.rows[1], ElementsAre(0.25f, 0.75f));
  // More keys than a slot holds, or rows of another set of tables.
  const std::vector<uint64_t> many = {1, 2, 3, 4};
  const std::vector<float> w4(4), e4(8);
  SparseGrads g4{many.data(), many.size(), {w4.data(), e4.data()}};
  EXPECT_THAT(
      (*a)->Post(1, 5, 4, {{}, {}, {0.f, 0.f}}, &g4),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr(name), HasSubstr("4 distinct keys"), HasSubstr("hold 3 keys"))));
  SparseGrads g_wide_only{one.data(), one.size(), {w1.data()}};
  EXPECT_THAT((*a)->Post(1, 5, 1, {{}, {}, {0.f, 0.f}}, &g_wide_only),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("of 1 sparse tables")));
  // A later worker takes the creator's room for keys (its view of the
  // job's workers may differ); rows of another width are another model's.
  SparseLayout wider = layout;
  wider.max_keys = 6;
  auto c = HostSegment::Open(name, {0, 0, 2}, 4, wider);
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ((*c)->sparse().max_keys, 3u);
  SparseLayout other = layout;
  other.dims = {1, 3};
  EXPECT_THAT(HostSegment::Open(name, {0, 0, 2}, 4, other),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(name)));
}

TEST(HostSegmentTest, MoreKeysThanASlotHoldsAreRefusedNamingTheBound) {
  const std::string name = UniqueName("keys");
  SparseLayout layout;
  layout.tables = {0};
  layout.dims = {2};
  layout.max_keys = 2;
  auto a = HostSegment::Open(name, {0, 2}, 2, layout);
  ASSERT_THAT(a, IsOk());
  const std::vector<uint64_t> keys = {1, 2, 3};
  const std::vector<float> rows(6, 1.f);
  SparseGrads g{keys.data(), keys.size(), {rows.data()}};
  EXPECT_THAT((*a)->Post(4, 0, 3, {{}, {1.f, 2.f}}, &g),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("worker 4's step 0 has 3 distinct keys"),
                             HasSubstr("its slots hold 2 keys"))));
  // Within the bound it goes in.
  g.n = 2;
  EXPECT_THAT((*a)->Post(4, 0, 2, {{}, {1.f, 2.f}}, &g), IsOk());
}

TEST(HostSegmentTest, PublishedParametersAreReadFromTheirVersionOn) {
  const std::string name = UniqueName("params");
  auto a = HostSegment::Open(name, {3}, 2);
  ASSERT_THAT(a, IsOk());
  std::vector<std::vector<float>> got;
  EXPECT_EQ((*a)->published(), std::nullopt);
  EXPECT_EQ((*a)->ReadParams(0, &got), std::nullopt);
  ASSERT_TRUE((*a)->Publish(4, {{1.f, 2.f, 3.f}}));
  EXPECT_THAT((*a)->published(), Optional(4u));
  EXPECT_EQ((*a)->ReadParams(5, &got), std::nullopt);
  EXPECT_THAT((*a)->ReadParams(4, &got), Optional(4u));
  EXPECT_THAT(got, ElementsAre(ElementsAre(1.f, 2.f, 3.f)));
}

// Two workers that both took themselves for the host's aggregating one
// (their views apart) may finish out of order: the older parameters do
// not replace the newer.
TEST(HostSegmentTest, PublishedParametersNeverGoBack) {
  const std::string name = UniqueName("back");
  auto a = HostSegment::Open(name, {2}, 2);
  ASSERT_THAT(a, IsOk());
  ASSERT_TRUE((*a)->Publish(5, {{5.f, 5.f}}));
  EXPECT_TRUE((*a)->Publish(4, {{4.f, 4.f}}));
  std::vector<std::vector<float>> got;
  EXPECT_THAT((*a)->ReadParams(0, &got), Optional(5u));
  EXPECT_THAT(got, ElementsAre(ElementsAre(5.f, 5.f)));
  ASSERT_TRUE((*a)->Publish(6, {{6.f, 6.f}}));
  EXPECT_THAT((*a)->ReadParams(6, &got), Optional(6u));
}

TEST(HostSegmentTest, SlotsRunOutAndAreReleasedForWorkersThatLeft) {
  const std::string name = UniqueName("slots");
  auto a = HostSegment::Open(name, {1}, 2);
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT((*a)->Post(1, 0, 1, {{1.f}}), IsOk());
  ASSERT_THAT((*a)->Post(2, 0, 1, {{1.f}}), IsOk());
  EXPECT_THAT((*a)->Post(3, 0, 1, {{1.f}}),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("all 2 worker slots")));
  (*a)->Release(1);
  EXPECT_THAT((*a)->Post(3, 0, 1, {{1.f}}), IsOk());
  std::vector<std::vector<float>> sum;
  EXPECT_EQ((*a)->Sum(0, {1, 3}, &sum), std::nullopt);  // 1's gradient went with its slot
}

TEST(HostSegmentTest, ASegmentOfAnotherModelIsRefusedNamingIt) {
  const std::string name = UniqueName("model");
  auto a = HostSegment::Open(name, {8}, 2);
  ASSERT_THAT(a, IsOk());
  EXPECT_THAT(HostSegment::Open(name, {9}, 2),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr(name), HasSubstr("another model"))));
}

TEST(HostSegmentTest, TheLastToLetGoRemovesTheName) {
  const std::string name = UniqueName("gone");
  {
    auto a = HostSegment::Open(name, {1}, 1);
    ASSERT_THAT(a, IsOk());
    auto b = HostSegment::Open(name, {1}, 1);
    ASSERT_THAT(b, IsOk());
    a->reset();
    EXPECT_EQ(access(("/dev/shm" + name).c_str(), F_OK), 0);
  }
  EXPECT_NE(access(("/dev/shm" + name).c_str(), F_OK), 0);
}

// Another process of the host posts its gradients step after step, each
// once the parameters of its step are published: the aggregating side
// sums and publishes, and a waiter wakes without polling.
TEST(HostSegmentTest, AnotherProcessPostsAndReadsThroughTheSegment) {
  const std::string name = UniqueName("fork");
  auto seg = HostSegment::Open(name, {1000}, 4);
  ASSERT_THAT(seg, IsOk());
  constexpr int kSteps = 20;
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto mine = HostSegment::Open(name, {1000}, 4);
    if (!mine.ok()) _exit(2);
    std::vector<std::vector<float>> params;
    for (uint64_t step = 0; step < kSteps; ++step) {
      std::optional<uint64_t> v;
      for (int i = 0; i < 20000 && !(v = (*mine)->ReadParams(step, &params)); ++i) {
        (*mine)->WaitChange((*mine)->generation(), absl::Milliseconds(1));
      }
      if (!v || *v != step || params[0][999] != static_cast<float>(step)) _exit(3);
      // The gradient: the parameters plus one.
      for (float& x : params[0]) x += 1;
      if (!(*mine)->Post(77, step, 1, params).ok()) _exit(4);
    }
    _exit(0);
  }
  std::vector<std::vector<float>> params{std::vector<float>(1000, 0.f)}, sum;
  for (uint64_t step = 0; step < kSteps; ++step) {
    ASSERT_TRUE((*seg)->Publish(step, params));
    ASSERT_THAT((*seg)->Post(1, step, 1, params), IsOk());
    std::optional<uint64_t> n;
    for (int i = 0; i < 20000 && !(n = (*seg)->Sum(step, {1, 77}, &sum)); ++i) {
      (*seg)->WaitChange((*seg)->generation(), absl::Milliseconds(1));
    }
    ASSERT_THAT(n, Optional(2u)) << "step " << step;
    // step + (step + 1) in every element.
    EXPECT_EQ(sum[0][0], static_cast<float>(2 * step + 1));
    EXPECT_EQ(sum[0][999], static_cast<float>(2 * step + 1));
    std::fill(params[0].begin(), params[0].end(), static_cast<float>(step + 1));
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  (*seg)->Unlink();  // (the child left without letting go)
}

// Hierarchical allreduce: the host's ring member whose ring cannot be
// formed again within the ring's time (here: the other host's member
// never comes) ends its aggregating thread with the error, for its worker
// to exit with (Worker::RunLoop), as a flat ring's member does; it does
// not retry for ever.
TEST(HostAggregatorTest, ARingMemberThatCannotFormARingEndsItsWorker) {
  transport::TransportOptions to;
  to.kind = "tcp";
  DenseSync::Options o;
  o.node_id = 1;
  o.optimizer.type = "sgd";
  o.timeout = absl::Milliseconds(300);
  auto started = StartListeningSync(to, o, {4});
  ASSERT_THAT(started, IsOk());
  proto::ClusterView view;
  view.set_epoch(3);
  view.set_aggregation_key(9);
  for (const auto& [id, host, address] :
       {std::tuple(1u, "a", started->address), std::tuple(2u, "b", std::string("127.0.0.1:1"))}) {
    proto::NodeInfo* n = view.add_members();
    n->set_id(id);
    n->set_role(proto::WORKER);
    n->set_state(proto::ALIVE);
    n->set_host(host);
    n->set_data_address(address);
  }
  ParamClient params(
      started->transport.get(), 1, [view]() -> absl::StatusOr<proto::ClusterView> { return view; },
      absl::Seconds(1));
  params.SetView(view);
  std::vector<std::vector<float>> tables = {std::vector<float>(4, 0.5f)};
  DenseRing::Hooks hooks;
  hooks.fetch_view = [view]() -> absl::StatusOr<proto::ClusterView> { return view; };
  hooks.epoch_seen = [] { return uint64_t{3}; };
  hooks.stopping = [] { return false; };
  DenseRing ring(started->sync.get(), 1, &tables, {0}, std::move(hooks),
                 /*reform_timeout=*/absl::Milliseconds(500), /*by_host=*/true);
  auto segment = HostSegment::Open(UniqueName("gaveup"), {4}, 4);
  ASSERT_THAT(segment, IsOk());
  HostAggregator agg(*std::move(segment), &params,
                     HostAggregator::Options{1, "a", absl::Seconds(1), &ring, &tables}, {4});
  agg.Start();
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (agg.fatal().ok() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_THAT(agg.fatal(), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("formed no ring")));
  EXPECT_TRUE(agg.failed());  // (the worker's waits end on it: Worker::stopping)
  EXPECT_TRUE(ring.gave_up());
  agg.Stop();
  started->transport->Shutdown();
}

// Hierarchical allreduce: host b's workers have all finished (its member
// is FINISHED) while host a trains. Host b's member steps the ring with no
// samples, and its version follows the ring's updates, which are host a's
// steps: the job's version, which b's workers evaluate at (the master's
// min_version) and a task b gets again pushes at. (It kept its own count
// once: b's evaluator waited the request timeout for a version that never
// came, and a task it got again pushed at that old version.)
TEST(HostAggregatorTest, AHostWhoseWorkersAllFinishedKeepsUpWithTheJobsVersion) {
  transport::TransportOptions to;
  to.kind = "tcp";
  DenseSync::Options o;
  o.optimizer.type = "sgd";
  o.timeout = absl::Seconds(10);
  std::vector<ListeningSync> syncs;
  for (uint32_t id : {1u, 2u}) {
    o.node_id = id;
    auto started = StartListeningSync(to, o, {4});
    ASSERT_THAT(started, IsOk());
    syncs.push_back(*std::move(started));
  }
  proto::ClusterView view;
  view.set_epoch(3);
  view.set_aggregation_key(9);
  for (const auto& [id, host, state] :
       {std::tuple(1u, "a", proto::ALIVE), std::tuple(2u, "b", proto::FINISHED)}) {
    proto::NodeInfo* n = view.add_members();
    n->set_id(id);
    n->set_role(proto::WORKER);
    n->set_state(state);
    n->set_host(host);
    n->set_data_address(syncs[id - 1].address);
  }
  struct Host {
    std::unique_ptr<ParamClient> params;
    std::vector<std::vector<float>> tables;
    std::unique_ptr<DenseRing> ring;
    std::unique_ptr<HostAggregator> agg;
    std::unique_ptr<HostSegment> worker;  // a worker's mapping of the segment
  };
  std::vector<Host> hosts(2);
  for (uint32_t h = 0; h < 2; ++h) {
    Host& host = hosts[h];
    const std::string name = UniqueName(h == 0 ? "keep-a" : "keep-b");
    host.params = std::make_unique<ParamClient>(
        syncs[h].transport.get(), h + 1,
        [view]() -> absl::StatusOr<proto::ClusterView> { return view; }, absl::Seconds(5));
    host.params->SetView(view);
    host.tables = {std::vector<float>(4, 0.5f)};
    DenseRing::Hooks hooks;
    hooks.fetch_view = [view]() -> absl::StatusOr<proto::ClusterView> { return view; };
    hooks.epoch_seen = [] { return uint64_t{3}; };
    hooks.stopping = [] { return false; };
    host.ring = std::make_unique<DenseRing>(syncs[h].sync.get(), h + 1, &host.tables,
                                            std::vector<size_t>{0}, std::move(hooks),
                                            absl::Seconds(10), /*by_host=*/true);
    auto segment = HostSegment::Open(name, {4}, 4);
    ASSERT_THAT(segment, IsOk());
    auto worker = HostSegment::Open(name, {4}, 4);
    ASSERT_THAT(worker, IsOk());
    host.worker = *std::move(worker);
    host.agg = std::make_unique<HostAggregator>(
        *std::move(segment), host.params.get(),
        HostAggregator::Options{h + 1, h == 0 ? "a" : "b", absl::Seconds(10), host.ring.get(),
                                &host.tables},
        std::vector<size_t>{4});
  }
  for (Host& host : hosts) host.agg->Start();
  // Host a's one worker (node 1) trains 3 steps: each at the version its
  // host published, with a gradient of 1 sample.
  std::vector<std::vector<float>> read;
  for (uint64_t step = 0; step < 3; ++step) {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (!hosts[0].worker->ReadParams(step, &read).has_value() && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    ASSERT_THAT(hosts[0].worker->published(), Optional(step));
    ASSERT_THAT(hosts[0].worker->Post(1, step, 1, {{1.f, 2.f, 3.f, 4.f}}), IsOk());
  }
  // Its task is done once version 3 is published; then it has no task:
  // it posts no samples to each version, as a worker told to wait does,
  // so that the ring steps on.
  std::vector<std::vector<float>> at_a, at_b;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (!hosts[0].worker->ReadParams(3, &at_a).has_value() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  while (!hosts[1].worker->ReadParams(3, &at_b).has_value() && absl::Now() < deadline) {
    hosts[0].agg->IdleFor(absl::Milliseconds(20), {std::vector<float>(4, 0.f)},
                          [] { return false; });
  }
  EXPECT_THAT(hosts[0].worker->published(), Optional(3u));
  EXPECT_THAT(hosts[1].worker->published(), Optional(3u));
  EXPECT_EQ(hosts[1].ring->updates(), 3u);
  EXPECT_EQ(at_a, at_b);
  EXPECT_NE(at_a, std::vector<std::vector<float>>{std::vector<float>(4, 0.5f)});
  // Host b's worker gets a task again (a dead worker's, returned): it is
  // ALIVE, and its step is at the job's version (the pservers', where a
  // CTR model's rows go), while host a's worker waits.
  view.set_epoch(4);
  view.mutable_members(1)->set_state(proto::ALIVE);
  for (Host& host : hosts) host.params->SetView(view);
  const std::optional<uint64_t> b_at = hosts[1].worker->published();
  ASSERT_THAT(b_at, Optional(3u));
  ASSERT_THAT(hosts[1].worker->Post(2, *b_at, 1, {{1.f, 1.f, 1.f, 1.f}}), IsOk());
  while (!hosts[1].worker->ReadParams(4, &at_b).has_value() && absl::Now() < deadline) {
    hosts[0].agg->IdleFor(absl::Milliseconds(20), {std::vector<float>(4, 0.f)},
                          [] { return false; });
  }
  while (!hosts[0].worker->ReadParams(4, &at_a).has_value() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_THAT(hosts[0].worker->published(), Optional(4u));
  EXPECT_THAT(hosts[1].worker->published(), Optional(4u));
  EXPECT_EQ(hosts[0].ring->updates(), 4u);
  EXPECT_EQ(at_a, at_b);
  for (uint32_t h = 0; h < 2; ++h) {
    syncs[h].sync->Abort(absl::CancelledError("the test is over"));
    hosts[h].agg->Stop();
  }
  for (ListeningSync& s : syncs) s.transport->Shutdown();
}

TEST(HostAggregatorTest, TheEvaluatorPostsNothingToTheStepsItWaitsFor) {
  // The host's member sums version 5 once both workers posted it; the
  // worker that evaluates waits for version 6 (after the job's last
  // step): it posts no samples to version 5, so that 6 comes. A version
  // that never comes: it takes what is published at the timeout.
  transport::TransportOptions to;
  to.kind = "tcp";
  auto transport = transport::CreateTransport(to);
  ASSERT_THAT(transport, IsOk());
  proto::ClusterView view;
  view.set_epoch(1);
  ParamClient params(
      transport->get(), 2, [view]() -> absl::StatusOr<proto::ClusterView> { return view; },
      absl::Seconds(1));
  const std::string name = UniqueName("final");
  auto member = HostSegment::Open(name, {2}, 2);
  ASSERT_THAT(member, IsOk());
  ASSERT_TRUE((*member)->Publish(5, {{1.f, 1.f}}));
  ASSERT_THAT((*member)->Post(1, 5, 3, {{3.f, 3.f}}), IsOk());
  auto mine = HostSegment::Open(name, {2}, 2);
  ASSERT_THAT(mine, IsOk());
  HostAggregator agg(*std::move(mine), &params,
                     HostAggregator::Options{2, "a", absl::Milliseconds(400)}, {2});
  std::thread leader([&] {
    std::vector<std::vector<float>> sum;
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    std::optional<uint64_t> count;
    while (!(count = (*member)->Sum(5, {1, 2}, &sum)).has_value() && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    ASSERT_THAT(count, Optional(3u));  // (worker 2's post had no samples)
    EXPECT_THAT(sum, ElementsAre(ElementsAre(3.f, 3.f)));
    ASSERT_TRUE((*member)->Publish(6, {{0.5f, 0.5f}}));
  });
  const std::vector<std::vector<float>> zeros = {{0.f, 0.f}};
  std::vector<std::vector<float>> got;
  absl::StatusOr<uint64_t> v = agg.AwaitFinalParams(6, &got, zeros, [] { return false; });
  ASSERT_THAT(v, IsOk());
  EXPECT_EQ(*v, 6u);
  EXPECT_THAT(got, ElementsAre(ElementsAre(0.5f, 0.5f)));
  leader.join();
  v = agg.AwaitFinalParams(9, &got, zeros, [] { return false; });
  ASSERT_THAT(v, IsOk());
  EXPECT_EQ(*v, 6u);
  (*transport)->Shutdown();
}

}  // namespace
}  // namespace strata::worker
