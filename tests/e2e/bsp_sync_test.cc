// Synchronisation check: with bsp, 2 workers at batch b reach the same
// parameters after 50 steps as 1 worker at batch 2b over the same records
// (each synchronous step averages the gradients over all 2b samples).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/criteo_reader.h"
#include "tests/testing/ctr_data.h"
#include "tests/testing/inproc_cluster.h"
#include "tests/testing/status_matchers.h"

namespace strata::testing {
namespace {

constexpr int kSteps = 50;
constexpr int kBatch = 16;  // b

proto::DataTask Task(uint64_t id, int64_t begin, int64_t end) {
  proto::DataTask t;
  t.set_id(id);
  t.set_begin(begin);
  t.set_end(end);
  return t;
}

// Trains kSteps steps with `workers` workers at batch 2b/workers; worker k's
// step-s batch is records [2b s + k (2b/workers), ...). Returns the final
// parameters. `chunk_bytes`: cluster.chunk_bytes; `replication`: backups
// per partition.
std::vector<std::vector<float>> Train(int workers, const std::string& optimizer,
                                      int apply_threads = 1, int64_t chunk_bytes = 1 << 20,
                                      int replication = 0, uint32_t* most_chunks = nullptr,
                                      const std::string& aggregation = "none",
                                      uint64_t* pushes_applied = nullptr) {
  InProcClusterOptions opts;
  opts.config = SmallFashionMnistConfig();
  opts.config.job.consistency = Consistency::kBsp;
  opts.config.job.batch_size = 2 * kBatch / workers;
  opts.config.optimizer.type = optimizer;
  opts.config.optimizer.learning_rate = optimizer == "adam" ? 0.001 : 0.05;
  opts.workers = workers;
  opts.pservers = 2;
  opts.shuffle_within_task = false;
  opts.pserver_apply_threads = apply_threads;
  opts.config.cluster.chunk_bytes = chunk_bytes;
  opts.config.cluster.replication = replication;
  opts.config.cluster.aggregation = aggregation;
  const int per = 2 * kBatch / workers;
  for (int k = 0; k < workers; ++k) {
    std::vector<proto::DataTask> tasks;
    for (int s = 0; s < kSteps; ++s) {
      const int64_t b = 2 * kBatch * s + k * per;
      tasks.push_back(Task(s, b, b + per));
    }
    opts.task_sources.push_back(std::make_unique<FixedTaskSource>(std::move(tasks)));
  }
  auto cluster = InProcCluster::Start(std::move(opts));
  EXPECT_THAT(cluster, IsOk());
  if (!cluster.ok()) return {};
  (*cluster)->RunWorkers();
  EXPECT_THAT((*cluster)->JoinWorkers(), IsOk());
  for (int k = 0; k < workers; ++k) {
    EXPECT_EQ((*cluster)->worker(k)->stats().steps, static_cast<uint64_t>(kSteps));
  }
  if (most_chunks != nullptr || pushes_applied != nullptr) {  // as the pservers cut them
    uint32_t chunks = 0;
    uint64_t pushes = 0;
    const proto::ClusterView view = (*cluster)->master()->View();
    for (const auto& p : view.partitions()) {
      auto part = (*cluster)->pserver(0)->FindPartition(p.id());
      if (part == nullptr) part = (*cluster)->pserver(1)->FindPartition(p.id());
      if (part == nullptr) continue;
      chunks = std::max(chunks, part->stats().chunks);
      pushes += part->stats().pushes_applied;
    }
    if (most_chunks != nullptr) *most_chunks = chunks;
    if (pushes_applied != nullptr) *pushes_applied = pushes;
  }
  auto params = (*cluster)->worker(0)->PullParams(kSteps);
  EXPECT_THAT(params, IsOk());
  return params.ok() ? *params : std::vector<std::vector<float>>{};
}

// Reports, at each Complete, whether every partition already holds the
// task's last step (version > last_step): a task is done only when its last
// gradient is in, else the master could end the worker's part in the step
// set while that push is still in flight.
class CheckingTaskSource : public FixedTaskSource {
 public:
  CheckingTaskSource(std::vector<proto::DataTask> tasks, InProcCluster** cluster,
                     std::vector<std::string>* problems)
      : FixedTaskSource(std::move(tasks)), cluster_(cluster), problems_(problems) {}
  absl::Status Complete(const proto::DataTask& task, int64_t, uint64_t last_step) override {
    InProcCluster* c = *cluster_;
    const proto::ClusterView view = c->master()->View();
    for (const auto& p : view.partitions()) {
      for (int i = 0; i < 2; ++i) {
        std::shared_ptr<const pserver::Partition> part = c->pserver(i)->FindPartition(p.id());
        if (part != nullptr && part->stats().version <= last_step) {
          problems_->push_back("task " + std::to_string(task.id()) + ": partition " +
                               std::to_string(p.id()) + " at version " +
                               std::to_string(part->stats().version) + ", last step " +
                               std::to_string(last_step));
        }
      }
    }
    return absl::OkStatus();
  }

 private:
  InProcCluster** const cluster_;
  std::vector<std::string>* const problems_;
};

TEST(BspTaskCompletionTest, ATaskIsDoneOnlyOnceItsLastPushIsApplied) {
  InProcClusterOptions opts;
  opts.config = SmallFashionMnistConfig();
  opts.config.job.consistency = Consistency::kBsp;
  opts.config.job.batch_size = kBatch;
  opts.workers = 1;
  opts.pservers = 2;
  InProcCluster* cluster = nullptr;
  std::vector<std::string> problems;
  std::vector<proto::DataTask> tasks;
  for (int t = 0; t < 10; ++t) tasks.push_back(Task(t, 4 * kBatch * t, 4 * kBatch * (t + 1)));
  opts.task_sources.push_back(
      std::make_unique<CheckingTaskSource>(std::move(tasks), &cluster, &problems));
  STRATA_ASSERT_OK_AND_ASSIGN(auto owned, InProcCluster::Start(std::move(opts)));
  cluster = owned.get();
  cluster->RunWorkers();
  ASSERT_THAT(cluster->JoinWorkers(), IsOk());
  EXPECT_EQ(cluster->worker(0)->stats().steps, 40u);
  EXPECT_THAT(problems, ::testing::IsEmpty());
}

// With node-local aggregation the task is done once the host's step is
// published, which is once it is applied on every partition, the sparse
// tables' virtual partitions included: 2 hosts of 2 workers, so that a
// partition has a host's push before the step is complete.
TEST(BspTaskCompletionTest, AnAggregatedCtrTaskIsDoneOnlyOnceItsLastStepIsAppliedEverywhere) {
  auto fs = storage::NewPosixFileSystem();
  const std::string dir = GenerateCtr(fs.get());
  InProcClusterOptions opts;
  opts.config = SmallCtrConfig(dir);
  opts.config.job.consistency = Consistency::kBsp;
  opts.config.job.batch_size = 64;
  opts.config.cluster.aggregation = "node";
  opts.fs = fs.get();
  opts.workers = 4;
  opts.worker_hosts = {"127.0.0.1", "127.0.0.1", "127.0.0.2", "127.0.0.2"};
  opts.pservers = 2;
  InProcCluster* cluster = nullptr;
  std::vector<std::string> problems;
  for (int k = 0; k < 4; ++k) {
    std::vector<proto::DataTask> tasks;
    for (int t = 0; t < 4; ++t) {
      const int64_t b = 1000 * (4 * t + k);
      tasks.push_back(Task(t, b, b + 256));
    }
    opts.task_sources.push_back(
        std::make_unique<CheckingTaskSource>(std::move(tasks), &cluster, &problems));
  }
  STRATA_ASSERT_OK_AND_ASSIGN(auto owned, InProcCluster::Start(std::move(opts)));
  cluster = owned.get();
  cluster->RunWorkers();
  ASSERT_THAT(cluster->JoinWorkers(), IsOk());
  for (int k = 0; k < 4; ++k) EXPECT_EQ(cluster->worker(k)->stats().steps, 16u);
  EXPECT_THAT(problems, ::testing::IsEmpty());
  owned.reset();
  std::filesystem::remove_all(dir);
}

class BspSyncTest : public ::testing::TestWithParam<std::string> {};

TEST_P(BspSyncTest, TwoWorkersAtBatchBEqualOneWorkerAtBatch2B) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const auto two = Train(2, GetParam());
  const auto one = Train(1, GetParam());
  ASSERT_EQ(two.size(), one.size());
  ASSERT_FALSE(one.empty());
  double max_diff = 0;
  const auto init = [&] {
    // Parameters moved away from zero-initialised biases: training happened.
    double m = 0;
    for (float v : one[1]) m = std::max(m, std::fabs(static_cast<double>(v)));
    return m;
  }();
  for (size_t t = 0; t < one.size(); ++t) {
    ASSERT_EQ(one[t].size(), two[t].size());
    for (size_t i = 0; i < one[t].size(); ++i) {
      max_diff = std::max(max_diff, std::fabs(static_cast<double>(one[t][i]) - two[t][i]));
    }
  }
  EXPECT_GT(init, 1e-3) << "biases did not move: no training happened";
  EXPECT_LT(max_diff, 1e-5) << "largest parameter difference";
  RecordProperty("max_param_diff", std::to_string(max_diff));
  std::printf("largest parameter difference after %d steps: %.3g\n", kSteps, max_diff);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, BspSyncTest, ::testing::Values("sgd", "adam"));

// Partitions applied on 3 pserver threads give exactly the same result as
// applied on the transport thread.
TEST(BspSyncParallelApplyTest, ParallelApplyChangesNothing) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const auto serial = Train(2, "adam", 1);
  const auto parallel = Train(2, "adam", 3);
  ASSERT_FALSE(serial.empty());
  EXPECT_EQ(serial, parallel);
}

// Partitions pushed, applied, replicated and pulled in chunks of 4 KiB (a
// 64 KiB slice in 16, the first layer's last slice in 8.5, a bias in one)
// give exactly the parameters of whole partitions, with and without a
// backup of each partition on the other pserver.
TEST(BspSyncChunkTest, ChunksChangeNothing) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const auto whole = Train(2, "adam", 1, /*chunk_bytes=*/0);
  ASSERT_FALSE(whole.empty());
  uint32_t chunks = 0;
  EXPECT_EQ(Train(2, "adam", 1, /*chunk_bytes=*/4096, 0, &chunks), whole);
  EXPECT_EQ(chunks, 16u);
  EXPECT_EQ(Train(2, "adam", 1, /*chunk_bytes=*/4096, /*replication=*/1), whole);
}

// Node-local aggregation: 4 workers of one host, their gradients summed in
// shared memory and pushed once a step by the host's aggregating worker,
// reach the parameters of 4 workers pushing each their own (and of one
// worker at the whole batch), within float rounding; the pservers take one
// push a step per partition instead of 4.
TEST(BspSyncAggregationTest, AHostsSumPushedOnceGivesTheParametersOfEveryWorkerPushing) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  uint64_t pushes_each = 0, pushes_aggregated = 0;
  const auto each = Train(4, "adam", 1, 1 << 20, 0, nullptr, "none", &pushes_each);
  const auto aggregated = Train(4, "adam", 1, 1 << 20, 0, nullptr, "node", &pushes_aggregated);
  const auto one = Train(1, "adam");
  ASSERT_FALSE(each.empty());
  ASSERT_EQ(aggregated.size(), each.size());
  double max_diff = 0, max_diff_one = 0;
  for (size_t t = 0; t < each.size(); ++t) {
    ASSERT_EQ(aggregated[t].size(), each[t].size());
    for (size_t i = 0; i < each[t].size(); ++i) {
      max_diff = std::max(max_diff, std::fabs(static_cast<double>(aggregated[t][i]) - each[t][i]));
      max_diff_one =
          std::max(max_diff_one, std::fabs(static_cast<double>(aggregated[t][i]) - one[t][i]));
    }
  }
  EXPECT_LT(max_diff, 1e-5) << "largest difference from every worker pushing";
  EXPECT_LT(max_diff_one, 1e-5) << "largest difference from one worker at the whole batch";
  EXPECT_EQ(pushes_each, 4 * pushes_aggregated);
  std::printf(
      "aggregated: largest parameter difference %.3g (one worker: %.3g); pushes "
      "applied %lu against %lu\n",
      max_diff, max_diff_one, static_cast<unsigned long>(pushes_aggregated),
      static_cast<unsigned long>(pushes_each));
}

// The CTR family: 4 workers of one host merge their batches' sparse rows
// per key in shared memory beside the dense sum, and the aggregating
// worker pushes one row a key; after 30 steps the dense layers and every
// row of both sparse tables are those of 4 workers pushing each their own
// rows (and of one worker at the whole batch), and every partition, dense
// or sparse, took a quarter of the pushes.
struct CtrRun {
  std::vector<std::vector<float>> dense;
  std::vector<float> rows;  // of every key of the data, partition by partition
  uint64_t pushes = 0;
  uint64_t rows_made = 0;  // rows the sparse partitions hold
};

CtrRun TrainCtr(storage::FileSystem* fs, const std::string& dir, const std::vector<uint64_t>& keys,
                int workers, const std::string& aggregation) {
  constexpr int kCtrSteps = 30, kCtrBatch = 128;
  InProcClusterOptions opts;
  opts.config = SmallCtrConfig(dir);
  opts.config.job.consistency = Consistency::kBsp;
  opts.config.job.batch_size = kCtrBatch / workers;
  opts.config.cluster.aggregation = aggregation;
  opts.fs = fs;
  opts.workers = workers;
  opts.pservers = 2;
  opts.shuffle_within_task = false;
  const int per = kCtrBatch / workers;
  for (int k = 0; k < workers; ++k) {
    std::vector<proto::DataTask> tasks;
    for (int s = 0; s < kCtrSteps; ++s) {
      const int64_t b = static_cast<int64_t>(kCtrBatch) * s + k * per;
      tasks.push_back(Task(s, b, b + per));
    }
    opts.task_sources.push_back(std::make_unique<FixedTaskSource>(std::move(tasks)));
  }
  CtrRun run;
  auto cluster = InProcCluster::Start(std::move(opts));
  EXPECT_THAT(cluster, IsOk());
  if (!cluster.ok()) return run;
  (*cluster)->RunWorkers();
  EXPECT_THAT((*cluster)->JoinWorkers(), IsOk());
  for (int k = 0; k < workers; ++k) {
    EXPECT_EQ((*cluster)->worker(k)->stats().steps, static_cast<uint64_t>(kCtrSteps));
  }
  const proto::ClusterView view = (*cluster)->master()->View();
  for (const auto& p : view.partitions()) {
    auto part = (*cluster)->pserver(0)->FindPartition(p.id());
    if (part == nullptr) part = (*cluster)->pserver(1)->FindPartition(p.id());
    if (part == nullptr) continue;
    run.pushes += part->stats().pushes_applied;
    run.rows_made += part->sparse_stats().rows;
    const std::vector<float> rows = part->RowsForTesting(keys);
    run.rows.insert(run.rows.end(), rows.begin(), rows.end());
  }
  auto dense = (*cluster)->worker(0)->PullParams(kCtrSteps);
  EXPECT_THAT(dense, IsOk());
  if (dense.ok()) run.dense = *std::move(dense);
  return run;
}

double MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  return d;
}

TEST(BspSyncAggregationTest, ACtrHostsRowsMergedPerKeyGiveTheParametersOfEveryWorkerPushing) {
  auto fs = storage::NewPosixFileSystem();
  const std::string dir = GenerateCtr(fs.get());
  auto data = storage::LoadCriteoFile(fs.get(), dir + "/train.txt", {}, nullptr);
  ASSERT_THAT(data, IsOk());
  std::vector<uint64_t> keys(data->keys.begin(), data->keys.end());
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  const CtrRun each = TrainCtr(fs.get(), dir, keys, 4, "none");
  const CtrRun aggregated = TrainCtr(fs.get(), dir, keys, 4, "node");
  const CtrRun one = TrainCtr(fs.get(), dir, keys, 1, "none");
  std::filesystem::remove_all(dir);
  ASSERT_FALSE(each.dense.empty());
  ASSERT_EQ(aggregated.dense.size(), each.dense.size());
  double dense_diff = 0, dense_diff_one = 0;
  for (size_t t = 0; t < each.dense.size(); ++t) {
    dense_diff = std::max(dense_diff, MaxDiff(aggregated.dense[t], each.dense[t]));
    dense_diff_one = std::max(dense_diff_one, MaxDiff(aggregated.dense[t], one.dense[t]));
  }
  ASSERT_FALSE(each.rows.empty());
  const double row_diff = MaxDiff(aggregated.rows, each.rows);
  const double row_diff_one = MaxDiff(aggregated.rows, one.rows);
  // (Rows were made by the pushes: the same ones.)
  EXPECT_GT(aggregated.rows_made, 1000u);
  EXPECT_EQ(aggregated.rows_made, each.rows_made);
  EXPECT_LT(dense_diff, 1e-5) << "dense: largest difference from every worker pushing";
  EXPECT_LT(dense_diff_one, 1e-5) << "dense: largest difference from one worker";
  EXPECT_LT(row_diff, 1e-5) << "rows: largest difference from every worker pushing";
  EXPECT_LT(row_diff_one, 1e-5) << "rows: largest difference from one worker";
  EXPECT_EQ(each.pushes, 4 * aggregated.pushes);
  std::printf(
      "CTR aggregated: largest difference dense %.3g, rows %.3g (one worker: %.3g, %.3g) over "
      "%zu keys (%lu rows made); pushes applied %lu against %lu\n",
      dense_diff, row_diff, dense_diff_one, row_diff_one, keys.size(),
      static_cast<unsigned long>(aggregated.rows_made),
      static_cast<unsigned long>(aggregated.pushes), static_cast<unsigned long>(each.pushes));
}

}  // namespace
}  // namespace strata::testing
