#include "worker/ctr_trainer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/eval_metrics.h"
#include "common/model_spec.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "worker/host_aggregator.h"

namespace strata::worker {

storage::CriteoReadOptions CtrReadOptions(const DataSection& d) {
  storage::CriteoReadOptions read;
  read.bad_lines =
      d.bad_lines == "skip" ? storage::BadLinePolicy::kSkip : storage::BadLinePolicy::kFail;
  return read;
}

absl::StatusOr<std::unique_ptr<Trainer>> CtrTrainer::Create(TrainerContext* ctx, Device* device) {
  const auto& d = ctx->config().data;
  // A plain-text training file is read per task (its byte range: see
  // DataTask.by_bytes), as the master cuts it; its start is checked here,
  // so a missing or foreign file fails now. A gzipped one, or the first
  // data.train_limit records, is read whole.
  storage::CriteoReadOptions read = CtrReadOptions(d);
  read.limit = d.train_limit;
  STRATA_ASSIGN_OR_RETURN(storage::CriteoTextShape shape,
                          storage::ProbeCriteoFile(ctx->fs(), d.train, read));
  storage::CtrDataset ctr;
  storage::CriteoReadStats stats;
  if (shape.gzipped || d.train_limit > 0) {
    STRATA_ASSIGN_OR_RETURN(ctr, storage::LoadCriteoFile(ctx->fs(), d.train, read, &stats));
    if (stats.skipped > 0) {
      LOG(WARNING) << d.train << ": skipped " << stats.skipped
                   << " bad line(s); first: " << stats.first_error;
    }
  }
  return std::unique_ptr<Trainer>(new CtrTrainer(ctx, device, std::move(ctr), stats.skipped));
}

CtrTrainer::CtrTrainer(TrainerContext* ctx, Device* device, storage::CtrDataset train,
                       int64_t skipped)
    : ctx_(ctx), ctr_train_(std::move(train)), ctr_train_skipped_(skipped) {
  const ModelSection& model = ctx_->config().model;
  wide_deep_ = std::make_unique<WideDeep>(model, *ParseActivation(model.activation), device);
  const RowCacheSection& cache = ctx_->config().sparse.cache;
  if (cache.rows > 0) {
    row_cache_ = std::make_unique<RowCache>(cache.rows, cache.staleness_steps,
                                            std::vector<int>{1, model.embedding_dim});
  }
}

std::string CtrTrainer::DescribeData() const {
  return ctr_train_.num_examples == 0
             ? absl::StrCat("training records read per data task from ", ctx_->config().data.train)
             : absl::StrCat(ctr_train_.num_examples, " training examples loaded");
}

void CtrTrainer::AddMetrics(MetricsRegistry* metrics) {
  if (row_cache_ == nullptr) return;
  // Read by the HTTP thread while the training thread updates them: plain
  // counters, a torn read is at worst one step off.
  metrics->AddCallbackGauge("strata_worker_row_cache_hits", "Sparse keys served by the row cache",
                            [this] { return static_cast<double>(row_cache_hits_.load()); });
  metrics->AddCallbackGauge("strata_worker_row_cache_misses", "Sparse keys pulled",
                            [this] { return static_cast<double>(row_cache_misses_.load()); });
}

absl::Status CtrTrainer::StartRowPull(const std::vector<uint64_t>& keys, uint64_t min_version,
                                      bool barrier, bool use_cache, uint64_t step, float* wide_rows,
                                      float* emb_rows, RowPull* pull) {
  ParamClient* const params = ctx_->params();
  const int dim = wide_deep_->dim();
  pull->missing.clear();
  pull->missing_at.clear();
  pull->use_cache = use_cache && row_cache_ != nullptr;
  pull->step = step;
  pull->wide_rows = wide_rows;
  pull->emb_rows = emb_rows;
  pull->wide.reset();
  pull->emb.reset();
  pull->wide_version = pull->emb_version = UINT64_MAX;
  if (pull->use_cache) {
    std::vector<uint8_t> hit;
    const size_t hits = row_cache_->Lookup(keys, step, {wide_rows, emb_rows}, &hit);
    row_cache_hits_ += hits;
    row_cache_misses_ += keys.size() - hits;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (hit[i]) continue;
      pull->missing.push_back(keys[i]);
      pull->missing_at.push_back(static_cast<uint32_t>(i));
    }
  } else {
    pull->missing = keys;
    pull->missing_at.resize(keys.size());
    std::iota(pull->missing_at.begin(), pull->missing_at.end(), 0u);
  }
  if (pull->missing.empty() && !barrier) return absl::OkStatus();
  STRATA_RETURN_IF_ERROR(params->GroupKeys(pull->missing, &pull->grouped, &pull->perm));
  pull->w.resize(pull->missing.size());
  pull->e.resize(pull->missing.size() * dim);
  pull->wide = params->StartSparsePull(WideDeep::kWideTable, &pull->grouped, pull->w.data(),
                                       min_version, barrier, &pull->wide_version);
  pull->emb = params->StartSparsePull(WideDeep::kEmbeddingTable, &pull->grouped, pull->e.data(),
                                      min_version, barrier, &pull->emb_version);
  pull->wide->IssueAll();
  pull->emb->IssueAll();
  return absl::OkStatus();
}

absl::Status CtrTrainer::FinishRowPull(RowPull* pull, absl::Duration* comm) {
  if (pull->wide == nullptr) return absl::OkStatus();
  const int dim = wide_deep_->dim();
  const absl::Time t0 = absl::Now();
  absl::Status s = pull->wide->Finish();
  s.Update(pull->emb->Finish());
  pull->wide.reset();
  pull->emb.reset();
  *comm += absl::Now() - t0;
  STRATA_RETURN_IF_ERROR(s);
  for (size_t i = 0; i < pull->missing.size(); ++i) {
    const size_t at = pull->perm[i];
    pull->wide_rows[pull->missing_at[i]] = pull->w[at];
    std::memcpy(pull->emb_rows + static_cast<size_t>(pull->missing_at[i]) * dim,
                pull->e.data() + at * dim, sizeof(float) * dim);
  }
  if (pull->use_cache) {
    row_cache_->Insert(pull->grouped.keys.data(), pull->grouped.keys.size(),
                       {pull->w.data(), pull->e.data()}, pull->step);
  }
  return absl::OkStatus();
}

absl::Status CtrTrainer::PullSparseRows(const std::vector<uint64_t>& keys, uint64_t min_version,
                                        bool barrier, bool use_cache, uint64_t step,
                                        float* wide_rows, float* emb_rows, absl::Duration* comm,
                                        uint64_t* version) {
  RowPull pull;
  STRATA_RETURN_IF_ERROR(
      StartRowPull(keys, min_version, barrier, use_cache, step, wide_rows, emb_rows, &pull));
  absl::Status s = FinishRowPull(&pull, comm);
  if (version != nullptr) *version = std::min(pull.wide_version, pull.emb_version);
  return s;
}

absl::Status CtrTrainer::TaskRecords(const proto::DataTask& task, storage::CtrDataset* ranged,
                                     const storage::CtrDataset** data, int64_t* first,
                                     int64_t* last) {
  const DataSection& d = ctx_->config().data;
  *data = &ctr_train_;
  *first = 0;
  *last = 0;
  if (task.by_bytes()) {
    // The lines starting in the task's bytes, read now (pread, or a ranged
    // GET from an object store).
    if (task.byte_begin() < 0 || task.byte_begin() > task.byte_end()) {
      return absl::InvalidArgumentError(absl::StrCat("data task ", task.id(), ": bad byte range [",
                                                     task.byte_begin(), ", ", task.byte_end(),
                                                     ") of ", d.train));
    }
    storage::CriteoReadStats stats;
    STRATA_ASSIGN_OR_RETURN(
        *ranged, storage::LoadCriteoRange(ctx_->fs(), d.train, task.byte_begin(), task.byte_end(),
                                          CtrReadOptions(d), &stats));
    if (stats.skipped > 0) {
      if (ctr_train_skipped_ == 0) {
        LOG(WARNING) << d.train
                     << ": skipping bad lines (data.bad_lines: skip); first: " << stats.first_error;
      }
      ctr_train_skipped_ += stats.skipped;
    }
    *data = ranged;
    *last = ranged->num_examples;
    return absl::OkStatus();
  }
  // The master counted lines; lines skipped as bad (data.bad_lines: skip)
  // make the last tasks a little shorter, and by no more than that.
  if (ctr_train_.num_examples == 0) {
    storage::CriteoReadStats stats;
    storage::CriteoReadOptions read = CtrReadOptions(d);
    read.limit = d.train_limit;
    STRATA_ASSIGN_OR_RETURN(ctr_train_, storage::LoadCriteoFile(ctx_->fs(), d.train, read, &stats));
    ctr_train_skipped_ = stats.skipped;
  }
  const int64_t n_records = ctr_train_.num_examples;
  if (task.begin() < 0 || task.begin() >= task.end() ||
      task.end() > n_records + ctr_train_skipped_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data task ", task.id(), " [", task.begin(), ", ", task.end(), ") is outside ", d.train,
        ": ", n_records, " records",
        ctr_train_skipped_ > 0 ? absl::StrCat(" and ", ctr_train_skipped_, " bad lines") : "",
        " here (does every host have the same file?)"));
  }
  *first = task.begin();
  *last = std::min<int64_t>(task.end(), n_records);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> CtrTrainer::TrainTask(const proto::DataTask& task,
                                              std::vector<std::unique_ptr<Optimizer>>* local) {
  if (local != nullptr) {
    // (Worker::Create refuses a local wide_deep worker before this.)
    return absl::UnimplementedError("a wide_deep model trains against its pservers only");
  }
  ctx_->SetEpoch(task.epoch());
  storage::CtrDataset ranged;
  const storage::CtrDataset* data = nullptr;
  int64_t first = 0, last = 0;
  STRATA_RETURN_IF_ERROR(TaskRecords(task, &ranged, &data, &first, &last));
  const int64_t records = std::max<int64_t>(0, last - first);
  if (first >= last) return records;
  const std::vector<int64_t> order = ctx_->TaskRecordOrder(task, first, last);
  const int batch_size = ctx_->batch_size();
  Batch batch;
  for (size_t b = 0; b < order.size(); b += batch_size) {
    if (ctx_->stopping()) return absl::CancelledError("worker shut down");
    const int n = static_cast<int>(std::min<size_t>(batch_size, order.size() - b));
    batch.n = n;
    batch.dense.resize(static_cast<size_t>(n) * kCtrDenseFeatures);
    batch.labels.resize(n);
    batch.keys.resize(static_cast<size_t>(n) * kCtrFields);
    for (int i = 0; i < n; ++i) {
      const int64_t r = order[b + i];
      std::copy_n(data->dense.data() + r * kCtrDenseFeatures, kCtrDenseFeatures,
                  batch.dense.data() + static_cast<size_t>(i) * kCtrDenseFeatures);
      std::copy_n(data->keys.data() + r * kCtrFields, kCtrFields,
                  batch.keys.data() + static_cast<size_t>(i) * kCtrFields);
      batch.labels[i] = data->labels[r];
    }
    DeduplicateKeys(batch.keys.data(), batch.keys.size(), &batch.index, &batch.unique, &batch.slot);
    STRATA_RETURN_IF_ERROR(ctx_->host_aggregator() != nullptr ? AggregatedStep(batch)
                                                              : Step(batch));
  }
  if (HostAggregator* agg = ctx_->host_aggregator(); agg != nullptr) {
    // The task is done once its last step is applied: when the version
    // after it is published.
    STRATA_RETURN_IF_ERROR(agg->AwaitParams(ctx_->next_step(), &wide_deep_->params(),
                                            [this] { return ctx_->stopping(); })
                               .status());
  }
  return records;
}

bool CtrTrainer::AggregatesOnHost(SparseLayout* sparse) const {
  sparse->tables = {WideDeep::kWideTable, WideDeep::kEmbeddingTable};
  sparse->dims = {1, wide_deep_->dim()};
  // A worker's batch may be the whole global batch (elastic.batch:
  // fixed_global with the others done, or by_speed): job.batch_size for
  // every worker of the job. The segment's pages are taken as keys come.
  sparse->max_keys = static_cast<size_t>(std::max(1, ctx_->config().job.batch_size)) *
                     std::max(1, ctx_->params()->WorkersInView()) * kCtrFields;
  return true;
}

absl::Status CtrTrainer::AggregatedStep(Batch& batch) {
  HostAggregator* agg = ctx_->host_aggregator();
  const int dim = wide_deep_->dim();
  const int n = batch.n;
  const std::vector<uint64_t>& unique = batch.unique;
  const absl::Time t0 = absl::Now();
  absl::Duration comm;
  // The batch's rows at this step's version, pulled while the host's
  // dense parameters of the step are awaited (every virtual partition
  // asked, so each has reached the step before the host's sum of it is
  // pushed there).
  const uint64_t want = ctx_->next_step();
  batch.wide_rows.resize(unique.size());
  batch.emb_rows.resize(unique.size() * dim);
  STRATA_RETURN_IF_ERROR(StartRowPull(unique, want, /*barrier=*/true, /*use_cache=*/true,
                                      ctr_steps_, batch.wide_rows.data(), batch.emb_rows.data(),
                                      &batch.pull));
  absl::StatusOr<uint64_t> awaited =
      agg->AwaitParams(want, &wide_deep_->params(), [this] { return ctx_->stopping(); });
  comm += absl::Now() - t0;
  // (Settled even when the wait failed: the pulls land in the batch's
  // buffers, which must not go while they may.)
  absl::Status pulled = FinishRowPull(&batch.pull, &comm);
  STRATA_RETURN_IF_ERROR(awaited.status());
  STRATA_RETURN_IF_ERROR(pulled);
  const uint64_t version = *awaited;
  if (version != want) {
    // The host is further on (this worker joined it midway): the rows of
    // its step, which replace the ones just cached.
    STRATA_RETURN_IF_ERROR(StartRowPull(unique, version, /*barrier=*/true, /*use_cache=*/false,
                                        ctr_steps_, batch.wide_rows.data(), batch.emb_rows.data(),
                                        &batch.pull));
    batch.pull.use_cache = row_cache_ != nullptr;
    STRATA_RETURN_IF_ERROR(FinishRowPull(&batch.pull, &comm));
  }
  absl::Time mark = ctx_->TraceSpan("wait for pull", "wait", t0, "");
  STRATA_ASSIGN_OR_RETURN(
      const double loss,
      wide_deep_->TrainStep(batch.dense.data(), batch.slot.data(), batch.labels.data(), n,
                            batch.wide_rows.data(), batch.emb_rows.data(), unique.size(),
                            &batch.wide_grad, &batch.emb_grad));
  mark = ctx_->TraceSpan("compute", "compute", mark, "");
  const absl::Time tp = absl::Now();
  SparseGrads rows;
  rows.keys = unique.data();
  rows.n = unique.size();
  rows.rows = {batch.wide_grad.data(), batch.emb_grad.data()};
  STRATA_RETURN_IF_ERROR(agg->Post(version, static_cast<uint64_t>(n), wide_deep_->grads(), &rows));
  comm += absl::Now() - tp;
  ctx_->TraceSpan("post", "wait", mark, "");
  ctx_->TraceSpan("step", "step", t0, absl::StrCat("\"step\": ", version, ", \"samples\": ", n));
  ++ctr_steps_;
  ctx_->RecordStep(n, version, loss, wide_deep_->last_correct(), absl::Now() - t0, comm,
                   /*stale=*/false);
  return absl::OkStatus();
}

absl::Status CtrTrainer::Step(Batch& batch) {
  ParamClient* const params = ctx_->params();
  const int dim = wide_deep_->dim();
  const int n = batch.n;
  const std::vector<uint64_t>& unique = batch.unique;
  // bsp and ssp: every partition gets a pull (at this step) and a push.
  const bool stepped = Stepped(ctx_->config().job.consistency);
  const absl::Time t0 = absl::Now();
  absl::Duration comm;
  const uint64_t step = ctx_->next_step();
  // model.dense_sync allreduce: the dense tables are the ring's, here
  // (dense_ring.h); only the sparse rows come from the pservers.
  DenseRing* const ring = ctx_->dense_ring();
  // Pull: the dense tables and the batch's rows, every partition at once.
  uint64_t pulled_version = 0;
  std::unique_ptr<ParamClient::Exchange> dense_pull;
  if (ring == nullptr) {
    dense_pull = params->StartPull(stepped ? step : 0, &wide_deep_->params(), &pulled_version);
    dense_pull->IssueAll();
  }
  batch.wide_rows.resize(unique.size());
  batch.emb_rows.resize(unique.size() * dim);
  uint64_t sparse_version = UINT64_MAX;
  absl::Status pulled = PullSparseRows(unique, stepped ? step : 0, /*barrier=*/stepped,
                                       /*use_cache=*/true, ctr_steps_, batch.wide_rows.data(),
                                       batch.emb_rows.data(), &comm, &sparse_version);
  const absl::Time tw = absl::Now();
  if (dense_pull != nullptr) {
    pulled.Update(dense_pull->Finish());
  } else {
    // (bsp: every virtual partition answered the barrier pull.)
    pulled_version = sparse_version == UINT64_MAX ? step : sparse_version;
  }
  comm += absl::Now() - tw;
  STRATA_RETURN_IF_ERROR(pulled);
  absl::Time mark = ctx_->TraceSpan("wait for pull", "wait", t0, "");
  // bsp: the step the partitions are at, which is ahead of ours when
  // this worker (re)joins a running or resumed job (ssp: the slowest
  // worker's).
  const uint64_t version = stepped ? std::max(step, pulled_version) : pulled_version;

  // The ring's step begins (its first exchange goes) while the model
  // computes; the dense gradients go round once the backward pass is done.
  // An error before the ring's step ends abandons it.
  const bool begun = ring != nullptr && ring->BeginStep(static_cast<uint64_t>(n));
  absl::Cleanup abandon = [&] {
    if (begun) ring->AbandonStep(absl::AbortedError("the CTR step failed before its ring step"));
  };
  STRATA_ASSIGN_OR_RETURN(
      const double loss,
      wide_deep_->TrainStep(batch.dense.data(), batch.slot.data(), batch.labels.data(), n,
                            batch.wide_rows.data(), batch.emb_rows.data(), unique.size(),
                            &batch.wide_grad, &batch.emb_grad));

  // Push: the dense gradients and one summed row per distinct key, in
  // the grouping by partition.
  ParamClient::SparseKeys grouped;
  STRATA_RETURN_IF_ERROR(params->GroupKeys(unique, &grouped, &batch.perm));
  batch.push_wide.resize(unique.size());
  batch.push_emb.resize(unique.size() * dim);
  for (size_t u = 0; u < unique.size(); ++u) {
    batch.push_wide[batch.perm[u]] = batch.wide_grad[u];
    std::memcpy(batch.push_emb.data() + static_cast<size_t>(batch.perm[u]) * dim,
                batch.emb_grad.data() + u * dim, sizeof(float) * dim);
  }
  PushResult pushed_dense, pushed_wide, pushed_emb;
  std::unique_ptr<ParamClient::Exchange> dense_push;
  if (ring == nullptr) {
    dense_push = params->StartPush(&wide_deep_->grads(), version, n, &pushed_dense);
  }
  auto wide_push = params->StartSparsePush(WideDeep::kWideTable, &grouped, batch.push_wide.data(),
                                           version, n, stepped, &pushed_wide);
  auto emb_push = params->StartSparsePush(WideDeep::kEmbeddingTable, &grouped,
                                          batch.push_emb.data(), version, n, stepped, &pushed_emb);
  if (dense_push != nullptr) dense_push->IssueAll();
  wide_push->IssueAll();
  emb_push->IssueAll();
  mark = ctx_->TraceSpan("compute", "compute", mark, "");
  const absl::Time tp = absl::Now();
  // The ring's step once the sparse pushes are out: a member waiting at
  // the next step's barrier pull needs them, not this step.
  std::move(abandon).Cancel();
  absl::Status pushed =
      ring != nullptr ? ring->TrainStep(wide_deep_->grads(), static_cast<uint64_t>(n)).status()
                      : dense_push->Finish();
  pushed.Update(wide_push->Finish());
  pushed.Update(emb_push->Finish());
  comm += absl::Now() - tp;
  STRATA_RETURN_IF_ERROR(pushed);

  ctx_->TraceSpan("wait for push", "wait", mark, "");
  const absl::Time t3 = absl::Now();
  ctx_->TraceSpan("step", "step", t0, absl::StrCat("\"step\": ", version, ", \"samples\": ", n));
  ++ctr_steps_;
  ctx_->RecordStep(
      n, version, loss, wide_deep_->last_correct(), t3 - t0, comm,
      pushed_dense.stale_partitions + pushed_wide.stale_partitions + pushed_emb.stale_partitions >
          0);
  return absl::OkStatus();
}

absl::StatusOr<EvalMetrics> CtrTrainer::Evaluate(std::optional<uint64_t> min_version_or) {
  if (!min_version_or.has_value()) {
    return absl::UnimplementedError("a wide_deep model is evaluated against its pservers");
  }
  // (Allreduce: the dense tables are the ring's, here already.)
  const bool pull_dense = ctx_->config().model.dense_sync != "allreduce";
  const uint64_t min_version = *min_version_or;
  const DataSection& d = ctx_->config().data;
  storage::CriteoReadStats read_stats;
  STRATA_ASSIGN_OR_RETURN(
      storage::CtrDataset test,
      storage::LoadCriteoFile(ctx_->fs(), d.test, CtrReadOptions(d), &read_stats));
  if (read_stats.skipped > 0) {
    LOG(WARNING) << d.test << ": skipped " << read_stats.skipped
                 << " bad line(s); first: " << read_stats.first_error;
  }
  if (pull_dense) {
    STRATA_RETURN_IF_ERROR(ctx_->params()->PullAll(min_version, &wide_deep_->params()).status());
  }
  const int dim = wide_deep_->dim();
  std::vector<float> probs(test.num_examples), wide_rows, emb_rows;
  std::vector<uint64_t> unique;
  std::vector<uint32_t> slot;
  absl::flat_hash_map<uint64_t, uint32_t> index;
  absl::Duration comm;
  const int64_t chunk = 4096;
  for (int64_t b = 0; b < test.num_examples; b += chunk) {
    const int n = static_cast<int>(std::min<int64_t>(chunk, test.num_examples - b));
    DeduplicateKeys(test.keys.data() + b * kCtrFields, static_cast<size_t>(n) * kCtrFields, &index,
                    &unique, &slot);
    wide_rows.resize(unique.size());
    emb_rows.resize(unique.size() * dim);
    STRATA_RETURN_IF_ERROR(PullSparseRows(unique, min_version, /*barrier=*/false,
                                          /*use_cache=*/false, 0, wide_rows.data(), emb_rows.data(),
                                          &comm));
    STRATA_RETURN_IF_ERROR(wide_deep_->Predict(test.dense.data() + b * kCtrDenseFeatures,
                                               slot.data(), n, wide_rows.data(), emb_rows.data(),
                                               probs.data() + b));
  }
  for (int64_t i = 0; i < test.num_examples; ++i) {
    if (!std::isfinite(probs[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("the model diverged: its prediction for test example ", i, " of ", d.test,
                       " is not a number (lower the learning rates)"));
    }
  }
  EvalMetrics m;
  m.examples = test.num_examples;
  m.auc = Auc(probs, test.labels);
  m.loss = LogLoss(probs, test.labels);
  int64_t correct = 0;
  for (int64_t i = 0; i < test.num_examples; ++i)
    correct += (probs[i] > 0.5f) == (test.labels[i] > 0.5f);
  m.accuracy = static_cast<double>(correct) / test.num_examples;
  return m;
}

}  // namespace strata::worker
