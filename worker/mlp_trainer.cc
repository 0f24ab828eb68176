#include "worker/mlp_trainer.h"

#include <algorithm>
#include <functional>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "worker/host_aggregator.h"

namespace strata::worker {
namespace {

absl::Status CheckLabelsFor(const storage::LabeledDataset& data, const std::string& file,
                            const ModelSection& model) {
  const int classes = model.layers.back();
  for (int64_t i = 0; i < data.num_examples; ++i) {
    if (data.labels[i] < 0 || data.labels[i] >= classes) {
      return absl::InvalidArgumentError(absl::StrCat(file, ": record ", i, " has label ",
                                                     data.labels[i], " outside [0, ", classes,
                                                     ") (the last entry of model.layers)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Trainer>> MlpTrainer::Create(TrainerContext* ctx, Device* device) {
  const JobConfig& config = ctx->config();
  const auto& d = config.data;
  STRATA_ASSIGN_OR_RETURN(
      storage::LabeledDataset train,
      storage::LoadIdxDataset(ctx->fs(), d.train_images, d.train_labels, d.train_limit));
  if (train.feature_dim != config.model.layers.front()) {
    return absl::InvalidArgumentError(
        absl::StrCat(d.train_images, ": examples have ", train.feature_dim,
                     " features but model.layers[0] is ", config.model.layers.front()));
  }
  STRATA_RETURN_IF_ERROR(CheckLabelsFor(train, d.train_labels, config.model));
  return std::unique_ptr<Trainer>(new MlpTrainer(ctx, device, std::move(train)));
}

MlpTrainer::MlpTrainer(TrainerContext* ctx, Device* device, storage::LabeledDataset train)
    : ctx_(ctx), train_(std::move(train)) {
  const ModelSection& model = ctx_->config().model;
  model_ = std::make_unique<Mlp>(model.layers, *ParseActivation(model.activation), device);
  model_->SetRecompute(ctx_->config().worker.recompute_every);
  if (model.stages > 1) {
    // (The config reader checked the stages against the layers.)
    const std::vector<int> bounds = *StageBounds(model.layers, model.stages);
    Mlp* whole = model_.get();
    pipeline_ = std::make_unique<PipelineRunner>(
        ctx_, &whole->params(),
        [this, device, whole, bounds](int s) -> absl::StatusOr<PipelineRunner::Stage> {
          const ModelSection& model = ctx_->config().model;
          PipelineRunner::Stage stage;
          stage.first_table = 2 * bounds[s];
          stage.end_table = 2 * bounds[s + 1];
          stage.model = std::make_shared<MlpStage>(
              std::make_unique<Mlp>(StageWidths(model.layers, bounds, s),
                                    *ParseActivation(model.activation), device),
              s + 1 == model.stages, whole, stage.first_table);
          stage.layers = absl::StrCat("layers ", bounds[s], "..", bounds[s + 1] - 1);
          return stage;
        });
  }
}

absl::Status MlpTrainer::Follow(absl::Duration idle) {
  return pipeline_ != nullptr ? pipeline_->Follow(idle) : absl::OkStatus();
}

std::string MlpTrainer::DescribeData() const {
  return absl::StrCat(train_.num_examples, " training examples loaded");
}

absl::StatusOr<int64_t> MlpTrainer::TrainTask(const proto::DataTask& task,
                                              std::vector<std::unique_ptr<Optimizer>>* local) {
  if (task.begin() < 0 || task.end() > train_.num_examples || task.begin() >= task.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("data task ", task.id(), " [", task.begin(), ", ", task.end(),
                     ") is outside the training set of ", train_.num_examples, " records"));
  }
  ctx_->SetEpoch(task.epoch());
  const std::vector<int64_t> order = ctx_->TaskRecordOrder(task, task.begin(), task.end());
  const int dim = train_.feature_dim;
  const int batch_size = ctx_->batch_size();
  // Batches in two buffers used in turn: the next one is put together, and
  // on a GPU copied up (Mlp::Prefetch), while this one computes.
  std::vector<float> xs[2];
  std::vector<int32_t> ys[2];
  auto assemble = [&](size_t b, int k) {
    const int n = static_cast<int>(std::min<size_t>(batch_size, order.size() - b));
    xs[k].resize(static_cast<size_t>(n) * dim);
    ys[k].resize(n);
    for (int i = 0; i < n; ++i) {
      const int64_t r = order[b + i];
      std::copy_n(train_.features.data() + r * dim, dim,
                  xs[k].data() + static_cast<size_t>(i) * dim);
      ys[k][i] = train_.labels[r];
    }
    // (A pipeline's stage computes on a model of its own.)
    return pipeline_ != nullptr ? absl::OkStatus()
                                : model_->Prefetch(xs[k].data(), ys[k].data(), n);
  };
  model_->DropPrefetched();  // (any left by a task that stopped early)
  if (!order.empty()) STRATA_RETURN_IF_ERROR(assemble(0, 0));
  int cur = 0;
  for (size_t b = 0; b < order.size(); b += batch_size, cur ^= 1) {
    if (ctx_->stopping()) return absl::CancelledError("worker shut down");
    if (b + batch_size < order.size()) STRATA_RETURN_IF_ERROR(assemble(b + batch_size, cur ^ 1));
    const std::vector<float>& x = xs[cur];
    const std::vector<int32_t>& y = ys[cur];
    const int n = static_cast<int>(y.size());
    const absl::Time t0 = absl::Now();
    uint64_t version = ctx_->next_step();
    double loss = 0;
    int64_t correct = -1;  // (-1: the model's last_correct)
    absl::Duration comm;
    if (local != nullptr) {
      STRATA_ASSIGN_OR_RETURN(loss, model_->TrainStep(x.data(), y.data(), n));
      for (size_t t = 0; t < local->size(); ++t) {
        (*local)[t]->Apply(model_->params()[t].data(), model_->grads()[t].data(), 1.0f / n,
                           model_->params()[t].size());
      }
    } else if (pipeline_ != nullptr) {
      STRATA_ASSIGN_OR_RETURN(
          loss, pipeline_->LeaderStep(x.data(), y.data(), n, &version, &correct, &comm));
    } else if (ctx_->dense_ring() != nullptr) {
      STRATA_ASSIGN_OR_RETURN(loss, AllreduceStep(x.data(), y.data(), n, &version, &comm));
    } else if (ctx_->host_aggregator() != nullptr) {
      STRATA_ASSIGN_OR_RETURN(loss, AggregatedStep(x.data(), y.data(), n, &version, &comm));
    } else {
      STRATA_ASSIGN_OR_RETURN(loss, PipelinedStep(x.data(), y.data(), n, t0, &version, &comm));
    }
    const absl::Time t3 = absl::Now();
    if (local == nullptr) {
      ctx_->TraceSpan("step", "step", t0,
                      absl::StrCat("\"step\": ", version, ", \"samples\": ", n));
    }
    ctx_->RecordStep(n, version, loss, correct >= 0 ? correct : model_->last_correct(), t3 - t0,
                     comm, /*stale=*/false);
  }
  if (pipeline_ != nullptr && local == nullptr) {
    // The task is done once the stages after this one have pushed its
    // last step too.
    STRATA_RETURN_IF_ERROR(pipeline_->Flush());
  }
  if (HostAggregator* agg = ctx_->host_aggregator(); agg != nullptr && local == nullptr) {
    // The task is done once its last step is applied: when the version
    // after it is published.
    STRATA_RETURN_IF_ERROR(
        agg->AwaitParams(ctx_->next_step(), &model_->params(), [this] { return ctx_->stopping(); })
            .status());
  }
  return task.end() - task.begin();
}

absl::StatusOr<double> MlpTrainer::AggregatedStep(const float* x, const int32_t* y, int n,
                                                  uint64_t* version, absl::Duration* comm) {
  // Node-local aggregation (host_aggregator.h): the parameters of the
  // host's step come through its shared memory, the gradient goes there;
  // the host's aggregating worker pushes the sum for everyone.
  HostAggregator* agg = ctx_->host_aggregator();
  absl::Time w = absl::Now();
  STRATA_ASSIGN_OR_RETURN(*version, agg->AwaitParams(ctx_->next_step(), &model_->params(),
                                                     [this] { return ctx_->stopping(); }));
  *comm += absl::Now() - w;
  STRATA_ASSIGN_OR_RETURN(const double loss, model_->TrainStep(x, y, n));
  w = absl::Now();
  STRATA_RETURN_IF_ERROR(agg->Post(*version, static_cast<uint64_t>(n), model_->grads()));
  *comm += absl::Now() - w;
  return loss;
}

absl::StatusOr<double> MlpTrainer::AllreduceStep(const float* x, const int32_t* y, int n,
                                                 uint64_t* version, absl::Duration* comm) {
  // model.dense_sync allreduce (dense_ring.h): the gradients of the batch,
  // summed over the ring; the parameters after the step come back into
  // the model's tables. The step overlaps the backward pass: it begins
  // (its first exchange) as the forward pass does, and each bucket of
  // gradients goes round as soon as the backward pass has made it, the
  // last layers' first (the weights' row blocks cut where the buckets
  // are).
  DenseRing* const ring = ctx_->dense_ring();
  // (Once, before the first step: every step, begun here or not, computes
  // in the same blocks. The forward pass sums a layer block by block, and
  // a resumed job's steps give the same bytes as an uninterrupted one's.)
  if (!blocks_cut_) {
    for (int t = 0; t < static_cast<int>(model_->params().size()); ++t) {
      model_->SetPartitionStarts(t, ring->BucketStarts(static_cast<size_t>(t)));
    }
    blocks_cut_ = true;
  }
  Mlp::Hooks hooks;
  if (ring->BeginStep(static_cast<uint64_t>(n))) {
    hooks.grads_ready = [this, ring](int table, uint64_t end) {
      ring->GradsReady(static_cast<size_t>(table), model_->grads()[table].data(), end);
      return absl::OkStatus();
    };
  }
  absl::StatusOr<double> trained = model_->TrainStep(x, y, n, hooks);
  if (!trained.ok()) {
    ring->AbandonStep(trained.status());
    return trained.status();
  }
  const double loss = *trained;
  const absl::Time w = absl::Now();
  STRATA_ASSIGN_OR_RETURN(const DenseRing::Done done,
                          ring->TrainStep(model_->grads(), static_cast<uint64_t>(n)));
  *comm += absl::Now() - w;
  *version = done.step;
  return loss;
}

absl::StatusOr<double> MlpTrainer::PipelinedStep(const float* x, const int32_t* y, int n,
                                                 absl::Time t0, uint64_t* version,
                                                 absl::Duration* comm) {
  // Communication overlaps computation (docs/performance.md): each block
  // of a weight's gradient is pushed as soon as the backward pass has it,
  // and the next step's pull of it right behind (once the backward pass no
  // longer reads those parameters); the forward pass waits only for the
  // block of parameters it reads next. A push is settled (acks, retries)
  // in the next step: a block's ack is awaited just before its pull, which
  // follows it on the same connection, and the rest after the forward
  // pass, before the gradients change (or at once, when a pull needs a
  // retry that could wait on it); the last push of a task before the task
  // is reported done.
  ParamClient* const params = ctx_->params();
  StepExchanges& ex = ctx_->exchanges();
  const bool stepped = Stepped(ctx_->config().job.consistency);
  const bool tracing = ctx_->tracing();
  const int n_tables = static_cast<int>(model_->params().size());
  for (int t = 0; t < n_tables; ++t) {
    model_->SetPartitionStarts(t, params->PartitionStarts(t));
  }
  if (ex.pull == nullptr) {
    ex.pull =
        params->StartPull(stepped ? ctx_->next_step() : 0, &model_->params(), &ex.pulled_version);
    ex.pull->IssueAll();
  } else {
    ex.pull->RenewDeadline();  // carried over: the timeout counts from now
  }
  if (ex.push != nullptr) ex.push->RenewDeadline();
  std::unique_ptr<ParamClient::Exchange> next_pull;
  std::vector<uint64_t> pushed(n_tables, 0);
  std::vector<bool> released(n_tables, false);
  auto timed = [comm](const std::function<absl::Status()>& fn) {
    const absl::Time w = absl::Now();
    absl::Status st = fn();
    *comm += absl::Now() - w;
    return st;
  };
  // The trace's spans: compute between the hooks, waits inside them.
  absl::Time mark = t0;
  auto table_arg = [](int table) { return absl::StrCat("\"table\": ", table); };
  Mlp::Hooks hooks;
  hooks.need_params = [&](int table, uint64_t end) {
    if (tracing) mark = ctx_->TraceSpan("forward", "compute", mark, table_arg(table));
    absl::Cleanup waited = [&] {
      if (tracing) mark = ctx_->TraceSpan("wait for pull", "wait", mark, table_arg(table));
    };
    return timed([&]() -> absl::Status {
      if (ex.push != nullptr) STRATA_RETURN_IF_ERROR(ex.push->WaitRange(table, end));
      STRATA_ASSIGN_OR_RETURN(bool good, ex.pull->AwaitRange(table, end));
      if (good) return absl::OkStatus();
      // A pull to retry (a new view, a lagging pserver): its answer may
      // wait on any of our pushes (bsp), so settle them all first.
      STRATA_RETURN_IF_ERROR(ctx_->SettlePush());
      return ex.pull->Finish();
    });
  };
  hooks.after_forward = [&]() {
    if (tracing) mark = ctx_->TraceSpan("forward", "compute", mark, "");
    absl::Cleanup waited = [&] {
      if (tracing) mark = ctx_->TraceSpan("wait to settle", "wait", mark, "");
    };
    STRATA_RETURN_IF_ERROR(timed([&] { return ctx_->SettlePush(); }));
    STRATA_RETURN_IF_ERROR(timed([&] { return ex.pull->Finish(); }));
    ex.pull.reset();
    *version = ex.pulled_version;
    ex.push = params->StartPush(&model_->grads(), *version, n, &ex.push_result);
    next_pull =
        params->StartPull(stepped ? *version + 1 : 0, &model_->params(), &ex.pulled_version);
    return absl::OkStatus();
  };
  hooks.grads_ready = [&](int table, uint64_t end) {
    if (tracing) mark = ctx_->TraceSpan("backward", "compute", mark, table_arg(table));
    ex.push->IssueRange(table, end);
    pushed[table] = end;
    if (released[table]) next_pull->IssueRange(table, end);
    return absl::OkStatus();
  };
  hooks.params_released = [&](int table) {
    released[table] = true;
    next_pull->IssueRange(table, pushed[table]);
    return absl::OkStatus();
  };
  absl::StatusOr<double> loss = model_->TrainStep(x, y, n, hooks);
  if (!loss.ok()) {
    ex.pull.reset();
    ex.push.reset();
    return loss.status();
  }
  if (tracing) ctx_->TraceSpan("backward", "compute", mark, "");
  LogActivationMemoryOnce();
  // The pull carries over to the next data task (see StepExchanges).
  ex.pull = std::move(next_pull);
  return *loss;
}

void MlpTrainer::LogActivationMemoryOnce() {
  const int every = ctx_->config().worker.recompute_every;
  if (activation_memory_logged_ || every < 2) return;
  activation_memory_logged_ = true;
  const Mlp::ActivationMemory m = model_->activation_memory();
  LOG(INFO) << absl::StrFormat(
      "activation recomputation (every %d layers): %.2f MiB of activations held instead "
      "of %.2f MiB (%.0f%% saved)",
      every, m.held / 1048576.0, m.without_recompute / 1048576.0,
      m.without_recompute == 0 ? 0.0 : 100.0 * (1.0 - double(m.held) / m.without_recompute));
}

absl::StatusOr<std::pair<double, double>> MlpTrainer::TestAccuracy() {
  const auto& d = ctx_->config().data;
  STRATA_ASSIGN_OR_RETURN(storage::LabeledDataset test,
                          storage::LoadIdxDataset(ctx_->fs(), d.test_images, d.test_labels));
  if (test.feature_dim != train_.feature_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        d.test_images, ": ", test.feature_dim, " features, training set has ", train_.feature_dim));
  }
  STRATA_RETURN_IF_ERROR(CheckLabelsFor(test, d.test_labels, ctx_->config().model));
  double loss = 0;
  int64_t correct = 0;
  const int chunk = 1000;
  for (int64_t b = 0; b < test.num_examples; b += chunk) {
    const int n = static_cast<int>(std::min<int64_t>(chunk, test.num_examples - b));
    STRATA_RETURN_IF_ERROR(model_->Evaluate(test.features.data() + b * test.feature_dim,
                                            test.labels.data() + b, n, &loss, &correct));
  }
  return std::make_pair(static_cast<double>(correct) / test.num_examples, loss / test.num_examples);
}

absl::StatusOr<EvalMetrics> MlpTrainer::Evaluate(std::optional<uint64_t> min_version) {
  // (Allreduce: the ring's parameters are here already.)
  // (Pipeline stages: every stage's tables; the whole model evaluates here.)
  if (min_version.has_value() && ctx_->config().model.dense_sync != "allreduce") {
    STRATA_RETURN_IF_ERROR(ctx_->params()->PullAll(*min_version, &model_->params()).status());
  }
  STRATA_ASSIGN_OR_RETURN(auto acc, TestAccuracy());
  EvalMetrics m;
  m.accuracy = acc.first;
  m.loss = acc.second;
  return m;
}

}  // namespace strata::worker
