#include "worker/script_trainer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace strata::worker {

absl::StatusOr<std::unique_ptr<ScriptTrainer>> ScriptTrainer::Create(TrainerContext* ctx) {
  std::vector<TableSpec> tables = ModelTables(ctx->config().model);
  for (const TableSpec& t : tables) {
    if (t.sparse) {
      return absl::UnimplementedError(
          absl::StrCat("a training script's worker holds dense tables only so far; table ", t.name,
                       " of model.type ", ctx->config().model.type, " is sparse"));
    }
  }
  if (tables.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.type ", ctx->config().model.type, " of ", ctx->config().source,
                     " has no tables for a training script to train"));
  }
  return std::unique_ptr<ScriptTrainer>(new ScriptTrainer(ctx, std::move(tables)));
}

ScriptTrainer::ScriptTrainer(TrainerContext* ctx, std::vector<TableSpec> tables)
    : ctx_(ctx), tables_(std::move(tables)) {
  for (const TableSpec& t : tables_) {
    params_.emplace_back(t.num_elements(), 0.f);
    grads_.emplace_back(t.num_elements(), 0.f);
  }
}

absl::StatusOr<int64_t> ScriptTrainer::TrainTask(const proto::DataTask& task,
                                                 std::vector<std::unique_ptr<Optimizer>>* local) {
  if (local != nullptr) {
    return absl::UnimplementedError(
        "a training script's worker trains against pservers (no --local run)");
  }
  ParamClient* const params = ctx_->params();
  const bool bsp = ctx_->config().job.consistency == Consistency::kBsp;
  ctx_->SetEpoch(task.epoch());
  // The task's first step starts from the parameters of its version.
  STRATA_RETURN_IF_ERROR(params->PullAll(bsp ? ctx_->next_step() : 0, &params_).status());
  {
    absl::MutexLock l(&mu_);
    if (phase_ == Phase::kClosed) return absl::CancelledError("the training script's side closed");
    offered_ = ctx_->TaskRecordOrder(task, task.begin(), task.end());
    phase_ = Phase::kTask;
  }
  absl::Time since = absl::Now();  // the script's compute starts
  while (true) {
    int n;
    double loss;
    int64_t correct;
    {
      absl::MutexLock l(&mu_);
      auto asked = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return phase_ == Phase::kStepAsked || phase_ == Phase::kTaskDone ||
               phase_ == Phase::kClosed;
      };
      while (!mu_.AwaitWithTimeout(absl::Condition(&asked), absl::Milliseconds(100))) {
        if (ctx_->stopping()) return absl::CancelledError("worker shut down");
      }
      if (phase_ == Phase::kClosed)
        return absl::CancelledError("the training script's side closed");
      if (phase_ == Phase::kTaskDone) {
        phase_ = Phase::kIdle;
        offered_.reset();
        return task.end() - task.begin();
      }
      n = step_n_;
      loss = step_loss_;
      correct = step_correct_;
    }
    // The gradient the script left in grads_ goes out, the next step's
    // parameters come back into params_ (in place: the script's tensors).
    const uint64_t version = ctx_->next_step();
    const absl::Time t0 = absl::Now();
    PushResult pushed;
    absl::Status s = params
                         ->PushThenPull(grads_, version, static_cast<uint64_t>(n),
                                        bsp ? version + 1 : 0, &params_, &pushed)
                         .status();
    const absl::Time t1 = absl::Now();
    if (s.ok()) {
      ctx_->TraceSpan("step", "step", since,
                      absl::StrCat("\"step\": ", version, ", \"samples\": ", n));
      ctx_->RecordStep(n, version, loss, correct, t1 - since, t1 - t0, pushed.stale_partitions > 0);
    }
    since = t1;
    absl::MutexLock l(&mu_);
    step_done_ = s;
    phase_ = Phase::kTask;
    if (!s.ok()) return s;
  }
}

absl::StatusOr<EvalMetrics> ScriptTrainer::Evaluate(std::optional<uint64_t> min_version) {
  if (min_version.has_value()) {
    STRATA_RETURN_IF_ERROR(ctx_->params()->PullAll(*min_version, &params_).status());
  }
  absl::MutexLock l(&mu_);
  evaluate_wanted_ = true;
  auto given = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return metrics_.has_value() || phase_ == Phase::kClosed;
  };
  while (!mu_.AwaitWithTimeout(absl::Condition(&given), absl::Milliseconds(100))) {
    if (ctx_->stopping()) return absl::CancelledError("worker shut down");
  }
  evaluate_wanted_ = false;
  if (!metrics_.has_value()) {
    return absl::CancelledError("the training script ended without giving the test figures");
  }
  EvalMetrics m;
  auto get = [this](const char* key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> std::optional<double> {
    auto it = metrics_->find(key);
    return it == metrics_->end() ? std::nullopt : std::optional<double>(it->second);
  };
  m.accuracy = get("test_accuracy").value_or(0);
  m.loss = get("test_loss").value_or(0);
  m.auc = get("test_auc");
  return m;
}

absl::StatusOr<std::optional<std::vector<int64_t>>> ScriptTrainer::NextTask() {
  absl::MutexLock l(&mu_);
  if (phase_ == Phase::kTask && !offered_.has_value()) phase_ = Phase::kTaskDone;  // (implied)
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return offered_.has_value() || evaluate_wanted_ || phase_ == Phase::kClosed;
  };
  mu_.Await(absl::Condition(&ready));
  if (offered_.has_value() && phase_ == Phase::kTask) {
    std::optional<std::vector<int64_t>> out = std::move(offered_);
    offered_.reset();
    return out;
  }
  if (phase_ == Phase::kClosed && !closed_.ok()) return closed_;
  return std::optional<std::vector<int64_t>>();
}

absl::Status ScriptTrainer::Step(int n, double loss, int64_t correct) {
  absl::MutexLock l(&mu_);
  if (phase_ == Phase::kClosed) {
    return closed_.ok() ? absl::FailedPreconditionError("the worker has stopped") : closed_;
  }
  if (phase_ != Phase::kTask || offered_.has_value()) {
    return absl::FailedPreconditionError("step() outside a data task (iterate job.tasks())");
  }
  if (n <= 0) return absl::InvalidArgumentError(absl::StrCat("step() over ", n, " records"));
  step_n_ = n;
  step_loss_ = loss;
  step_correct_ = correct;
  step_done_.reset();
  phase_ = Phase::kStepAsked;
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return step_done_.has_value() || phase_ == Phase::kClosed;
  };
  mu_.Await(absl::Condition(&done));
  if (step_done_.has_value()) return *step_done_;
  return closed_.ok() ? absl::CancelledError("the worker stopped during the step") : closed_;
}

absl::Status ScriptTrainer::TaskDone() {
  absl::MutexLock l(&mu_);
  if (phase_ != Phase::kTask) return absl::OkStatus();
  phase_ = Phase::kTaskDone;
  return absl::OkStatus();
}

void ScriptTrainer::Finish(const std::map<std::string, double>& metrics) {
  absl::MutexLock l(&mu_);
  metrics_ = metrics;
}

void ScriptTrainer::Close(const absl::Status& status) {
  absl::MutexLock l(&mu_);
  phase_ = Phase::kClosed;
  closed_ = status;
}

}  // namespace strata::worker
