// The CTR family's trainer: a Wide & Deep model over sparse tables on
// Criteo-format data (docs/sparse.md). Each step pulls the dense tables and
// the rows of the batch's distinct keys, all partitions of every table in
// parallel, computes, and pushes the dense gradients and one summed
// gradient row per distinct key.
#ifndef STRATA_WORKER_CTR_TRAINER_H_
#define STRATA_WORKER_CTR_TRAINER_H_

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "storage/criteo_reader.h"
#include "worker/device.h"
#include "worker/row_cache.h"
#include "worker/trainer.h"
#include "worker/wide_deep.h"

namespace strata::worker {

// The reader options of a CTR job's data files (data.bad_lines).
storage::CriteoReadOptions CtrReadOptions(const DataSection& d);

// Owns the model, the training set (when loaded whole) and the row cache.
// Training thread only, but for the row cache's counters, which /metrics
// reads on the HTTP thread.
class CtrTrainer : public Trainer {
 public:
  // Checks the start of the training file named by ctx's config, so that a
  // missing or foreign file fails now; loads it whole when it is gzipped or
  // data.train_limit is set. Errors name the data file. `ctx` and `device`
  // are borrowed: both outlive the trainer (the Worker owns them).
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(TrainerContext* ctx, Device* device);
  CtrTrainer(const CtrTrainer&) = delete;
  CtrTrainer& operator=(const CtrTrainer&) = delete;

  std::string_view family() const override { return "wide_deep"; }
  // Both sparse tables' rows merged per key; a worker's step has at most
  // its batch x kCtrFields distinct keys, its batch at most job.batch_size
  // for each worker of the job.
  bool AggregatesOnHost(SparseLayout* sparse) const override;
  std::string DescribeData() const override;
  int64_t loaded_examples() const override { return ctr_train_.num_examples; }
  std::vector<std::vector<float>>& params() override { return wide_deep_->params(); }
  const std::vector<std::vector<float>>& grads() const override { return wide_deep_->grads(); }
  void AddMetrics(MetricsRegistry* metrics) override;
  // Unimplemented with `local`: the sparse tables live on pservers.
  absl::StatusOr<int64_t> TrainTask(const proto::DataTask& task,
                                    std::vector<std::unique_ptr<Optimizer>>* local) override;
  // AUC, log-loss and accuracy at 0.5, with the sparse rows pulled at
  // version >= min_version; Unimplemented without one.
  absl::StatusOr<EvalMetrics> Evaluate(std::optional<uint64_t> min_version) override;

 private:
  // A pull of a batch's rows in flight (StartRowPull .. FinishRowPull):
  // the keys the row cache did not have, their grouping, the landing
  // buffers and the exchanges.
  struct RowPull {
    std::vector<uint64_t> missing;
    std::vector<uint32_t> missing_at;  // where each missing key is in the batch's keys
    ParamClient::SparseKeys grouped;
    std::vector<uint32_t> perm;
    std::vector<float> w, e;
    bool use_cache = false;
    uint64_t step = 0;
    float* wide_rows = nullptr;
    float* emb_rows = nullptr;
    std::unique_ptr<ParamClient::Exchange> wide, emb;
    // The lowest version the partitions answered (UINT64_MAX: none asked).
    uint64_t wide_version = UINT64_MAX, emb_version = UINT64_MAX;
  };
  // One batch and the buffers of its step, reused from batch to batch.
  struct Batch {
    int n = 0;
    std::vector<float> dense, labels, wide_rows, emb_rows, wide_grad, emb_grad, push_wide, push_emb;
    std::vector<uint64_t> keys, unique;
    std::vector<uint32_t> slot, perm;
    absl::flat_hash_map<uint64_t, uint32_t> index;
    RowPull pull;
  };

  CtrTrainer(TrainerContext* ctx, Device* device, storage::CtrDataset train, int64_t skipped);
  // The records of `task`: *data[*first, *last), read into *ranged when the
  // task is a byte range of the file.
  absl::Status TaskRecords(const proto::DataTask& task, storage::CtrDataset* ranged,
                           const storage::CtrDataset** data, int64_t* first, int64_t* last);
  // The training step of `batch`: pull, compute, push, all partitions in
  // parallel.
  absl::Status Step(Batch& batch);
  // The step with node-local aggregation (host_aggregator.h): the dense
  // parameters come from the host's segment and the batch's rows from the
  // pservers; the dense gradient and the rows' go to the segment, and the
  // host's aggregating worker pushes the host's sum.
  absl::Status AggregatedStep(Batch& batch);
  // The rows of both sparse tables for distinct `keys` (any order) into
  // wide_rows[i] and emb_rows[i * dim], pulled at version >= min_version;
  // with the row cache (training), fresh cached rows are not pulled and
  // pulled ones are cached as of `step`. Adds the time spent waiting to
  // *comm.
  // With `barrier` (bsp) every virtual partition is asked, with keys or
  // not, so that each has reached min_version before this worker pushes to
  // it (also when every key came from the cache). The cache's clock is
  // this worker's own step count (`step`). With `version`, the lowest
  // version the partitions answered goes there (UINT64_MAX: none asked).
  absl::Status PullSparseRows(const std::vector<uint64_t>& keys, uint64_t min_version, bool barrier,
                              bool use_cache, uint64_t step, float* wide_rows, float* emb_rows,
                              absl::Duration* comm, uint64_t* version = nullptr);
  // PullSparseRows in two halves, so that the caller waits for something
  // else meanwhile: Start fills the cached rows and sends the pulls (the
  // rows' buffers and `keys` must stay put until Finish), Finish waits
  // for them, fills the rest and caches them.
  absl::Status StartRowPull(const std::vector<uint64_t>& keys, uint64_t min_version, bool barrier,
                            bool use_cache, uint64_t step, float* wide_rows, float* emb_rows,
                            RowPull* pull);
  absl::Status FinishRowPull(RowPull* pull, absl::Duration* comm);

  TrainerContext* const ctx_;  // the Worker, which owns this trainer
  // The whole training file: loaded when it is gzipped or data.train_limit
  // is set; else empty, and each task's byte range is read.
  storage::CtrDataset ctr_train_;
  int64_t ctr_train_skipped_ = 0;  // lines skipped as bad (data.bad_lines: skip)
  uint64_t ctr_steps_ = 0;         // this worker's CTR steps (the cache's clock)
  std::unique_ptr<WideDeep> wide_deep_;
  std::unique_ptr<RowCache> row_cache_;  // with sparse.cache.rows > 0
  // Mirror row_cache_ for /metrics: read by the HTTP thread while the
  // training thread updates them.
  std::atomic<uint64_t> row_cache_hits_{0};
  std::atomic<uint64_t> row_cache_misses_{0};
};

}  // namespace strata::worker

#endif  // STRATA_WORKER_CTR_TRAINER_H_
