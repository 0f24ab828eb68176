// The trainer seam (worker/trainer.h): the Worker picks its model family's
// Trainer by model.type, and each trainer trains and evaluates through the
// context it is handed, a fake one (the MLP, locally) or a real worker in an
// in-process cluster (Wide & Deep, whose sparse tables live on pservers).
#include "worker/trainer.h"

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "common/initializer.h"
#include "common/model_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/ctr_data.h"
#include "tests/testing/inproc_cluster.h"
#include "tests/testing/status_matchers.h"
#include "worker/ctr_trainer.h"
#include "worker/mlp_trainer.h"

namespace strata::testing {
namespace {

using ::testing::HasSubstr;

// A TrainerContext with no pservers: it counts the steps it is told of.
class FakeContext : public worker::TrainerContext {
 public:
  FakeContext(JobConfig config, storage::FileSystem* fs) : config_(std::move(config)), fs_(fs) {}
  const JobConfig& config() const override { return config_; }
  storage::FileSystem* fs() const override { return fs_; }
  worker::ParamClient* params() override { return nullptr; }
  bool stopping() const override { return false; }
  std::vector<int64_t> TaskRecordOrder(const proto::DataTask& task, int64_t begin,
                                       int64_t end) const override {
    std::vector<int64_t> order;
    for (int64_t r = begin; r < end; ++r) order.push_back(r);
    return order;
  }
  void SetEpoch(int epoch) override { epoch_ = epoch; }
  uint64_t next_step() const override { return next_step_; }
  int batch_size() const override { return config_.job.batch_size; }
  void RecordStep(int n, uint64_t version, double loss, int64_t correct, absl::Duration busy,
                  absl::Duration comm, bool stale) override {
    samples_ += n;
    losses_.push_back(loss / n);
    next_step_ = version + 1;
  }
  worker::StepExchanges& exchanges() override { return exchanges_; }
  absl::Status SettlePush() override { return absl::OkStatus(); }
  bool tracing() const override { return false; }
  absl::Time TraceSpan(const char*, const char*, absl::Time, const std::string&) override {
    return absl::Now();
  }

  int epoch_ = -1;
  int64_t samples_ = 0;
  std::vector<double> losses_;  // mean loss of each step

 private:
  JobConfig config_;
  storage::FileSystem* fs_;
  uint64_t next_step_ = 0;
  worker::StepExchanges exchanges_;
};

double Mean(const std::vector<double>& v, size_t begin, size_t end) {
  double sum = 0;
  for (size_t i = begin; i < end; ++i) sum += v[i];
  return sum / (end - begin);
}

TEST(TrainerTest, WorkerPicksTheTrainerByModelType) {
  auto fs = storage::NewPosixFileSystem();
  if (HaveFashionMnist()) {
    worker::WorkerOptions w;
    w.config = SmallFashionMnistConfig();
    w.local_only = true;
    w.http_port = -1;
    w.fs = fs.get();
    STRATA_ASSERT_OK_AND_ASSIGN(auto mlp, worker::Worker::Create(std::move(w)));
    EXPECT_EQ(mlp->model_family(), "mlp");
  }
  const std::string dir = GenerateCtr(fs.get());
  worker::WorkerOptions w;
  w.config = SmallCtrConfig(dir);
  w.master_address = "127.0.0.1:1";  // not called by Create
  w.http_port = -1;
  w.fs = fs.get();
  STRATA_ASSERT_OK_AND_ASSIGN(auto ctr, worker::Worker::Create(std::move(w)));
  EXPECT_EQ(ctr->model_family(), "wide_deep");

  worker::WorkerOptions local;
  local.config = SmallCtrConfig(dir);
  local.local_only = true;
  local.fs = fs.get();
  EXPECT_THAT(worker::Worker::Create(std::move(local)),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("pservers")));
  std::filesystem::remove_all(dir);
}

TEST(TrainerTest, MlpTrainerTrainsAndEvaluatesThroughItsContext) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  auto fs = storage::NewPosixFileSystem();
  FakeContext ctx(SmallFashionMnistConfig(), fs.get());
  STRATA_ASSERT_OK_AND_ASSIGN(auto device, worker::NewDevice(worker::DeviceChoice{"cpu"}));
  STRATA_ASSERT_OK_AND_ASSIGN(auto trainer, worker::MlpTrainer::Create(&ctx, device.get()));
  EXPECT_EQ(trainer->family(), "mlp");
  EXPECT_EQ(trainer->loaded_examples(), 4000);
  EXPECT_THAT(trainer->DescribeData(), HasSubstr("4000 training examples"));
  // As Worker::RunLocal: initialized tables, an optimizer each.
  const std::vector<TableSpec> tables = ModelTables(ctx.config().model);
  std::vector<std::unique_ptr<Optimizer>> optimizers;
  auto& params = trainer->params();
  for (size_t t = 0; t < tables.size(); ++t) {
    STRATA_ASSERT_OK(InitializeSlice(
        InitSpec{tables[t].init, tables[t].fan_in, tables[t].fan_out, static_cast<uint32_t>(t), 1},
        0, params[t].size(), params[t].data()));
    STRATA_ASSERT_OK_AND_ASSIGN(auto opt,
                                Optimizer::Create(ctx.config().optimizer, params[t].size()));
    optimizers.push_back(std::move(opt));
  }
  const std::vector<float> before = params[0];
  STRATA_ASSERT_OK_AND_ASSIGN(const worker::EvalMetrics untrained, trainer->Evaluate(std::nullopt));

  proto::DataTask task;
  task.set_id(0);
  task.set_epoch(0);
  task.set_begin(0);
  task.set_end(4000);
  STRATA_ASSERT_OK_AND_ASSIGN(const int64_t records, trainer->TrainTask(task, &optimizers));
  EXPECT_EQ(records, 4000);
  EXPECT_EQ(ctx.samples_, 4000);
  EXPECT_EQ(ctx.next_step(), 125u);  // 4000 / 32 steps
  EXPECT_EQ(ctx.epoch_, 0);
  EXPECT_NE(params[0], before);
  // The training loss falls, and the test accuracy rises well above chance.
  EXPECT_LT(Mean(ctx.losses_, 100, 125), 0.7 * Mean(ctx.losses_, 0, 25));
  STRATA_ASSERT_OK_AND_ASSIGN(const worker::EvalMetrics trained, trainer->Evaluate(std::nullopt));
  EXPECT_FALSE(trained.auc.has_value());
  EXPECT_GT(trained.accuracy, 0.65);
  EXPECT_GT(trained.accuracy, untrained.accuracy + 0.3);
  EXPECT_LT(trained.loss, untrained.loss);

  task.set_end(4001);  // past the training set
  EXPECT_THAT(trainer->TrainTask(task, &optimizers),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("outside the training set")));
}

TEST(TrainerTest, CtrTrainerTrainsAndEvaluatesAgainstPservers) {
  auto fs = storage::NewPosixFileSystem();
  const std::string dir = GenerateCtr(fs.get());
  InProcClusterOptions o;
  o.config = SmallCtrConfig(dir);
  o.pservers = 2;
  o.workers = 1;
  o.fs = fs.get();
  STRATA_ASSERT_OK_AND_ASSIGN(auto cluster, InProcCluster::Start(std::move(o)));
  EXPECT_EQ(cluster->worker(0)->model_family(), "wide_deep");
  cluster->RunWorkers();
  STRATA_ASSERT_OK(cluster->JoinWorkers());
  const worker::Worker::Stats s = cluster->worker(0)->stats();
  EXPECT_EQ(s.samples, 20000u);  // every record, one epoch
  EXPECT_EQ(s.steps, 4u * 20u);  // 4 tasks of 5000, 20 batches of 256 each
  // The evaluation the master asked for at the end: AUC well above chance
  // (the planted model's is about 0.78).
  const proto::JobStatus job = cluster->master()->GetStatus().job();
  ASSERT_TRUE(job.has_test_auc());
  EXPECT_GT(job.test_auc(), 0.6);
  EXPECT_LE(job.test_auc(), 1.0);
  EXPECT_GT(job.test_loss(), 0.0);
  cluster->Shutdown();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace strata::testing
