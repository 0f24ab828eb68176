#include "worker/script_trainer.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/vector_ops.h"

namespace strata::worker {

absl::StatusOr<std::unique_ptr<ScriptTrainer>> ScriptTrainer::Create(TrainerContext* ctx) {
  auto trainer = std::unique_ptr<ScriptTrainer>(new ScriptTrainer(ctx));
  // (Tables the script declares come with Declare.)
  if (!ScriptDeclaresTables(ctx->config().model)) {
    STRATA_RETURN_IF_ERROR(trainer->Declare(ModelTables(ctx->config().model)));
    trainer->ValuesIn();  // (the pservers initialise them)
  }
  return trainer;
}

ScriptTrainer::ScriptTrainer(TrainerContext* ctx) : ctx_(ctx) {
  if (ctx->config().model.stages > 1) {
    runner_ = std::make_unique<PipelineRunner>(
        ctx, &params_, [this](int stage) -> absl::StatusOr<PipelineRunner::Stage> {
          absl::MutexLock l(&stage_mu_);
          if (!script_stage_.has_value()) {
            return absl::FailedPreconditionError(
                absl::StrCat("pipeline stage ", stage,
                             ": the training script has not made its stage yet (job.pipeline)"));
          }
          if (script_stage_index_ != stage) {
            return absl::FailedPreconditionError(absl::StrCat(
                "this worker's seat is pipeline stage ", stage, ", its script made stage ",
                script_stage_index_, " (worker index i is stage i % model.stages)"));
          }
          return *script_stage_;
        });
  }
}

absl::Status ScriptTrainer::SetStage(int stage, int first_table, int end_table,
                                     std::shared_ptr<StageModel> model, std::string layers) {
  const int k = ctx_->config().model.stages;
  if (runner_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(ctx_->config().source, ": model.stages is 1: no pipeline stage to make"));
  }
  if (!declared_.HasBeenNotified()) {
    return absl::FailedPreconditionError(
        "a pipeline stage before the job's tables are declared (job.pipeline() declares them "
        "through distribute() first)");
  }
  if (has_sparse_) {
    return absl::FailedPreconditionError(absl::StrCat(
        ctx_->config().source,
        ": model.stages with sparse tables (embeddings) is not built yet: one stage or none"));
  }
  if (stage < 0 || stage >= k || first_table < 0 || first_table >= end_table ||
      end_table > static_cast<int>(tables_.size()) || model == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        ctx_->config().source, ": model.stages ", k, ": stage ", stage, " of tables [", first_table,
        ", ", end_table, ") of ", tables_.size(), " does not fit the model"));
  }
  absl::MutexLock l(&stage_mu_);
  if (script_stage_.has_value()) {
    return absl::FailedPreconditionError("this worker's pipeline stage is made already");
  }
  PipelineRunner::Stage made;
  made.model = std::move(model);
  made.first_table = first_table;
  made.end_table = end_table;
  made.layers = std::move(layers);
  script_stage_ = std::move(made);
  script_stage_index_ = stage;
  return absl::OkStatus();
}

absl::Status ScriptTrainer::Follow(absl::Duration idle) {
  if (runner_ == nullptr) return absl::OkStatus();
  return runner_->Follow(idle);
}

absl::Status ScriptTrainer::PipelineStep(const float* x, const int32_t* y, int n, double* loss,
                                         int64_t* correct) {
  if (runner_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(ctx_->config().source, ": model.stages is 1: no pipeline to step"));
  }
  absl::Time since;
  {
    absl::MutexLock l(&mu_);
    STRATA_RETURN_IF_ERROR(EnterStepLocked(n));
    since = step_since_;
  }
  // (The training thread waits in TrainTask meanwhile: the runner is this
  // thread's.)
  uint64_t version = 0;
  absl::Duration comm;
  absl::StatusOr<double> summed = runner_->LeaderStep(x, y, n, &version, correct, &comm);
  if (summed.ok()) *loss = *summed;
  return LeaveStep(summed.status(), n, version, summed.value_or(0), *correct, since, comm,
                   /*stale=*/false);
}

absl::Status ScriptTrainer::LeaveStep(absl::Status s, int n, uint64_t step, double loss,
                                      int64_t correct, absl::Time since, absl::Duration comm,
                                      bool stale) {
  const absl::Time t1 = absl::Now();
  if (s.ok()) {
    ctx_->TraceSpan("step", "step", since, absl::StrCat("\"step\": ", step, ", \"samples\": ", n));
    ctx_->RecordStep(n, step, loss, correct, t1 - since, comm, stale);
  }
  const bool stepped = Stepped(ctx_->config().job.consistency);
  absl::MutexLock l(&mu_);
  --in_calls_;
  step_since_ = t1;
  lookup_version_ = stepped ? std::max(ctx_->next_step(), ssp_floor_) : 0;
  if (!s.ok()) step_error_ = s;  // the task fails with it (TrainTask)
  return s;
}

ScriptTrainer::~ScriptTrainer() { DropExchanges(); }

void ScriptTrainer::DropExchanges() {
  ahead_.reset();
  begun_.reset();
  runner_.reset();  // (its stage's connection to the next one)
}

absl::Status ScriptTrainer::Declare(std::vector<TableSpec> tables) {
  absl::MutexLock l(&mu_);
  if (declared_.HasBeenNotified()) {
    bool same = tables.size() == tables_.size();
    for (size_t t = 0; same && t < tables.size(); ++t) {
      same = tables[t].name == tables_[t].name && tables[t].shape == tables_[t].shape &&
             tables[t].sparse == tables_[t].sparse && tables[t].dim == tables_[t].dim;
    }
    if (same) return absl::OkStatus();
    return absl::FailedPreconditionError(
        "this worker's tables are declared already, as another model's (one distribute() per "
        "job)");
  }
  if (tables.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.type ", ctx_->config().model.type, " of ", ctx_->config().source,
                     ": no tables for a training script to train (a model without parameters?)"));
  }
  tables_ = std::move(tables);
  for (size_t t = 0; t < tables_.size(); ++t) {
    // A sparse table's tensors are empty: its rows come by key (Lookup).
    params_.emplace_back(tables_[t].num_elements(), 0.f);
    grads_.emplace_back(tables_[t].num_elements(), 0.f);
    if (tables_[t].sparse) row_grads_[static_cast<uint32_t>(t)];
    has_sparse_ |= tables_[t].sparse;
  }
  declared_.Notify();
  return absl::OkStatus();
}

int ScriptTrainer::SparseDim(uint32_t table) const {
  return table < tables_.size() && tables_[table].sparse ? tables_[table].dim : 0;
}

absl::StatusOr<int64_t> ScriptTrainer::TrainTask(const proto::DataTask& task,
                                                 std::vector<std::unique_ptr<Optimizer>>* local) {
  if (local != nullptr) {
    return absl::UnimplementedError(
        "a training script's worker trains against pservers (no --local run)");
  }
  const bool stepped = Stepped(ctx_->config().job.consistency);
  ctx_->SetEpoch(task.epoch());
  // The task's first step starts from the parameters of its version.
  // (model.dense_sync allreduce: the dense tables are the ring's, in
  // params_ already; a sparse table's rows come by lookup.)
  // (Pipeline stages: each step pulls its stage's tables.)
  uint64_t pulled = 0;
  if (ctx_->dense_ring() == nullptr && runner_ == nullptr) {
    STRATA_ASSIGN_OR_RETURN(pulled,
                            ctx_->params()->PullAll(stepped ? ctx_->next_step() : 0, &params_));
  }
  absl::Status status;
  {
    absl::MutexLock l(&mu_);
    // ssp: a worker joining a running job goes on at the slowest worker's
    // clock, not at 0 (it would hold every other worker back).
    ssp_floor_ = ctx_->config().job.consistency == Consistency::kSsp ? pulled : 0;
    if (phase_ == Phase::kClosed) return absl::CancelledError("the training script's side closed");
    offered_ = ctx_->TaskRecordOrder(task, task.begin(), task.end());
    phase_ = Phase::kTask;
    lookup_version_ = stepped ? std::max(ctx_->next_step(), ssp_floor_) : 0;
    lookup_barrier_ = stepped;
    for (auto& [t, g] : row_grads_) g = RowGrads();
    step_error_ = absl::OkStatus();
    step_since_ = absl::Now();  // the script's compute starts
    // The script's thread trains the task now (Step), in this thread's place:
    // this one waits until it is done, failed, or the worker stops.
    auto over = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return phase_ == Phase::kTaskDone || phase_ == Phase::kClosed || !step_error_.ok();
    };
    while (!mu_.AwaitWithTimeout(absl::Condition(&over), absl::Milliseconds(100))) {
      if (ctx_->stopping()) {
        status = absl::CancelledError("worker shut down");
        break;
      }
    }
    if (status.ok() && phase_ == Phase::kClosed) {
      status = absl::CancelledError("the training script's side closed");
    }
    if (status.ok()) status = step_error_;
    // Nothing of the script's may still use the worker once this returns.
    AwaitCallsLocked();
    if (phase_ != Phase::kClosed) phase_ = Phase::kIdle;
    offered_.reset();
    lookup_version_ = 0;
    lookup_barrier_ = false;
  }
  if (!status.ok()) return status;
  if (runner_ != nullptr) {
    // The task is done once the stages after this one have pushed its
    // last step too.
    STRATA_RETURN_IF_ERROR(runner_->Flush());
  }
  return task.end() - task.begin();
}

void ScriptTrainer::AwaitCallsLocked() {
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return in_calls_ == 0; };
  mu_.Await(absl::Condition(&idle));
}

uint64_t ScriptTrainer::NextStep() {
  absl::MutexLock l(&mu_);
  return std::max(ctx_->next_step(), ssp_floor_);
}

absl::Status ScriptTrainer::IssueSparsePushes(
    uint64_t version, int n, bool stepped,
    std::vector<std::unique_ptr<ParamClient::Exchange>>* exchanges,
    std::vector<ParamClient::SparseKeys>* grouped, std::vector<PushResult>* results) {
  std::map<uint32_t, RowGrads> step;
  {
    absl::MutexLock l(&mu_);
    if (row_grads_.empty()) return absl::OkStatus();
    for (auto& [t, g] : row_grads_) step[t] = std::exchange(g, RowGrads());
  }
  ParamClient* const params = ctx_->params();
  // Stable addresses: each exchange borrows its keys and result.
  grouped->resize(step.size());
  results->resize(step.size());
  size_t i = 0;
  for (auto& [table, g] : step) {
    const int dim = SparseDim(table);
    if (stepped && !g.looked_up) {
      // The partitions at this step first, as a lookup would have waited
      // for: a bsp push must not run ahead of a partition's step.
      ParamClient::SparseKeys none;
      std::vector<uint32_t> perm;
      STRATA_RETURN_IF_ERROR(params->GroupKeys({}, &none, &perm));
      float unused = 0;
      STRATA_RETURN_IF_ERROR(
          params->StartSparsePull(table, &none, &unused, version, /*every_partition=*/true)
              ->Finish());
    }
    if (!stepped && g.keys.empty()) {
      ++i;
      continue;
    }
    std::vector<uint32_t> perm;
    STRATA_RETURN_IF_ERROR(params->GroupKeys(g.keys, &(*grouped)[i], &perm));
    // One row per key in the grouping's order, the mean loss's gradient
    // times n: a push carries the gradient summed over its records.
    std::vector<float> rows(g.grads.size());
    for (size_t u = 0; u < g.keys.size(); ++u) {
      const float* from = g.grads.data() + u * dim;
      float* to = rows.data() + static_cast<size_t>(perm[u]) * dim;
      for (int j = 0; j < dim; ++j) to[j] = from[j] * static_cast<float>(n);
    }
    exchanges->push_back(params->StartSparsePush(table, &(*grouped)[i], rows.data(), version,
                                                 static_cast<uint64_t>(n), stepped,
                                                 &(*results)[i]));
    exchanges->back()->IssueAll();
    ++i;
  }
  return absl::OkStatus();
}

absl::Status ScriptTrainer::Lookup(uint32_t table, const uint64_t* keys, size_t n, float* rows) {
  const int dim = SparseDim(table);
  if (dim == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", table < tables_.size() ? tables_[table].name : std::to_string(table),
                     " is not a sparse table of the job"));
  }
  uint64_t version;
  bool barrier;
  {
    absl::MutexLock l(&mu_);
    if (phase_ == Phase::kClosed) {
      return closed_.ok() ? absl::FailedPreconditionError("the worker has stopped") : closed_;
    }
    version = lookup_version_;
    barrier = lookup_barrier_;
    row_grads_[table].looked_up |= barrier;
    if (n == 0 && !barrier) return absl::OkStatus();
    ++in_calls_;
  }
  ParamClient* const params = ctx_->params();
  ParamClient::SparseKeys grouped;
  std::vector<uint32_t> perm;
  absl::Status s = params->GroupKeys(std::vector<uint64_t>(keys, keys + n), &grouped, &perm);
  std::vector<float> got(std::max<size_t>(n, 1) * dim);
  if (s.ok()) s = params->StartSparsePull(table, &grouped, got.data(), version, barrier)->Finish();
  for (size_t i = 0; s.ok() && i < n; ++i) {
    std::memcpy(rows + i * dim, got.data() + static_cast<size_t>(perm[i]) * dim,
                sizeof(float) * dim);
  }
  absl::MutexLock l(&mu_);
  --in_calls_;
  return s;
}

absl::Status ScriptTrainer::AddRowGrads(uint32_t table, const uint64_t* keys, size_t n,
                                        const float* grads) {
  const int dim = SparseDim(table);
  if (dim == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", table < tables_.size() ? tables_[table].name : std::to_string(table),
                     " is not a sparse table of the job"));
  }
  absl::MutexLock l(&mu_);
  RowGrads& g = row_grads_[table];
  for (size_t i = 0; i < n; ++i) {
    auto [it, fresh] = g.index.emplace(keys[i], static_cast<uint32_t>(g.keys.size()));
    if (fresh) {
      g.keys.push_back(keys[i]);
      g.grads.resize(g.grads.size() + dim, 0.f);
    }
    float* to = g.grads.data() + static_cast<size_t>(it->second) * dim;
    for (int j = 0; j < dim; ++j) to[j] += grads[i * dim + j];
  }
  return absl::OkStatus();
}

absl::StatusOr<EvalMetrics> ScriptTrainer::Evaluate(std::optional<uint64_t> min_version) {
  // (Allreduce: the ring's parameters are here already.)
  if (min_version.has_value() && ctx_->dense_ring() == nullptr) {
    STRATA_RETURN_IF_ERROR(ctx_->params()->PullAll(*min_version, &params_).status());
  }
  absl::MutexLock l(&mu_);
  evaluate_wanted_ = true;
  // The test pass's lookups read the rows of the evaluated version.
  lookup_version_ = min_version.value_or(0);
  lookup_barrier_ = false;
  auto given = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return metrics_.has_value() || phase_ == Phase::kClosed;
  };
  while (!mu_.AwaitWithTimeout(absl::Condition(&given), absl::Milliseconds(100))) {
    if (ctx_->stopping()) {
      evaluate_wanted_ = false;
      AwaitCallsLocked();  // (a lookup of the test pass)
      lookup_version_ = 0;
      return absl::CancelledError("worker shut down");
    }
  }
  evaluate_wanted_ = false;
  AwaitCallsLocked();
  lookup_version_ = 0;
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
  m.examples = static_cast<int64_t>(get("test_examples").value_or(0));
  return m;
}

absl::StatusOr<std::optional<std::vector<int64_t>>> ScriptTrainer::NextTask(absl::Duration wait) {
  if (begun_ != nullptr) FailBegunStep("a step begun by backward() was not finished by step()");
  SettleAhead().IgnoreError();  // (a failure is the task's: step_error_)
  absl::MutexLock l(&mu_);
  if (phase_ == Phase::kTask && !offered_.has_value()) phase_ = Phase::kTaskDone;  // (implied)
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return offered_.has_value() || evaluate_wanted_ || phase_ == Phase::kClosed;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready), wait)) {
    return absl::DeadlineExceededError("no data task yet");
  }
  if (offered_.has_value() && phase_ == Phase::kTask) {
    std::optional<std::vector<int64_t>> out = std::move(offered_);
    offered_.reset();
    return out;
  }
  if (phase_ == Phase::kClosed && !closed_.ok()) return closed_;
  return std::optional<std::vector<int64_t>>();
}

absl::Status ScriptTrainer::EnterStepLocked(int n) {
  if (phase_ == Phase::kClosed) {
    return closed_.ok() ? absl::FailedPreconditionError("the worker has stopped") : closed_;
  }
  if (phase_ != Phase::kTask || offered_.has_value()) {
    return absl::FailedPreconditionError("step() outside a data task (iterate job.tasks())");
  }
  if (!step_error_.ok()) return step_error_;
  if (n <= 0) return absl::InvalidArgumentError(absl::StrCat("step() over ", n, " records"));
  ++in_calls_;
  return absl::OkStatus();
}

void ScriptTrainer::AheadFailed(const absl::Status& s) {
  ahead_.reset();  // (drops the connections of pulls still writing params_)
  absl::MutexLock l(&mu_);
  if (step_error_.ok()) step_error_ = s;
}

absl::Status ScriptTrainer::WaitTables(const std::vector<uint32_t>& tables) {
  if (ahead_ == nullptr) return absl::OkStatus();
  for (uint32_t t : tables) {
    if (absl::Status s = ahead_->WaitTable(t); !s.ok()) {
      AheadFailed(s);
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status ScriptTrainer::SettleAhead() {
  if (ahead_ == nullptr) return absl::OkStatus();
  absl::Status s = ahead_->FinishPull().status();
  if (!s.ok()) {
    AheadFailed(s);
    return s;
  }
  ahead_.reset();
  return absl::OkStatus();
}

absl::Status ScriptTrainer::BeginStep(int n) {
  STRATA_RETURN_IF_ERROR(SettleAhead());
  if (begun_ != nullptr) {
    return absl::FailedPreconditionError("a step was begun and not finished (call step())");
  }
  {
    absl::MutexLock l(&mu_);
    STRATA_RETURN_IF_ERROR(EnterStepLocked(n));  // left by Step or AbandonStep
  }
  const bool stepped = Stepped(ctx_->config().job.consistency);
  const uint64_t version = NextStep();
  // (Allreduce: the ring's step begins now, when this worker is in a
  // ring; its gradients go as PushTable hands them over, and Step ends it.
  // Else the ring steps every dense table at Step.)
  if (DenseRing* ring = ctx_->dense_ring(); ring != nullptr) {
    ring->BeginStep(static_cast<uint64_t>(n));
  }
  begun_ = std::make_unique<Begun>(
      Begun{n, version,
            ctx_->dense_ring() != nullptr
                ? nullptr
                : std::make_unique<ParamClient::PushPull>(ctx_->params(), &grads_, version,
                                                          static_cast<uint64_t>(n),
                                                          stepped ? version + 1 : 0, &params_)});
  return absl::OkStatus();
}

absl::Status ScriptTrainer::PushTable(uint32_t table) {
  if (begun_ == nullptr) return absl::FailedPreconditionError("push outside a begun step");
  if (begun_->exchange != nullptr) begun_->exchange->Issue(table);
  if (DenseRing* ring = ctx_->dense_ring(); ring != nullptr && table < grads_.size()) {
    ring->GradsReady(table, grads_[table].data(), grads_[table].size());
  }
  return absl::OkStatus();
}

void ScriptTrainer::AbandonStep() {
  ahead_.reset();
  FailBegunStep(ctx_->dense_ring() != nullptr
                    ? "the step begun by backward() was abandoned (its batch is not trained)"
                    : "the step begun by backward() was abandoned after some of its pushes "
                      "went out");
}

void ScriptTrainer::FailBegunStep(const std::string& why) {
  if (begun_ == nullptr) return;
  begun_.reset();  // (drops the connections of calls still borrowing grads_ and params_)
  // (The ring's step begun ends here: no member completes it.)
  if (DenseRing* ring = ctx_->dense_ring(); ring != nullptr) {
    ring->AbandonStep(absl::AbortedError(why));
  }
  for (std::vector<float>& g : grads_) std::fill(g.begin(), g.end(), 0.f);
  absl::MutexLock l(&mu_);
  --in_calls_;
  // Some tables' gradients may have reached the pservers: the step cannot
  // be taken again at its version, so the task fails (and is requeued).
  if (step_error_.ok()) step_error_ = absl::AbortedError(why);
}

absl::Status ScriptTrainer::Step(int n, double loss, int64_t correct, bool ahead) {
  STRATA_RETURN_IF_ERROR(SettleAhead());
  const bool stepped = Stepped(ctx_->config().job.consistency);
  std::unique_ptr<Begun> begun = std::move(begun_);
  absl::Time since;
  {
    absl::MutexLock l(&mu_);
    if (begun == nullptr) STRATA_RETURN_IF_ERROR(EnterStepLocked(n));
    since = step_since_;
  }
  // On this thread, in the training thread's place (it waits in TrainTask
  // until the task is over): the gradient the script left in grads_ goes
  // out, the next step's parameters come back into params_, in place.
  // A begun step's pushes went out table by table during the backward
  // pass, its gradients already summed over the records.
  absl::Status s;
  if (begun != nullptr && begun->n != n) {
    s = absl::InvalidArgumentError(
        absl::StrCat("step() over ", n, " records, the backward pass was over ", begun->n));
  }
  if (begun == nullptr) {
    for (std::vector<float>& g : grads_) Scale(g.data(), static_cast<float>(n), g.size());
  }
  const uint64_t version = begun != nullptr ? begun->version : NextStep();
  const absl::Time t0 = absl::Now();
  PushResult pushed;
  std::vector<std::unique_ptr<ParamClient::Exchange>> sparse;
  std::vector<ParamClient::SparseKeys> grouped;
  std::vector<PushResult> sparse_pushed;
  if (s.ok()) s = IssueSparsePushes(version, n, stepped, &sparse, &grouped, &sparse_pushed);
  DenseRing* const ring = ctx_->dense_ring();
  std::unique_ptr<ParamClient::PushPull> exchange;
  if (begun != nullptr) {
    exchange = std::move(begun->exchange);
  } else if (s.ok() && ring == nullptr) {
    exchange = std::make_unique<ParamClient::PushPull>(ctx_->params(), &grads_, version,
                                                       static_cast<uint64_t>(n),
                                                       stepped ? version + 1 : 0, &params_);
  }
  // The step's number: the pservers' (their sparse tables'), else the
  // ring's.
  uint64_t recorded = version;
  if (!s.ok() && ring != nullptr) ring->AbandonStep(s);  // (a ring step begun)
  if (s.ok() && ring != nullptr) {
    // model.dense_sync allreduce (dense_ring.h): the dense gradients summed
    // over the ring, the parameters after the step written into params_
    // (the script's tensors) in place; once the sparse pushes are out (a
    // member at the pservers' next-step barrier waits for them, not for
    // this step).
    absl::StatusOr<DenseRing::Done> done = ring->TrainStep(grads_, static_cast<uint64_t>(n));
    if (!done.ok()) {
      s = done.status();
    } else if (!has_sparse_) {
      recorded = done->step;
    }
  } else if (s.ok() && ahead) {
    s = exchange->FinishPush(&pushed);
    if (s.ok()) ahead_ = std::move(exchange);  // (its pulls land while the script computes)
  } else if (s.ok()) {
    s = exchange->Finish(&pushed).status();
  }
  exchange.reset();
  begun.reset();
  for (auto& e : sparse) s.Update(e->Finish());
  sparse.clear();
  if (!s.ok()) ahead_.reset();  // (the task fails: no pulls left landing)
  for (const PushResult& r : sparse_pushed) pushed.stale_partitions += r.stale_partitions;
  const absl::Duration comm = absl::Now() - t0;
  // Settled: the transport no longer reads the gradients.
  for (std::vector<float>& g : grads_) std::fill(g.begin(), g.end(), 0.f);
  return LeaveStep(std::move(s), n, recorded, loss, correct, since, comm,
                   pushed.stale_partitions > 0);
}

bool ScriptTrainer::evaluating() {
  absl::MutexLock l(&mu_);
  return evaluate_wanted_ && !metrics_.has_value() && phase_ != Phase::kClosed;
}

absl::Status ScriptTrainer::TaskDone() {
  if (begun_ != nullptr) FailBegunStep("a step begun by backward() was not finished by step()");
  SettleAhead().IgnoreError();  // (a failure is the task's: step_error_)
  absl::MutexLock l(&mu_);
  if (phase_ != Phase::kTask) return absl::OkStatus();
  phase_ = Phase::kTaskDone;
  return absl::OkStatus();
}

void ScriptTrainer::LeaveTask() {
  AbandonStep();
  absl::MutexLock l(&mu_);
  if (phase_ != Phase::kTask || !step_error_.ok()) return;
  // Not trained to its end: not completed, so the master gives it to
  // another worker (or this one's next instance) once this one has left.
  step_error_ = absl::AbortedError(
      "the training script left its data task before its end (an exception or a break out of "
      "job.tasks())");
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
