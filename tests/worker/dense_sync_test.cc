// Dense tables by allreduce with the optimizer sharded over the workers
// (worker/dense_sync.h), against one optimizer applied to the mean
// gradient directly: rings of 1-4 members over the inproc and tcp
// transports, uneven samples (a member with none), tables that do not
// divide by the ring; a member lost mid-step (its shard's state comes from
// its replica, the step is retried by those left), a member that joins
// (it gets the parameters and a share of the state), two neighbours lost
// at once (their shard's state is gone: counted); and bad calls.
#include "worker/dense_sync.h"

#include <cmath>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/dense_sync_testing.h"

namespace strata::worker {
namespace {

using ::strata::testing::IsOk;
using ::strata::testing::StatusIs;
using ::testing::HasSubstr;

const std::vector<size_t> kTables = {1001, 37, 5};

size_t Total() {
  size_t n = 0;
  for (size_t t : kTables) n += t;
  return n;
}

OptimizerSection Adam() {
  OptimizerSection o;
  o.type = "adam";
  o.learning_rate = 0.01;
  return o;
}

// A member: its transport, its DenseSync and its model's tables.
struct Member {
  uint32_t node_id = 0;
  std::unique_ptr<transport::Transport> transport;
  std::unique_ptr<DenseSync> sync;
  std::vector<std::vector<float>> params;
  std::string address;
  std::vector<float*> param_ptrs() {
    std::vector<float*> p;
    for (auto& t : params) p.push_back(t.data());
    return p;
  }
};

class Cluster {
 public:
  explicit Cluster(std::string kind = "inproc", absl::Duration timeout = absl::Seconds(3),
                   OptimizerSection opt = Adam())
      : kind_(std::move(kind)), timeout_(timeout), opt_(std::move(opt)) {
    if (kind_ == "inproc") net_ = transport::NewInProcNetwork();
  }
  ~Cluster() {
    for (auto& m : members_) {
      if (m->transport != nullptr) m->transport->Shutdown();
    }
  }
  // A new member; its tables start at `init` + its id (so that a ring's
  // first Form must pick one member's values).
  Member* Add(uint32_t node_id, std::optional<uint64_t> fail_after_step = std::nullopt) {
    auto m = std::make_unique<Member>();
    m->node_id = node_id;
    transport::TransportOptions to;
    to.kind = kind_;
    to.lend_request_payloads = true;
    to.inproc_network = net_;
    DenseSync::Options o;
    o.node_id = node_id;
    o.optimizer = opt_;
    o.chunk_bytes = 1024;  // (chunks that divide nothing here)
    o.timeout = timeout_;
    o.fail_after_step_for_testing = fail_after_step;
    auto started = StartListeningSync(to, o, kTables);
    EXPECT_THAT(started, IsOk());
    m->transport = std::move(started->transport);
    m->sync = std::move(started->sync);
    m->address = started->address;
    for (size_t t = 0; t < kTables.size(); ++t) {
      m->params.emplace_back(kTables[t]);
      for (size_t i = 0; i < kTables[t]; ++i) {
        m->params[t][i] = 0.01f * static_cast<float>(i % 17) + 0.1f * t + node_id;
      }
    }
    members_.push_back(std::move(m));
    return members_.back().get();
  }
  // Kills a member: its transport goes, so sends to it fail.
  void Kill(Member* m) { m->transport->Shutdown(); }

  // Forms the ring of `ring` for `epoch`, on every member at once; their
  // results.
  std::vector<absl::StatusOr<DenseSync::Formed>> Form(uint64_t epoch,
                                                      const std::vector<Member*>& ring) {
    std::vector<DenseSync::Member> list;
    for (Member* m : ring) list.push_back({m->node_id, m->address});
    std::vector<absl::StatusOr<DenseSync::Formed>> out(ring.size(), absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (size_t i = 0; i < ring.size(); ++i) {
      threads.emplace_back(
          [&, i] { out[i] = ring[i]->sync->Form(epoch, list, ring[i]->param_ptrs()); });
    }
    for (auto& t : threads) t.join();
    return out;
  }
  // Step `step` on every member of `ring` at once, each with its gradient
  // from Grad(member, step) over Samples(member, step).
  std::vector<absl::StatusOr<DenseSync::StepResult>> Step(uint64_t step,
                                                          const std::vector<Member*>& ring,
                                                          uint64_t epoch_seen = 0) {
    std::vector<absl::StatusOr<DenseSync::StepResult>> out(ring.size(),
                                                           absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (size_t i = 0; i < ring.size(); ++i) {
      threads.emplace_back([&, i] {
        std::vector<std::vector<float>> g = Grads(ring[i]->node_id, step);
        std::vector<const float*> gp;
        for (auto& t : g) gp.push_back(t.data());
        out[i] = ring[i]->sync->Step(step, gp, Samples(ring[i]->node_id, step), epoch_seen,
                                     ring[i]->param_ptrs());
      });
    }
    for (auto& t : threads) t.join();
    return out;
  }

  static uint64_t Samples(uint32_t node, uint64_t step) { return (node * 7 + step * 3) % 5; }
  // A gradient summed over Samples(node, step) samples.
  static std::vector<std::vector<float>> Grads(uint32_t node, uint64_t step) {
    std::vector<std::vector<float>> g;
    for (size_t t = 0; t < kTables.size(); ++t) {
      g.emplace_back(kTables[t]);
      for (size_t i = 0; i < kTables[t]; ++i) {
        g[t][i] = static_cast<float>(Samples(node, step)) *
                  static_cast<float>(std::sin(0.3 * i + node + 0.7 * step + t));
      }
    }
    return g;
  }

 private:
  std::string kind_;
  absl::Duration timeout_;
  OptimizerSection opt_;
  std::shared_ptr<transport::InProcNetwork> net_;
  std::vector<std::unique_ptr<Member>> members_;
};

// One optimizer over the flat tables, stepped with the mean gradient of
// the members given for each step.
class Reference {
 public:
  Reference(const std::vector<float>& init, const OptimizerSection& opt) : params_(init) {
    opt_ = *Optimizer::Create(opt, init.size());
  }
  void Step(uint64_t step, const std::vector<uint32_t>& nodes) {
    std::vector<float> sum(params_.size(), 0.f);
    uint64_t samples = 0;
    for (uint32_t n : nodes) {
      samples += Cluster::Samples(n, step);
      size_t at = 0;
      for (const auto& t : Cluster::Grads(n, step)) {
        for (float v : t) sum[at++] += v;
      }
    }
    if (samples == 0) return;
    opt_->ApplyRange(0, params_.data(), sum.data(), 1.f / static_cast<float>(samples),
                     params_.size(), ++updates_);
  }
  const std::vector<float>& params() const { return params_; }

 private:
  std::vector<float> params_;
  std::unique_ptr<Optimizer> opt_;
  uint64_t updates_ = 0;
};

std::vector<float> Flat(const Member& m) {
  std::vector<float> f;
  for (const auto& t : m.params) f.insert(f.end(), t.begin(), t.end());
  return f;
}

// Every member of `ring` holds the reference's parameters (float
// tolerance: the ring sums in another order) and the same bytes.
void ExpectParams(const std::vector<Member*>& ring, const Reference& ref, const char* when) {
  const std::vector<float> first = Flat(*ring[0]);
  double worst = 0;
  for (size_t i = 0; i < first.size(); ++i) {
    worst = std::max(worst,
                     std::fabs(first[i] - ref.params()[i]) / (1e-3 + std::fabs(ref.params()[i])));
  }
  EXPECT_LT(worst, 1e-4) << when;
  for (size_t r = 1; r < ring.size(); ++r) {
    EXPECT_EQ(Flat(*ring[r]), first) << when << ": member " << ring[r]->node_id;
  }
}

TEST(DenseSyncTest, ShardedOptimizerMatchesOneOptimizerOnTheMean) {
  for (int w : {1, 2, 3, 4}) {
    Cluster c;
    std::vector<Member*> ring;
    std::vector<uint32_t> nodes;
    for (int i = 0; i < w; ++i) {
      ring.push_back(c.Add(10 + i));
      nodes.push_back(10 + i);
    }
    for (auto& f : c.Form(1, ring)) {
      ASSERT_THAT(f, IsOk());
      EXPECT_EQ(f->next_step, 0u);
      EXPECT_EQ(f->lost_state, 0u);
    }
    // Everyone starts from the first member's values.
    Reference ref(Flat(*ring[0]), Adam());
    ExpectParams(ring, ref, "formed");
    for (uint64_t step = 0; step < 6; ++step) {
      uint64_t want = 0;
      for (uint32_t n : nodes) want += Cluster::Samples(n, step);
      for (auto& r : c.Step(step, ring, /*epoch_seen=*/step)) {
        ASSERT_THAT(r, IsOk());
        EXPECT_EQ(r->samples, want);
        EXPECT_EQ(r->max_epoch, step);
      }
      ref.Step(step, nodes);
      ExpectParams(ring, ref, absl::StrCat(w, " members, step ", step).c_str());
    }
    // Each holds its shard's Adam state (2 floats a parameter) and, in a
    // ring of more than one, its neighbour's: about 4/W of the tables.
    size_t held = 0;
    for (Member* m : ring) held += m->sync->state_floats();
    EXPECT_EQ(held, (w == 1 ? 2 : 4) * Total()) << w << " members";
  }
}

TEST(DenseSyncTest, SumsOverTcp) {
  Cluster c("tcp");
  std::vector<Member*> ring = {c.Add(1), c.Add(2), c.Add(3)};
  for (auto& f : c.Form(5, ring)) ASSERT_THAT(f, IsOk());
  Reference ref(Flat(*ring[0]), Adam());
  for (uint64_t step = 0; step < 3; ++step) {
    for (auto& r : c.Step(step, ring)) ASSERT_THAT(r, IsOk());
    ref.Step(step, {1, 2, 3});
  }
  ExpectParams(ring, ref, "tcp");
}

TEST(DenseSyncTest, AMemberLostMidStepIsRetriedByTheOthersWithItsShardFromTheReplica) {
  Cluster c("inproc", absl::Seconds(1));
  Member* a = c.Add(1);
  Member* b = c.Add(2);
  Member* dead = c.Add(3);
  for (auto& f : c.Form(1, {a, b, dead})) ASSERT_THAT(f, IsOk());
  Reference ref(Flat(*a), Adam());
  for (uint64_t step = 0; step < 4; ++step) {
    for (auto& r : c.Step(step, {a, b, dead})) ASSERT_THAT(r, IsOk());
    ref.Step(step, {1, 2, 3});
  }
  const std::vector<float> before = Flat(*a);
  // Member 3 is gone: step 4 fails for the others, naming the ring.
  c.Kill(dead);
  for (auto& r : c.Step(4, {a, b})) {
    ASSERT_FALSE(r.ok());
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("ring allreduce rank"));
  }
  EXPECT_EQ(Flat(*a), before) << "a failed step leaves the parameters as they were";
  EXPECT_THAT(a->sync->Step(4, {}, 0, 0, {}).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("form a ring first")));
  // The ring of those left: step 4 again, nothing of the dead member's
  // shard lost (its replica was on member 1, next in the ring).
  for (auto& f : c.Form(2, {a, b})) {
    ASSERT_THAT(f, IsOk());
    EXPECT_EQ(f->next_step, 4u);
    EXPECT_EQ(f->lost_state, 0u);
  }
  for (uint64_t step = 4; step < 7; ++step) {
    for (auto& r : c.Step(step, {a, b})) ASSERT_THAT(r, IsOk());
    ref.Step(step, {1, 2});
  }
  ExpectParams({a, b}, ref, "after the loss");
}

TEST(DenseSyncTest, AStepTheOthersCompletedIsNotDoneAgain) {
  // Member 2's step 2 fails after the ring call went through everywhere
  // (its last acknowledgement lost): the others completed it and went on
  // to step 3, which fails without member 2. The new ring goes on from
  // step 3: the others undo their part of step 3, member 2 keeps its
  // shards' update of step 2 and takes the parameters after it.
  Cluster c("inproc", absl::Seconds(1));
  Member* a = c.Add(1);
  Member* b = c.Add(2, /*fail_after_step=*/2);
  Member* d = c.Add(3);
  for (auto& f : c.Form(1, {a, b, d})) ASSERT_THAT(f, IsOk());
  Reference ref(Flat(*a), Adam());
  for (uint64_t step = 0; step < 3; ++step) {
    auto r = c.Step(step, {a, b, d});
    ASSERT_THAT(r[0], IsOk());
    ASSERT_THAT(r[2], IsOk());
    EXPECT_EQ(r[1].ok(), step != 2) << r[1].status();
    ref.Step(step, {1, 2, 3});
  }
  for (auto& r : c.Step(3, {a, d})) EXPECT_FALSE(r.ok());
  for (auto& f : c.Form(2, {a, b, d})) {
    ASSERT_THAT(f, IsOk());
    EXPECT_EQ(f->next_step, 3u);
    EXPECT_EQ(f->lost_state, 0u);
  }
  ExpectParams({a, b, d}, ref, "formed after step 2");
  for (uint64_t step = 3; step < 6; ++step) {
    for (auto& r : c.Step(step, {a, b, d})) ASSERT_THAT(r, IsOk());
    ref.Step(step, {1, 2, 3});
  }
  ExpectParams({a, b, d}, ref, "three steps on");
}

TEST(DenseSyncTest, AJoiningMemberGetsTheParametersAndAShareOfTheState) {
  Cluster c;
  Member* a = c.Add(1);
  Member* b = c.Add(2);
  for (auto& f : c.Form(1, {a, b})) ASSERT_THAT(f, IsOk());
  Reference ref(Flat(*a), Adam());
  for (uint64_t step = 0; step < 3; ++step) {
    for (auto& r : c.Step(step, {a, b})) ASSERT_THAT(r, IsOk());
    ref.Step(step, {1, 2});
  }
  Member* joiner = c.Add(7);  // (its own initial values: replaced)
  for (auto& f : c.Form(2, {a, joiner, b})) {
    ASSERT_THAT(f, IsOk());
    EXPECT_EQ(f->next_step, 3u);
  }
  ExpectParams({a, joiner, b}, ref, "joined");
  for (uint64_t step = 3; step < 6; ++step) {
    for (auto& r : c.Step(step, {a, joiner, b})) ASSERT_THAT(r, IsOk());
    ref.Step(step, {1, 7, 2});
  }
  ExpectParams({a, joiner, b}, ref, "trained with the joiner");
}

TEST(DenseSyncTest, TwoNeighboursLostTogetherLoseTheirShardsStateAndSaySo) {
  Cluster c("inproc", absl::Seconds(1));
  std::vector<Member*> ring = {c.Add(1), c.Add(2), c.Add(3), c.Add(4)};
  for (auto& f : c.Form(1, ring)) ASSERT_THAT(f, IsOk());
  for (auto& r : c.Step(0, ring)) ASSERT_THAT(r, IsOk());
  // Ranks 1 and 2 go: rank 1 owned segment 2, whose replica was rank 2.
  c.Kill(ring[1]);
  c.Kill(ring[2]);
  for (auto& r : c.Step(1, {ring[0], ring[3]})) EXPECT_FALSE(r.ok());
  const size_t segment = Total() * 3 / 4 - Total() * 2 / 4;
  for (auto& f : c.Form(2, {ring[0], ring[3]})) {
    ASSERT_THAT(f, IsOk());
    EXPECT_EQ(f->next_step, 1u);
    EXPECT_EQ(f->lost_state, 2 * segment) << "Adam's two moments of segment 2";
  }
  // The job goes on from there, every member alike.
  for (auto& r : c.Step(1, {ring[0], ring[3]})) ASSERT_THAT(r, IsOk());
  EXPECT_EQ(Flat(*ring[0]), Flat(*ring[3]));
}

TEST(DenseSyncTest, BadCallsAreRefused) {
  Cluster c;
  Member* a = c.Add(1);
  Member* b = c.Add(2);
  EXPECT_THAT(a->sync->Step(0, {}, 0, 0, {}).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("before a ring")));
  EXPECT_THAT(a->sync->Form(1, {{2, b->address}}, a->param_ptrs()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("node 1 is not among")));
  EXPECT_THAT(a->sync->Form(1, {{1, a->address}}, {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("0 parameter buffers")));
  ASSERT_THAT(a->sync->Form(3, {{1, a->address}}, a->param_ptrs()), IsOk());
  EXPECT_THAT(a->sync->Form(3, {{1, a->address}}, a->param_ptrs()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("epochs rise")));
  // A ring whose other member never comes: Form fails, and Step is refused
  // until a Form goes through.
  Cluster slow("inproc", absl::Milliseconds(300));
  Member* x = slow.Add(1);
  Member* y = slow.Add(2);
  EXPECT_FALSE(x->sync->Form(1, {{1, x->address}, {2, y->address}}, x->param_ptrs()).ok());
  EXPECT_THAT(x->sync->Step(0, {}, 0, 0, {}).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("after forming the ring of epoch 1 failed")));
  OptimizerSection bad;
  bad.type = "adagrad";
  EXPECT_THAT(DenseSync::Create(a->transport.get(), {1, bad}, kTables).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("adagrad")));
}

}  // namespace
}  // namespace strata::worker
