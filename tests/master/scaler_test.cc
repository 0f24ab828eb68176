#include "master/scaler.h"

#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace strata::master {
namespace {

using ::strata::testing::IsOk;
using ::strata::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

const absl::Time kT0 = absl::FromUnixSeconds(1000000);

// A host file with room for 4 workers: 0 and 1 started, 2 and 3 room.
std::vector<HostSlot> Slots() {
  return {{"pserver", 0, "a", true},
          {"worker", 0, "a", true},
          {"worker", 1, "b", true},
          {"worker", 2, "a", false},
          {"worker", 3, "b", false}};
}

proto::NodeInfo* AddNode(proto::ClusterView* v, uint32_t id, proto::Role role, int32_t index,
                         proto::NodeState state, absl::Time registered = kT0) {
  proto::NodeInfo* n = v->add_members();
  n->set_id(id);
  n->set_role(role);
  n->set_index(index);
  n->set_state(state);
  n->set_registered_unix_ms(absl::ToUnixMillis(registered));
  return n;
}

// pserver 0 (node 1), workers 0 and 1 (nodes 2, 3).
proto::ClusterView TwoWorkers() {
  proto::ClusterView v;
  AddNode(&v, 1, proto::PSERVER, 0, proto::ALIVE);
  AddNode(&v, 2, proto::WORKER, 0, proto::ALIVE);
  AddNode(&v, 3, proto::WORKER, 1, proto::ALIVE);
  return v;
}

proto::ScaleRequest Workers(const std::string& spec) {
  proto::ScaleRequest r;
  if (spec[0] == '+' || spec[0] == '-') {
    r.mutable_workers()->set_by(std::stoi(spec));
  } else {
    r.mutable_workers()->set_to(std::stoi(spec));
  }
  return r;
}

class ScalerTest : public ::testing::Test {
 protected:
  Scaler::Options Opts() {
    Scaler::Options o;
    o.slots = Slots();
    o.clock = &clock_;
    o.elastic.scale_timeout_seconds = 60;
    return o;
  }
  FakeClock clock_{kT0};
};

TEST_F(ScalerTest, GrowingPicksTheLowestFreeInstancesOfTheRoom) {
  Scaler s(Opts());
  proto::ClusterView v = TwoWorkers();
  STRATA_ASSERT_OK_AND_ASSIGN(Scaler::Plan p, s.Prepare(Workers("+2"), v, proto::JOB_RUNNING));
  EXPECT_EQ(p.from, 2);
  EXPECT_EQ(p.target, 4);
  EXPECT_THAT(p.add, ElementsAre(2, 3));
  EXPECT_THAT(p.drain, IsEmpty());
  EXPECT_EQ(p.what, "workers 2 -> 4: starting workers 2, 3");
  // A drained instance's index is free again; a dead one's waits for its
  // restart.
  v.mutable_members(2)->set_state(proto::DRAINED);
  AddNode(&v, 4, proto::WORKER, 2, proto::DEAD);
  STRATA_ASSERT_OK_AND_ASSIGN(p, s.Prepare(Workers("3"), v, proto::JOB_RUNNING));
  EXPECT_THAT(p.add, ElementsAre(1, 3));
}

TEST_F(ScalerTest, ShrinkingDrainsTheIdleFirstThenTheHighestIndices) {
  Scaler s(Opts());
  proto::ClusterView v = TwoWorkers();
  AddNode(&v, 4, proto::WORKER, 2, proto::ALIVE);
  AddNode(&v, 5, proto::WORKER, 3, proto::ALIVE);
  v.mutable_members(1)->set_state(proto::FINISHED);  // worker 0: no task left for it
  STRATA_ASSERT_OK_AND_ASSIGN(Scaler::Plan p, s.Prepare(Workers("-2"), v, proto::JOB_RUNNING));
  EXPECT_THAT(p.drain, ElementsAre(2u, 5u));  // worker 0 (idle), then worker 3
  EXPECT_THAT(p.add, IsEmpty());
  EXPECT_EQ(p.what, "workers 4 -> 2: draining workers 0, 3");
  // A worker already draining does not count.
  v.mutable_members(4)->set_draining(true);
  STRATA_ASSERT_OK_AND_ASSIGN(p, s.Prepare(Workers("-1"), v, proto::JOB_RUNNING));
  EXPECT_EQ(p.from, 3);
  EXPECT_THAT(p.drain, ElementsAre(2u));
}

TEST_F(ScalerTest, RefusalsSayWhy) {
  Scaler::Options o = Opts();
  o.elastic.min_workers = 2;
  o.elastic.max_workers = 3;
  Scaler s(o);
  const proto::ClusterView v = TwoWorkers();
  EXPECT_THAT(
      s.Prepare(Workers("1"), v, proto::JOB_RUNNING),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("below elastic.min_workers (2)")));
  EXPECT_THAT(
      s.Prepare(Workers("4"), v, proto::JOB_RUNNING),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("beyond elastic.max_workers (3)")));
  EXPECT_THAT(Scaler(Opts()).Prepare(Workers("5"), v, proto::JOB_RUNNING),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("beyond the host file's room for 4")));
  EXPECT_THAT(s.Prepare(Workers("3"), v, proto::JOB_WAITING),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("the job is waiting: only a running job scales")));
  EXPECT_THAT(s.Prepare(Workers("-5"), v, proto::JOB_RUNNING),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("-3 workers asked for")));
  EXPECT_THAT(s.Prepare(proto::ScaleRequest(), v, proto::JOB_RUNNING),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--workers N|+k|-k")));
  proto::ScaleRequest ps;
  ps.mutable_pservers()->set_by(1);
  EXPECT_THAT(s.Prepare(ps, v, proto::JOB_RUNNING),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("2 pservers is beyond the host file's room for 1 (a range on a "
                                 "host's line makes room, e.g. pserver=1..4)")));
  proto::ScaleRequest both = Workers("3");
  both.mutable_pservers()->set_to(1);
  EXPECT_THAT(s.Prepare(both, v, proto::JOB_RUNNING),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("one role at a time")));
  ps.mutable_pservers()->set_to(1);  // (unchanged: fine)
  STRATA_ASSERT_OK_AND_ASSIGN(Scaler::Plan same, s.Prepare(ps, v, proto::JOB_RUNNING));
  EXPECT_THAT(same.what, HasSubstr("nothing to do"));
  // One scale at a time.
  STRATA_ASSERT_OK_AND_ASSIGN(Scaler::Plan p, s.Prepare(Workers("3"), v, proto::JOB_RUNNING));
  s.Begin(p);
  EXPECT_THAT(s.Prepare(Workers("2"), v, proto::JOB_RUNNING),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("a scale is in progress (workers 2 -> 3: starting worker 2")));
}

TEST_F(ScalerTest, AScaleIsDoneOnceTheAddedWorkersTrainAndTheDrainedOnesLeft) {
  Scaler s(Opts());
  proto::ClusterView v = TwoWorkers();
  STRATA_ASSERT_OK_AND_ASSIGN(Scaler::Plan p, s.Prepare(Workers("3"), v, proto::JOB_RUNNING));
  s.Begin(p);
  proto::JobStatus js;
  s.FillStatus(v, &js);
  EXPECT_EQ(js.workers_target(), 3);
  EXPECT_EQ(js.scaling(), "workers 2 -> 3: starting worker 2 (0 s)");
  EXPECT_THAT(s.Check(v), IsEmpty());
  clock_.Advance(absl::Seconds(2));
  // Registered: joining, not yet training.
  proto::NodeInfo* joined = AddNode(&v, 4, proto::WORKER, 2, proto::JOINING, clock_.Now());
  EXPECT_THAT(s.Check(v), IsEmpty());
  joined->set_state(proto::ALIVE);  // its first data task
  std::vector<Scaler::Ended> ended = s.Check(v);
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_TRUE(ended[0].ok);
  EXPECT_EQ(ended[0].kind, "scale_done");
  EXPECT_EQ(ended[0].message,
            "scale done (workers 2 -> 3: starting worker 2) in 2.0 s: the new workers train");
  EXPECT_FALSE(s.in_progress());

  // Shrinking: done once the drained worker has left.
  STRATA_ASSERT_OK_AND_ASSIGN(p, s.Prepare(Workers("-1"), v, proto::JOB_RUNNING));
  ASSERT_THAT(p.drain, ElementsAre(4u));
  s.Begin(p);
  v.mutable_members(3)->set_draining(true);
  EXPECT_THAT(s.Check(v), IsEmpty());
  v.mutable_members(3)->set_state(proto::DRAINED);
  ended = s.Check(v);
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].kind, "scale_done");
}

TEST_F(ScalerTest, AScaleIsGivenUpAtItsDeadlineNamingWhatIsMissingAndSurvivesARestart) {
  Scaler s(Opts());
  proto::ClusterView v = TwoWorkers();
  STRATA_ASSERT_OK_AND_ASSIGN(Scaler::Plan p, s.Prepare(Workers("4"), v, proto::JOB_RUNNING));
  s.Begin(p);
  // A restarted master takes the scale up from its state.
  proto::MasterState st;
  s.Save(&st);
  Scaler restarted(Opts());
  restarted.Restore(st);
  ASSERT_TRUE(restarted.in_progress());
  // An instance registered before the scale began is not one it started.
  AddNode(&v, 4, proto::WORKER, 2, proto::JOINING, kT0 - absl::Seconds(1));
  AddNode(&v, 5, proto::WORKER, 3, proto::JOINING, kT0 + absl::Seconds(1));
  clock_.Advance(absl::Seconds(61));
  std::vector<Scaler::Ended> ended = restarted.Check(v);
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_FALSE(ended[0].ok);
  EXPECT_EQ(ended[0].kind, "scale_failed");
  EXPECT_THAT(ended[0].message, HasSubstr("scale given up after 60 s (workers 2 -> 4"));
  EXPECT_THAT(ended[0].message,
              HasSubstr("worker 2 did not register (no provider: start them by hand); worker 3 "
                        "registered but took no data task"));
  proto::JobStatus js;
  restarted.FillStatus(v, &js);
  EXPECT_EQ(js.workers_target(), 4);  // (the joining ones count)
  EXPECT_EQ(js.scaling(), "");
}

// The autoscaler's decisions from what it is shown, tick by tick.
class AutoscalerTest : public ::testing::Test {
 protected:
  AutoscalerTest() {
    e_.autoscale = true;
    e_.cooldown_seconds = 5;
    e_.queue_per_worker = 4;
    e_.min_gain = 0.5;
    e_.measure_seconds = 10;
  }
  // One tick a second for `secs` seconds at `rate` samples/s per worker.
  std::vector<Autoscaler::Decision> Run(Autoscaler* a, int secs, double rate) {
    std::vector<Autoscaler::Decision> out;
    for (int i = 0; i < secs; ++i) {
      now_ += absl::Seconds(1);
      samples_ += static_cast<uint64_t>(rate * in_.workers);
      in_.now = now_;
      in_.samples = samples_;
      if (auto d = a->Tick(in_)) out.push_back(*d);
    }
    return out;
  }
  ElasticSection e_;
  absl::Time now_ = kT0;
  uint64_t samples_ = 0;
  Autoscaler::Input in_{kT0, proto::JOB_RUNNING, false, 1, 0, 4, 100, 0};
};

TEST_F(AutoscalerTest, GrowsUnderADeepQueueUntilAWorkerGainsTooLittle) {
  Autoscaler a(e_);
  // A deep queue: a worker more once a rate is measured over a window.
  EXPECT_THAT(Run(&a, 10, 1000), IsEmpty());
  std::vector<Autoscaler::Decision> d = Run(&a, 1, 1000);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].delta, 1);
  EXPECT_THAT(d[0].reason, HasSubstr("100 tasks pending for 1 worker(s)"));
  EXPECT_THAT(d[0].reason, HasSubstr("(1000 samples/s before it)"));
  EXPECT_EQ(a.Describe(), "autoscale on, measuring the worker it added");
  // The scale: 2 s. Then 2 workers at 900 each: 1800, +80% of a worker.
  in_.scaling = true;
  EXPECT_THAT(Run(&a, 2, 1000), IsEmpty());
  in_.scaling = false;
  in_.workers = 2;
  d = Run(&a, 11, 900);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].delta, 0);
  EXPECT_THAT(d[0].reason, HasSubstr("from 1000 to 1800, 80% of a worker's average"));
  EXPECT_THAT(d[0].reason, HasSubstr("growing on while the queue is deep"));
  // Next: a third worker (the queue holds 100 >= 4 x 2), which adds
  // nothing (3 at 600 each).
  d = Run(&a, 1, 900);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].delta, 1);
  in_.scaling = true;
  Run(&a, 1, 900);
  in_.scaling = false;
  in_.workers = 3;
  d = Run(&a, 11, 600);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_THAT(d[0].reason, HasSubstr("from 1800 to 1800, 0% of a worker's average"));
  EXPECT_THAT(d[0].reason, HasSubstr("growing no further"));
  EXPECT_THAT(Run(&a, 60, 600), IsEmpty());  // however deep the queue
  EXPECT_THAT(a.Describe(), HasSubstr("not growing"));
}

TEST_F(AutoscalerTest, ReleasesTheWorkersIdleAtTheTailAndHoldsItsCooldown) {
  e_.min_workers = 2;
  Autoscaler a(e_);
  in_.workers = 4;
  in_.pending = 0;
  in_.idle = 3;
  std::vector<Autoscaler::Decision> d = Run(&a, 1, 100);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].delta, -2);  // (elastic.min_workers 2)
  EXPECT_THAT(d[0].reason, HasSubstr("3 worker(s) idle at the job's tail"));
  EXPECT_THAT(Run(&a, 4, 100), IsEmpty());  // the cooldown
  in_.workers = 3;
  in_.idle = 1;
  d = Run(&a, 1, 100);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].delta, -1);
}

TEST_F(AutoscalerTest, NothingWhenOffWhileScalingOrWhenNotRunningAndARefusalEndsTheMeasuring) {
  e_.autoscale = false;
  Autoscaler a(e_);
  EXPECT_THAT(Run(&a, 30, 100), IsEmpty());
  EXPECT_EQ(a.Describe(), "autoscale off");
  a.SetEnabled(true);
  in_.state = proto::JOB_EVALUATING;
  EXPECT_THAT(Run(&a, 30, 100), IsEmpty());
  in_.state = proto::JOB_RUNNING;
  in_.scaling = true;
  EXPECT_THAT(Run(&a, 30, 100), IsEmpty());
  in_.scaling = false;
  EXPECT_THAT(Run(&a, 10, 100), IsEmpty());  // a window since the last scale ended
  std::vector<Autoscaler::Decision> d = Run(&a, 1, 100);
  ASSERT_EQ(d.size(), 1u);
  a.Refused();
  EXPECT_EQ(a.Describe(), "autoscale on");
  in_.workers = 4;  // the most
  EXPECT_THAT(Run(&a, 30, 100), IsEmpty());
}

// Pservers: heartbeats carry each one's load; the autoscaler averages it
// over elastic.pserver_signal_seconds.
class PServerAutoscaleTest : public AutoscalerTest {
 protected:
  PServerAutoscaleTest() {
    e_.pserver_signal_seconds = 10;
    in_.pending = 0;  // (no worker decision in the way)
    in_.pservers = {10, 11};
    in_.most_pservers = 3;
    in_.least_pservers = 1;
  }
  struct Load {
    double cpu = 0;  // of the 2 cores
    uint64_t queue = 0;
    double memory = 0;  // of 1 GB
  };
  // One second: a heartbeat from each pserver of `load`, then a tick.
  std::vector<Autoscaler::Decision> Run(Autoscaler* a, int secs,
                                        const std::map<uint32_t, Load>& load) {
    std::vector<Autoscaler::Decision> out;
    for (int i = 0; i < secs; ++i) {
      now_ += absl::Seconds(1);
      for (const auto& [id, l] : load) {
        cpu_seconds_[id] += l.cpu * 2;
        proto::HeartbeatRequest beat;
        beat.set_node_id(id);
        beat.set_apply_queue(l.queue);
        beat.set_cpu_seconds(cpu_seconds_[id]);
        beat.set_cpu_cores(2);
        beat.set_rss_bytes(static_cast<uint64_t>(l.memory * 1e9));
        beat.set_memory_limit_bytes(1000000000);
        a->PServerBeat(id, now_, beat);
      }
      in_.now = now_;
      if (auto d = a->Tick(in_)) out.push_back(*d);
    }
    return out;
  }
  std::map<uint32_t, double> cpu_seconds_;
};

TEST_F(PServerAutoscaleTest, AddsOneWhenAPServersCpuAveragesOverItsHighUpToTheMost) {
  Autoscaler a(e_);
  const std::map<uint32_t, Load> busy = {{10, {0.5, 0, 0.1}}, {11, {0.9, 0, 0.1}}};
  EXPECT_THAT(Run(&a, 10, busy), IsEmpty());  // (a whole window first)
  std::vector<Autoscaler::Decision> d = Run(&a, 1, busy);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].role, proto::PSERVER);
  EXPECT_EQ(d[0].delta, 1);
  EXPECT_THAT(d[0].reason, HasSubstr("pserver node 11 averaged CPU 90% of its cores "
                                     "(elastic.pserver_cpu_high 80%) over 10 s: adding a "
                                     "pserver (2 -> 3)"));
  EXPECT_THAT(a.Describe(), HasSubstr("autoscale on"));
  // The scale (its moves) takes 3 s; the new shape is measured afresh.
  in_.scaling = true;
  EXPECT_THAT(Run(&a, 3, busy), IsEmpty());
  in_.scaling = false;
  in_.pservers = {10, 11, 12};
  std::map<uint32_t, Load> three = busy;
  three[12] = {0.9, 0, 0.1};
  // Still busy, but at the most there may be (3): nothing more.
  EXPECT_THAT(Run(&a, 40, three), IsEmpty());
  EXPECT_THAT(a.Describe(), HasSubstr("pservers (the highest): apply queue 0.0, CPU 90%"));
}

TEST_F(PServerAutoscaleTest, TheApplyQueueAndMemoryAreSignalsToo) {
  Autoscaler a(e_);
  // A queue that averages 40 (>= 32) though it swings.
  std::vector<Autoscaler::Decision> d;
  for (int i = 0; i < 15 && d.empty(); ++i) {
    d = Run(&a, 1, {{10, {0.1, i % 2 ? 70u : 10u, 0.1}}, {11, {0.1, 0, 0.1}}});
  }
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].delta, 1);
  EXPECT_THAT(d[0].reason, HasSubstr("pserver node 10 averaged apply queue "));
  EXPECT_THAT(d[0].reason, HasSubstr(" (elastic.pserver_queue_high 32.0) over 10 s"));
  Autoscaler b(e_);
  d = Run(&b, 11, {{10, {0.1, 0, 0.3}}, {11, {0.1, 0, 0.85}}});
  ASSERT_EQ(d.size(), 1u);
  EXPECT_THAT(d[0].reason, HasSubstr("pserver node 11 averaged memory 85% of its limit "
                                     "(elastic.pserver_memory_high 80%)"));
}

TEST_F(PServerAutoscaleTest, RemovesOneWhenAllAreUnderTheirLowsAndTheRestWouldStayUnderTheHighs) {
  Autoscaler a(e_);
  const std::map<uint32_t, Load> idle = {{10, {0.05, 0, 0.1}}, {11, {0.1, 0, 0.1}}};
  // One pserver over a low (CPU 30% >= 20%): nothing.
  EXPECT_THAT(Run(&a, 20, {{10, {0.05, 0, 0.1}}, {11, {0.3, 0, 0.1}}}), IsEmpty());
  // Both under, but the window holds the busy seconds still (node 11's
  // average: 20.9% after 5 s, 19.1% after 6).
  std::vector<Autoscaler::Decision> d = Run(&a, 5, idle);
  EXPECT_THAT(d, IsEmpty());
  d = Run(&a, 1, idle);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].role, proto::PSERVER);
  EXPECT_EQ(d[0].delta, -1);
  EXPECT_THAT(d[0].reason, HasSubstr("every pserver under elastic.pserver_*_low over 10 s "
                                     "(the highest: apply queue 0.0, CPU 19%, memory 10%): "
                                     "removing a pserver (2 -> 1)"));
  // At elastic.min_pservers: never below.
  in_.pservers = {10};
  EXPECT_THAT(Run(&a, 40, {{10, {0.05, 0, 0.1}}}), IsEmpty());
  // Two under their lows whose sum would put the one left over a high:
  // kept.
  e_.pserver_memory_low = 0.5;
  e_.pserver_memory_high = 0.6;
  Autoscaler b(e_);
  in_.pservers = {10, 11};
  EXPECT_THAT(Run(&b, 40, {{10, {0.05, 0, 0.4}}, {11, {0.05, 0, 0.4}}}), IsEmpty());
}

TEST_F(ScalerTest, AutoscaleOnOrOffIsKeptInTheState) {
  Scaler s(Opts());
  const proto::ClusterView v = TwoWorkers();
  proto::ScaleRequest off;
  off.set_autoscale(proto::ScaleRequest::AUTOSCALE_ON);
  STRATA_ASSERT_OK_AND_ASSIGN(Scaler::Plan p, s.Prepare(off, v, proto::JOB_RUNNING));
  EXPECT_EQ(p.what, "autoscale on");
  s.SetAutoscale(proto::ScaleRequest::AUTOSCALE_ON);
  EXPECT_TRUE(s.autoscaler().enabled());
  proto::MasterState st;
  s.Save(&st);
  Scaler restarted(Opts());
  EXPECT_FALSE(restarted.autoscaler().enabled());  // (elastic.autoscale is off)
  restarted.Restore(st);
  EXPECT_TRUE(restarted.autoscaler().enabled());
  EXPECT_EQ(restarted.most_workers(), 4);
}

// The autoscaler's inputs counted from the view: idle (finished) workers
// count, draining and gone ones do not; the most is the room.
TEST_F(ScalerTest, AutoscaleCountsTheJobsShapeFromTheView) {
  Scaler::Options o = Opts();
  o.elastic.autoscale = true;
  o.elastic.cooldown_seconds = 0;
  Scaler s(o);
  proto::ClusterView v = TwoWorkers();
  v.mutable_members(1)->set_state(proto::FINISHED);
  AddNode(&v, 4, proto::WORKER, 2, proto::ALIVE)->set_draining(true);
  AddNode(&v, 5, proto::WORKER, 3, proto::DEAD);
  // The tail: one idle of two, nothing pending: released down to min 1.
  std::optional<Autoscaler::Decision> d = s.Autoscale(v, proto::JOB_RUNNING, 0, 100);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->delta, -1);
  EXPECT_THAT(d->reason, HasSubstr("1 worker(s) idle at the job's tail"));
}

TEST(ProviderArgsTest, ReplacesThePlaceholders) {
  EXPECT_THAT(ProviderArgs({"p.sh", "{action}", "--role={role}", "{count}", "{indices}"}, "add",
                           "worker", {2, 5}),
              ElementsAre("p.sh", "add", "--role=worker", "2", "2,5"));
}

// The provider is run (a real process) with the scale's words, and its
// failure gives the scale up with its exit status.
TEST(ScalerProviderTest, RunsTheProviderAndGivesUpWhenItFails) {
  const std::string out = ::testing::TempDir() + "/scaler_provider_out";
  std::remove(out.c_str());
  Scaler::Options o;
  o.slots = Slots();
  o.clock = RealClock();
  o.elastic.scale_timeout_seconds = 30;
  o.provider = {"/bin/sh",  "-c",     absl::StrCat("echo \"$0 $1 $2\" >> ", out, "; exit 3"),
                "{action}", "{role}", "{indices}"};
  Scaler s(o);
  proto::ClusterView v = TwoWorkers();
  STRATA_ASSERT_OK_AND_ASSIGN(Scaler::Plan p, s.Prepare(Workers("+2"), v, proto::JOB_RUNNING));
  s.Begin(p);
  std::vector<Scaler::Ended> ended;
  for (int i = 0; i < 200 && ended.empty(); ++i) {
    absl::SleepFor(absl::Milliseconds(25));
    ended = s.Check(v);
  }
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].kind, "scale_failed");
  EXPECT_THAT(ended[0].message, HasSubstr("the provider (/bin/sh -c"));
  EXPECT_THAT(ended[0].message, HasSubstr("for add workers 2, 3 failed: it exited with status 3"));
  std::ifstream in(out);
  std::stringstream got;
  got << in.rdbuf();
  EXPECT_EQ(got.str(), "add worker 2,3\n");
  EXPECT_FALSE(s.in_progress());
  proto::JobStatus js;
  s.FillStatus(v, &js);
  EXPECT_EQ(js.workers_target(), 2);  // back to what there is
}

// Pservers scale like workers (the room of the host file, elastic's
// bounds), and the scale is done only once the partitions moved.
TEST_F(ScalerTest, PServersScaleAndTheScaleWaitsForTheMoves) {
  Scaler::Options o = Opts();
  o.slots.push_back({"pserver", 1, "b", false});
  o.slots.push_back({"pserver", 2, "b", false});
  o.elastic.max_pservers = 3;
  Scaler s(o);
  proto::ClusterView v = TwoWorkers();
  proto::ScaleRequest ps;
  ps.mutable_pservers()->set_to(3);
  STRATA_ASSERT_OK_AND_ASSIGN(Scaler::Plan p, s.Prepare(ps, v, proto::JOB_RUNNING));
  EXPECT_EQ(p.role, proto::PSERVER);
  EXPECT_THAT(p.add, ElementsAre(1, 2));
  EXPECT_EQ(p.what, "pservers 1 -> 3: starting pservers 1, 2, then moving partitions");
  ps.mutable_pservers()->set_to(4);
  EXPECT_THAT(s.Prepare(ps, v, proto::JOB_RUNNING),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("beyond elastic.max_pservers (3)")));
  s.Begin(p);
  EXPECT_TRUE(s.scaling_pservers());
  clock_.Advance(absl::Seconds(1));
  AddNode(&v, 7, proto::PSERVER, 1, proto::ALIVE, clock_.Now());
  AddNode(&v, 8, proto::PSERVER, 2, proto::ALIVE, clock_.Now());
  EXPECT_THAT(s.Check(v, /*moves=*/3), IsEmpty());  // registered; the moves go on
  std::vector<Scaler::Ended> ended = s.Check(v, 0);
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_TRUE(ended[0].ok);
  EXPECT_THAT(ended[0].message, HasSubstr("the partitions are balanced"));
  // Shrinking: the highest index leaves, once emptied (the master's moves).
  ps.mutable_pservers()->set_to(2);
  STRATA_ASSERT_OK_AND_ASSIGN(p, s.Prepare(ps, v, proto::JOB_RUNNING));
  EXPECT_THAT(p.drain, ElementsAre(8u));
  EXPECT_EQ(p.what,
            "pservers 3 -> 2: draining pserver 2 once their partitions moved to the others");
  s.Begin(p);
  v.mutable_members(4)->set_draining(true);
  clock_.Advance(absl::Seconds(61));
  ended = s.Check(v, 2);
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_FALSE(ended[0].ok);
  EXPECT_THAT(ended[0].message, HasSubstr("a drained pserver did not leave; 2 partition move(s) "
                                          "not done"));
  proto::JobStatus js;
  s.FillStatus(v, &js);
  EXPECT_EQ(js.pservers_target(), 2);  // what there is (pserver 2 is leaving)
}

// The migration's pace: a second's worth of credit at most, spent by the
// moves started.
TEST_F(ScalerTest, MoveCreditRefillsAtTheConfiguredRate) {
  Scaler::Options o = Opts();
  o.elastic.move_rate_mb_per_s = 4;
  Scaler s(o);
  EXPECT_DOUBLE_EQ(s.MoveCredit(), 4 << 20);
  s.MovesStarted(12 << 20);
  EXPECT_DOUBLE_EQ(s.MoveCredit(), -(8 << 20));
  clock_.Advance(absl::Seconds(1));
  EXPECT_DOUBLE_EQ(s.MoveCredit(), -(4 << 20));
  clock_.Advance(absl::Seconds(10));
  EXPECT_DOUBLE_EQ(s.MoveCredit(), 4 << 20);
}

}  // namespace
}  // namespace strata::master
