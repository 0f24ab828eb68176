#include "master/checkpoint_coordinator.h"

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/crc32c.h"
#include "common/error_reason.h"
#include "common/grpc_status.h"
#include "common/model_spec.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "master/placement.h"
#include "master/pserver_calls.h"
#include "storage/checkpoint_format.h"
#include "storage/file_system.h"
#include "storage/ring_checkpoint.h"
#include "tests/testing/status_matchers.h"

namespace strata::master {
namespace {

using ::strata::testing::IsOk;
using ::strata::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kRoot[] = "/ckpt";

// A pserver's admin service that writes its partitions' files into the
// shared (memory) file system, as a real one does: a full image the first
// time, a delta after, and nothing when told its partition did not change.
class FakePServer final : public proto::PServerAdmin::Service {
 public:
  FakePServer(storage::FileSystem* fs, std::vector<uint32_t> partitions)
      : fs_(fs), partitions_(std::move(partitions)) {}

  grpc::Status GetStatus(grpc::ServerContext*, const proto::PServerStatusRequest*,
                         proto::PServerStatusResponse* resp) override {
    absl::MutexLock l(&mu_);
    for (uint32_t id : partitions_) {
      proto::PartitionStatus* p = resp->add_partitions();
      p->set_id(id);
      p->set_version(version_);
      (*p->mutable_applied_by_sender())[9] = version_ * 10 + id;  // the update ledger's
    }
    return grpc::Status::OK;
  }
  grpc::Status CheckpointPartitions(grpc::ServerContext* ctx,
                                    const proto::CheckpointPartitionsRequest* req,
                                    proto::CheckpointPartitionsResponse* resp) override {
    absl::MutexLock l(&mu_);
    requests_.push_back(*req);
    if (!fail_.ok()) return ToGrpcStatus(fail_);
    // As a pserver does: a bsp cut ahead of the partitions is waited for
    // (until the call is cancelled, or its deadline). (The wait holds mu_:
    // a test sees it by waiting_for_cut.)
    if (wait_for_cut_ && req->at_version() && version_ < req->version()) ++waiting_for_cut;
    while (wait_for_cut_ && req->at_version() && version_ < req->version()) {
      if (ctx->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
      mu_.AwaitWithTimeout(absl::Condition::kTrue, absl::Milliseconds(10));
    }
    if (cut_passed_ > 0) {
      --cut_passed_;
      return ToGrpcStatus(
          WithReason(absl::FailedPreconditionError("cut passed"), proto::REASON_CUT_PASSED));
    }
    for (uint32_t id : partitions_) {
      proto::CheckpointPartition* p = resp->add_partitions();
      p->set_id(id);
      p->set_version(req->at_version() ? req->version() : version_);
      p->set_raw_bytes(100);
      if (unchanged_) continue;  // nothing new since base_seq
      const bool full = req->base_seq() == 0;
      const std::string path =
          storage::JoinPath(storage::CheckpointDirName(req->seq()), absl::StrCat("p", id, ".blk"));
      const std::string data = absl::StrCat("partition ", id, " of ", req->seq());
      absl::Status s = fs_->WriteFileAtomic(storage::JoinPath(req->root(), path), data);
      if (!s.ok()) return ToGrpcStatus(s);
      proto::CheckpointFile* f = p->add_files();
      f->set_path(path);
      f->set_size(data.size());
      f->set_crc32c(Crc32c(data));
      f->set_seq(req->seq());
      f->set_full(full);
      resp->set_bytes_written(resp->bytes_written() + data.size());
    }
    return grpc::Status::OK;
  }

  grpc::Status AssignPartitions(grpc::ServerContext*, const proto::AssignPartitionsRequest* req,
                                proto::AssignPartitionsResponse*) override {
    absl::MutexLock l(&mu_);
    assigns_.push_back(*req);
    return ToGrpcStatus(assign_fail_);
  }

  void set_version(uint64_t v) {
    absl::MutexLock l(&mu_);
    version_ = v;
  }
  void FailAssign(absl::Status s) {
    absl::MutexLock l(&mu_);
    assign_fail_ = std::move(s);
  }
  std::vector<proto::AssignPartitionsRequest> assigns() {
    absl::MutexLock l(&mu_);
    return assigns_;
  }
  void Fail(absl::Status s) {
    absl::MutexLock l(&mu_);
    fail_ = std::move(s);
  }
  void PassCut(int times) {
    absl::MutexLock l(&mu_);
    cut_passed_ = times;
  }
  void WaitForCut(bool wait) {
    absl::MutexLock l(&mu_);
    wait_for_cut_ = wait;
  }
  void set_unchanged(bool u) {
    absl::MutexLock l(&mu_);
    unchanged_ = u;
  }
  std::vector<proto::CheckpointPartitionsRequest> requests() {
    absl::MutexLock l(&mu_);
    return requests_;
  }
  std::atomic<int> waiting_for_cut{0};  // calls that began waiting for their cut

 private:
  storage::FileSystem* const fs_;
  const std::vector<uint32_t> partitions_;
  absl::Mutex mu_;
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status fail_ ABSL_GUARDED_BY(mu_);
  int cut_passed_ ABSL_GUARDED_BY(mu_) = 0;
  bool wait_for_cut_ ABSL_GUARDED_BY(mu_) = false;
  bool unchanged_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<proto::CheckpointPartitionsRequest> requests_ ABSL_GUARDED_BY(mu_);
  absl::Status assign_fail_ ABSL_GUARDED_BY(mu_);
  std::vector<proto::AssignPartitionsRequest> assigns_ ABSL_GUARDED_BY(mu_);
};

// The rest of the master, as the coordinator sees it: two pservers owning
// partitions {0, 1} and {2}.
class FakeMaster final : public CheckpointCoordinator::Master {
 public:
  Cluster CheckpointCluster(bool with_view) override {
    Cluster c = Read(with_view);
    std::function<void()> after;
    {
      absl::MutexLock l(&mu_);
      after = std::exchange(after_read, nullptr);
    }
    if (after) after();
    return c;
  }
  Cluster Read(bool with_view) {
    absl::MutexLock l(&mu_);
    Cluster c;
    c.ready = ready;
    c.why_not = "the job is waiting (partitions not placed)";
    c.running = running;
    c.training_over = training_over;
    c.evaluating = evaluating;
    c.owners = owners;
    if (!with_view) return c;  // (a manifest made without it would miss every partition)
    for (uint32_t id : {0u, 1u, 2u}) {
      proto::PartitionInfo* p = c.view.add_partitions();
      p->set_id(id);
      p->set_owner(id < 2 ? 1 : 2);
      p->set_length(10);
    }
    // The view's tables (a manifest records them): the default config's.
    for (const auto& t : MakeTableInfos(ModelTables(JobConfig().model), 2)) {
      *c.view.add_tables() = t;
    }
    c.view.set_epoch(7);
    return c;
  }
  void FillManifestTasks(std::optional<uint64_t> cut_step, proto::CheckpointManifest* m) override {
    absl::MutexLock l(&mu_);
    cuts.push_back(cut_step);
    m->add_tasks_done(11);
    m->set_samples(640);
    m->set_next_node_id(5);
  }
  void StopAfterCheckpoint(uint64_t seq, const std::string& reason) override {
    absl::MutexLock l(&mu_);
    stopped_after = seq;
  }
  void FinalCheckpointDone() override {
    absl::MutexLock l(&mu_);
    ++final_done;
  }

  absl::Mutex mu_;
  bool ready ABSL_GUARDED_BY(mu_) = true;
  bool running ABSL_GUARDED_BY(mu_) = true;
  bool training_over ABSL_GUARDED_BY(mu_) = false;
  bool evaluating ABSL_GUARDED_BY(mu_) = false;
  std::vector<PServerTarget> owners ABSL_GUARDED_BY(mu_);
  std::vector<std::optional<uint64_t>> cuts ABSL_GUARDED_BY(mu_);
  uint64_t stopped_after ABSL_GUARDED_BY(mu_) = 0;
  int final_done ABSL_GUARDED_BY(mu_) = 0;
  // Run once, after the next read of the cluster (what happens between
  // that read and the coordinator's next step).
  std::function<void()> after_read ABSL_GUARDED_BY(mu_);
};

class CheckpointCoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(&ps1_);
    server1_ = b.BuildAndStart();
    stub1_ = proto::PServerAdmin::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
    grpc::ServerBuilder b2;
    int port2 = 0;
    b2.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port2);
    b2.RegisterService(&ps2_);
    server2_ = b2.BuildAndStart();
    stub2_ = proto::PServerAdmin::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port2), grpc::InsecureChannelCredentials()));
    absl::MutexLock l(&master_.mu_);
    master_.owners = {{1, stub1_.get()}, {2, stub2_.get()}};

    config_.job.name = "unit";
    config_.checkpoint.enabled = true;
    config_.checkpoint.dir = kRoot;
    config_.checkpoint.every_seconds = 60;
    config_.checkpoint.timeout_seconds = 5;
    EventSink::Options so;
    so.fs = fs_.get();
    so.clock = &clock_;
    sink_ = *EventSink::Open(std::move(so));
  }
  void TearDown() override {
    coordinator_.reset();
    server1_->Shutdown();
    server2_->Shutdown();
  }
  CheckpointCoordinator& Make() {
    coordinator_ = std::make_unique<CheckpointCoordinator>(
        CheckpointCoordinator::Options{config_, fs_.get(), &clock_, sink_.get(), nullptr},
        &master_);
    return *coordinator_;
  }
  proto::JobStatus Status() {
    proto::JobStatus js;
    coordinator_->FillStatus(&js);
    return js;
  }

  JobConfig config_;
  FakeClock clock_{absl::FromUnixMillis(1764590000000)};
  std::unique_ptr<storage::FileSystem> fs_ = storage::NewMemoryFileSystem();
  std::unique_ptr<EventSink> sink_;
  FakePServer ps1_{fs_.get(), {0, 1}};
  FakePServer ps2_{fs_.get(), {2}};
  std::unique_ptr<grpc::Server> server1_, server2_;
  std::unique_ptr<proto::PServerAdmin::Stub> stub1_, stub2_;
  FakeMaster master_;
  std::unique_ptr<CheckpointCoordinator> coordinator_;
};

TEST_F(CheckpointCoordinatorTest, DueByTimeBySteps_AndTheFinalOneFirst) {
  config_.checkpoint.every_steps = 100;
  CheckpointCoordinator& c = Make();
  EXPECT_EQ(c.Due(/*step=*/30, /*running=*/true), "");  // the clock starts; next at 100
  EXPECT_EQ(c.Due(99, true), "");
  EXPECT_EQ(c.Due(100, true), "steps");
  EXPECT_EQ(c.Due(150, true), "");  // next at 200
  clock_.Advance(absl::Seconds(59));
  EXPECT_EQ(c.Due(150, true), "");
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(c.Due(150, true), "interval");
  EXPECT_EQ(c.Due(250, false), "");  // not training: none by steps or time
  c.TrainingDone();
  EXPECT_TRUE(c.final_pending());
  EXPECT_EQ(c.Due(250, false), "final");
}

TEST_F(CheckpointCoordinatorTest, WritesAManifestOfEveryPartitionWithTheMastersTasks) {
  CheckpointCoordinator& c = Make();
  ps1_.set_version(41);
  ps2_.set_version(40);
  auto r = c.Checkpoint("request", /*stop_after=*/false);
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_EQ(r->seq(), 1u);
  EXPECT_FALSE(r->incremental());
  // bsp: the cut 16 steps after the newest version.
  EXPECT_EQ(r->step(), 57u);
  ASSERT_THAT(ps2_.requests(), ::testing::SizeIs(1));
  EXPECT_EQ(ps2_.requests()[0].version(), 57u);
  auto m =
      storage::ReadManifest(fs_.get(), storage::JoinPath(kRoot, storage::CheckpointDirName(1)));
  ASSERT_THAT(m.status(), IsOk());
  EXPECT_EQ(m->partitions_size(), 3);
  EXPECT_EQ(m->cluster_epoch(), 7u);
  EXPECT_THAT(m->tasks_done(), ElementsAre(11u));
  EXPECT_EQ(m->samples(), 640u);
  EXPECT_EQ(m->raw_bytes(), 300u);
  {
    absl::MutexLock l(&master_.mu_);
    ASSERT_EQ(master_.cuts.size(), 1u);
    EXPECT_EQ(master_.cuts[0], std::optional<uint64_t>(57));
    EXPECT_EQ(master_.stopped_after, 0u);
  }
  const proto::JobStatus js = Status();
  EXPECT_EQ(js.checkpoints(), 1u);
  EXPECT_EQ(js.last_checkpoint_seq(), 1u);
  EXPECT_EQ(js.checkpoint_in_progress(), 0u);  // none now
  proto::MasterState st;
  c.Save(&st);
  EXPECT_EQ(st.next_checkpoint_seq(), 2u);
}

TEST_F(CheckpointCoordinatorTest, TheNextOneChainsOnTheLastAndUnchangedPartitionsKeepTheirFiles) {
  CheckpointCoordinator& c = Make();
  ASSERT_THAT(c.Checkpoint("request", false).status(), IsOk());
  ps2_.set_unchanged(true);  // partition 2 did not change
  auto r = c.Checkpoint("request", false);
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_TRUE(r->incremental());
  auto m =
      storage::ReadManifest(fs_.get(), storage::JoinPath(kRoot, storage::CheckpointDirName(2)));
  ASSERT_THAT(m.status(), IsOk());
  EXPECT_EQ(m->base_seq(), 1u);
  for (const auto& p : m->partitions()) {
    ASSERT_GE(p.files_size(), 1) << p.id();
    EXPECT_TRUE(p.files(0).full());
    EXPECT_EQ(p.files(0).seq(), 1u);
    // 0 and 1: a delta of checkpoint 2 on top; 2: checkpoint 1's file only.
    EXPECT_EQ(p.files_size(), p.id() == 2 ? 1 : 2) << p.id();
  }
  // The manifest of the first checkpoint to resume from, read back.
  auto found = FindResumeCheckpoint(config_, fs_.get(), "latest");
  ASSERT_THAT(found.status(), IsOk());
  ASSERT_TRUE(found->has_value());
  EXPECT_EQ((*found)->manifest.seq(), 2u);
}

TEST_F(CheckpointCoordinatorTest, AFailingPServerFailsItAndThePreviousStaysTheLatest) {
  CheckpointCoordinator& c = Make();
  ASSERT_THAT(c.Checkpoint("request", false).status(), IsOk());
  ps2_.Fail(absl::UnavailableError("disk full"));
  auto r = c.Checkpoint("request", false);
  EXPECT_THAT(r.status().message(), HasSubstr("disk full"));
  EXPECT_FALSE(fs_->Exists(storage::JoinPath(kRoot, storage::CheckpointDirName(2))));
  const proto::JobStatus js = Status();
  EXPECT_EQ(js.checkpoints(), 1u);
  EXPECT_EQ(js.checkpoint_failures(), 1u);
  EXPECT_EQ(js.last_checkpoint_seq(), 1u);
  ASSERT_TRUE(c.last_manifest().has_value());
  EXPECT_EQ(c.last_manifest()->seq(), 1u);
}

TEST_F(CheckpointCoordinatorTest, ACutTrainingPassedIsSetFurtherAhead) {
  CheckpointCoordinator& c = Make();
  ps1_.set_version(100);
  ps1_.PassCut(1);
  auto r = c.Checkpoint("request", false);
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_EQ(r->step(), 164u);  // 100 + 16 passed; then 100 + 64
  ASSERT_EQ(ps1_.requests().size(), 2u);
  EXPECT_EQ(ps1_.requests()[0].version(), 116u);
}

// Training that ends between the coordinator reading the cluster and its
// calls for the cut being made: the cut ahead is never reached, and the
// TrainingDone that cancels waiting calls came before them. The calls are
// not made; the cut is set again where training stopped. (A job's final
// checkpoint hung on this once: its evaluation waits for it.)
TEST_F(CheckpointCoordinatorTest, TrainingEndingBeforeTheCallsAreMadeMovesTheCutBack) {
  CheckpointCoordinator& c = Make();
  ps1_.set_version(100);
  ps2_.set_version(100);
  ps1_.WaitForCut(true);
  ps2_.WaitForCut(true);
  {
    absl::MutexLock l(&master_.mu_);
    master_.after_read = [&] {
      {
        absl::MutexLock l(&master_.mu_);
        master_.running = false;
        master_.training_over = true;
      }
      c.TrainingDone();
    };
  }
  const absl::Time start = absl::Now();
  auto r = c.Checkpoint("steps", false);
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_EQ(r->step(), 100u);  // where training stopped
  // (Not at the calls' deadline: checkpoint.timeout_seconds 5, + 5.)
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  for (FakePServer* ps : {&ps1_, &ps2_}) {
    const auto reqs = ps->requests();
    ASSERT_EQ(reqs.size(), 1u);  // only the call at the moved cut was made
    EXPECT_EQ(reqs[0].version(), 100u);
  }
}

TEST_F(CheckpointCoordinatorTest, RefusedWhenOffOrTheJobIsNotRunning_StopsTheJobWhenAsked) {
  config_.checkpoint.enabled = false;
  EXPECT_THAT(Make().Checkpoint("request", false).status().message(),
              HasSubstr("checkpoints are off"));
  config_.checkpoint.enabled = true;
  CheckpointCoordinator& c = Make();
  {
    absl::MutexLock l(&master_.mu_);
    master_.ready = false;
  }
  auto refused = c.Checkpoint("request", false);
  EXPECT_TRUE(HasReason(refused.status(), proto::REASON_JOB_NOT_RUNNING)) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("partitions not placed"));
  {
    absl::MutexLock l(&master_.mu_);
    master_.ready = true;
  }
  auto r = c.Checkpoint("sigterm", /*stop_after=*/true);
  ASSERT_THAT(r.status(), IsOk());
  absl::MutexLock l(&master_.mu_);
  EXPECT_EQ(master_.stopped_after, r->seq());
}

TEST_F(CheckpointCoordinatorTest, TickTakesTheFinalCheckpointThenLetsTheJobEvaluate) {
  CheckpointCoordinator& c = Make();
  c.Tick();  // nothing due
  EXPECT_TRUE(ps1_.requests().empty());
  {
    absl::MutexLock l(&master_.mu_);
    master_.running = false;
    master_.training_over = true;
  }
  c.TrainingDone();
  c.Tick();
  EXPECT_FALSE(c.final_pending());
  ASSERT_EQ(ps1_.requests().size(), 1u);
  {
    absl::MutexLock l(&master_.mu_);
    EXPECT_EQ(master_.final_done, 1);
  }
  c.TrainingDone();  // (once only)
  EXPECT_FALSE(c.final_pending());
}

// A master paused under a checkpoint (its lead in etcd not renewed in
// time: MasterServer::Pause) cancels it; the checkpoint thread takes it
// again once the master acts again, not a whole interval later. The final
// one stays pending until it is taken.
TEST_F(CheckpointCoordinatorTest, ACheckpointAPauseCancelledIsTakenAgainOnceTheMasterActs) {
  config_.checkpoint.every_steps = 100;
  CheckpointCoordinator& c = Make();
  ps1_.set_version(150);
  ps2_.set_version(150);
  c.Tick();  // the first look starts the step count: next at 200
  EXPECT_TRUE(ps1_.requests().empty());
  ps1_.set_version(200);
  ps2_.set_version(200);
  // Due by steps; its cut is ahead, so the pservers wait for it, and the
  // master pauses meanwhile.
  ps1_.WaitForCut(true);
  ps2_.WaitForCut(true);
  std::thread pause([&] {
    // (Both calls made, each waiting: requests() would wait on the
    // handler's lock.)
    while (ps1_.waiting_for_cut.load() == 0 || ps2_.waiting_for_cut.load() == 0) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    {
      absl::MutexLock l(&master_.mu_);
      master_.ready = false;  // (a paused master's cluster is not ready)
    }
    c.CancelInflight();
  });
  c.Tick();
  pause.join();
  EXPECT_EQ(Status().checkpoints(), 0u);
  EXPECT_EQ(Status().checkpoint_failures(), 1u);
  c.Tick();  // paused: nothing
  EXPECT_EQ(ps1_.requests().size(), 1u);
  // It acts again: the cancelled one is due at once (the step trigger had
  // moved on to 300, and the pservers are still at 200).
  ps1_.WaitForCut(false);
  ps2_.WaitForCut(false);
  {
    absl::MutexLock l(&master_.mu_);
    master_.ready = true;
  }
  c.Tick();
  EXPECT_EQ(ps1_.requests().size(), 2u);
  EXPECT_EQ(Status().checkpoints(), 1u);
  c.Tick();  // nothing more due
  EXPECT_EQ(ps1_.requests().size(), 2u);

  // The final checkpoint, cancelled so: still pending, taken after the pause.
  {
    absl::MutexLock l(&master_.mu_);
    master_.running = false;
    master_.training_over = true;
    master_.after_read = [&] { c.CancelInflight(); };  // paused just after the read
  }
  c.TrainingDone();
  ps1_.Fail(absl::CancelledError("cancelled"));
  c.Tick();
  EXPECT_TRUE(c.final_pending());
  {
    absl::MutexLock l(&master_.mu_);
    EXPECT_EQ(master_.final_done, 0);
  }
  ps1_.Fail(absl::OkStatus());
  c.Tick();
  EXPECT_FALSE(c.final_pending());
  absl::MutexLock l(&master_.mu_);
  EXPECT_EQ(master_.final_done, 1);
}

// A job resuming from a checkpoint places its partitions from it: the
// pservers get the partitions' chains only, the phase says how far the
// loading is, and once placed there is nothing left to restore.
TEST_F(CheckpointCoordinatorTest, AResumedJobsPartitionsArePlacedFromTheCheckpoint) {
  CheckpointCoordinator& c = Make();
  ASSERT_THAT(c.Checkpoint("request", false).status(), IsOk());
  auto start = FindCheckpointStart(config_, fs_.get(), "latest", /*restarted=*/false);
  ASSERT_THAT(start.status(), IsOk());
  ASSERT_TRUE(start->resumed.has_value());
  EXPECT_EQ(start->resumed->manifest.seq(), 1u);
  EXPECT_EQ(start->next_seq, 2u);

  CheckpointCoordinator& resumed = Make();
  resumed.Resume(*start->resumed);
  proto::ClusterView view;
  view.set_epoch(3);
  const std::vector<PServerTarget> targets = {{1, stub1_.get()}, {2, stub2_.get()}};
  // Pserver 2 cannot load it: the job cannot go on; one of two had loaded.
  ps2_.FailAssign(absl::DataLossError("p2.blk: bad crc"));
  const absl::Status failed = resumed.PlacePartitions(view, targets);
  EXPECT_TRUE(absl::IsFailedPrecondition(failed)) << failed;
  EXPECT_THAT(failed.message(), HasSubstr("cannot restore checkpoint 1"));
  EXPECT_EQ(resumed.RestorePhase(), "restoring checkpoint 1: 1 of 2 pserver(s) loaded");
  // Unreachable: again later, from the start.
  ps2_.FailAssign(absl::UnavailableError("restarting"));
  EXPECT_TRUE(absl::IsUnavailable(resumed.PlacePartitions(view, targets)));
  ps2_.FailAssign(absl::OkStatus());
  ASSERT_THAT(resumed.PlacePartitions(view, targets), IsOk());
  EXPECT_EQ(resumed.RestorePhase(), "restoring checkpoint 1: 2 of 2 pserver(s) loaded");
  resumed.RestorePlaced();  // (the master, once the placement is its view)
  EXPECT_EQ(resumed.RestorePhase(), "");
  const std::vector<proto::AssignPartitionsRequest> got = ps1_.assigns();
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got.back().node_id(), 1u);
  EXPECT_EQ(got.back().view().epoch(), 3u);
  EXPECT_EQ(got.back().checkpoint_root(), kRoot);
  EXPECT_EQ(got.back().restore().seq(), 1u);
  EXPECT_EQ(got.back().restore().partitions_size(), 3);
  EXPECT_EQ(got.back().restore().tables_size(), 0);  // the chains only
  // Placed: a later placement (new backups, say) restores nothing.
  ASSERT_THAT(resumed.PlacePartitions(view, targets), IsOk());
  EXPECT_FALSE(ps1_.assigns().back().has_restore());
  // Under this job's checkpoint.dir: the next one builds on it.
  ASSERT_TRUE(resumed.last_manifest().has_value());
  EXPECT_EQ(resumed.last_manifest()->seq(), 1u);
}

// A restarted master carries on from its own last checkpoint (its resume
// flag is then ignored); a fresh one with nothing to resume from starts
// after every directory there, complete or not.
TEST_F(CheckpointCoordinatorTest, FindCheckpointStartForARestartedOrAFreshMaster) {
  auto fresh = FindCheckpointStart(config_, fs_.get(), "", /*restarted=*/false);
  ASSERT_THAT(fresh.status(), IsOk());
  EXPECT_FALSE(fresh->resumed.has_value());
  EXPECT_EQ(fresh->next_seq, 1u);
  ASSERT_THAT(Make().Checkpoint("request", false).status(), IsOk());
  ASSERT_THAT(fs_->WriteFileAtomic(
                  storage::JoinPath(kRoot, storage::CheckpointDirName(5) + "/p0.blk"), "partial"),
              IsOk());
  auto restarted = FindCheckpointStart(config_, fs_.get(), "/elsewhere", /*restarted=*/true);
  ASSERT_THAT(restarted.status(), IsOk());
  ASSERT_TRUE(restarted->resumed.has_value());
  EXPECT_EQ(restarted->resumed->manifest.seq(), 1u);
  EXPECT_EQ(restarted->next_seq, 6u);
  EXPECT_FALSE(FindCheckpointStart(config_, fs_.get(), "/missing", false).ok());
}

TEST_F(CheckpointCoordinatorTest, AFailedCheckpointBeforeAStopSaysTheJobGoesOn) {
  CheckpointCoordinator& c = Make();
  ps1_.Fail(absl::UnavailableError("disk full"));
  auto r = c.CheckpointBeforeStop("operator");
  EXPECT_THAT(r.status().message(), HasSubstr("not stopped"));
  EXPECT_THAT(r.status().message(), HasSubstr("disk full"));
  {
    absl::MutexLock l(&master_.mu_);
    EXPECT_EQ(master_.stopped_after, 0u);
  }
  ps1_.Fail(absl::OkStatus());
  r = c.CheckpointBeforeStop("operator");
  ASSERT_THAT(r.status(), IsOk());
  absl::MutexLock l(&master_.mu_);
  EXPECT_EQ(master_.stopped_after, r->seq());
}

// What the master asks of pservers (master/pserver_calls.h), against the
// fake pservers: the newest version, the ledger from primaries only, the
// probe of one that answers and one that does not.
TEST_F(CheckpointCoordinatorTest, PServerCallsReadVersionsTheLedgerAndProbe) {
  ps1_.set_version(7);
  ps2_.set_version(9);
  const std::vector<PServerTarget> both = {{1, stub1_.get()}, {2, stub2_.get()}};
  auto newest = NewestPartitionVersion(both);
  ASSERT_THAT(newest.status(), IsOk());
  EXPECT_EQ(*newest, 9u);
  // Partition 1's primary is node 2 (node 1 holds a backup's copy): only
  // partitions 0 and 2 are counted, from their primaries.
  auto ledger = ReadLedger(both, {{0, 1}, {1, 2}, {2, 2}});
  ASSERT_THAT(ledger.status(), IsOk());
  EXPECT_EQ(ledger->size(), 2u);
  EXPECT_EQ(ledger->count(1), 0u);
  EXPECT_EQ((*ledger)[0][9], 70u);
  EXPECT_EQ((*ledger)[2][9], 92u);
  EXPECT_THAT(ProbePServer(both[0], absl::Seconds(5)), IsOk());
  server2_->Shutdown();
  const absl::Status down = ProbePServer(both[1], absl::Milliseconds(500));
  EXPECT_FALSE(down.ok());
  EXPECT_THAT(down.message(), HasSubstr("pserver node 2"));
  EXPECT_FALSE(ReadLedger(both, {{0, 1}}).ok());
}

TEST_F(CheckpointCoordinatorTest, ARestartedMasterCarriesOnTheSequenceAndTheCounts) {
  CheckpointCoordinator& c = Make();
  proto::MasterState st;
  st.set_next_checkpoint_seq(9);
  st.set_checkpoints_done(4);
  c.set_next_seq(3);
  ResumePoint last{kRoot, proto::CheckpointManifest()};
  last.manifest.set_seq(8);
  c.Restore(st, last);
  proto::MasterState saved;
  c.Save(&saved);
  EXPECT_EQ(saved.next_checkpoint_seq(), 9u);
  EXPECT_EQ(saved.checkpoints_done(), 4u);
  EXPECT_EQ(Status().last_checkpoint_seq(), 8u);
}

// model.dense_sync allreduce: the workers' ring writes the dense tables'
// shards (storage/ring_checkpoint.h). The coordinator asks for them in the
// workers' heartbeat responses beside the pservers' calls; a ring past the
// cut is asked again further ahead (a new id); the shards of one ring that
// tile the tables join the manifest; a resumed job hands them to its
// workers until the ring has gone past them.
TEST_F(CheckpointCoordinatorTest, TheRingsShardsJoinTheManifestAndARingPastTheCutIsAskedAgain) {
  config_.model.dense_sync = "allreduce";
  config_.cluster.heartbeat_interval_ms = 50;
  uint64_t floats = 0;
  for (const TableSpec& t : ModelTables(config_.model)) {
    if (t.allreduce) floats += t.num_elements();
  }
  ASSERT_GT(floats, 10u);
  CheckpointCoordinator& c = Make();
  ps1_.set_version(41);
  ps2_.set_version(41);
  // Two workers, nodes 5 and 6: the ring is at update 30 (behind the
  // pservers' heartbeats here: the newest counts).
  auto beat = [&](uint32_t node, std::vector<proto::RingCheckpointReport> reports) {
    proto::HeartbeatRequest req;
    req.set_ring_updates(30);
    for (auto& r : reports) *req.add_ring_checkpoints() = r;
    proto::HeartbeatResponse resp;
    c.RingBeat(node, req, &resp);
    return resp.ring_checkpoint();
  };
  absl::StatusOr<proto::CheckpointResponse> result;
  std::thread checkpoint([&] { result = c.Checkpoint("request", false); });
  std::vector<proto::RingCheckpointRequest> asks;
  for (int i = 0; i < 400 && asks.size() < 2; ++i) {
    const proto::RingCheckpointRequest ask = beat(5, {});
    if (ask.id() == 0 || (!asks.empty() && ask.id() == asks.back().id())) {
      absl::SleepFor(absl::Milliseconds(10));
      continue;
    }
    asks.push_back(ask);
    proto::RingCheckpointReport r;
    r.set_id(ask.id());
    r.set_seq(ask.seq());
    r.set_cut(ask.cut());
    if (asks.size() == 1) {  // the first: the ring was past it
      r.set_passed(true);
      beat(6, {r});
      continue;
    }
    r.set_ring_size(2);
    r.set_ring_epoch(9);
    r.set_floats(floats);
    r.set_step(ask.cut() + 3);  // (idle steps besides)
    r.set_updates(ask.cut());
    std::vector<proto::RingCheckpointReport> shards;
    for (uint32_t rank : {0u, 1u}) {
      proto::RingCheckpointReport s = r;
      s.mutable_shard()->set_rank(rank);
      s.mutable_shard()->set_begin(rank == 0 ? floats / 2 : 0);
      s.mutable_shard()->set_end(rank == 0 ? floats : floats / 2);
      s.mutable_shard()->mutable_file()->set_path(storage::RingShardFileName(ask.seq(), 9, rank));
      s.mutable_shard()->mutable_file()->set_size(100 + rank);
      shards.push_back(s);
    }
    // A shard of another ring first (a member that formed a newer one):
    // it does not complete the checkpoint on its own.
    proto::RingCheckpointReport stray = shards[1];
    stray.set_ring_epoch(10);
    beat(7, {stray});
    beat(5, {shards[0]});
    beat(6, {shards[1]});
  }
  checkpoint.join();
  ASSERT_EQ(asks.size(), 2u);
  EXPECT_EQ(asks[0].seq(), 1u);
  EXPECT_EQ(asks[0].root(), kRoot);
  EXPECT_EQ(asks[0].cut(), 57u);  // 41 + 16
  EXPECT_EQ(asks[1].seq(), 1u);
  EXPECT_GT(asks[1].id(), asks[0].id());
  EXPECT_EQ(asks[1].cut(), 105u);  // 41 + 64
  ASSERT_THAT(result.status(), IsOk());
  EXPECT_EQ(result->step(), 105u);  // the pservers' cut
  auto m =
      storage::ReadManifest(fs_.get(), storage::JoinPath(kRoot, storage::CheckpointDirName(1)));
  ASSERT_THAT(m.status(), IsOk());
  ASSERT_EQ(m->ring_shards_size(), 2);
  EXPECT_EQ(m->ring_floats(), floats);
  EXPECT_EQ(m->ring_updates(), 105u);
  EXPECT_EQ(m->ring_step(), 108u);
  EXPECT_EQ(m->ring_shards(0).begin(), 0u);  // in the order of the flat space
  EXPECT_EQ(m->ring_shards(1).begin(), floats / 2);
  // Asked no more: the heartbeats' responses say so.
  EXPECT_EQ(beat(5, {}).id(), 0u);
  // A worker restarting now (the ring has not passed update 105) starts
  // from the newest checkpoint.
  ASSERT_TRUE(c.RingRestore().has_value());
  EXPECT_EQ(c.RingRestore()->seq(), 1u);

  // Resumed from it: registering workers get its shards while the ring
  // has not gone past them.
  CheckpointCoordinator& resumed = Make();
  resumed.Resume(ResumePoint{kRoot, *m});
  std::optional<proto::RingRestore> restore = resumed.RingRestore();
  ASSERT_TRUE(restore.has_value());
  EXPECT_EQ(restore->seq(), 1u);
  EXPECT_EQ(restore->shards_size(), 2);
  EXPECT_EQ(restore->updates(), 105u);
  proto::HeartbeatRequest later;
  later.set_ring_updates(106);
  proto::HeartbeatResponse resp;
  resumed.RingBeat(5, later, &resp);
  EXPECT_FALSE(resumed.RingRestore().has_value());
}

// Once the evaluator is chosen the ring's members leave their steps
// (docs/reliability.md, "The job's end"): a checkpoint asked for then is
// refused at once, naming the one that holds the model, not failed at
// checkpoint.timeout_seconds; one that was waiting for the ring's shards
// when the evaluator was chosen gives up then. (A pserver-only job's is
// taken.)
TEST_F(CheckpointCoordinatorTest, NoRingCheckpointWhileTheModelIsEvaluated) {
  for (const std::string sync : {"allreduce", "ps"}) {
    SCOPED_TRACE(sync);
    config_.model.dense_sync = sync;
    CheckpointCoordinator& c = Make();
    {
      absl::MutexLock l(&master_.mu_);
      master_.running = false;
      master_.training_over = true;
      master_.evaluating = true;
    }
    const size_t calls = ps1_.requests().size();
    const absl::Time start = absl::Now();
    auto r = c.Checkpoint("request", false);
    if (sync == "ps") {
      EXPECT_THAT(r.status(), IsOk());
      continue;
    }
    EXPECT_TRUE(HasReason(r.status(), proto::REASON_JOB_NOT_RUNNING)) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr("steps no more while the model is evaluated"));
    EXPECT_THAT(r.status().message(), HasSubstr("no checkpoint holds the trained model"));
    EXPECT_LT(absl::Now() - start, absl::Seconds(3));  // (timeout_seconds is 5)
    EXPECT_EQ(Status().checkpoint_failures(), 0u);
    EXPECT_EQ(ps1_.requests().size(), calls);  // (no pserver was asked)

    // Chosen while the checkpoint waits for the ring: it gives up then.
    {
      absl::MutexLock l(&master_.mu_);
      master_.evaluating = false;
      master_.after_read = [&] {
        absl::MutexLock l(&master_.mu_);
        master_.evaluating = true;
      };
    }
    const absl::Time again = absl::Now();
    r = c.Checkpoint("request", false);
    EXPECT_THAT(r.status(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                     HasSubstr("steps no more while the model is evaluated")));
    EXPECT_LT(absl::Now() - again, absl::Seconds(3));
  }
}

// A ring that writes no whole set of shards fails the checkpoint in
// checkpoint.timeout_seconds, naming what came; the previous stays.
TEST_F(CheckpointCoordinatorTest, ARingThatWritesNoWholeSetFailsTheCheckpoint) {
  config_.model.dense_sync = "allreduce";
  config_.checkpoint.timeout_seconds = 1;
  CheckpointCoordinator& c = Make();
  auto r = c.Checkpoint("request", false);
  EXPECT_TRUE(absl::IsDeadlineExceeded(r.status())) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("the workers' ring wrote no whole set of shards"));
  EXPECT_FALSE(c.last_manifest().has_value());
}

// A checkpoint of a job whose dense tables were on the pservers does not
// resume one that keeps them by allreduce (nor the other way round): the
// refusal names the table and where each keeps it.
TEST_F(CheckpointCoordinatorTest, ACheckpointOfPServerTablesDoesNotResumeAnAllreduceJob) {
  CheckpointCoordinator& c = Make();
  ASSERT_THAT(c.Checkpoint("request", false).status(), IsOk());
  JobConfig ring = config_;
  ring.model.dense_sync = "allreduce";
  auto found = FindResumeCheckpoint(ring, fs_.get(), storage::JoinPath(kRoot, "ckpt-00000001"));
  EXPECT_TRUE(absl::IsFailedPrecondition(found.status())) << found.status();
  EXPECT_THAT(std::string(found.status().message()),
              HasSubstr("(on the pservers) in the checkpoint, fc0.weight [784x256] (allreduce "
                        "among the workers) in the config"))
      << found.status();
}

// A worker that cannot write its shard fails the checkpoint at once,
// naming the node and why; the previous checkpoint stays the latest.
TEST_F(CheckpointCoordinatorTest, AShardAWorkerCouldNotWriteFailsTheCheckpointNamingIt) {
  config_.model.dense_sync = "allreduce";
  CheckpointCoordinator& c = Make();
  absl::StatusOr<proto::CheckpointResponse> result;
  std::thread checkpoint([&] { result = c.Checkpoint("request", false); });
  for (int i = 0; i < 400; ++i) {
    proto::HeartbeatResponse resp;
    c.RingBeat(5, proto::HeartbeatRequest(), &resp);
    if (resp.ring_checkpoint().id() == 0) {
      absl::SleepFor(absl::Milliseconds(10));
      continue;
    }
    proto::HeartbeatRequest req;
    proto::RingCheckpointReport* r = req.add_ring_checkpoints();
    r->set_id(resp.ring_checkpoint().id());
    r->set_seq(resp.ring_checkpoint().seq());
    r->set_error("/ckpt/ckpt-00000001/ring-9-00000.blk: No space left on device");
    c.RingBeat(5, req, &resp);
    break;
  }
  checkpoint.join();
  EXPECT_TRUE(absl::IsUnavailable(result.status())) << result.status();
  EXPECT_THAT(std::string(result.status().message()),
              HasSubstr("worker node 5 could not write its ring shard: "
                        "/ckpt/ckpt-00000001/ring-9-00000.blk: No space left on device"));
  EXPECT_FALSE(c.last_manifest().has_value());
}

}  // namespace
}  // namespace strata::master
