// The worker daemon's library: registers with the master, heartbeats,
// leases data tasks, has its model family's Trainer (trainer.h) train them
// with pull -> compute -> push steps, reports progress, and evaluates the
// final model when asked.
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
#include "storage/file_system.h"
#include "transport/transport.h"
#include "worker/dense_ring.h"
#include "worker/dense_sync.h"
#include "worker/device.h"
#include "worker/host_aggregator.h"
#include "worker/param_client.h"
#include "worker/script_trainer.h"
#include "worker/trainer.h"

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
    int batch_size = 0;    // with TASK: the records of each step (0: job.batch_size)
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
  // The model's steps run in a training script (the Python package,
  // docs/python.md): the trainer is a ScriptTrainer, whose script side
  // script_trainer() gives.
  bool script = false;
};

// Thread-safe where noted: Run() on one thread; Shutdown() from any. The
// model family is a Trainer chosen in Create by model.type; the Worker is
// its TrainerContext (privately: only the trainer sees it so).
class Worker : private TrainerContext {
 public:
  // Chooses the trainer by model.type and loads the training set. Errors
  // name the data file.
  static absl::StatusOr<std::unique_ptr<Worker>> Create(WorkerOptions options);
  ~Worker() override;
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

  uint32_t node_id() const override { return node_id_; }
  // Test accuracy measured at the end of a local_only run.
  double local_test_accuracy() const { return local_test_accuracy_; }
  int http_port() const { return http_.port(); }
  // model.type of the trainer chosen: "mlp", "wide_deep"; "script".
  std::string_view model_family() const { return trainer_->family(); }
  // With WorkerOptions.script: the trainer, for the script's side of it.
  ScriptTrainer* script_trainer() const { return script_; }
  // A training script's tables, when the config has no model.tables
  // (docs/python.md). DeclareTables gives the script trainer tensors for
  // them and declares them to the master: FailedPrecondition naming the
  // table when they differ from the job's (another worker's). Once the
  // script has put its model's values into the trainer's params(),
  // ShareInitialValues writes them as the tables' initial values if this
  // worker is the one to (the first to declare, or the next when that one
  // left before it was done), and returns once the job's tables hold the
  // initial values (the first worker's).
  absl::Status DeclareTables(std::vector<TableSpec> tables);
  // Gives up at `deadline` (DeadlineExceeded: call again), so that the
  // caller can attend to signals meanwhile.
  absl::Status ShareInitialValues(absl::Time deadline = absl::InfiniteFuture());
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
  Worker(WorkerOptions options, std::unique_ptr<Device> device);

  // TrainerContext, for trainer_ (trainer.h says what each does).
  const JobConfig& config() const override { return options_.config; }
  storage::FileSystem* fs() const override { return options_.fs; }
  ParamClient* params() override { return params_.get(); }
  // (Or the host's aggregating thread ended with an error, which Run
  // returns: the training thread's waits end at once.)
  bool stopping() const override {
    return stop_.HasBeenNotified() || (aggregator_ != nullptr && aggregator_->failed());
  }
  std::vector<int64_t> TaskRecordOrder(const proto::DataTask& task, int64_t begin,
                                       int64_t end) const override;
  void SetEpoch(int epoch) override { current_epoch_ = epoch; }
  uint64_t next_step() const override { return next_step_; }
  int batch_size() const override {
    const int b = task_batch_.load(std::memory_order_relaxed);
    return b > 0 ? b : options_.config.job.batch_size;
  }
  void RecordStep(int n, uint64_t version, double loss, int64_t correct, absl::Duration busy,
                  absl::Duration comm, bool stale) override;
  StepExchanges& exchanges() override { return exchanges_; }
  // Settles the last step's push (acks, retries), if any.
  absl::Status SettlePush() override;
  HostAggregator* host_aggregator() override { return aggregator_.get(); }
  // (Hierarchical: the steps go through the host's aggregation, whose
  // aggregating worker steps the ring.)
  DenseRing* dense_ring() override { return hierarchical() ? nullptr : dense_ring_.get(); }
  transport::Transport* data_plane() override { return transport_.get(); }
  void SetPipelineStage(std::shared_ptr<PipelineStage> stage) override;
  bool tracing() const override { return trace_ != nullptr; }
  absl::Time TraceSpan(const char* name, const char* category, absl::Time from,
                       const std::string& args) override;

  // Registers the model's tensors with the transport (rdma: pulls land in
  // the parameters, pushes are sent from the gradients); logs when they
  // cannot be, and pushes and pulls are copied instead.
  void RegisterModelMemory();
  absl::Status RunLoop();
  absl::Status RunLocal();
  // model.dense_sync allreduce: the tables' initial values here (the
  // first ring takes its first member's), and this worker's DenseSync and
  // DenseRing once it is a node (Start).
  absl::Status InitLocalTables();
  // Told to evaluate (flat dense allreduce): true when this worker's ring
  // holds the trained model (joined, at the job's last step `min_version`
  // - 1 or past it); false when it cannot (logged, cannot_evaluate_ set:
  // its next request for work says so); an error otherwise.
  absl::StatusOr<bool> RingHoldsTrainedModel(uint64_t min_version);
  // DenseSync::Options::checkpoint_state: the lost optimizer state of a
  // flat space of `total` floats from the newest checkpoint, the last one
  // read kept.
  std::function<absl::StatusOr<DenseSync::CheckpointState>()> LostStateReader(size_t total);
  // The worker's own data-plane listener, for the other workers: the
  // ring's chunks (allreduce) and the previous pipeline stage's
  // micro-batches. Before registering: its address goes along.
  absl::Status ListenForPeers();
  // `restore`: the allreduce tables of the checkpoint the job resumed
  // from (RegisterResponse.ring_restore; empty when none).
  absl::Status StartDenseSync(const proto::RingRestore& restore);
  // The ring's part of checkpoint ask.seq (DenseRing::Hooks): this
  // member's shard (moved from `snap`) written on ring_writer_, off the
  // training thread, or the ring past the cut (`snap` null); answered in
  // the heartbeats once done.
  void WriteRingShard(const DenseSync::CheckpointAsk& ask, DenseSync::Snapshot* snap,
                      const absl::Status& error);
  // The report of a shard's write (or of none: `snap` null).
  proto::RingCheckpointReport RingShardReport(const DenseSync::CheckpointAsk& ask,
                                              const DenseSync::Snapshot* snap,
                                              const absl::Status& error);
  void AddRingReport(proto::RingCheckpointReport r) ABSL_LOCKS_EXCLUDED(ring_ckpt_mu_);
  // Waits for the shard write in flight, if any; `close`: later shards
  // are written in place, on the caller's thread (shutting down).
  void AwaitRingWriter(bool close) ABSL_LOCKS_EXCLUDED(ring_writer_mu_);
  // SettlePush, then waits for the pull sent ahead, if any, and drops it.
  absl::Status Settle();
  absl::Status WaitForReadyView();
  // With a view that aggregates by host: maps the host's segment and
  // starts this worker's part of the aggregation (once).
  absl::Status StartHostAggregation();
  absl::Status CheckViewMatchesModel(const proto::ClusterView& view) const;
  // This node's data-plane keys (mtls clusters; null in plain text).
  std::shared_ptr<transport::MembershipKeys> membership_;
  // Calls the master, retrying Unavailable/DeadlineExceeded with back-off
  // for up to cluster.request_timeout_ms (NodeAgent::Call).
  absl::Status CallMaster(const std::function<grpc::Status(grpc::ClientContext*)>& call);
  // The trainer's test-set figures, logged and reported to the master.
  absl::Status Evaluate(uint64_t min_version);
  // Logs a progress line and reports to the master; `error` non-empty
  // reports a fatal input error instead.
  void ReportProgress(bool has_eval, double accuracy, double test_loss,
                      const std::string& error = "", const double* auc = nullptr);
  void HeartbeatLoop();
  absl::StatusOr<proto::ClusterView> FetchView();
  // The master's DeclareTables with `tables`.
  absl::StatusOr<proto::DeclareTablesResponse> CallDeclareTables(
      const std::vector<TableSpec>& tables, bool initialised);

  WorkerOptions options_;
  std::unique_ptr<Device> device_;
  // Pipeline stages: the stage the listener hands kStage requests to, and
  // those that came while there was none (handed to the next one set).
  // Declared before trainer_, whose pipeline sets it until it goes.
  absl::Mutex stage_mu_;
  std::shared_ptr<PipelineStage> stage_ ABSL_GUARDED_BY(stage_mu_);
  std::vector<std::pair<transport::Message, std::shared_ptr<transport::Responder>>> stage_pending_
      ABSL_GUARDED_BY(stage_mu_);
  // The model family: its model and data. Set once in Create; borrows
  // device_ and this worker (as its TrainerContext).
  std::unique_ptr<Trainer> trainer_;
  ScriptTrainer* script_ = nullptr;  // trainer_, with options_.script
  std::unique_ptr<transport::Transport> transport_;
  // Membership with the master (register, heartbeats, keys, calls); null
  // until Start registers (and in a --local run).
  std::unique_ptr<NodeAgent> agent_;
  std::unique_ptr<proto::Master::Stub> master() const { return agent_->master(); }
  std::unique_ptr<ParamClient> params_;
  // Node-local aggregation, when the view asks for it; stopped in Shutdown
  // (it pushes through params_).
  std::unique_ptr<HostAggregator> aggregator_;
  std::unique_ptr<TaskSource> tasks_;
  // model.dense_sync allreduce (null otherwise). The transport's listener
  // hands them kCollective requests through dense_sync_handler_ (set once
  // the DenseSync exists; the listener stops in Shutdown, before these go).
  std::unique_ptr<DenseSync> dense_sync_;
  std::unique_ptr<DenseRing> dense_ring_;
  bool ring_aborted_ = false;            // the heartbeat thread's: the job is over
  std::atomic<bool> evaluating_{false};  // it evaluates (allreduce): ReportProgress says so
  // Hierarchical allreduce (with cluster.aggregation node): the tables the
  // ring writes into, the host aggregator's thread's (the host's workers
  // read its parameters from the segment), and an idle step's gradients.
  std::vector<std::vector<float>> ring_tables_;
  std::vector<std::vector<float>> idle_zeros_;
  bool hierarchical() const {
    return options_.config.model.dense_sync == "allreduce" &&
           options_.config.cluster.aggregation == "node";
  }
  std::atomic<DenseSync*> dense_sync_handler_{nullptr};
  // Ring checkpoints: the newest the master asked for (the heartbeat
  // thread's), this worker's answers until the master asks no more, and
  // the ring's updates (the training thread's, read by the heartbeats).
  absl::Mutex ring_ckpt_mu_;
  proto::RingCheckpointRequest ring_ask_ ABSL_GUARDED_BY(ring_ckpt_mu_);
  std::vector<proto::RingCheckpointReport> ring_reports_ ABSL_GUARDED_BY(ring_ckpt_mu_);
  std::atomic<uint64_t> ring_updates_{0};
  // The thread writing this member's ring shard: one write at a time (the
  // next waits for it), joined at Shutdown.
  absl::Mutex ring_writer_mu_;
  std::thread ring_writer_ ABSL_GUARDED_BY(ring_writer_mu_);
  bool ring_writer_closed_ ABSL_GUARDED_BY(ring_writer_mu_) = false;
  std::vector<std::unique_ptr<Optimizer>> local_optimizers_;  // local_only
  HttpServer http_;
  MetricsRegistry metrics_;
  std::unique_ptr<TraceWriter> trace_;  // with options_.trace_path
  // Set in Start, before training: each step's time split, and the
  // progress window's rate and communication share.
  Histogram* step_compute_seconds_ = nullptr;
  Histogram* step_wait_seconds_ = nullptr;
  Gauge* samples_per_second_ = nullptr;
  Gauge* comm_share_ = nullptr;

  std::atomic<uint32_t> node_id_{0};
  std::atomic<bool> declared_dead_{false};
  // When each pserver was last reported unreachable (by the training
  // thread, or the host aggregator's).
  absl::Mutex suspect_mu_;
  std::map<uint32_t, absl::Time> suspect_reported_ ABSL_GUARDED_BY(suspect_mu_);
  // The training thread's, or a thread's it lends a task to while it waits
  // (ScriptTrainer: the script's).
  uint64_t next_step_ = 0;
  // The batch of the data task being trained (Lease::batch_size); read by
  // a training script's thread too.
  std::atomic<int> task_batch_{0};
  // bsp: a task leased without the step it starts at (the first one): its
  // first step goes to the master with the next progress report, sent at
  // once. Training thread only.
  bool lease_had_next_step_ = false;
  // Told to evaluate, this worker found it holds no dense allreduce ring's
  // parameters (LeaseTaskRequest.cannot_evaluate). Training thread only.
  bool cannot_evaluate_ = false;
  // The newest view the heartbeat thread checked the ring against
  // (DenseSync::AbortIfLeft). Heartbeat thread only.
  uint64_t ring_view_checked_ = 0;
  std::optional<uint64_t> task_start_unknown_;
  std::optional<std::pair<uint64_t, uint64_t>> task_start_;  // (task, first step)
  // The exchanges a pipelined step leaves in flight (trainer.h), settled
  // between tasks (Settle). Declared after params_ and transport_, so that
  // they go before them. Training thread only.
  StepExchanges exchanges_;
  int current_epoch_ = 0;    // training thread only
  absl::Time window_start_;  // training thread only: throughput window
  uint64_t window_samples_ = 0;
  double window_loss_ = 0;
  int64_t window_correct_ = 0;
  uint64_t window_steps_ = 0;
  double recent_sps_ = 0;
  double local_test_accuracy_ = 0;

  mutable absl::Mutex mu_;
  Stats stats_ ABSL_GUARDED_BY(mu_);

  std::atomic<bool> shutdown_{false};
  absl::Notification stop_;
  std::thread heartbeat_;
};

}  // namespace strata::worker

#endif  // STRATA_WORKER_WORKER_H_
