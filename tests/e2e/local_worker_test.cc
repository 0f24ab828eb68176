// strata-worker --local: one process trains alone (no master, no pservers),
// the baseline that docs/performance.md measures the cluster against.
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/inproc_cluster.h"
#include "tests/testing/status_matchers.h"

namespace strata::testing {
namespace {

TEST(LocalWorkerTest, TrainsAloneOverEveryRecordOfEveryEpoch) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  auto fs = storage::NewPosixFileSystem();
  worker::WorkerOptions w;
  w.config = SmallFashionMnistConfig();
  w.config.job.epochs = 2;
  w.local_only = true;
  w.http_port = -1;
  w.fs = fs.get();
  STRATA_ASSERT_OK_AND_ASSIGN(auto wk, worker::Worker::Create(std::move(w)));
  STRATA_ASSERT_OK(wk->Start());
  STRATA_ASSERT_OK(wk->Run());
  const worker::Worker::Stats s = wk->stats();
  EXPECT_EQ(s.samples, 8000u);        // 4000 records, 2 epochs
  EXPECT_EQ(s.steps, 2u * 8u * 16u);  // 8 tasks of 500 a pass, 16 batches of 32 each
  EXPECT_EQ(s.comm_seconds, 0.0);     // nothing to wait for
  // The same model and data as inproc_cluster_test: well above chance.
  EXPECT_GT(wk->local_test_accuracy(), 0.70);
}

TEST(LocalWorkerTest, WithoutLocalAMasterIsRequired) {
  auto fs = storage::NewPosixFileSystem();
  worker::WorkerOptions w;
  w.config = SmallFashionMnistConfig();
  w.fs = fs.get();
  EXPECT_THAT(worker::Worker::Create(std::move(w)),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("master")));
}

}  // namespace
}  // namespace strata::testing
