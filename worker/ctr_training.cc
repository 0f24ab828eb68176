// The worker's CTR path: a wide & deep model over sparse tables
// (docs/sparse.md). Each step pulls the dense tables and the rows of the
// batch's distinct keys, all partitions of every table in parallel,
// computes, and pushes the dense gradients and one summed gradient row per
// distinct key.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/eval_metrics.h"
#include "common/model_spec.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "worker/worker.h"

namespace strata::worker {
namespace {}  // namespace

absl::Status Worker::PullSparseRows(const std::vector<uint64_t>& keys, uint64_t min_version,
                                    bool barrier, bool use_cache, uint64_t step, float* wide_rows,
                                    float* emb_rows, absl::Duration* comm) {
  const int dim = wide_deep_->dim();
  std::vector<uint64_t> missing;
  std::vector<uint32_t> missing_at;  // where each missing key is in `keys`
  if (use_cache && row_cache_ != nullptr) {
    std::vector<uint8_t> hit;
    const size_t hits = row_cache_->Lookup(keys, step, {wide_rows, emb_rows}, &hit);
    row_cache_hits_ += hits;
    row_cache_misses_ += keys.size() - hits;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (hit[i]) continue;
      missing.push_back(keys[i]);
      missing_at.push_back(static_cast<uint32_t>(i));
    }
  } else {
    missing = keys;
    missing_at.resize(keys.size());
    std::iota(missing_at.begin(), missing_at.end(), 0u);
  }
  if (missing.empty() && !barrier) return absl::OkStatus();
  ParamClient::SparseKeys grouped;
  std::vector<uint32_t> perm;
  STRATA_RETURN_IF_ERROR(params_->GroupKeys(missing, &grouped, &perm));
  std::vector<float> w(missing.size()), e(missing.size() * dim);
  auto wide =
      params_->StartSparsePull(WideDeep::kWideTable, &grouped, w.data(), min_version, barrier);
  auto emb =
      params_->StartSparsePull(WideDeep::kEmbeddingTable, &grouped, e.data(), min_version, barrier);
  wide->IssueAll();
  emb->IssueAll();
  const absl::Time t0 = absl::Now();
  absl::Status s = wide->Finish();
  s.Update(emb->Finish());
  *comm += absl::Now() - t0;
  STRATA_RETURN_IF_ERROR(s);
  for (size_t i = 0; i < missing.size(); ++i) {
    const size_t at = perm[i];
    wide_rows[missing_at[i]] = w[at];
    std::memcpy(emb_rows + static_cast<size_t>(missing_at[i]) * dim, e.data() + at * dim,
                sizeof(float) * dim);
  }
  if (use_cache && row_cache_ != nullptr) {
    row_cache_->Insert(grouped.keys.data(), grouped.keys.size(), {w.data(), e.data()}, step);
  }
  return absl::OkStatus();
}

absl::Status Worker::TrainCtrTask(const proto::DataTask& task) {
  current_epoch_ = task.epoch();
  const DataSection& d = options_.config.data;
  const storage::CtrDataset* data = &ctr_train_;
  storage::CtrDataset ranged;
  int64_t first = 0, last = 0;
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
        ranged, storage::LoadCriteoRange(options_.fs, d.train, task.byte_begin(), task.byte_end(),
                                         CtrReadOptions(d), &stats));
    if (stats.skipped > 0) {
      if (ctr_train_skipped_ == 0) {
        LOG(WARNING) << d.train
                     << ": skipping bad lines (data.bad_lines: skip); first: " << stats.first_error;
      }
      ctr_train_skipped_ += stats.skipped;
    }
    data = &ranged;
    last = ranged.num_examples;
  } else {
    // The master counted lines; lines skipped as bad (data.bad_lines: skip)
    // make the last tasks a little shorter, and by no more than that.
    if (ctr_train_.num_examples == 0) {
      storage::CriteoReadStats stats;
      storage::CriteoReadOptions read = CtrReadOptions(d);
      read.limit = d.train_limit;
      STRATA_ASSIGN_OR_RETURN(ctr_train_,
                              storage::LoadCriteoFile(options_.fs, d.train, read, &stats));
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
    first = task.begin();
    last = std::min<int64_t>(task.end(), n_records);
  }
  task_records_ = std::max<int64_t>(0, last - first);
  if (first >= last) return absl::OkStatus();
  const std::vector<int64_t> order = TaskRecordOrder(task, first, last);
  const int dim = wide_deep_->dim();
  const int batch_size = options_.config.job.batch_size;
  const bool bsp = options_.config.job.consistency == Consistency::kBsp;
  std::vector<float> dense, labels, wide_rows, emb_rows, wide_grad, emb_grad, push_wide, push_emb;
  std::vector<uint64_t> keys, unique;
  std::vector<uint32_t> slot, perm;
  absl::flat_hash_map<uint64_t, uint32_t> index;
  for (size_t b = 0; b < order.size(); b += batch_size) {
    if (stop_.HasBeenNotified()) return absl::CancelledError("worker shut down");
    const int n = static_cast<int>(std::min<size_t>(batch_size, order.size() - b));
    dense.resize(static_cast<size_t>(n) * kCtrDenseFeatures);
    labels.resize(n);
    keys.resize(static_cast<size_t>(n) * kCtrFields);
    for (int i = 0; i < n; ++i) {
      const int64_t r = order[b + i];
      std::copy_n(data->dense.data() + r * kCtrDenseFeatures, kCtrDenseFeatures,
                  dense.data() + static_cast<size_t>(i) * kCtrDenseFeatures);
      std::copy_n(data->keys.data() + r * kCtrFields, kCtrFields,
                  keys.data() + static_cast<size_t>(i) * kCtrFields);
      labels[i] = data->labels[r];
    }
    DeduplicateKeys(keys.data(), keys.size(), &index, &unique, &slot);

    const absl::Time t0 = absl::Now();
    absl::Duration comm;
    const uint64_t step = next_step_;
    // Pull: the dense tables and the batch's rows, every partition at once.
    uint64_t pulled_version = 0;
    auto dense_pull = params_->StartPull(bsp ? step : 0, &wide_deep_->params(), &pulled_version);
    dense_pull->IssueAll();
    wide_rows.resize(unique.size());
    emb_rows.resize(unique.size() * dim);
    absl::Status pulled =
        PullSparseRows(unique, bsp ? step : 0, /*barrier=*/bsp, /*use_cache=*/true, ctr_steps_,
                       wide_rows.data(), emb_rows.data(), &comm);
    const absl::Time tw = absl::Now();
    pulled.Update(dense_pull->Finish());
    comm += absl::Now() - tw;
    STRATA_RETURN_IF_ERROR(pulled);
    absl::Time mark = TraceSpan("wait for pull", "wait", t0);
    // bsp: the step the partitions are at, which is ahead of ours when
    // this worker (re)joins a running or resumed job.
    const uint64_t version = bsp ? std::max(step, pulled_version) : pulled_version;

    STRATA_ASSIGN_OR_RETURN(
        const double loss,
        wide_deep_->TrainStep(dense.data(), slot.data(), labels.data(), n, wide_rows.data(),
                              emb_rows.data(), unique.size(), &wide_grad, &emb_grad));

    // Push: the dense gradients and one summed row per distinct key, in
    // the grouping by partition.
    ParamClient::SparseKeys grouped;
    STRATA_RETURN_IF_ERROR(params_->GroupKeys(unique, &grouped, &perm));
    push_wide.resize(unique.size());
    push_emb.resize(unique.size() * dim);
    for (size_t u = 0; u < unique.size(); ++u) {
      push_wide[perm[u]] = wide_grad[u];
      std::memcpy(push_emb.data() + static_cast<size_t>(perm[u]) * dim, emb_grad.data() + u * dim,
                  sizeof(float) * dim);
    }
    PushResult pushed_dense, pushed_wide, pushed_emb;
    auto dense_push = params_->StartPush(&wide_deep_->grads(), version, n, &pushed_dense);
    auto wide_push = params_->StartSparsePush(WideDeep::kWideTable, &grouped, push_wide.data(),
                                              version, n, bsp, &pushed_wide);
    auto emb_push = params_->StartSparsePush(WideDeep::kEmbeddingTable, &grouped, push_emb.data(),
                                             version, n, bsp, &pushed_emb);
    dense_push->IssueAll();
    wide_push->IssueAll();
    emb_push->IssueAll();
    mark = TraceSpan("compute", "compute", mark);
    const absl::Time tp = absl::Now();
    absl::Status pushed = dense_push->Finish();
    pushed.Update(wide_push->Finish());
    pushed.Update(emb_push->Finish());
    comm += absl::Now() - tp;
    STRATA_RETURN_IF_ERROR(pushed);

    TraceSpan("wait for push", "wait", mark);
    const absl::Time t3 = absl::Now();
    TraceSpan("step", "step", t0, absl::StrCat("\"step\": ", version, ", \"samples\": ", n));
    next_step_ = version + 1;
    ++ctr_steps_;
    RecordStep(
        n, version, loss, wide_deep_->last_correct(), t3 - t0, comm,
        pushed_dense.stale_partitions + pushed_wide.stale_partitions + pushed_emb.stale_partitions >
            0);
  }
  return absl::OkStatus();
}

absl::StatusOr<Worker::CtrMetrics> Worker::CtrTestMetrics(uint64_t min_version) {
  const DataSection& d = options_.config.data;
  storage::CriteoReadStats read_stats;
  STRATA_ASSIGN_OR_RETURN(
      storage::CtrDataset test,
      storage::LoadCriteoFile(options_.fs, d.test, CtrReadOptions(d), &read_stats));
  if (read_stats.skipped > 0) {
    LOG(WARNING) << d.test << ": skipped " << read_stats.skipped
                 << " bad line(s); first: " << read_stats.first_error;
  }
  STRATA_RETURN_IF_ERROR(params_->PullAll(min_version, &wide_deep_->params()).status());
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
  CtrMetrics m;
  m.examples = test.num_examples;
  m.auc = Auc(probs, test.labels);
  m.logloss = LogLoss(probs, test.labels);
  int64_t correct = 0;
  for (int64_t i = 0; i < test.num_examples; ++i)
    correct += (probs[i] > 0.5f) == (test.labels[i] > 0.5f);
  m.accuracy = static_cast<double>(correct) / test.num_examples;
  return m;
}

}  // namespace strata::worker
