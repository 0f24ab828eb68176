// Dense tables by allreduce with the optimizer sharded over the workers
// (worker/dense_sync.h), against one optimizer applied to the mean
// gradient directly: rings of 1-4 members over the inproc and tcp
// transports, uneven samples (a member with none), tables that do not
// divide by the ring; a member lost mid-step (its shard's state comes from
// its replica, the step is retried by those left), a member that joins
// (it gets the parameters and a share of the state), two neighbours lost
// at once (their shard's state is gone: counted); a checkpoint of the
// shards (storage/ring_checkpoint.h) restored into rings of the same size
// (bit for bit) and another (float tolerance), the checkpoint asked of the
// ring carried by every step; steps overlapping a backward pass in
// buckets (the same bytes as one reduction), one abandoned; and bad calls
// and bad shard files.
#include "worker/dense_sync.h"

#include <cmath>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/checkpoint_format.h"
#include "storage/ring_checkpoint.h"
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
                   OptimizerSection opt = Adam(), size_t bucket_bytes = 0)
      : kind_(std::move(kind)),
        timeout_(timeout),
        opt_(std::move(opt)),
        bucket_bytes_(bucket_bytes) {
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
    o.bucket_bytes = bucket_bytes_;
    o.row_floats = {13, 0};  // (table 0: 77 rows of 13)
    o.checkpoint_state = checkpoint_state;
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
  // The members added from now on take lost state from it.
  std::function<absl::StatusOr<DenseSync::CheckpointState>()> checkpoint_state;

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

  // Step `step` as a backward pass overlaps it: each member of `ring`
  // (but those in `whole`, which Step) starts it, hands its gradients
  // over from the last table to the first, the first in pieces, and
  // finishes it.
  std::vector<absl::StatusOr<DenseSync::StepResult>> OverlappedStep(
      uint64_t step, const std::vector<Member*>& ring, const std::vector<uint32_t>& whole = {}) {
    std::vector<absl::StatusOr<DenseSync::StepResult>> out(ring.size(),
                                                           absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (size_t i = 0; i < ring.size(); ++i) {
      threads.emplace_back([&, i] {
        Member* m = ring[i];
        std::vector<std::vector<float>> g = Grads(m->node_id, step);
        std::vector<const float*> gp;
        for (auto& t : g) gp.push_back(t.data());
        const uint64_t samples = Samples(m->node_id, step);
        if (std::find(whole.begin(), whole.end(), m->node_id) != whole.end()) {
          out[i] = m->sync->Step(step, gp, samples, 0, m->param_ptrs());
          return;
        }
        if (absl::Status s = m->sync->StartStep(step, samples, 0, {}); !s.ok()) {
          out[i] = s;
          return;
        }
        for (size_t t = kTables.size(); t-- > 0;) {
          for (size_t end = 0; end < kTables[t];) {
            end = std::min(kTables[t], end + 130);
            m->sync->GradsReady(t, gp[t], end);
            absl::SleepFor(absl::Microseconds(200));  // (the backward pass computing)
          }
        }
        out[i] = m->sync->FinishStep(gp, m->param_ptrs());
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
  size_t bucket_bytes_ = 0;
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
  // The optimizer's state as a checkpoint's (Adam: its count first).
  void SetState(const storage::RingState& s) {
    std::string st(reinterpret_cast<const char*>(&s.updates), sizeof(uint64_t));
    st.append(reinterpret_cast<const char*>(s.state.data()), s.state.size() * sizeof(float));
    ASSERT_THAT(opt_->RestoreState(st), IsOk());
    updates_ = s.updates;
  }

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

TEST(DenseSyncTest, BucketsOverlappingTheBackwardPassGiveTheSameBytesAsOneReduction) {
  // Each bucket is cut where the members' shards fall, so every float is
  // summed in the same order as in one reduction of everything: the
  // parameters are the same bytes. Members that step whole (no overlap)
  // and members that overlap go together in one ring.
  for (int w : {1, 2, 3, 4}) {
    for (size_t bucket_bytes : {size_t{256}, size_t{1800}}) {
      Cluster whole;
      Cluster buckets("inproc", absl::Seconds(3), Adam(), bucket_bytes);
      std::vector<Member*> a, b;
      std::vector<uint32_t> nodes;
      for (int i = 0; i < w; ++i) {
        a.push_back(whole.Add(10 + i));
        b.push_back(buckets.Add(10 + i));
        nodes.push_back(10 + i);
      }
      for (auto& f : whole.Form(1, a)) ASSERT_THAT(f, IsOk());
      for (auto& f : buckets.Form(1, b)) ASSERT_THAT(f, IsOk());
      Reference ref(Flat(*a[0]), Adam());
      for (uint64_t step = 0; step < 5; ++step) {
        const std::string when =
            absl::StrCat(w, " members, buckets of ", bucket_bytes, " bytes, step ", step);
        for (auto& r : whole.Step(step, a)) ASSERT_THAT(r, IsOk()) << when;
        // (Step 3: the first member steps whole.)
        for (auto& r :
             buckets.OverlappedStep(step, b, step == 3 ? nodes : std::vector<uint32_t>{})) {
          ASSERT_THAT(r, IsOk()) << when;
        }
        ref.Step(step, nodes);
        ExpectParams(b, ref, when.c_str());
        EXPECT_EQ(Flat(*b[0]), Flat(*a[0])) << when;
      }
    }
  }
}

TEST(DenseSyncTest, BucketsStartAtWholeRowsLastTablesFirst) {
  // 1800 bytes: 450 floats a bucket. Table 0 (77 rows of 13) in 3 pieces
  // of whole rows; tables 1 and 2 (42 floats) in one.
  transport::TransportOptions to;
  to.kind = "inproc";
  to.inproc_network = transport::NewInProcNetwork();
  DenseSync::Options o;
  o.optimizer = Adam();
  o.bucket_bytes = 1800;
  o.row_floats = {13};
  auto m = StartListeningSync(to, o, kTables);
  ASSERT_THAT(m, IsOk());
  EXPECT_TRUE(m->sync->overlaps());
  EXPECT_EQ(m->sync->BucketStarts(0), (std::vector<uint64_t>{325, 663}));
  EXPECT_TRUE(m->sync->BucketStarts(1).empty());
  EXPECT_TRUE(m->sync->BucketStarts(2).empty());
  m->transport->Shutdown();
}

TEST(DenseSyncTest, AnAbandonedStepFailsTheRingAndIsDoneAgainOnTheNext) {
  // A member's compute fails after its step began, and after its
  // backward pass handed every gradient over: its ring is aborted, the
  // others' step fails at the timeout (the step's last bucket waits for
  // FinishStep, so nobody completes it), and the next ring does the step
  // again from where it was (the optimizer state the buckets had moved
  // undone).
  Cluster c("inproc", absl::Milliseconds(700), Adam(), 256);
  std::vector<Member*> ring = {c.Add(1), c.Add(2), c.Add(3)};
  for (auto& f : c.Form(1, ring)) ASSERT_THAT(f, IsOk());
  Reference ref(Flat(*ring[0]), Adam());
  for (auto& r : c.OverlappedStep(0, ring)) ASSERT_THAT(r, IsOk());
  ref.Step(0, {1, 2, 3});
  const std::vector<float> before = Flat(*ring[0]);
  std::vector<absl::Status> status(3);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      Member* m = ring[i];
      std::vector<std::vector<float>> g = Cluster::Grads(m->node_id, 1);
      std::vector<const float*> gp;
      for (auto& t : g) gp.push_back(t.data());
      status[i] = m->sync->StartStep(1, Cluster::Samples(m->node_id, 1), 0, {});
      if (!status[i].ok()) return;
      for (size_t t = kTables.size(); t-- > 0;) m->sync->GradsReady(t, gp[t], kTables[t]);
      if (i == 1) {
        absl::SleepFor(absl::Milliseconds(200));  // (the buckets but the last go round)
        m->sync->AbandonStep(absl::InternalError("the device failed (test)"));
        EXPECT_FALSE(m->sync->stepping());
        return;
      }
      status[i] = m->sync->FinishStep(gp, m->param_ptrs()).status();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_FALSE(status[0].ok());
  EXPECT_FALSE(status[2].ok());
  for (Member* m : ring) EXPECT_EQ(Flat(*m), before) << "member " << m->node_id;
  EXPECT_THAT(ring[1]->sync->StartStep(1, 1, 0, {}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("after step 1 failed")));
  for (auto& f : c.Form(2, ring)) {
    ASSERT_THAT(f, IsOk());
    EXPECT_EQ(f->next_step, 1u);
  }
  for (uint64_t step = 1; step < 3; ++step) {
    for (auto& r : c.OverlappedStep(step, ring)) ASSERT_THAT(r, IsOk());
    ref.Step(step, {1, 2, 3});
  }
  ExpectParams(ring, ref, "after the abandoned step");
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
  // Member 2 knows that step 2 had samples (the others may have completed
  // it); the others' step 3 failed before its first exchange went
  // through (nobody completed it).
  uint64_t samples = 0;
  for (uint32_t n : {1, 2, 3}) samples += Cluster::Samples(n, 2);
  EXPECT_EQ(b->sync->cut_short_samples(), samples);
  for (auto& r : c.Step(3, {a, d})) EXPECT_FALSE(r.ok());
  EXPECT_EQ(a->sync->cut_short_samples(), std::nullopt);
  for (auto& f : c.Form(2, {a, b, d})) {
    ASSERT_THAT(f, IsOk());
    EXPECT_EQ(f->next_step, 3u);
    EXPECT_EQ(f->lost_state, 0u);
  }
  EXPECT_EQ(b->sync->cut_short_samples(), std::nullopt);
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

// Each member's shard written as a checkpoint's (seq 4) under `root`; the
// manifest's list of them.
std::vector<proto::CheckpointRingShard> WriteShards(storage::FileSystem* fs,
                                                    const std::vector<Member*>& ring) {
  std::vector<proto::CheckpointRingShard> shards;
  for (Member* m : ring) {
    absl::StatusOr<DenseSync::Snapshot> snap = m->sync->TakeSnapshot();
    EXPECT_THAT(snap, IsOk());
    if (!snap.ok()) return {};
    proto::CheckpointRingShardHeader h;
    h.set_job("j");
    h.set_seq(4);
    h.set_rank(snap->rank);
    h.set_ring_size(snap->ring_size);
    h.set_begin(snap->begin);
    h.set_end(snap->end);
    h.set_total(snap->total);
    h.set_optimizer("adam");
    h.set_state_vectors(snap->state_vectors);
    h.set_state_count(snap->state_count);
    h.set_step(snap->step);
    h.set_updates(snap->updates);
    absl::StatusOr<proto::CheckpointFile> f =
        storage::WriteRingShard(fs, "/ck", h, snap->values, snap->state, 1);
    EXPECT_THAT(f, IsOk());
    if (!f.ok()) return {};
    proto::CheckpointRingShard s;
    s.set_rank(snap->rank);
    s.set_begin(snap->begin);
    s.set_end(snap->end);
    *s.mutable_file() = *f;
    shards.push_back(s);
  }
  return shards;
}

TEST(DenseSyncTest, ACheckpointOfTheShardsRestoresTheRingInAnySize) {
  auto fs = storage::NewMemoryFileSystem();
  Cluster c;
  std::vector<Member*> ring = {c.Add(1), c.Add(2), c.Add(3)};
  for (auto& f : c.Form(1, ring)) ASSERT_THAT(f, IsOk());
  for (uint64_t step = 0; step < 4; ++step) {
    for (auto& r : c.Step(step, ring)) ASSERT_THAT(r, IsOk());
  }
  const std::vector<proto::CheckpointRingShard> shards = WriteShards(fs.get(), ring);
  ASSERT_EQ(shards.size(), 3u);
  absl::StatusOr<storage::RingState> state =
      storage::ReadRingState(fs.get(), "/ck", shards, Total(), "j", "adam");
  ASSERT_THAT(state, IsOk());
  EXPECT_EQ(state->step, 3u);
  EXPECT_EQ(state->state_vectors, 2u);
  EXPECT_EQ(state->values, Flat(*ring[0]));
  uint64_t updates = 0;
  for (uint64_t step = 0; step < 4; ++step) {
    uint64_t n = 0;
    for (uint32_t node : {1, 2, 3}) n += Cluster::Samples(node, step);
    updates += n > 0 ? 1 : 0;
  }
  EXPECT_EQ(state->updates, updates);
  // The ring never stopped: the reference.
  for (uint64_t step = 4; step < 8; ++step) {
    for (auto& r : c.Step(step, ring)) ASSERT_THAT(r, IsOk());
  }

  // Restored into a ring of 3 (new processes, their own initial values):
  // the same parameters, bit for bit.
  {
    Cluster c2;
    std::vector<Member*> again = {c2.Add(1), c2.Add(2), c2.Add(3)};
    for (Member* m : again) {
      ASSERT_THAT(m->sync->Restore(state->step, state->updates, state->values, state->state,
                                   m->param_ptrs()),
                  IsOk());
    }
    for (auto& f : c2.Form(1, again)) {
      ASSERT_THAT(f, IsOk());
      EXPECT_EQ(f->next_step, 4u);
      EXPECT_TRUE(f->own_params);  // (a gradient on them counts)
    }
    for (uint64_t step = 4; step < 8; ++step) {
      for (auto& r : c2.Step(step, again)) ASSERT_THAT(r, IsOk());
    }
    for (size_t i = 0; i < again.size(); ++i) EXPECT_EQ(Flat(*again[i]), Flat(*ring[i]));
  }
  // Into a ring of 2, only one of which restored (the other a worker with
  // its own values): the checkpoint's state, to float tolerance (another
  // split, another order of sums).
  {
    Cluster c3;
    Member* a = c3.Add(1);
    Member* b = c3.Add(2);
    ASSERT_THAT(
        b->sync->Restore(state->step, state->updates, state->values, state->state, b->param_ptrs()),
        IsOk());
    std::vector<absl::StatusOr<DenseSync::Formed>> formed = c3.Form(1, {a, b});
    for (auto& f : formed) {
      ASSERT_THAT(f, IsOk());
      EXPECT_EQ(f->next_step, 4u);
    }
    EXPECT_FALSE(formed[0]->own_params);  // (its values were not the checkpoint's)
    EXPECT_TRUE(formed[1]->own_params);
    Reference ref(state->values, Adam());
    ref.SetState(*state);
    ExpectParams({a, b}, ref, "restored into 2");
    for (uint64_t step = 4; step < 8; ++step) {
      for (auto& r : c3.Step(step, {a, b})) ASSERT_THAT(r, IsOk());
      ref.Step(step, {1, 2});
    }
    ExpectParams({a, b}, ref, "trained after the restore");
  }
}

TEST(DenseSyncTest, EveryMemberLearnsTheNewestCheckpointAskedInTheSameStep) {
  Cluster c;
  std::vector<Member*> ring = {c.Add(1), c.Add(2), c.Add(3)};
  for (auto& f : c.Form(1, ring)) ASSERT_THAT(f, IsOk());
  std::vector<absl::StatusOr<DenseSync::StepResult>> out(3, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  const DenseSync::CheckpointAsk asks[3] = {{0, 0, 0}, {9, 7, 40}, {8, 7, 30}};
  for (size_t i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      std::vector<std::vector<float>> g = Cluster::Grads(ring[i]->node_id, 0);
      std::vector<const float*> gp;
      for (auto& t : g) gp.push_back(t.data());
      out[i] = ring[i]->sync->Step(0, gp, Cluster::Samples(ring[i]->node_id, 0), 0,
                                   ring[i]->param_ptrs(), asks[i]);
    });
  }
  for (auto& t : threads) t.join();
  for (auto& r : out) {
    ASSERT_THAT(r, IsOk());
    EXPECT_EQ(r->ask.id, 9u);
    EXPECT_EQ(r->ask.seq, 7u);
    EXPECT_EQ(r->ask.cut, 40u);
  }
}

TEST(DenseSyncTest, TheNewestCheckpointWithTheRingsShardsIsFound) {
  auto fs = storage::NewMemoryFileSystem();
  uint64_t seq = 0;
  EXPECT_THAT(storage::ReadNewestRingState(fs.get(), "/ck", Total(), "j", "adam", &seq),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("under /ck")));
  Cluster c;
  std::vector<Member*> ring = {c.Add(1), c.Add(2)};
  for (auto& f : c.Form(1, ring)) ASSERT_THAT(f, IsOk());
  for (auto& r : c.Step(0, ring)) ASSERT_THAT(r, IsOk());
  proto::CheckpointManifest m;
  m.set_format_version(storage::kCheckpointFormatVersion);
  m.set_seq(4);
  for (const auto& s : WriteShards(fs.get(), ring)) *m.add_ring_shards() = s;
  m.set_ring_floats(Total());
  ASSERT_THAT(storage::WriteManifest(fs.get(), "/ck/" + storage::CheckpointDirName(4), m), IsOk());
  // A newer one without the ring's shards, and one not complete.
  proto::CheckpointManifest later;
  later.set_format_version(storage::kCheckpointFormatVersion);
  later.set_seq(5);
  ASSERT_THAT(storage::WriteManifest(fs.get(), "/ck/" + storage::CheckpointDirName(5), later),
              IsOk());
  ASSERT_THAT(fs->WriteFileAtomic("/ck/" + storage::CheckpointDirName(6) + "/x", "x"), IsOk());
  // A newer one whose shards are gone (retention deleting it mid-read).
  proto::CheckpointManifest gone = m;
  gone.set_seq(7);
  for (auto& shard : *gone.mutable_ring_shards()) {
    shard.mutable_file()->set_path(storage::CheckpointDirName(7) + "/ring-gone.blk");
  }
  ASSERT_THAT(storage::WriteManifest(fs.get(), "/ck/" + storage::CheckpointDirName(7), gone),
              IsOk());
  absl::StatusOr<storage::RingState> got =
      storage::ReadNewestRingState(fs.get(), "/ck", Total(), "j", "adam", &seq);
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(seq, 4u);
  EXPECT_EQ(got->values, Flat(*ring[0]));
  EXPECT_EQ(got->state.size(), 2 * Total());
  // Asked again with the state read before (a forming that timed out while
  // reading tries again): checkpoint 4 is not read again (its files gone
  // here, as a store too slow to answer in time).
  for (const auto& shard : m.ring_shards()) {
    ASSERT_THAT(fs->DeleteFile("/ck/" + shard.file().path()), IsOk());
  }
  uint64_t again = 0;
  absl::StatusOr<storage::RingState> cached =
      storage::ReadNewestRingState(fs.get(), "/ck", Total(), "j", "adam", &again, &*got, 4);
  ASSERT_THAT(cached, IsOk());
  EXPECT_EQ(again, 4u);
  EXPECT_EQ(cached->values, got->values);
  EXPECT_EQ(cached->state, got->state);
  EXPECT_FALSE(storage::ReadNewestRingState(fs.get(), "/ck", Total(), "j", "adam", &again).ok());
}

TEST(DenseSyncTest, BadCheckpointsAreRefusedNamingTheFile) {
  auto fs = storage::NewMemoryFileSystem();
  Cluster c;
  std::vector<Member*> ring = {c.Add(1), c.Add(2)};
  for (auto& f : c.Form(1, ring)) ASSERT_THAT(f, IsOk());
  for (auto& r : c.Step(0, ring)) ASSERT_THAT(r, IsOk());
  std::vector<proto::CheckpointRingShard> shards = WriteShards(fs.get(), ring);
  ASSERT_EQ(shards.size(), 2u);
  // A shard missing.
  EXPECT_THAT(storage::ReadRingState(fs.get(), "/ck", {shards[0]}, Total(), "j", "adam"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("missing")));
  // Another job, another optimizer.
  EXPECT_THAT(storage::ReadRingState(fs.get(), "/ck", shards, Total(), "k", "adam"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("a shard of job 'j'")));
  EXPECT_THAT(
      storage::ReadRingState(fs.get(), "/ck", shards, Total(), "j", "momentum"),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("optimizer 'adam' in the shard")));
  // A model of another size.
  EXPECT_THAT(storage::ReadRingState(fs.get(), "/ck", shards, Total() + 1, "j", "adam"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("ring-0-0000")));
  // A corrupt file: its path named.
  const std::string path = "/ck/" + shards[1].file().path();
  std::string bytes = *fs->ReadFile(path);
  bytes[bytes.size() / 2] ^= 0x40;
  ASSERT_THAT(fs->WriteFileAtomic(path, bytes), IsOk());
  shards[1].mutable_file()->set_crc32c(0);
  shards[1].mutable_file()->clear_crc32c();
  EXPECT_THAT(storage::ReadRingState(fs.get(), "/ck", shards, Total(), "j", "adam"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr(path)));
  // Restored with the wrong sizes, or after a ring was formed.
  Cluster c2;
  Member* m = c2.Add(5);
  EXPECT_THAT(m->sync->Restore(0, 1, std::vector<float>(3), {}, m->param_ptrs()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("3 parameters")));
  EXPECT_THAT(ring[0]->sync->Restore(0, 1, std::vector<float>(Total()),
                                     std::vector<float>(2 * Total()), ring[0]->param_ptrs()),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("after a ring")));
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
    EXPECT_FALSE(f->state_checkpoint.has_value());  // (no checkpoint to take it from)
  }
  // The job goes on from there, every member alike.
  for (auto& r : c.Step(1, {ring[0], ring[3]})) ASSERT_THAT(r, IsOk());
  EXPECT_EQ(Flat(*ring[0]), Flat(*ring[3]));
}

TEST(DenseSyncTest, TwoNeighboursLostTogetherTakeTheirShardsStateFromTheNewestCheckpoint) {
  auto fs = storage::NewMemoryFileSystem();
  Cluster c("inproc", absl::Seconds(1));
  std::vector<proto::CheckpointRingShard> shards;  // the checkpoint's, once written
  int reads = 0;
  c.checkpoint_state = [&]() -> absl::StatusOr<DenseSync::CheckpointState> {
    ++reads;
    if (shards.empty()) return absl::NotFoundError("no checkpoint yet");
    STRATA_ASSIGN_OR_RETURN(storage::RingState s,
                            storage::ReadRingState(fs.get(), "/ck", shards, Total(), "j", "adam"));
    return DenseSync::CheckpointState{4, s.step, std::move(s.state)};
  };
  std::vector<Member*> ring = {c.Add(1), c.Add(2), c.Add(3), c.Add(4)};
  for (auto& f : c.Form(1, ring)) ASSERT_THAT(f, IsOk());
  for (uint64_t step = 0; step < 2; ++step) {
    for (auto& r : c.Step(step, ring)) ASSERT_THAT(r, IsOk());
  }
  shards = WriteShards(fs.get(), ring);  // checkpoint 4, at step 1
  absl::StatusOr<storage::RingState> at_checkpoint =
      storage::ReadRingState(fs.get(), "/ck", shards, Total(), "j", "adam");
  ASSERT_THAT(at_checkpoint, IsOk());
  for (uint64_t step = 2; step < 4; ++step) {
    for (auto& r : c.Step(step, ring)) ASSERT_THAT(r, IsOk());
  }
  // The whole state now (at step 3), as another checkpoint would hold it.
  auto now_fs = storage::NewMemoryFileSystem();
  absl::StatusOr<storage::RingState> now = storage::ReadRingState(
      now_fs.get(), "/ck", WriteShards(now_fs.get(), ring), Total(), "j", "adam");
  ASSERT_THAT(now, IsOk());
  // Ranks 1 and 2 go: rank 1 owned segment 2, whose replica was rank 2.
  c.Kill(ring[1]);
  c.Kill(ring[2]);
  for (auto& r : c.Step(4, {ring[0], ring[3]})) EXPECT_FALSE(r.ok());
  const size_t b = Total() * 2 / 4, e = Total() * 3 / 4;
  for (auto& f : c.Form(2, {ring[0], ring[3]})) {
    ASSERT_THAT(f, IsOk());
    EXPECT_EQ(f->next_step, 4u);
    EXPECT_EQ(f->lost_state, 2 * (e - b));
    EXPECT_EQ(f->state_checkpoint, std::optional<uint64_t>(4));
  }
  EXPECT_EQ(reads, 1);  // (one member reads it, for the ring)
  // The ring goes on as one optimizer whose state is now's, but for
  // segment 2's, which is the checkpoint's.
  storage::RingState merged = *now;
  for (size_t v = 0; v < 2; ++v) {
    std::copy(at_checkpoint->state.begin() + v * Total() + b,
              at_checkpoint->state.begin() + v * Total() + e,
              merged.state.begin() + v * Total() + b);
  }
  ASSERT_NE(merged.state, now->state);
  Reference ref(Flat(*ring[0]), Adam());
  ref.SetState(merged);
  for (uint64_t step = 4; step < 7; ++step) {
    for (auto& r : c.Step(step, {ring[0], ring[3]})) ASSERT_THAT(r, IsOk());
    ref.Step(step, {1, 4});
  }
  ExpectParams({ring[0], ring[3]}, ref, "after the checkpoint's state was taken");
}

// Abort (the job's end, or the worker stopping) while a ring is being
// formed with a member that never answers: the Form ends then, Cancelled,
// not at the ring's timeout; no ring is formed after it.
TEST(DenseSyncTest, AbortEndsAFormInProgressAndNoRingFormsAfter) {
  Cluster c("inproc", absl::Seconds(20));
  Member* a = c.Add(1);
  Member* silent = c.Add(2);  // (listens, never forms)
  const std::vector<DenseSync::Member> ring = {{1, a->address}, {2, silent->address}};
  absl::StatusOr<DenseSync::Formed> formed = absl::UnknownError("not run");
  const absl::Time start = absl::Now();
  std::thread former([&] { formed = a->sync->Form(1, ring, a->param_ptrs()); });
  absl::SleepFor(absl::Milliseconds(300));
  a->sync->Abort(absl::CancelledError("the job is over"));
  former.join();
  EXPECT_THAT(formed.status(), StatusIs(absl::StatusCode::kCancelled));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));  // (the timeout is 20 s)
  EXPECT_TRUE(a->sync->over());
  EXPECT_THAT(a->sync->Form(2, ring, a->param_ptrs()).status(),
              StatusIs(absl::StatusCode::kCancelled, HasSubstr("over")));
}

// A member waits in a step for a member that died without breaking a
// connection it waits on (the one it receives from, in a ring of 2): a
// newer view that leaves that member out ends the wait (AbortIfLeft, from
// the worker's heartbeat thread), not the ring's timeout. A view of the
// same ring, or a newer one with every member, leaves the step alone. A
// ring of an older view formed afterwards fails at once.
TEST(DenseSyncTest, AViewWithoutAMemberEndsAStepWaitingOnIt) {
  Cluster c("inproc", absl::Seconds(30));
  Member* a = c.Add(1);
  Member* b = c.Add(2);
  for (const auto& f : c.Form(1, {a, b})) ASSERT_THAT(f, IsOk());
  std::atomic<bool> done{false};
  absl::StatusOr<DenseSync::StepResult> r = absl::UnknownError("not run");
  std::thread stepper([&] {
    std::vector<std::vector<float>> g = Cluster::Grads(1, 0);
    std::vector<const float*> gp;
    for (auto& t : g) gp.push_back(t.data());
    r = a->sync->Step(0, gp, Cluster::Samples(1, 0) + 1, 0, a->param_ptrs());
    done = true;
  });
  a->sync->AbortIfLeft(1, {1});     // (the ring's own view)
  a->sync->AbortIfLeft(2, {1, 2});  // (every member still in it)
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_FALSE(done.load());
  a->sync->AbortIfLeft(3, {1});
  stepper.join();
  EXPECT_THAT(r.status(), StatusIs(absl::StatusCode::kUnavailable,
                                   HasSubstr("node 2 of the ring of epoch 1 is not in the job in "
                                             "view 3")));
  EXPECT_FALSE(a->sync->over());  // (the next ring forms as usual)
  Member* solo = a;
  for (const auto& f : c.Form(3, {solo})) EXPECT_THAT(f, IsOk());
  // A ring of an older view than the newest one seen, formed after it,
  // fails as it starts when that view leaves a member out.
  Member* x = c.Add(3);
  Member* y = c.Add(4);
  x->sync->AbortIfLeft(5, {3});
  const std::vector<DenseSync::Member> old_ring = {{3, x->address}, {4, y->address}};
  EXPECT_THAT(x->sync->Form(4, old_ring, x->param_ptrs()).status(),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("node 4 of the ring of epoch 4 is not in the job in view 5")));
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
