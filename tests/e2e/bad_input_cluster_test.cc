// Bad input reaching a running cluster: every daemon stays up, the job
// fails with a message naming the file or the mismatch, nothing crashes.
#include <cstdio>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/inproc_cluster.h"
#include "tests/testing/status_matchers.h"

namespace strata::testing {
namespace {

using ::testing::HasSubstr;

// An uncompressed IDX label file of `n` labels, label `bad` at record 3.
std::string WriteLabels(int n, int bad) {
  std::string path = ::testing::TempDir() + "/bad-labels-idx1-ubyte";
  std::ofstream f(path, std::ios::binary);
  const unsigned char head[8] = {0,
                                 0,
                                 8,
                                 1,
                                 static_cast<unsigned char>(n >> 24),
                                 static_cast<unsigned char>(n >> 16),
                                 static_cast<unsigned char>(n >> 8),
                                 static_cast<unsigned char>(n)};
  f.write(reinterpret_cast<const char*>(head), 8);
  for (int i = 0; i < n; ++i) f.put(static_cast<char>(i == 3 ? bad : i % 10));
  return path;
}

TEST(BadInputClusterTest, OutOfRangeTestLabelFailsTheJobNamingTheFile) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  InProcClusterOptions opts;
  opts.config = SmallFashionMnistConfig();
  opts.config.data.train_limit = 1000;
  opts.config.data.test_labels = WriteLabels(10000, 12);
  STRATA_ASSERT_OK_AND_ASSIGN(auto cluster, InProcCluster::Start(std::move(opts)));
  cluster->RunWorkers();
  const absl::Status s = cluster->JoinWorkers();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                          HasSubstr("record 3 has label 12 outside [0, 10)")));
  ASSERT_TRUE(cluster->master()->WaitForJobEnd(absl::Seconds(30)));
  const proto::JobStatus job = cluster->master()->GetStatus().job();
  EXPECT_EQ(job.state(), "failed");
  EXPECT_THAT(job.message(), HasSubstr("bad-labels-idx1-ubyte: record 3 has label 12"));
}

TEST(BadInputClusterTest, WorkerWithAnotherModelIsRefused) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  InProcClusterOptions opts;
  opts.config = SmallFashionMnistConfig();
  opts.config.data.train_limit = 1000;
  opts.workers = 1;
  const JobConfig base = opts.config;
  STRATA_ASSERT_OK_AND_ASSIGN(auto cluster, InProcCluster::Start(std::move(opts)));

  worker::WorkerOptions w;
  w.config = base;
  w.config.model.layers = {784, 64, 10};  // the job's model is 784-32-10
  w.config.source = "other.yaml";
  w.master_address = cluster->master()->address();
  w.index = 1;
  w.http_port = -1;
  w.transport.kind = "tcp";
  w.fs = cluster->fs();
  STRATA_ASSERT_OK_AND_ASSIGN(auto stray, worker::Worker::Create(std::move(w)));
  STRATA_ASSERT_OK(stray->Start());
  EXPECT_THAT(stray->Run(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("model.layers of other.yaml does not match the job at "
                                 "master")));
  stray->Shutdown();
  // A misconfigured extra worker does not fail the job.
  EXPECT_NE(cluster->master()->GetStatus().job().state(), "failed");
}

}  // namespace
}  // namespace strata::testing
