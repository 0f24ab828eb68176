// The worker's ring of the view's workers (worker/dense_ring.h) over
// in-process transports, against a view the test changes as a master
// would: members that train, one out of tasks that steps with no samples,
// one killed mid-run (the others' step fails, the next view's ring goes on
// without it; also with steps that overlap a backward pass), one that
// joins at a step boundary; every member ends with the same parameters at
// the same step.
#include "worker/dense_ring.h"

#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/dense_sync_testing.h"

namespace strata::worker {
namespace {

using ::strata::testing::IsOk;
using ::strata::testing::StatusIs;

const std::vector<size_t> kTables = {300, 7};

// The master's view, as the test sets it.
class FakeMaster {
 public:
  void Set(uint32_t node, const std::string& address, proto::NodeState state) {
    absl::MutexLock l(&mu_);
    proto::NodeInfo* n = nullptr;
    for (auto& m : *view_.mutable_members()) {
      if (m.id() == node) n = &m;
    }
    if (n == nullptr) n = view_.add_members();
    n->set_id(node);
    n->set_role(proto::WORKER);
    n->set_state(state);
    n->set_data_address(address);
    view_.set_epoch(view_.epoch() + 1);
  }
  proto::ClusterView view() const {
    absl::MutexLock l(&mu_);
    return view_;
  }
  uint64_t epoch() const {
    absl::MutexLock l(&mu_);
    return view_.epoch();
  }

 private:
  mutable absl::Mutex mu_;
  proto::ClusterView view_;
};

struct Member {
  uint32_t node_id = 0;
  std::unique_ptr<transport::Transport> transport;
  std::unique_ptr<DenseSync> sync;
  std::vector<std::vector<float>> tables;
  std::unique_ptr<DenseRing> ring;
  std::string address;
  std::atomic<bool> stop{false};
};

class DenseRingTest : public ::testing::Test {
 protected:
  DenseRingTest() : net_(transport::NewInProcNetwork()) {}
  ~DenseRingTest() override {
    for (auto& m : members_) m->transport->Shutdown();
  }

  Member* Add(uint32_t node_id, std::vector<size_t> ring_tables = {0, 1}, size_t bucket_bytes = 0) {
    auto m = std::make_unique<Member>();
    m->node_id = node_id;
    transport::TransportOptions to;
    to.kind = "inproc";
    to.inproc_network = net_;
    DenseSync::Options o;
    o.node_id = node_id;
    o.optimizer.type = "sgd";
    o.optimizer.learning_rate = 0.1;
    o.chunk_bytes = 256;
    o.timeout = absl::Seconds(5);
    o.bucket_bytes = bucket_bytes;
    std::vector<size_t> sizes;
    for (size_t t : ring_tables) sizes.push_back(kTables[t]);
    auto started = StartListeningSync(to, o, sizes);
    EXPECT_THAT(started, IsOk());
    m->transport = std::move(started->transport);
    m->sync = std::move(started->sync);
    m->address = started->address;
    for (size_t n : kTables) m->tables.emplace_back(n, 0.5f + node_id);  // (differ at first)
    DenseRing::Hooks hooks;
    hooks.fetch_view = [this]() -> absl::StatusOr<proto::ClusterView> { return master_.view(); };
    hooks.epoch_seen = [this] { return master_.epoch(); };
    Member* raw = m.get();
    hooks.stopping = [raw] { return raw->stop.load(); };
    m->ring =
        std::make_unique<DenseRing>(m->sync.get(), node_id, &m->tables, std::move(ring_tables),
                                    std::move(hooks), absl::Seconds(20));
    members_.push_back(std::move(m));
    return members_.back().get();
  }

  // Trains until the member's next step is `until` (each step: a gradient
  // of the node id over one sample), from its own thread.
  static absl::Status Train(Member* m, uint64_t until) {
    STRATA_RETURN_IF_ERROR(m->ring->Join());
    std::vector<std::vector<float>> g;
    for (size_t n : kTables) g.emplace_back(n, static_cast<float>(m->node_id));
    while (m->ring->next_step() < until) {
      STRATA_RETURN_IF_ERROR(m->ring->TrainStep(g, 1).status());
    }
    return absl::OkStatus();
  }

  // Train with each step overlapping a backward pass: begun, its
  // gradients handed over from the last table to the first, then ended.
  static absl::Status TrainOverlapped(Member* m, uint64_t until) {
    STRATA_RETURN_IF_ERROR(m->ring->Join());
    std::vector<std::vector<float>> g;
    for (size_t n : kTables) g.emplace_back(n, static_cast<float>(m->node_id));
    while (m->ring->next_step() < until) {
      if (m->ring->BeginStep(1)) {
        for (size_t t = kTables.size(); t-- > 0;) {
          for (size_t end = 50; end < kTables[t] + 50; end += 50) {
            m->ring->GradsReady(t, g[t].data(), std::min(end, kTables[t]));
          }
        }
      }
      STRATA_RETURN_IF_ERROR(m->ring->TrainStep(g, 1).status());
    }
    return absl::OkStatus();
  }

  // The 3 members of `ms` train with `train`; the third is killed after
  // step 10 (its transport goes, the others' next step fails; the master
  // declares it dead a moment later), the others go on to step 40 on the
  // next view's ring, with the same tables.
  void KillTheThirdAtStep10(const std::vector<Member*>& ms,
                            absl::Status (*train)(Member*, uint64_t)) {
    for (Member* m : ms) master_.Set(m->node_id, m->address, proto::ALIVE);
    std::vector<absl::Status> st(2);
    std::vector<std::thread> threads;
    for (int i = 0; i < 2; ++i) threads.emplace_back([&, i] { st[i] = train(ms[i], 40); });
    EXPECT_THAT(train(ms[2], 10), IsOk());
    ms[2]->transport->Shutdown();
    absl::SleepFor(absl::Milliseconds(300));
    master_.Set(3, ms[2]->address, proto::DEAD);
    for (auto& t : threads) t.join();
    for (const auto& s : st) EXPECT_THAT(s, IsOk());
    EXPECT_EQ(ms[0]->ring->next_step(), 40);
    EXPECT_EQ(ms[1]->ring->next_step(), 40);
    ExpectSameTables({ms[0], ms[1]});
    EXPECT_EQ(ms[0]->ring->rings_formed(), 2);
  }

  // The 2 members of `ms`, alive in the view, train together until their
  // next step is `until`.
  void TrainBothTo(const std::vector<Member*>& ms, uint64_t until) {
    for (Member* m : ms) master_.Set(m->node_id, m->address, proto::ALIVE);
    std::vector<absl::Status> st(2);
    std::thread t0([&] { st[0] = Train(ms[0], until); });
    std::thread t1([&] { st[1] = Train(ms[1], until); });
    t0.join();
    t1.join();
    ASSERT_THAT(st[0], IsOk());
    ASSERT_THAT(st[1], IsOk());
  }

  void ExpectSameTables(const std::vector<Member*>& ms) {
    for (Member* m : ms) {
      EXPECT_EQ(m->tables, ms.front()->tables) << "node " << m->node_id;
    }
  }

  std::shared_ptr<transport::InProcNetwork> net_;
  FakeMaster master_;
  std::vector<std::unique_ptr<Member>> members_;
};

TEST_F(DenseRingTest, MembersAreTheViewsAliveAndFinishedWorkersByNodeId) {
  proto::ClusterView v;
  auto add = [&v](uint32_t id, proto::Role role, proto::NodeState state) {
    proto::NodeInfo* n = v.add_members();
    n->set_id(id);
    n->set_role(role);
    n->set_state(state);
    n->set_data_address(absl::StrCat("h:", id));
  };
  add(9, proto::WORKER, proto::ALIVE);
  add(2, proto::PSERVER, proto::ALIVE);
  add(4, proto::WORKER, proto::FINISHED);
  add(5, proto::WORKER, proto::JOINING);
  add(6, proto::WORKER, proto::DEAD);
  add(7, proto::WORKER, proto::DRAINED);
  add(3, proto::WORKER, proto::ALIVE);
  std::vector<uint32_t> ids;
  for (const auto& m : DenseRing::MembersOf(v)) ids.push_back(m.node_id);
  EXPECT_THAT(ids, ::testing::ElementsAre(3, 4, 9));
  EXPECT_EQ(DenseRing::MembersOf(v)[0].address, "h:3");
  // Hierarchical (cluster.aggregation node): one member per host, its
  // lowest worker in the job, ALIVE or FINISHED.
  for (int i = 0; i < v.members_size(); ++i) {
    v.mutable_members(i)->set_host(v.members(i).id() == 9 ? "b" : "a");
  }
  ids.clear();
  for (const auto& m : DenseRing::MembersOf(v, /*by_host=*/true)) ids.push_back(m.node_id);
  EXPECT_THAT(ids, ::testing::ElementsAre(3, 9));
  v.mutable_members(6)->set_state(proto::FINISHED);  // node 3
  v.mutable_members(0)->set_state(proto::FINISHED);  // node 9
  ids.clear();
  for (const auto& m : DenseRing::MembersOf(v, true)) ids.push_back(m.node_id);
  EXPECT_THAT(ids, ::testing::ElementsAre(3, 9));
  v.mutable_members(2)->set_state(proto::ALIVE);  // node 4: node 3 keeps its seat
  ids.clear();
  for (const auto& m : DenseRing::MembersOf(v, true)) ids.push_back(m.node_id);
  EXPECT_THAT(ids, ::testing::ElementsAre(3, 9));
  v.mutable_members(6)->set_state(proto::DEAD);  // node 3 dies: node 4 takes it
  ids.clear();
  for (const auto& m : DenseRing::MembersOf(v, true)) ids.push_back(m.node_id);
  EXPECT_THAT(ids, ::testing::ElementsAre(4, 9));
}

TEST_F(DenseRingTest, MembersTrainTogetherAndOneOutOfTasksStepsWithNoSamples) {
  std::vector<Member*> ms = {Add(1), Add(2), Add(3)};
  for (Member* m : ms) master_.Set(m->node_id, m->address, proto::ALIVE);
  std::vector<absl::Status> st(3);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) threads.emplace_back([&, i] { st[i] = Train(ms[i], 30); });
  // Member 3 trains 5 steps, then has no task: it leaves the step set
  // (FINISHED, still in the ring) and steps with no samples.
  threads.emplace_back([&] {
    st[2] = Train(ms[2], 5);
    master_.Set(3, ms[2]->address, proto::FINISHED);
    // (One step a call: the others stop at step 30.)
    while (st[2].ok() && ms[2]->ring->next_step() < 30) {
      st[2] = ms[2]->ring->IdleFor(absl::ZeroDuration());
    }
  });
  for (auto& t : threads) t.join();
  for (const auto& s : st) EXPECT_THAT(s, IsOk());
  EXPECT_EQ(ms[0]->ring->next_step(), 30);
  EXPECT_EQ(ms[1]->ring->next_step(), 30);
  EXPECT_EQ(ms[2]->ring->next_step(), 30);
  ExpectSameTables(ms);
  // FINISHED keeps the ring as it was: formed once, no step failed.
  for (Member* m : ms) {
    EXPECT_EQ(m->ring->rings_formed(), 1) << m->node_id;
    EXPECT_EQ(m->ring->steps_failed(), 0) << m->node_id;
  }
  // Equal starts (the first member's values), then SGD on the mean of
  // the gradients: 1 and 2 (and 3 while it trained).
  const float expected = 1.5f - 0.1f * (5 * 2.0f + 25 * 1.5f);
  EXPECT_NEAR(ms[0]->tables[1][0], expected, 1e-4);
}

TEST_F(DenseRingTest, AKilledMemberLeavesAndTheOthersGoOnWithTheNextView) {
  std::vector<Member*> ms = {Add(1), Add(2), Add(3)};
  KillTheThirdAtStep10(ms, Train);
  EXPECT_GE(ms[0]->ring->steps_failed() + ms[1]->ring->steps_failed(), 1);
}

TEST_F(DenseRingTest, StepsOverlappingTheBackwardPassGoOnAcrossAKilledMember) {
  // Buckets of 64 floats (table 0 in 5 pieces of 60); the step that fails
  // was begun on the killed member's ring and is retried whole on the
  // next.
  std::vector<Member*> ms = {Add(1, {0, 1}, 256), Add(2, {0, 1}, 256), Add(3, {0, 1}, 256)};
  EXPECT_EQ(ms[0]->ring->BucketStarts(0), (std::vector<uint64_t>{60, 120, 180, 240}));
  KillTheThirdAtStep10(ms, TrainOverlapped);
  EXPECT_GE(ms[0]->ring->steps_overlapped(), 30u);
  // SGD, lr 0.1, a gradient of the node id a sample: 10 steps of 3
  // members (mean 2), 30 of 2 (mean 1.5) from the first member's 1.5.
  EXPECT_NEAR(ms[0]->tables[0][0], 1.5f - 0.1f * (10 * 2.f + 30 * 1.5f), 1e-4);
}

TEST_F(DenseRingTest, AJoiningMemberComesInAtAStepBoundary) {
  std::vector<Member*> ms = {Add(1), Add(2)};
  for (Member* m : ms) master_.Set(m->node_id, m->address, proto::ALIVE);
  std::vector<absl::Status> st(3);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) threads.emplace_back([&, i] { st[i] = Train(ms[i], 60); });
  while (ms[0]->ring->next_step() < 10) absl::SleepFor(absl::Milliseconds(1));
  // A worker that leases its first task: ALIVE in a new view; it joins,
  // and the others take it in once a step carries that view's epoch.
  Member* joiner = Add(3);
  master_.Set(3, joiner->address, proto::ALIVE);
  threads.emplace_back([&] { st[2] = Train(joiner, 60); });
  for (auto& t : threads) t.join();
  for (const auto& s : st) EXPECT_THAT(s, IsOk());
  EXPECT_GT(joiner->ring->rings_formed(), 0);
  ExpectSameTables({ms[0], ms[1], joiner});
  EXPECT_EQ(joiner->ring->next_step(), 60);
}

TEST_F(DenseRingTest, AMemberLeftOutOfTheViewCannotTrain) {
  std::vector<Member*> ms = {Add(1), Add(2)};
  master_.Set(1, ms[0]->address, proto::ALIVE);
  master_.Set(2, ms[1]->address, proto::JOINING);
  // Member 2 is not in the view's ring: Join leaves it out, TrainStep says so.
  EXPECT_THAT(ms[1]->ring->Join(), IsOk());
  EXPECT_FALSE(ms[1]->ring->in_ring());
  EXPECT_THAT(ms[1]->ring->TrainStep(ms[1]->tables, 1).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::HasSubstr("no ring")));
  // Member 1 alone: a ring of one.
  EXPECT_THAT(Train(ms[0], 3), IsOk());
  EXPECT_EQ(ms[0]->ring->next_step(), 3);
}

TEST_F(DenseRingTest, OnlyTheRingsTablesAreSteppedAndTheirGradientsChecked) {
  // Table 0 is another's (a sparse table on the pservers): left alone.
  std::vector<Member*> ms = {Add(1, {1}), Add(2, {1})};
  for (Member* m : ms) master_.Set(m->node_id, m->address, proto::ALIVE);
  std::vector<absl::Status> st(2);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) threads.emplace_back([&, i] { st[i] = Train(ms[i], 3); });
  for (auto& t : threads) t.join();
  for (const auto& s : st) EXPECT_THAT(s, IsOk());
  EXPECT_EQ(ms[0]->tables[1], ms[1]->tables[1]);
  EXPECT_EQ(ms[0]->tables[0], std::vector<float>(kTables[0], 1.5f));
  EXPECT_EQ(ms[1]->tables[0], std::vector<float>(kTables[0], 2.5f));
  std::vector<std::vector<float>> bad = {std::vector<float>(kTables[0]), std::vector<float>(3)};
  EXPECT_THAT(ms[0]->ring->TrainStep(bad, 1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("the gradient of table 1 has 3 floats, its table 7")));
}

// The job over (DenseSync::Abort, from the heartbeats or a stopping
// worker): a member idling in a step whose other member left without a
// word ends it at once, not at the ring's timeout (5 s here), and forms
// no ring after it; IdleFor waits then, Join is OK (this member holds the
// ring's parameters: the step ended had no samples), TrainStep fails.
TEST_F(DenseRingTest, AbortEndsAnIdleStepAtOnceAndNoRingFormsAfter) {
  std::vector<Member*> ms = {Add(1), Add(2)};
  ASSERT_NO_FATAL_FAILURE(TrainBothTo(ms, 3));
  // Member 2 is gone, silently (its connections stay open): member 1 idles
  // in a step that cannot complete.
  const absl::Time start = absl::Now();
  absl::Status idle;
  std::thread waiter([&] { idle = ms[0]->ring->IdleFor(absl::Milliseconds(10)); });
  absl::SleepFor(absl::Milliseconds(200));
  ms[0]->sync->Abort(absl::CancelledError("the job is over"));
  waiter.join();
  EXPECT_THAT(idle, IsOk());  // (the caller asks the master what to do)
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_EQ(ms[0]->ring->steps_failed(), 0u);  // (an end, not a failure)
  EXPECT_TRUE(ms[0]->ring->over());
  const uint64_t formed = ms[0]->ring->rings_formed();
  master_.Set(3, "nowhere", proto::ALIVE);  // a new view: no ring forms
  EXPECT_THAT(ms[0]->ring->Join(), IsOk());
  EXPECT_THAT(ms[0]->ring->IdleFor(absl::Milliseconds(10)), IsOk());
  std::vector<std::vector<float>> g;
  for (size_t n : kTables) g.emplace_back(n, 1.f);
  EXPECT_THAT(ms[0]->ring->TrainStep(g, 1).status(), StatusIs(absl::StatusCode::kCancelled));
  EXPECT_EQ(ms[0]->ring->rings_formed(), formed);

  // A worker that was in no ring when training ended holds no ring's
  // parameters: it cannot evaluate (its Join says so); it idles.
  Member* late = Add(4);
  late->sync->Abort(absl::CancelledError("training is over"));
  EXPECT_THAT(late->ring->Join(), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(late->ring->IdleFor(absl::Milliseconds(10)), IsOk());
}

// The job over while a member is in a step with samples whose first
// exchange went through (the other member began it and handed nothing
// over): another member may have completed that step, so the member ended
// by the Abort does not hold the trained model; its Join says so (it
// cannot evaluate). The same Abort in a step of no samples leaves the
// member holding it (AbortEndsAnIdleStepAtOnceAndNoRingFormsAfter).
TEST_F(DenseRingTest, AnAbortAfterAStepsFirstExchangeLeavesNoModelToEvaluate) {
  std::vector<Member*> ms = {Add(1, {0, 1}, 256), Add(2, {0, 1}, 256)};
  ASSERT_NO_FATAL_FAILURE(TrainBothTo(ms, 3));
  // Member 2 begins step 3 (its first exchange goes at once) and its
  // backward pass never ends; member 1 steps 3 with its sample.
  ASSERT_TRUE(ms[1]->ring->BeginStep(1));
  std::vector<std::vector<float>> g;
  for (size_t n : kTables) g.emplace_back(n, 1.f);
  absl::Status stepped;
  std::thread stepper([&] { stepped = ms[0]->ring->TrainStep(g, 1).status(); });
  // (The first exchange is done in microseconds here; 1 s leaves a loaded
  // machine time to schedule both threads.)
  absl::SleepFor(absl::Seconds(1));
  ms[0]->sync->Abort(absl::CancelledError("the job is over"));
  stepper.join();
  EXPECT_THAT(stepped, StatusIs(absl::StatusCode::kCancelled));
  EXPECT_EQ(ms[0]->sync->cut_short_samples(), std::optional<uint64_t>(2));
  EXPECT_THAT(ms[0]->ring->Join(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                            ::testing::HasSubstr("cannot evaluate")));
  ms[1]->sync->Abort(absl::CancelledError("the job is over"));
  ms[1]->ring->AbandonStep(absl::CancelledError("the job is over"));
}

}  // namespace
}  // namespace strata::worker
