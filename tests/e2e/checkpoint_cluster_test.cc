// Checkpoints of an in-process cluster written through a fault-injecting
// file system: a crash at every write of a checkpoint, a full disk, and
// every kind of bad checkpoint a resume must refuse.
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/checkpoint_export.h"
#include "storage/checkpoint_format.h"
#include "storage/faulty_file_system.h"
#include "tests/testing/inproc_cluster.h"
#include "tests/testing/status_matchers.h"

namespace strata::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

class CheckpointClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
    std::string templ = absl::StrCat(::testing::TempDir(), "strata_ckpt_test.XXXXXX");
    ASSERT_NE(mkdtemp(templ.data()), nullptr);
    dir_ = templ;
    root_ = dir_ + "/ck";
  }
  void TearDown() override {
    if (!dir_.empty()) ASSERT_EQ(std::system(("rm -rf '" + dir_ + "'").c_str()), 0);
  }

  JobConfig Config(Consistency c) const {
    JobConfig config = SmallFashionMnistConfig();
    config.job.consistency = c;
    config.checkpoint.enabled = true;
    config.checkpoint.dir = root_;
    config.checkpoint.every_seconds = 0;
    config.checkpoint.on_finish = false;
    config.checkpoint.keep_last = 2;
    config.checkpoint.timeout_seconds = 20;
    return config;
  }

  absl::StatusOr<std::unique_ptr<InProcCluster>> StartCluster(const JobConfig& config,
                                                              int workers = 1) {
    InProcClusterOptions o;
    o.config = config;
    o.pservers = 2;
    o.workers = workers;
    o.fs = &faulty_;
    STRATA_ASSIGN_OR_RETURN(auto c, InProcCluster::Start(std::move(o)));
    // Running once every node has registered and the partitions are placed.
    for (int i = 0; i < 200 && c->master()->GetStatus().job().state() != "running"; ++i) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    return c;
  }

  // The checkpoint a restarted master resumes from (0: a fresh start), or
  // why it refuses to start.
  absl::StatusOr<uint64_t> ResumeFrom(const JobConfig& config, const std::string& resume) {
    master::MasterOptions o;
    o.config = config;
    o.fs = fs_.get();
    o.resume = resume;
    STRATA_ASSIGN_OR_RETURN(auto m, master::MasterServer::Create(std::move(o)));
    return m->GetStatus().job().resumed_from_seq();
  }

  std::string dir_, root_;
  std::unique_ptr<storage::FileSystem> fs_ = storage::NewPosixFileSystem();
  storage::FaultyFileSystem faulty_{fs_.get()};
};

TEST_F(CheckpointClusterTest, ACrashAtAnyWriteLeavesTheNewestCompleteCheckpointRestorable) {
  JobConfig config = Config(Consistency::kAsp);
  config.checkpoint.incremental = false;  // every checkpoint writes every file
  STRATA_ASSERT_OK_AND_ASSIGN(auto cluster, StartCluster(config));
  STRATA_ASSERT_OK_AND_ASSIGN(auto first, cluster->master()->Checkpoint("request", false));
  EXPECT_EQ(first.seq(), 1u);
  // How many write operations one checkpoint takes (the retention that
  // follows it included).
  const int64_t before = faulty_.write_ops();
  STRATA_ASSERT_OK_AND_ASSIGN(auto second, cluster->master()->Checkpoint("request", false));
  const int64_t ops = faulty_.write_ops() - before;
  ASSERT_GT(ops, 20);
  RecordProperty("write_ops_per_checkpoint", static_cast<int>(ops));
  uint64_t newest = second.seq();
  for (int64_t n = 0; n <= ops; ++n) {
    SCOPED_TRACE(absl::StrCat("crash at write ", n, " of ", ops));
    faulty_.CrashAfter(n);
    auto r = cluster->master()->Checkpoint("request", false);
    // The machine goes down: what was not synced is lost (half of it kept
    // every other time: a torn write).
    faulty_.DropUnsyncedData(/*torn=*/n % 2 == 1);
    if (r.ok()) newest = r->seq();
    STRATA_ASSERT_OK_AND_ASSIGN(uint64_t resumed, ResumeFrom(config, "latest"));
    EXPECT_EQ(resumed, newest);
    // A checkpoint without its manifest is no checkpoint.
    if (!r.ok()) {
      EXPECT_FALSE(fs_->Exists(storage::JoinPath(
          storage::JoinPath(root_, storage::CheckpointDirName(newest + 1)), "MANIFEST")));
    }
  }
  // After all that, checkpoints work again.
  STRATA_ASSERT_OK_AND_ASSIGN(auto last, cluster->master()->Checkpoint("request", false));
  STRATA_ASSERT_OK_AND_ASSIGN(uint64_t resumed, ResumeFrom(config, "latest"));
  EXPECT_EQ(resumed, last.seq());
  cluster->Shutdown();
}

TEST_F(CheckpointClusterTest, AFullDiskFailsTheCheckpointButNotTrainingOrThePreviousOne) {
  JobConfig config = Config(Consistency::kAsp);
  config.job.epochs = 20;  // still training after the checkpoints
  config.checkpoint.incremental = false;
  STRATA_ASSERT_OK_AND_ASSIGN(auto cluster, StartCluster(config, 2));
  cluster->RunWorkers();
  STRATA_ASSERT_OK_AND_ASSIGN(auto first, cluster->master()->Checkpoint("request", false));
  faulty_.SetSpaceLimit(4000);
  auto full = cluster->master()->Checkpoint("request", false);
  EXPECT_THAT(full.status(),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("No space left on device")));
  faulty_.ClearFaults();
  // The failed one left nothing; the previous one is whole.
  EXPECT_FALSE(fs_->Exists(storage::JoinPath(root_, storage::CheckpointDirName(first.seq() + 1))));
  STRATA_ASSERT_OK_AND_ASSIGN(uint64_t resumed, ResumeFrom(config, "latest"));
  EXPECT_EQ(resumed, first.seq());
  // Space again: the next checkpoint works, and training went on throughout.
  STRATA_ASSERT_OK_AND_ASSIGN(auto next, cluster->master()->Checkpoint("request", false));
  EXPECT_EQ(next.seq(), first.seq() + 2);
  STRATA_ASSERT_OK(cluster->JoinWorkers());
  ASSERT_TRUE(cluster->master()->WaitForJobEnd(absl::Seconds(60)));
  const proto::JobStatus job = cluster->master()->GetStatus().job();
  EXPECT_EQ(job.state(), "succeeded") << job.message();
  EXPECT_EQ(job.checkpoints(), 2u);
  EXPECT_EQ(job.checkpoint_failures(), 1u);
  cluster->Shutdown();
}

TEST_F(CheckpointClusterTest, TheMasterCheckpointsEveryIntervalWhileTrainingGoesOn) {
  JobConfig config = Config(Consistency::kAsp);
  config.job.epochs = 200;  // longer than the test waits
  config.checkpoint.every_seconds = 1;
  STRATA_ASSERT_OK_AND_ASSIGN(auto cluster, StartCluster(config));
  cluster->RunWorkers();
  for (int i = 0; i < 300 && cluster->master()->GetStatus().job().checkpoints() < 2; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_GE(cluster->master()->GetStatus().job().checkpoints(), 2u);
  STRATA_ASSERT_OK_AND_ASSIGN(auto all, storage::ListCheckpoints(fs_.get(), root_));
  ASSERT_FALSE(all.empty());
  STRATA_ASSERT_OK_AND_ASSIGN(auto m, storage::ReadManifest(fs_.get(), all.back().dir));
  EXPECT_EQ(m.reason(), "interval");
  cluster->Shutdown();
}

TEST_F(CheckpointClusterTest, BadCheckpointsAreRefusedNamingTheFile) {
  JobConfig config = Config(Consistency::kBsp);
  // Each checkpoint writes its own files: an incremental one would share a
  // partition that did not change in between (a loaded machine may not
  // step between the two), and damaging it would damage both.
  config.checkpoint.incremental = false;
  {
    STRATA_ASSERT_OK_AND_ASSIGN(auto cluster, StartCluster(config));
    cluster->RunWorkers();
    STRATA_ASSERT_OK(cluster->master()->Checkpoint("request", false).status());
    STRATA_ASSERT_OK(cluster->master()->Checkpoint("request", false).status());
    STRATA_ASSERT_OK(cluster->JoinWorkers());
    cluster->Shutdown();
  }
  const std::string ck1 = storage::JoinPath(root_, storage::CheckpointDirName(1));
  const std::string ck2 = storage::JoinPath(root_, storage::CheckpointDirName(2));
  const std::string manifest2 = storage::JoinPath(ck2, "MANIFEST");
  STRATA_ASSERT_OK_AND_ASSIGN(uint64_t resumed, ResumeFrom(config, "latest"));
  EXPECT_EQ(resumed, 2u);
  STRATA_ASSERT_OK_AND_ASSIGN(resumed, ResumeFrom(config, ck1));
  EXPECT_EQ(resumed, 1u);
  // An inference export (bf16, no optimizer state) is no checkpoint to
  // resume from.
  const std::string exported = dir_ + "/export/ckpt-00000001";
  STRATA_ASSERT_OK(
      storage::ExportCheckpoint(fs_.get(), ck1, exported, storage::Precision::kBf16).status());
  EXPECT_THAT(ResumeFrom(config, exported),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("an inference export")));

  // Another job, another model, another optimizer: refused, saying so.
  JobConfig other = config;
  other.job.name = "someone-else";
  EXPECT_THAT(ResumeFrom(other, ck2), StatusIs(absl::StatusCode::kFailedPrecondition,
                                               HasSubstr(manifest2 + ": a checkpoint of job")));
  other = config;
  other.model.layers = {784, 64, 10};
  EXPECT_THAT(ResumeFrom(other, ck2), StatusIs(absl::StatusCode::kFailedPrecondition,
                                               HasSubstr("its model does not match")));
  other = config;
  other.optimizer.type = "sgd";
  EXPECT_THAT(ResumeFrom(other, ck2), StatusIs(absl::StatusCode::kFailedPrecondition,
                                               HasSubstr("optimizer 'adam' in the checkpoint")));

  STRATA_ASSERT_OK_AND_ASSIGN(std::string good_manifest, fs_->ReadFile(manifest2));
  STRATA_ASSERT_OK_AND_ASSIGN(auto m2, storage::ReadManifest(fs_.get(), ck2));
  const std::string part = storage::JoinPath(root_, m2.partitions(0).files(0).path());
  STRATA_ASSERT_OK_AND_ASSIGN(std::string good_part, fs_->ReadFile(part));

  // A truncated partition file.
  STRATA_ASSERT_OK(fs_->WriteFileAtomic(part, good_part.substr(0, good_part.size() / 2)));
  EXPECT_THAT(ResumeFrom(config, ck2), StatusIs(absl::StatusCode::kDataLoss, HasSubstr(part)));
  // ... and `latest` goes back to the previous checkpoint.
  STRATA_ASSERT_OK_AND_ASSIGN(resumed, ResumeFrom(config, "latest"));
  EXPECT_EQ(resumed, 1u);
  // A flipped bit in it.
  std::string flipped = good_part;
  flipped[flipped.size() - 3] ^= 0x01;
  STRATA_ASSERT_OK(fs_->WriteFileAtomic(part, flipped));
  EXPECT_THAT(ResumeFrom(config, ck2),
              StatusIs(absl::StatusCode::kDataLoss, AllOf(HasSubstr(part), HasSubstr("corrupt"))));
  STRATA_ASSERT_OK(fs_->WriteFileAtomic(part, good_part));

  // A corrupt manifest.
  std::string bad = good_manifest;
  bad[bad.size() - 5] ^= 0x20;
  STRATA_ASSERT_OK(fs_->WriteFileAtomic(manifest2, bad));
  EXPECT_THAT(ResumeFrom(config, ck2), StatusIs(absl::StatusCode::kDataLoss, HasSubstr(manifest2)));
  // Another format version.
  bad = good_manifest;
  bad[8] = 9;
  STRATA_ASSERT_OK(fs_->WriteFileAtomic(manifest2, bad));
  EXPECT_THAT(ResumeFrom(config, ck2),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr(manifest2), HasSubstr("format version 9"))));
  STRATA_ASSERT_OK_AND_ASSIGN(resumed, ResumeFrom(config, "latest"));
  EXPECT_EQ(resumed, 1u);
  // No manifest: an unfinished checkpoint, skipped by `latest`.
  STRATA_ASSERT_OK(fs_->DeleteFile(manifest2));
  STRATA_ASSERT_OK_AND_ASSIGN(resumed, ResumeFrom(config, "latest"));
  EXPECT_EQ(resumed, 1u);
  EXPECT_THAT(ResumeFrom(config, ck2), StatusIs(absl::StatusCode::kNotFound, HasSubstr(manifest2)));
  // Every checkpoint bad: `latest` refuses to start rather than start over.
  STRATA_ASSERT_OK(fs_->DeleteFile(storage::JoinPath(root_, m2.partitions(0).files(0).path())));
  STRATA_ASSERT_OK_AND_ASSIGN(auto m1, storage::ReadManifest(fs_.get(), ck1));
  STRATA_ASSERT_OK(fs_->DeleteFile(storage::JoinPath(root_, m1.partitions(0).files(0).path())));
  EXPECT_THAT(ResumeFrom(config, "latest"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no usable checkpoint")));
  // None at all: a fresh start.
  STRATA_ASSERT_OK(fs_->DeleteRecursively(root_));
  STRATA_ASSERT_OK_AND_ASSIGN(resumed, ResumeFrom(config, "latest"));
  EXPECT_EQ(resumed, 0u);
}

}  // namespace
}  // namespace strata::testing
