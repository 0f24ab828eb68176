// Pipeline stages (worker/pipeline.h): the cut of the layers, a stage's
// arithmetic against the whole model's, a pipeline of 2 and 3 stages over
// the tcp transport against one worker after several steps (1F1B with 1
// to 10 micro-batches of odd sizes), and its failures: a next stage that
// is gone, a micro-batch that never comes, a malformed one, and an error
// passed back from the last stage to the first.
#include "worker/pipeline.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "worker/device.h"

namespace strata::worker {
namespace {

using ::strata::testing::IsOk;
using ::strata::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Params = std::vector<std::vector<float>>;

void Fill(std::vector<float>* v, std::mt19937* rng, float scale) {
  std::normal_distribution<float> d(0.f, scale);
  for (float& f : *v) f = d(*rng);
}

// A model's parameters, drawn from the seed.
void InitParams(Mlp* m, uint32_t seed) {
  std::mt19937 rng(seed);
  for (auto& p : m->params()) Fill(&p, &rng, 0.4f);
}

struct Batch {
  std::vector<float> x;
  std::vector<int32_t> y;
};

Batch MakeBatch(int n, int dim, int classes, uint32_t seed) {
  std::mt19937 rng(seed);
  Batch b;
  b.x.resize(static_cast<size_t>(n) * dim);
  Fill(&b.x, &rng, 1.f);
  for (int i = 0; i < n; ++i) b.y.push_back(static_cast<int32_t>(rng() % classes));
  return b;
}

void Sgd(std::vector<float>* p, const std::vector<float>& g, float lr, int n) {
  for (size_t i = 0; i < p->size(); ++i) (*p)[i] -= lr * g[i] / n;
}

TEST(StageBoundsTest, CutsSoThatTheLargestStageIsSmallest) {
  // Layer parameters: 200960, 32896, 1290.
  EXPECT_THAT(*StageBounds({784, 256, 128, 10}, 1), ElementsAre(0, 3));
  EXPECT_THAT(*StageBounds({784, 256, 128, 10}, 2), ElementsAre(0, 1, 3));
  EXPECT_THAT(*StageBounds({784, 256, 128, 10}, 3), ElementsAre(0, 1, 2, 3));
  // Even layers: even stages.
  EXPECT_THAT(*StageBounds({64, 64, 64, 64, 64}, 2), ElementsAre(0, 2, 4));
  EXPECT_THAT(StageWidths({784, 256, 128, 10}, {0, 1, 3}, 1), ElementsAre(256, 128, 10));
}

TEST(StageBoundsTest, LayersOfNoParametersStayWithTheLayerBefore) {
  // An nn.Sequential's modules: linear, ReLU, linear, ReLU, linear.
  EXPECT_THAT(*CutStages({100, 0, 100, 0, 10}, 2), ElementsAre(0, 2, 5));
  EXPECT_THAT(*CutStages({100, 0, 100, 0, 10}, 3), ElementsAre(0, 2, 4, 5));
  // Conv, ReLU, conv, ReLU, flatten, linear: the 4-d boundary is where the
  // costs put it.
  EXPECT_THAT(*CutStages({416, 0, 2320, 0, 0, 77450}, 3), ElementsAre(0, 2, 5, 6));
  // A stage of no parameters where nothing better fits (the script refuses it).
  EXPECT_THAT(*CutStages({0, 50}, 2), ElementsAre(0, 1, 2));
  EXPECT_THAT(CutStages({1, 2}, 3),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("model.stages: 3 stages")));
}

TEST(StageBoundsTest, RefusesMoreStagesThanLayers) {
  EXPECT_THAT(StageBounds({784, 256, 10}, 3),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("model.stages"), HasSubstr("2 layers"))));
  EXPECT_THAT(StageBounds({784, 10}, 0), StatusIs(absl::StatusCode::kInvalidArgument));
}

// Two stage models whose step, the second's input gradient passed back to
// the first, is the whole model's.
TEST(StageMathTest, TwoStagesGiveTheWholeModelsGradient) {
  for (Activation act : {Activation::kRelu, Activation::kTanh, Activation::kSigmoid}) {
    auto dev = NewCpuDevice(1);
    Mlp whole({6, 5, 4, 3}, act, dev.get());
    InitParams(&whole, 7);
    Mlp a({6, 5}, act, dev.get()), b({5, 4, 3}, act, dev.get());
    a.SetActivateOutput(true);
    a.params()[0] = whole.params()[0];
    a.params()[1] = whole.params()[1];
    for (int t = 0; t < 4; ++t) b.params()[t] = whole.params()[t + 2];
    const int n = 7;
    const Batch batch = MakeBatch(n, 6, 3, 11);
    auto loss = whole.TrainStep(batch.x.data(), batch.y.data(), n);
    ASSERT_THAT(loss, IsOk());
    std::vector<float> h(n * 5), dh(n * 5);
    ASSERT_THAT(a.ForwardOutput(batch.x.data(), n, h.data()), IsOk());
    auto stage_loss = b.StageStep(h.data(), batch.y.data(), n, nullptr, dh.data());
    ASSERT_THAT(stage_loss, IsOk());
    EXPECT_NEAR(*stage_loss, *loss, 1e-4);
    EXPECT_EQ(b.last_correct(), whole.last_correct());
    ASSERT_THAT(a.StageStep(batch.x.data(), nullptr, n, dh.data(), nullptr), IsOk());
    for (int t = 0; t < 6; ++t) {
      const std::vector<float>& got = t < 2 ? a.grads()[t] : b.grads()[t - 2];
      ASSERT_EQ(got.size(), whole.grads()[t].size());
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_NEAR(got[i], whole.grads()[t][i], 1e-4) << "table " << t << " element " << i;
      }
    }
  }
}

// K stages, each on a tcp transport of its own, connected in a line.
struct Pipeline {
  std::vector<std::unique_ptr<transport::Transport>> transports;
  std::unique_ptr<Device> device = NewCpuDevice(1);
  std::vector<std::unique_ptr<Mlp>> models;
  std::vector<std::unique_ptr<PipelineStage>> stages;
  std::vector<int> bounds;
  std::vector<std::string> addresses;
  ~Pipeline() {
    for (auto& t : transports) t->Shutdown();
    stages.clear();
  }
};

std::unique_ptr<Pipeline> MakePipeline(const std::vector<int>& layers, int k,
                                       absl::Duration timeout = absl::Seconds(30)) {
  auto p = std::make_unique<Pipeline>();
  auto bounds = StageBounds(layers, k);
  EXPECT_THAT(bounds, IsOk());
  if (!bounds.ok()) return nullptr;
  p->bounds = *bounds;
  transport::TransportOptions to;
  to.kind = "tcp";
  for (int s = 0; s < k; ++s) {
    auto t = transport::CreateTransport(to);
    EXPECT_THAT(t, IsOk());
    if (!t.ok()) return nullptr;
    p->transports.push_back(*std::move(t));
    p->models.push_back(std::make_unique<Mlp>(StageWidths(layers, p->bounds, s), Activation::kTanh,
                                              p->device.get()));
    PipelineStage::Options o;
    o.stage = s;
    o.stages = k;
    o.node_id = 100 + s;
    o.timeout = timeout;
    auto st = PipelineStage::Create(p->transports.back().get(), o, p->models.back().get());
    EXPECT_THAT(st, IsOk());
    if (!st.ok()) return nullptr;
    p->stages.push_back(*std::move(st));
    PipelineStage* stage = p->stages.back().get();
    EXPECT_THAT(p->transports.back()->Listen(
                    "127.0.0.1", 0,
                    [stage](transport::Message m, std::shared_ptr<transport::Responder> r) {
                      stage->Handle(std::move(m), std::move(r));
                    }),
                IsOk());
    p->addresses.push_back(p->transports.back()->listen_address());
  }
  for (int s = 0; s + 1 < k; ++s) {
    EXPECT_THAT(p->stages[s]->ConnectNext(p->addresses[s + 1]), IsOk());
  }
  return p;
}

// Runs one step on every stage, each in a thread of its own; returns each
// stage's outcome.
std::vector<absl::StatusOr<PipelineStage::StepResult>> RunStep(Pipeline* p, uint64_t step,
                                                               const Batch& b, int micro) {
  const int k = static_cast<int>(p->stages.size());
  std::vector<absl::StatusOr<PipelineStage::StepResult>> out(k, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int s = 0; s < k; ++s) {
    threads.emplace_back([&, s] {
      PipelineStage* st = p->stages[s].get();
      out[s] =
          s == 0 ? st->Step(step, step, b.x.data(), b.y.data(), static_cast<int>(b.y.size()), micro)
                 : st->Step(PipelineStage::Next{step, step});
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

struct PipelineCase {
  int stages;
  int micro;
};

class PipelineEqualsOneWorkerTest : public ::testing::TestWithParam<PipelineCase> {};

// A bsp step's gradient is the batch's however it is pipelined: after
// several SGD steps the stages hold what one worker's model does.
TEST_P(PipelineEqualsOneWorkerTest, AfterSeveralSteps) {
  const std::vector<int> layers = {8, 7, 6, 5, 4};
  const int k = GetParam().stages, micro = GetParam().micro;
  auto p = MakePipeline(layers, k);
  ASSERT_NE(p, nullptr);
  Mlp whole(layers, Activation::kTanh, p->device.get());
  InitParams(&whole, 3);
  for (int s = 0; s < k; ++s) {
    for (int t = 2 * p->bounds[s]; t < 2 * p->bounds[s + 1]; ++t) {
      p->models[s]->params()[t - 2 * p->bounds[s]] = whole.params()[t];
    }
  }
  const float lr = 0.5f;
  for (uint64_t step = 0; step < 4; ++step) {
    const int n = 10 + static_cast<int>(step);  // micro-batches of odd sizes
    const Batch b = MakeBatch(n, 8, 4, 20 + step);
    auto want = whole.TrainStep(b.x.data(), b.y.data(), n);
    ASSERT_THAT(want, IsOk());
    const int64_t want_correct = whole.last_correct();
    for (size_t t = 0; t < whole.params().size(); ++t) {
      Sgd(&whole.params()[t], whole.grads()[t], lr, n);
    }
    auto got = RunStep(p.get(), step, b, micro);
    for (int s = 0; s < k; ++s) {
      ASSERT_THAT(got[s], IsOk()) << "stage " << s;
      EXPECT_EQ(got[s]->samples, n);
      EXPECT_EQ(got[s]->micro_batches, std::min(micro, n));
      EXPECT_NEAR(got[s]->loss, *want, 1e-3 * std::abs(*want)) << "stage " << s;
      EXPECT_EQ(got[s]->correct, want_correct) << "stage " << s;
      for (size_t t = 0; t < p->models[s]->params().size(); ++t) {
        Sgd(&p->models[s]->params()[t], p->models[s]->grads()[t], lr, n);
      }
    }
  }
  for (int s = 0; s < k; ++s) {
    for (int t = 2 * p->bounds[s]; t < 2 * p->bounds[s + 1]; ++t) {
      const auto& got = p->models[s]->params()[t - 2 * p->bounds[s]];
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_NEAR(got[i], whole.params()[t][i], 2e-4)
            << "stage " << s << " table " << t << " element " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Schedules, PipelineEqualsOneWorkerTest,
                         ::testing::Values(PipelineCase{1, 3}, PipelineCase{2, 1},
                                           PipelineCase{2, 3}, PipelineCase{3, 4},
                                           PipelineCase{4, 10}),
                         [](const auto& info) {
                           return absl::StrCat(info.param.stages, "stages", info.param.micro,
                                               "micro");
                         });

// The stages after the first as a worker runs them: each takes the steps
// as they come (NextStep), and a flush from the first returns once every
// stage has finished the steps it took.
TEST(PipelineStageTest, FollowersTakeTheStepsAsTheyComeAndAnswerAFlush) {
  auto p = MakePipeline({8, 7, 6, 4}, 3);
  ASSERT_NE(p, nullptr);
  EXPECT_THAT(p->stages[1]->NextStep(absl::Milliseconds(50)), IsOk());
  std::atomic<bool> done{false};
  std::atomic<int> taken[3] = {0, 0, 0};
  std::vector<std::thread> followers;
  for (int s = 1; s < 3; ++s) {
    followers.emplace_back([&, s] {
      while (!done) {
        auto next = p->stages[s]->NextStep(absl::Milliseconds(50));
        ASSERT_THAT(next, IsOk());
        if (!next->has_value()) continue;
        ASSERT_THAT(p->stages[s]->Step(**next), IsOk());
        ++taken[s];
      }
    });
  }
  for (uint64_t step = 5; step < 8; ++step) {
    const Batch b = MakeBatch(9, 8, 4, step);
    ASSERT_THAT(p->stages[0]->Step(step, step, b.x.data(), b.y.data(), 9, 4), IsOk());
  }
  EXPECT_THAT(p->stages[0]->Flush(), IsOk());
  EXPECT_EQ(taken[1], 3);
  EXPECT_EQ(taken[2], 3);
  done = true;
  for (auto& t : followers) t.join();
  // Nothing more comes: no step.
  auto none = p->stages[2]->NextStep(absl::Milliseconds(20));
  ASSERT_THAT(none, IsOk());
  EXPECT_FALSE(none->has_value());
}

// A step tried again after a failed attempt: what the failed attempt left
// at the next stage is not taken for the new one's.
TEST(PipelineStageTest, AStepTriedAgainIsANewAttempt) {
  auto p = MakePipeline({8, 6, 4}, 2, absl::Milliseconds(300));
  ASSERT_NE(p, nullptr);
  const Batch b = MakeBatch(6, 8, 4, 3);
  // Attempt 1: stage 1 takes nothing; stage 0 gives up.
  EXPECT_THAT(
      p->stages[0]->Step(1, 0, b.x.data(), b.y.data(), 6, 2),
      StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("did not come from stage 1")));
  // Attempt 2 of the same step: stage 1, looking once its first
  // micro-batch is there beside attempt 1's, takes it.
  absl::StatusOr<PipelineStage::StepResult> r = absl::UnknownError("not run");
  std::thread leader([&] { r = p->stages[0]->Step(2, 0, b.x.data(), b.y.data(), 6, 2); });
  absl::Cleanup join = [&] { leader.join(); };
  absl::SleepFor(absl::Milliseconds(100));
  auto next = p->stages[1]->NextStep(absl::Seconds(10));
  ASSERT_THAT(next, IsOk());
  ASSERT_TRUE(next->has_value());
  EXPECT_EQ((*next)->op, 2u);
  EXPECT_EQ((*next)->step, 0u);
  EXPECT_THAT(p->stages[1]->Step(**next), IsOk());
  std::move(join).Invoke();
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->samples, 6);
}

TEST(PipelineStageTest, ANextStageThatIsGoneFailsTheStep) {
  auto p = MakePipeline({8, 6, 4}, 2, absl::Seconds(5));
  ASSERT_NE(p, nullptr);
  p->transports[1]->Shutdown();
  const Batch b = MakeBatch(6, 8, 4, 1);
  const absl::Time t0 = absl::Now();
  auto r = p->stages[0]->Step(0, 0, b.x.data(), b.y.data(), 6, 2);
  EXPECT_FALSE(r.ok());
  EXPECT_LT(absl::Now() - t0, absl::Seconds(30));
}

TEST(PipelineStageTest, AMicroBatchThatNeverComesTimesOut) {
  auto p = MakePipeline({8, 6, 4}, 2, absl::Milliseconds(300));
  ASSERT_NE(p, nullptr);
  EXPECT_THAT(p->stages[1]->Step(PipelineStage::Next{0, 0}),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       AllOf(HasSubstr("pipeline stage 1"), HasSubstr("micro-batch 0 of step 0"),
                             HasSubstr("did not come from stage 0"))));
}

TEST(PipelineStageTest, AMalformedMicroBatchIsRefused) {
  auto p = MakePipeline({8, 6, 4}, 2);
  ASSERT_NE(p, nullptr);
  auto conn = p->transports[0]->Connect(p->addresses[1]);
  ASSERT_THAT(conn, IsOk());
  transport::Message m;
  m.header.type = transport::MessageType::kStage;
  m.header.sender_id = 9;
  m.header.partition = 1;
  m.header.count = 2;
  transport::Message short_rows = m;
  short_rows.payload.assign(2 * 5 * 4 + 8, '\0');  // rows of 5, not 6
  auto answer = (*conn)->CallSync(std::move(short_rows), absl::Seconds(10));
  ASSERT_THAT(answer, IsOk());
  EXPECT_THAT(transport::ResponseStatus(*answer),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("malformed micro-batch"), HasSubstr("node 9"))));
  // Rows of the right size, a label outside the last stage's 4 classes.
  transport::Message bad_label;
  bad_label.header = m.header;
  bad_label.payload.assign(2 * 6 * 4 + 8, '\0');
  const int32_t label = 7;
  std::memcpy(bad_label.payload.data() + 2 * 6 * 4 + 4, &label, sizeof(label));
  answer = (*conn)->CallSync(std::move(bad_label), absl::Seconds(10));
  ASSERT_THAT(answer, IsOk());
  EXPECT_THAT(transport::ResponseStatus(*answer),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("row 1 of micro-batch 0"), HasSubstr("label 7"),
                             HasSubstr("outside [0, 4)"))));
  // More micro-batches than a step may have.
  transport::Message too_many;
  too_many.header = m.header;
  too_many.header.partition = kMaxMicroBatches + 1;
  too_many.payload.assign(2 * 6 * 4 + 8, '\0');
  answer = (*conn)->CallSync(std::move(too_many), absl::Seconds(10));
  ASSERT_THAT(answer, IsOk());
  EXPECT_THAT(transport::ResponseStatus(*answer), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(PipelineStageTest, TheLastStagesErrorReachesTheFirst) {
  auto p = MakePipeline({8, 7, 6, 4}, 3);
  ASSERT_NE(p, nullptr);
  p->stages[2]->Abort(absl::CancelledError("stage 2's worker shut down"));
  const Batch b = MakeBatch(6, 8, 4, 2);
  auto got = RunStep(p.get(), 0, b, 3);
  for (int s = 0; s < 3; ++s) {
    EXPECT_THAT(got[s],
                StatusIs(absl::StatusCode::kCancelled, HasSubstr("stage 2's worker shut down")))
        << "stage " << s;
  }
}

}  // namespace
}  // namespace strata::worker
