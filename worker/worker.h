// The worker daemon's library: registers with the master, heartbeats,
// leases data tasks, trains the model with pull -> compute -> push steps,
// reports progress, and evaluates the final model when asked.
#ifndef STRATA_WORKER_WORKER_H_
#define STRATA_WORKER_WORKER_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/config.h"
#include "common/grpc_channel.h"
#include "common/http_server.h"
#include "common/metrics.h"
#include "common/node_agent.h"
#include "common/optimizer.h"
#include "common/security.h"
#include "common/trace.h"
#include "grpcpp/grpcpp.h"
#include "proto/strata.grpc.pb.h"
#include "storage/criteo_reader.h"
#include "storage/file_system.h"
#include "storage/idx_reader.h"
#include "transport/transport.h"
#include "worker/device.h"
#include "worker/mlp.h"
#include "worker/param_client.h"
#include "worker/row_cache.h"
#include "worker/wide_deep.h"

namespace strata::worker {

// Where the worker's data tasks come from: the master in production, a fixed
// list in tests. Called from the training thread only.
class TaskSource {
 public:
  struct Lease {
    proto::LeaseTaskResponse::Outcome outcome;
    proto::DataTask task;
    uint64_t min_version = 0;
    bool drained = false;  // with DONE: drained (`strata drain`), the job goes on
  };
  virtual ~TaskSource() = default;
  virtual absl::StatusOr<Lease> Next() = 0;
  virtual absl::Status Complete(const proto::DataTask& task, int64_t records,
                                uint64_t last_step) = 0;
};

struct WorkerOptions {
  JobConfig config;
  std::string master_address;      // "host:port"
  int index = 0;                   // instance index
  std::string host = "127.0.0.1";  // advertised / HTTP bind address
  int http_port = 0;               // 0 = any, -1 = off
  transport::TransportOptions transport;
  storage::FileSystem* fs = nullptr;  // borrowed, required
  // Optional: replaces the master as the source of data tasks (tests).
  std::unique_ptr<TaskSource> task_source;
  bool shuffle_within_task = true;
  // Train alone, with no master and no pservers: the optimizer runs in this
  // process (the baseline that measures the cost of distribution). Data is
  // cut into the same tasks and shuffled the same way; the test accuracy is
  // logged at the end.
  bool local_only = false;
  int cpu_threads = 1;  // OpenBLAS threads of the CPU device
  absl::Duration register_timeout = absl::Seconds(60);
  // Chrome trace-event JSON of the training steps goes here (docs/
  // operations.md): per step, and within it per table the forward and
  // backward compute and the waits; every push and pull request on lanes
  // of their own. The first `trace_max_steps` steps (0 = all).
  std::string trace_path;
  int64_t trace_max_steps = 2000;
  // Control-plane credentials (docs/security.md); plain text unless set.
  ControlPlaneSecurity security = ControlPlaneSecurity::Plaintext();
};

// The reader options of a CTR job's data files (data.bad_lines).
storage::CriteoReadOptions CtrReadOptions(const DataSection& d);

// Thread-safe where noted: Run() on one thread; Shutdown() from any.
class Worker {
 public:
  // Loads the training set. Errors name the data file.
  static absl::StatusOr<std::unique_ptr<Worker>> Create(WorkerOptions options);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // HTTP endpoint, registration, heartbeats.
  absl::Status Start();
  // Trains until the master says the job is done (or the task source runs
  // dry). Returns the first unrecoverable error.
  absl::Status Run();
  // Stops Run() at the next step and the background threads.
  void Shutdown();
  // A preemption notice (SIGTERM): asks the master for a checkpoint and a
  // clean stop of the job, waiting at most `grace`; training goes on
  // meanwhile (a bsp cut needs this worker's steps).
  absl::Status RequestCheckpointAndStop(absl::Duration grace);

  uint32_t node_id() const { return node_id_; }
  // Test accuracy measured at the end of a local_only run.
  double local_test_accuracy() const { return local_test_accuracy_; }
  int http_port() const { return http_.port(); }
  // Pulls the current parameters (all tables).
  absl::StatusOr<std::vector<std::vector<float>>> PullParams(uint64_t min_version = 0);

  struct Stats {
    uint64_t steps = 0;
    uint64_t samples = 0;
    uint64_t last_step = 0;
    uint64_t stale_pushes = 0;
    double busy_seconds = 0;
    double comm_seconds = 0;
    double recent_loss = 0;
    double recent_accuracy = 0;  // of the same window's training batches
  };
  Stats stats() const;

 private:
  class MasterTaskSource;
  Worker(WorkerOptions options, std::unique_ptr<Device> device, storage::LabeledDataset train,
         storage::CtrDataset ctr_train, int64_t ctr_skipped = 0);
  // The model's tensors (one per table; a sparse table's are empty).
  std::vector<std::vector<float>>& ModelParams();
  const std::vector<std::vector<float>>& ModelGrads() const;
  // A CTR (wide_deep) training step per batch of the task: pull the dense
  // tables and the batch's sparse rows, compute, push, all partitions in
  // parallel (docs/sparse.md).
  absl::Status TrainCtrTask(const proto::DataTask& task);
  // Counts a finished training step of `n` samples, `correct` of them
  // predicted right (stats, the progress window) and reports progress
  // every job.progress_every_steps.
  void RecordStep(int n, uint64_t version, double loss, int64_t correct, absl::Duration busy,
                  absl::Duration comm, bool stale);
  // A CTR model on the test set: AUC, log-loss and accuracy at 0.5, with
  // the sparse rows pulled at version >= min_version.
  struct CtrMetrics {
    double auc = 0, logloss = 0, accuracy = 0;
    int64_t examples = 0;
  };
  absl::StatusOr<CtrMetrics> CtrTestMetrics(uint64_t min_version);
  // The rows of both sparse tables for distinct `keys` (any order) into
  // wide_rows[i] and emb_rows[i * dim], pulled at version >= min_version;
  // with the row cache (training), fresh cached rows are not pulled and
  // pulled ones are cached as of `step`. Adds the time spent waiting to
  // *comm.
  // With `barrier` (bsp) every virtual partition is asked, with keys or
  // not, so that each has reached min_version before this worker pushes to
  // it (also when every key came from the cache). The cache's clock is
  // this worker's own step count (`step`).
  absl::Status PullSparseRows(const std::vector<uint64_t>& keys, uint64_t min_version, bool barrier,
                              bool use_cache, uint64_t step, float* wide_rows, float* emb_rows,
                              absl::Duration* comm);
  absl::Status RunLoop();
  absl::Status RunLocal();
  // The training step: pull, compute, push (or, local, apply in place).
  absl::Status TrainTask(const proto::DataTask& task, bool local);
  // The records of `task` below `end` in training order (shuffled by the
  // job seed when shuffle_within_task), less its first skip_records.
  std::vector<int64_t> TaskRecordOrder(const proto::DataTask& task, int64_t begin,
                                       int64_t end) const;
  // Settles the last step's push (acks, retries), if any.
  absl::Status SettlePush();
  // SettlePush, then waits for the pull sent ahead, if any, and drops it.
  absl::Status Settle();
  absl::Status WaitForReadyView();
  absl::Status CheckViewMatchesModel(const proto::ClusterView& view) const;
  // This node's data-plane keys (mtls clusters; null in plain text).
  std::shared_ptr<transport::MembershipKeys> membership_;
  // Calls the master, retrying Unavailable/DeadlineExceeded with back-off
  // for up to cluster.request_timeout_ms (NodeAgent::Call).
  absl::Status CallMaster(const std::function<grpc::Status(grpc::ClientContext*)>& call);
  absl::Status Evaluate(uint64_t min_version);
  // Test-set accuracy and mean loss of the model's current parameters.
  absl::StatusOr<std::pair<double, double>> TestAccuracy();
  // Logs a progress line and reports to the master; `error` non-empty
  // reports a fatal input error instead.
  void ReportProgress(bool has_eval, double accuracy, double test_loss,
                      const std::string& error = "", const double* auc = nullptr);
  void HeartbeatLoop();
  absl::StatusOr<proto::ClusterView> FetchView();

  WorkerOptions options_;
  storage::LabeledDataset train_;  // mlp
  storage::CtrDataset ctr_train_;  // wide_deep
  // wide_deep, the whole training file: loaded when it is gzipped or
  // data.train_limit is set; else empty, and each task's byte range is read.
  int64_t ctr_train_skipped_ = 0;  // lines skipped as bad (data.bad_lines: skip)
  int64_t task_records_ = 0;       // training thread: records of the last task trained
  uint64_t ctr_steps_ = 0;         // training thread: this worker's CTR steps (cache clock)
  std::unique_ptr<Device> device_;
  std::unique_ptr<Mlp> model_;             // mlp
  bool activation_memory_logged_ = false;  // training thread
  std::unique_ptr<WideDeep> wide_deep_;    // wide_deep
  std::unique_ptr<RowCache> row_cache_;    // wide_deep with sparse.cache.rows > 0
  std::unique_ptr<transport::Transport> transport_;
  // Membership with the master (register, heartbeats, keys, calls); null
  // until Start registers (and in a --local run).
  std::unique_ptr<NodeAgent> agent_;
  std::unique_ptr<proto::Master::Stub> master() const { return agent_->master(); }
  std::unique_ptr<ParamClient> params_;
  std::unique_ptr<TaskSource> tasks_;
  std::vector<std::unique_ptr<Optimizer>> local_optimizers_;  // local_only
  HttpServer http_;
  MetricsRegistry metrics_;
  std::unique_ptr<TraceWriter> trace_;  // with options_.trace_path
  // Training thread: a trace span from `from` to now on the steps lane,
  // when tracing; returns now.
  absl::Time TraceSpan(const char* name, const char* category, absl::Time from,
                       const std::string& args = "");
  // Set in Start, before training: each step's time split, and the
  // progress window's rate and communication share.
  Histogram* step_compute_seconds_ = nullptr;
  Histogram* step_wait_seconds_ = nullptr;
  Gauge* samples_per_second_ = nullptr;
  Gauge* comm_share_ = nullptr;

  std::atomic<uint32_t> node_id_{0};
  std::atomic<bool> declared_dead_{false};
  // Training thread only: when each pserver was last reported unreachable.
  std::map<uint32_t, absl::Time> suspect_reported_;
  uint64_t next_step_ = 0;  // training thread only
  // bsp: a task leased without the step it starts at (the first one): its
  // first step goes to the master with the next progress report, sent at
  // once. Training thread only.
  bool lease_had_next_step_ = false;
  std::optional<uint64_t> task_start_unknown_;
  std::optional<std::pair<uint64_t, uint64_t>> task_start_;  // (task, first step)
  // The pull of the next step's parameters, sent ahead during the backward
  // pass, and the last step's push, settled during the next step or before
  // its task is reported done (training thread). The pull carries over to
  // the next data task; when the master has no task for us (wait, evaluate,
  // done) it is settled first (Settle), so a later task starts from a fresh
  // pull of the current version rather than from parameters that went
  // stale meanwhile.
  std::unique_ptr<ParamClient::Exchange> pull_;
  std::unique_ptr<ParamClient::Exchange> push_;
  PushResult push_result_;
  uint64_t pulled_version_ = 0;
  int current_epoch_ = 0;    // training thread only
  absl::Time window_start_;  // training thread only: throughput window
  uint64_t window_samples_ = 0;
  double window_loss_ = 0;
  int64_t window_correct_ = 0;
  uint64_t window_steps_ = 0;
  double recent_sps_ = 0;
  std::atomic<uint64_t> row_cache_hits_{0};  // mirrors row_cache_ for /metrics
  std::atomic<uint64_t> row_cache_misses_{0};
  double local_test_accuracy_ = 0;

  mutable absl::Mutex mu_;
  Stats stats_ ABSL_GUARDED_BY(mu_);

  std::atomic<bool> shutdown_{false};
  absl::Notification stop_;
  std::thread heartbeat_;
};

}  // namespace strata::worker

#endif  // STRATA_WORKER_WORKER_H_
