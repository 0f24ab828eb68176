#include "master/job_tracker.h"

#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/time/time.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "storage/file_system.h"
#include "tests/testing/status_matchers.h"

namespace strata::master {
namespace {

using ::strata::testing::IsOk;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::SizeIs;

class JobTrackerTest : public ::testing::Test {
 protected:
  JobTrackerTest() {
    EventSink::Options so;
    so.fs = fs_.get();
    so.event_log = "/events.jsonl";
    so.job = "job";
    so.clock = &clock_;
    sink_ = *EventSink::Open(std::move(so));
  }
  std::unique_ptr<JobTracker> Make(Consistency consistency = Consistency::kBsp,
                                   Planted planted = Planted()) {
    return std::make_unique<JobTracker>(
        JobTracker::Options{"fmnist", consistency, 2, planted, &clock_, sink_.get()});
  }
  // A view with workers 1 and 2 (index 0 and 1) alive, and worker 3 dead.
  static proto::ClusterView View() {
    proto::ClusterView v;
    for (uint32_t id : {1u, 2u, 3u}) {
      proto::NodeInfo* n = v.add_members();
      n->set_id(id);
      n->set_role(proto::WORKER);
      n->set_index(static_cast<int32_t>(id - 1));
      n->set_state(id == 3 ? proto::DEAD : proto::ALIVE);
    }
    return v;
  }
  static proto::ReportProgressRequest Report(uint64_t steps, uint64_t samples, double loss,
                                             double busy, double comm) {
    proto::ReportProgressRequest r;
    r.set_steps_done(steps);
    r.set_samples(samples);
    r.set_loss(loss);
    r.set_train_accuracy(0.5);
    r.set_busy_seconds(busy);
    r.set_comm_seconds(comm);
    r.set_samples_per_sec(100);
    return r;
  }
  // summary.json, parsed back.
  static google::protobuf::Struct Parse(const std::string& json) {
    google::protobuf::Struct s;
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json, &s).ok()) << json;
    return s;
  }

  FakeClock clock_{absl::FromUnixMillis(1764590000000)};
  std::unique_ptr<storage::FileSystem> fs_ = storage::NewMemoryFileSystem();
  std::unique_ptr<EventSink> sink_;
};

TEST_F(JobTrackerTest, GoesThroughItsStatesAndTimesThemOnItsClock) {
  auto job = Make();
  EXPECT_EQ(job->state(), proto::JOB_WAITING);
  EXPECT_FALSE(job->over());
  job->Start(/*epoch=*/4);
  EXPECT_EQ(job->state(), proto::JOB_RUNNING);
  clock_.Advance(absl::Seconds(10));
  job->TrainingDone(/*tasks=*/8);
  EXPECT_EQ(job->state(), proto::JOB_EVALUATING);
  clock_.Advance(absl::Seconds(2));
  job->Finish(proto::JOB_SUCCEEDED, "");
  EXPECT_TRUE(job->over());
  EXPECT_TRUE(job->AwaitEnd(absl::ZeroDuration()));
  clock_.Advance(absl::Seconds(100));  // ended: its times stay
  proto::JobStatus js;
  job->FillStatus(View(), &js);
  EXPECT_EQ(js.state(), "succeeded");
  EXPECT_DOUBLE_EQ(js.wall_seconds(), 12);
  EXPECT_DOUBLE_EQ(js.train_seconds(), 10);
  sink_->Flush();
  auto log = fs_->ReadFile("/events.jsonl");
  ASSERT_THAT(log.status(), IsOk());
  EXPECT_THAT(*log, HasSubstr("job running: cluster ready at epoch 4"));
  EXPECT_THAT(*log, HasSubstr("job evaluating: all 8 data tasks done"));
  EXPECT_THAT(*log, HasSubstr("job succeeded"));
}

TEST_F(JobTrackerTest, AwaitEndWakesWhenAnotherThreadFinishesTheJob) {
  auto job = Make();
  std::thread t([&] { job->Finish(proto::JOB_FAILED, "no worker left"); });
  EXPECT_TRUE(job->AwaitEnd(absl::Seconds(30)));
  t.join();
  EXPECT_EQ(job->state(), proto::JOB_FAILED);
}

TEST_F(JobTrackerTest, EventsAreStampedFromTheStartAndReadFromAnIndex) {
  auto job = Make();
  job->Event("before the start");
  job->Start(1);
  clock_.Advance(absl::Milliseconds(2500));
  job->Event("pserver 1 declared dead", "node_dead");
  EXPECT_EQ(job->events_size(), 2u);
  EXPECT_THAT(job->EventsFrom(0),
              ElementsAre("0.0s before the start", "2.5s pserver 1 declared dead"));
  EXPECT_THAT(job->EventsFrom(1), ElementsAre("2.5s pserver 1 declared dead"));
  EXPECT_THAT(job->EventsFrom(5), SizeIs(0));
}

TEST_F(JobTrackerTest, StatusSumsTheWorkersAndLeavesOutTheDeadOnesLoss) {
  auto job = Make();
  job->Start(1);
  job->RecordProgress(1, Report(10, 640, 0.4, 2, 1));
  job->RecordProgress(2, Report(10, 640, 0.6, 2, 0));
  job->RecordProgress(3, Report(5, 320, 9.0, 1, 1));  // dead: its loss is stale
  job->TaskCompleted(7);
  job->TaskCompleted(3);
  EXPECT_EQ(job->max_last_step(), 7u);
  proto::JobStatus js;
  job->FillStatus(View(), &js);
  EXPECT_EQ(js.steps(), 8u);  // bsp: the newest step + 1
  EXPECT_EQ(js.samples(), 1600u);
  EXPECT_DOUBLE_EQ(js.loss(), 0.5);
  EXPECT_DOUBLE_EQ(js.comm_share(), 2.0 / 5.0);
  EXPECT_DOUBLE_EQ(js.samples_per_sec(), 200);  // the live ones'
  ASSERT_EQ(js.workers_size(), 3);
  EXPECT_EQ(js.workers(2).index(), 2);

  auto asp = Make(Consistency::kAsp);
  asp->RecordProgress(1, Report(10, 640, 0.4, 2, 1));
  asp->RecordProgress(2, Report(12, 640, 0.4, 2, 1));
  proto::JobStatus as;
  asp->FillStatus(View(), &as);
  EXPECT_EQ(as.steps(), 22u);  // asp: every push a step
}

TEST_F(JobTrackerTest, HistoryIsSampledAtItsIntervalAndOnlyOnceWorkersReport) {
  auto job = Make();
  int made = 0;
  auto status = [&](uint64_t steps) {
    return [&made, steps] {
      ++made;
      proto::JobStatus js;
      js.set_steps(steps);
      return js;
    };
  };
  job->SampleHistory(false, status(5));  // not started: nothing
  EXPECT_EQ(made, 0);
  job->Start(1);
  job->SampleHistory(false, status(0));  // no report yet: not charted
  job->SampleHistory(false, status(5));
  clock_.Advance(absl::Milliseconds(100));
  job->SampleHistory(false, status(6));  // too soon
  clock_.Advance(absl::Milliseconds(500));
  job->SampleHistory(false, status(7));
  job->SampleHistory(true, status(8));  // forced
  EXPECT_EQ(made, 4);
  proto::JobStatus js;
  job->FillStatus(View(), &js);
  ASSERT_EQ(js.history_size(), 3);
  EXPECT_EQ(js.history(0).steps(), 5u);
  EXPECT_EQ(js.history(2).steps(), 8u);
  EXPECT_DOUBLE_EQ(js.history(1).t(), 0.6);
}

TEST_F(JobTrackerTest, TheEvaluationWaitsForTheLedgerAtMostTenSeconds) {
  auto job = Make();
  job->Start(1);
  job->TrainingDone(4);
  EXPECT_FALSE(job->ClaimEvaluation(1, false).has_value());
  clock_.Advance(absl::Seconds(11));
  EXPECT_TRUE(job->ClaimEvaluation(1, false).has_value());

  auto other = Make();
  other->Start(1);
  other->TrainingDone(4);
  other->SetLedger({});
  EXPECT_TRUE(other->ledger_taken());
  EXPECT_TRUE(other->ClaimEvaluation(1, false).has_value());
}

// A worker out of data tasks becomes the evaluator when there is none, or
// the one chosen has left; bsp evaluates past the newest step trained.
TEST_F(JobTrackerTest, ClaimEvaluationPicksOneEvaluatorAndReplacesOneThatLeft) {
  auto job = Make();
  EXPECT_FALSE(job->ClaimEvaluation(1, false).has_value());  // not evaluating
  job->Start(1);
  job->TaskCompleted(41);
  job->TrainingDone(4);
  job->SetLedger({});
  EXPECT_EQ(job->ClaimEvaluation(1, /*evaluator_in_job=*/false), std::optional<uint64_t>(42));
  EXPECT_EQ(job->evaluator(), 1u);
  EXPECT_EQ(job->evaluating(), 0u);  // (until it says it has the model)
  job->EvaluationStarted(2);         // not the evaluator: ignored
  EXPECT_EQ(job->evaluating(), 0u);
  job->EvaluationStarted(1);
  EXPECT_EQ(job->evaluating(), 1u);
  EXPECT_FALSE(job->ClaimEvaluation(2, /*evaluator_in_job=*/true).has_value());
  EXPECT_EQ(job->ClaimEvaluation(1, true), std::optional<uint64_t>(42));  // asks again
  EXPECT_EQ(job->ClaimEvaluation(2, /*evaluator_in_job=*/false), std::optional<uint64_t>(42));
  EXPECT_EQ(job->evaluator(), 2u);
  job->EvaluationStarted(2);
  EXPECT_EQ(job->evaluating(), 2u);

  auto asp = Make(Consistency::kAsp);
  asp->Start(1);
  asp->TrainingDone(4);
  EXPECT_FALSE(asp->ClaimEvaluation(1, false).has_value());  // the ledger is not read yet
  clock_.Advance(absl::Seconds(11));
  EXPECT_EQ(asp->ClaimEvaluation(1, false), std::optional<uint64_t>(0));
}

// A worker that cannot evaluate (it holds no dense allreduce ring's
// parameters: a restart after training ended) gives the evaluation back,
// and is never chosen again; the next worker that asks is.
TEST_F(JobTrackerTest, AWorkerThatCannotEvaluateGivesTheEvaluationToTheNext) {
  auto job = Make();
  job->Start(1);
  job->TaskCompleted(41);
  job->TrainingDone(4);
  job->SetLedger({});
  EXPECT_EQ(job->ClaimEvaluation(5, /*evaluator_in_job=*/false), std::optional<uint64_t>(42));
  job->DeclineEvaluation(5);
  EXPECT_EQ(job->evaluator(), 0u);
  EXPECT_FALSE(job->ClaimEvaluation(5, /*evaluator_in_job=*/false).has_value());
  EXPECT_EQ(job->ClaimEvaluation(3, /*evaluator_in_job=*/false), std::optional<uint64_t>(42));
  job->DeclineEvaluation(6);  // (not the evaluator: it stays)
  EXPECT_EQ(job->evaluator(), 3u);
  EXPECT_FALSE(job->ClaimEvaluation(6, /*evaluator_in_job=*/false).has_value());
  // Nobody can evaluate once every worker in the job has declined (the
  // master then fails the job, naming the final checkpoint).
  EXPECT_FALSE(job->AllDeclined({3, 5, 6}));
  EXPECT_TRUE(job->AllDeclined({5, 6}));
  EXPECT_FALSE(job->AllDeclined({}));
}

TEST_F(JobTrackerTest, PhaseSaysWhatTheJobWaitsForOrDoes) {
  proto::JobStatus js;
  js.set_job_state(proto::JOB_WAITING);
  js.set_pservers_registered(1);
  js.set_pservers_expected(2);
  js.set_workers_registered(0);
  js.set_workers_expected(3);
  EXPECT_EQ(JobPhase(js, false, 2, ""), "waiting for pservers: 1 of 2 registered");
  js.set_pservers_registered(2);
  EXPECT_EQ(JobPhase(js, false, 2, ""), "placing 2 table(s) on 2 pserver(s)");
  EXPECT_EQ(JobPhase(js, false, 2, "restoring checkpoint 4: 1 of 2 pserver(s) loaded"),
            "restoring checkpoint 4: 1 of 2 pserver(s) loaded");
  EXPECT_EQ(JobPhase(js, true, 2, ""), "waiting for workers: 0 of 3 registered");
  js.set_job_state(proto::JOB_RUNNING);
  js.set_epoch(1);
  js.set_epochs(2);
  js.set_tasks_done(5);
  js.set_tasks_total(8);
  EXPECT_EQ(JobPhase(js, true, 2, ""), "training: epoch 2 of 2, 5 of 8 data tasks");
  js.set_epoch(2);  // all done
  EXPECT_EQ(JobPhase(js, true, 2, ""), "training: epoch 2 of 2, 5 of 8 data tasks");
  js.set_job_state(proto::JOB_EVALUATING);
  EXPECT_EQ(JobPhase(js, true, 2, ""), "evaluating");
}

TEST_F(JobTrackerTest, GaugesAreReadFromTheWorkersReportsAtEachScrape) {
  auto job = Make();
  MetricsRegistry metrics;
  job->RegisterMetrics(&metrics, [] { return View(); });
  job->Start(1);
  job->RecordProgress(1, Report(10, 640, 0.5, 4, 1));
  job->RecordProgress(2, Report(10, 360, 0.7, 4, 3));
  const std::string text = metrics.RenderPrometheus();
  EXPECT_THAT(text, HasSubstr("strata_job_samples 1000"));
  EXPECT_THAT(text, HasSubstr("strata_job_comm_share 0.5"));
  EXPECT_THAT(text, HasSubstr("strata_job_samples_per_second 200"));
}

TEST_F(JobTrackerTest, SummaryIsTheProtoPrintedAsJsonWithNumbersAndOptionalParts) {
  auto job = Make(Consistency::kBsp, Planted{true, 0.81, 0.45});
  job->Start(1);
  proto::ReportProgressRequest r1 = Report(10, 640, 0.4, 2, 1);
  (*r1.mutable_acked_pushes())[0] = 10;
  (*r1.mutable_acked_pushes())[1] = 10;
  job->RecordProgress(1, r1);
  proto::ReportProgressRequest r2 = Report(10, 640, 0.6, 2, 0);
  (*r2.mutable_acked_pushes())[0] = 10;
  job->RecordProgress(2, r2);
  job->RecordApplies(9, 40, 0.2);
  job->TaskCompleted(9);
  // Partition 0 holds all 10 of worker 2's and one more of worker 1's than
  // it acknowledged; partition 1 only 8 of worker 1's 10.
  job->SetLedger({{0, {{1, 11}, {2, 10}}}, {1, {{1, 8}}}});
  proto::ReportProgressRequest eval;
  eval.set_has_test_accuracy(true);
  eval.set_test_accuracy(0.75);
  eval.set_test_loss(0.5);
  eval.set_has_test_auc(true);
  eval.set_test_auc(0.8);
  job->Evaluated(eval);
  clock_.Advance(absl::Seconds(4));
  job->Finish(proto::JOB_SUCCEEDED, "");
  proto::JobStatus js;
  job->FillStatus(View(), &js);
  js.set_tasks_total(1ull << 40);  // (the master's part)
  const std::string json = SummaryJson(job->Summary(js, View()));
  const google::protobuf::Struct s = Parse(json);
  const auto& f = s.fields();
  EXPECT_EQ(f.at("job").string_value(), "fmnist");
  EXPECT_EQ(f.at("state").string_value(), "succeeded");
  EXPECT_DOUBLE_EQ(f.at("steps").number_value(), 10);
  // Counts past 2^32 are numbers, not strings.
  EXPECT_DOUBLE_EQ(f.at("tasks_total").number_value(), static_cast<double>(1ull << 40));
  EXPECT_DOUBLE_EQ(f.at("final_test_accuracy").number_value(), 0.75);
  EXPECT_DOUBLE_EQ(f.at("final_test_auc").number_value(), 0.8);
  EXPECT_DOUBLE_EQ(f.at("planted_test_auc").number_value(), 0.81);
  EXPECT_DOUBLE_EQ(f.at("failovers").number_value(), 0);  // zeros are printed
  EXPECT_EQ(f.count("checkpoints"), 0u);                  // the master's, when on
  const auto& ledger = f.at("ledger").struct_value().fields();
  EXPECT_DOUBLE_EQ(ledger.at("acked").number_value(), 30);
  EXPECT_DOUBLE_EQ(ledger.at("held").number_value(), 28);
  EXPECT_DOUBLE_EQ(ledger.at("lost").number_value(), 2);
  EXPECT_DOUBLE_EQ(ledger.at("unacked_applied").number_value(), 1);
  const auto& phases = f.at("step_phases").struct_value().fields();
  EXPECT_DOUBLE_EQ(phases.at("step_seconds").number_value(), 0.2);
  EXPECT_DOUBLE_EQ(phases.at("wait_seconds").number_value(), 0.05);
  EXPECT_DOUBLE_EQ(phases.at("apply_seconds_per_push").number_value(), 0.005);
  ASSERT_EQ(f.at("workers").list_value().values_size(), 2);
  EXPECT_DOUBLE_EQ(
      f.at("workers").list_value().values(1).struct_value().fields().at("index").number_value(), 1);

  // A job without a CTR evaluation, a planted model or the ledger.
  auto plain = Make();
  proto::JobStatus ps;
  plain->FillStatus(View(), &ps);
  const google::protobuf::Struct plain_summary = Parse(SummaryJson(plain->Summary(ps, View())));
  const auto& g = plain_summary.fields();
  EXPECT_EQ(g.count("final_test_auc"), 0u);
  EXPECT_EQ(g.count("planted_test_auc"), 0u);
  EXPECT_EQ(g.count("ledger"), 0u);
  EXPECT_EQ(g.count("step_phases"), 1u);
}

TEST_F(JobTrackerTest, StateLogRoundTripCountsTheRestart) {
  auto job = Make();
  job->Start(1);
  job->Resume(3, 1000, 41);
  job->TaskCompleted(50);
  job->Event("something happened");
  proto::MasterState st;
  job->Save(&st);
  for (const std::string& e : job->EventsFrom(0)) st.add_events(e);
  EXPECT_EQ(st.job_state(), proto::JOB_RUNNING);
  EXPECT_EQ(st.max_last_step(), 50u);

  auto again = Make();
  EXPECT_EQ(again->Restore(st), 1u);
  EXPECT_EQ(again->state(), proto::JOB_RUNNING);
  EXPECT_EQ(again->max_last_step(), 50u);
  EXPECT_EQ(again->events_size(), 1u);
  proto::JobStatus js;
  again->FillStatus(View(), &js);
  EXPECT_EQ(js.resumed_from_seq(), 3u);
  EXPECT_EQ(js.samples(), 1000u);
  proto::MasterState st2;
  again->Save(&st2);
  EXPECT_EQ(st2.restarts(), 1u);

  // A state directory of before JobState: the state's name only.
  proto::MasterState old;
  old.set_job_state_name("evaluating");
  auto third = Make();
  third->Restore(old);
  EXPECT_EQ(third->state(), proto::JOB_EVALUATING);
}

}  // namespace
}  // namespace strata::master
