// Pipeline stages in a job (model.stages; worker/pipeline_runner.h): a bsp
// job whose MLP is cut into 2 and 3 stages, each on a worker of its own,
// trains the data tasks the master leases to the one worker that leads
// them and ends with the parameters of the same job on one unpipelined
// worker (float rounding); the stages after the first take no task.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/inproc_cluster.h"
#include "tests/testing/status_matchers.h"

namespace strata::testing {
namespace {

struct Trained {
  std::vector<std::vector<float>> params;
  std::vector<uint64_t> steps;  // per worker
};

Trained Train(int workers, int stages, const std::string& transport) {
  InProcClusterOptions opts;
  opts.config = SmallFashionMnistConfig();
  opts.config.job.consistency = Consistency::kBsp;
  opts.config.data.train_limit = 1500;
  opts.config.model.layers = {784, 24, 16, 10};
  opts.config.model.stages = stages;
  opts.config.model.micro_batches = stages > 1 ? 3 : 0;
  opts.config.optimizer.type = "sgd";
  opts.config.optimizer.learning_rate = 0.05;
  opts.workers = workers;
  opts.pservers = 2;
  opts.transport = transport;
  opts.shuffle_within_task = false;
  Trained out;
  auto cluster = InProcCluster::Start(std::move(opts));
  EXPECT_THAT(cluster, IsOk());
  if (!cluster.ok()) return out;
  (*cluster)->RunWorkers();
  EXPECT_THAT((*cluster)->JoinWorkers(), IsOk());
  for (int k = 0; k < workers; ++k) out.steps.push_back((*cluster)->worker(k)->stats().steps);
  auto params = (*cluster)->worker(workers - 1)->PullParams(0);
  EXPECT_THAT(params, IsOk());
  if (params.ok()) out.params = *std::move(params);
  return out;
}

double MaxDiff(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  double d = 0;
  for (size_t t = 0; t < a.size(); ++t) {
    for (size_t i = 0; i < a[t].size(); ++i) {
      d = std::max(d, std::fabs(static_cast<double>(a[t][i]) - b[t][i]));
    }
  }
  return d;
}

TEST(PipelineJobTest, StagesOnTheirOwnWorkersGiveOneWorkersParameters) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const Trained one = Train(1, 1, "inproc");
  ASSERT_EQ(one.params.size(), 6u);
  // 3 tasks of 500 records in batches of 32: 48 steps.
  EXPECT_EQ(one.steps, std::vector<uint64_t>({48}));
  double moved = 0;
  for (float v : one.params[1]) moved = std::max(moved, std::fabs(static_cast<double>(v)));
  EXPECT_GT(moved, 1e-3) << "biases did not move: no training happened";
  for (const auto& [workers, stages, transport] :
       {std::tuple<int, int, std::string>{2, 2, "inproc"}, {3, 3, "tcp"}}) {
    SCOPED_TRACE(absl::StrCat(stages, " stages over ", transport));
    const Trained piped = Train(workers, stages, transport);
    ASSERT_EQ(piped.params.size(), one.params.size());
    // The leader takes the steps; the stages after it record none.
    std::vector<uint64_t> steps = piped.steps;
    std::sort(steps.begin(), steps.end());
    std::vector<uint64_t> want(workers, 0);
    want.back() = 48;
    EXPECT_EQ(steps, want);
    EXPECT_LT(MaxDiff(piped.params, one.params), 1e-4);
  }
}

// Two groups of 2 stages train data-parallel: each leader leases tasks of
// its own (at job.batch_size each: the groups, not the workers, split the
// global batch), the pservers sum the groups' pushes, and every record is
// trained.
TEST(PipelineJobTest, TwoGroupsTrainDataParallel) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const Trained two = Train(4, 2, "inproc");
  ASSERT_EQ(two.steps.size(), 4u);
  std::vector<uint64_t> steps = two.steps;
  std::sort(steps.begin(), steps.end());
  EXPECT_EQ(steps[0], 0u);
  EXPECT_EQ(steps[1], 0u);
  EXPECT_GT(steps[2], 0u) << "one group did not train";
  // 3 tasks of 500 records at 32 a step.
  EXPECT_EQ(steps[2] + steps[3], 3u * 16);
  ASSERT_EQ(two.params.size(), 6u);
}

}  // namespace
}  // namespace strata::testing
