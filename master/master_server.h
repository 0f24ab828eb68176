// The master: membership and failure detection, the cluster view, partition
// placement, data-task leasing, job progress, and the summary at the end.
#ifndef STRATA_MASTER_MASTER_SERVER_H_
#define STRATA_MASTER_MASTER_SERVER_H_

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/failpoint.h"
#include "common/http_server.h"
#include "common/metrics.h"
#include "common/security.h"
#include "grpcpp/grpcpp.h"
#include "master/batch_split.h"
#include "master/checkpoint_coordinator.h"
#include "master/event_sink.h"
#include "master/job_tracker.h"
#include "master/master_parts.h"
#include "master/node_manager.h"
#include "master/scaler.h"
#include "master/state_log.h"
#include "master/task_scheduler.h"
#include "proto/strata.grpc.pb.h"
#include "storage/audit_log.h"
#include "storage/file_system.h"

namespace strata::master {

struct MasterOptions {
  JobConfig config;
  int expected_pservers = 1;
  int expected_workers = 1;
  std::string host = "127.0.0.1";  // bind and advertise address
  int port = 0;                    // gRPC; 0 picks a free port
  int http_port = 0;               // 0 picks a free port; -1 disables HTTP
  std::string summary_path;        // summary.json written at the end; "" = none
  // Cluster events (joins, deaths, failovers, recoveries, checkpoints, job
  // states) appended here as JSON lines; "" = none (docs/operations.md).
  std::string event_log;
  // The audit log (docs/security.md): hash-chained JSON lines, each synced
  // to disk; "" = none. A log that does not verify keeps the master from
  // starting.
  std::string audit_log;
  Clock* clock = nullptr;             // borrowed; nullptr = RealClock()
  storage::FileSystem* fs = nullptr;  // borrowed, required; outlives the server
  // Resume the job from a checkpoint: "latest" (the newest good one under
  // checkpoint.dir; a fresh start when there is none) or a checkpoint
  // directory. "" = a fresh start.
  std::string resume;
  // Crash points for tests (common/failpoint.h); borrowed, may be null.
  const Failpoints* failpoints = nullptr;
  // The state directory (docs/reliability.md): every state change is logged
  // there, and a master started on a directory that holds a state carries
  // on from it (resume is then ignored). "" = nothing kept. The caller
  // makes sure only one master uses it (master_main.cc locks it).
  std::string state_dir;
  // Instead of state_dir: a store the caller opened (the state in etcd of
  // a leading master, master/etcd_state.h) and what it replayed; the
  // master writes its state there and carries on from that state.
  std::shared_ptr<StateStore> state_store;
  std::optional<proto::MasterState> state_replayed;
  bool keeps_state() const { return !state_dir.empty() || state_store != nullptr; }
  // Control-plane credentials and policy (docs/security.md); plain text
  // unless set.
  ControlPlaneSecurity security = ControlPlaneSecurity::Plaintext();
  // Scaling (`strata scale`): the host file's instances, started and
  // room (HostFile::Slots; none: the job cannot grow), and the launcher's
  // provider command, used when the config's elastic.provider is empty.
  std::vector<HostSlot> slots;
  std::vector<std::string> provider;
};

// The gRPC facade over the master's components (node manager, job tracker,
// checkpoint coordinator, task scheduler, event sink; docs/architecture.md).
// Thread-safe: mu_ orders the calls that change more than one component and
// guards the data tasks; each component has its own lock, taken after mu_.
// RPC handlers hold mu_ only briefly and never across outgoing RPCs.
class MasterServer : private CheckpointCoordinator::Master {
 public:
  // Validates options and reads the training-set size from the labels
  // file. With options.resume, finds and checks the checkpoint to resume
  // from: errors name the checkpoint file and what is wrong with it.
  static absl::StatusOr<std::unique_ptr<MasterServer>> Create(MasterOptions options);
  ~MasterServer() override;
  MasterServer(const MasterServer&) = delete;
  MasterServer& operator=(const MasterServer&) = delete;

  // Starts the gRPC server, the HTTP server and the background thread.
  absl::Status Start();
  // Stops serving and joins threads. Idempotent.
  void Shutdown();

  std::string address() const;  // "host:port" of the gRPC server

  // A leader that cannot renew its lease in etcd (docs/reliability.md,
  // "Master high availability") stops acting: every call is answered as a
  // standby's (REASON_NOT_LEADER), nothing is detected, placed, pushed or
  // checkpointed, until Resume. Resume gives every node the dead timeout
  // anew (its heartbeats went unheard meanwhile).
  void Pause();
  void Resume();
  bool paused() const { return paused_.load(); }
  int http_port() const;

  // Blocks until the job has succeeded or failed, or `timeout` passed;
  // true when it ended.
  bool WaitForJobEnd(absl::Duration timeout) { return job_.AwaitEnd(timeout); }
  proto::GetStatusResponse GetStatus();
  // Runs one pass of failure detection and placement now.
  void TickForTesting() { Tick(); }

  // RPC bodies (called by the gRPC service).
  // `who`: the caller, as its certificate names it (a default Identity:
  // plain text). A certificate's role must be the one registered, and its
  // name "role@host" the host it registers; a live instance of the same
  // role and index is replaced only by the same identity.
  absl::StatusOr<proto::RegisterResponse> Register(const proto::RegisterRequest& req,
                                                   const std::string& peer,
                                                   const Identity& who = Identity());
  // OK unless node `node_id` was registered by an identity other than `who`
  // (PermissionDenied): a node speaks only for itself.
  absl::Status CheckNodeCaller(uint32_t node_id, const Identity& who) {
    return nodes_.CheckCaller(node_id, who);
  }
  absl::StatusOr<proto::HeartbeatResponse> Heartbeat(const proto::HeartbeatRequest& req);
  proto::ClusterView View() { return nodes_.View(); }
  absl::StatusOr<proto::LeaseTaskResponse> LeaseTask(const proto::LeaseTaskRequest& req);
  absl::Status CompleteTask(const proto::CompleteTaskRequest& req);
  absl::Status ReportProgress(const proto::ReportProgressRequest& req);
  // Takes a checkpoint now (docs/checkpoint-format.md) and answers when it
  // is complete: every pserver's files synced, then the manifest. With
  // `stop_after`, the job then stops (state "stopped"). FailedPrecondition
  // when checkpoints are off or the job is not running; the failure of any
  // pserver or of the disk otherwise (the previous checkpoint stays the
  // latest).
  absl::StatusOr<proto::CheckpointResponse> Checkpoint(const std::string& reason, bool stop_after) {
    return checkpoints_->Checkpoint(reason, stop_after);
  }
  // A preemption notice (SIGTERM on the master): a checkpoint, then the job
  // stopped cleanly, within `grace`. False when the checkpoint has not
  // completed by then (it goes on; the previous checkpoint stays the
  // latest until a manifest is written). A failed checkpoint is logged and
  // counts as done.
  bool CheckpointAndStopWithin(absl::Duration grace) {
    return checkpoints_->CheckpointAndStopWithin(grace);
  }
  // Stops the job: after a checkpoint when checkpoints are on (unless
  // `no_checkpoint`); FailedPrecondition when it has already ended.
  absl::StatusOr<proto::StopResponse> Stop(const std::string& reason, bool no_checkpoint);
  // Takes node req.node_id() out of the running job (`strata drain`): a
  // worker leaves once its current data task is done; a pserver's
  // partitions go to their backups at once and it leaves. Refused
  // (FailedPrecondition, saying why) for the master, a dead node, after the
  // job ended, for the last worker, the evaluator while it evaluates, and a
  // pserver whose partitions have no backup in sync (cluster.replication 0,
  // or replicas still catching up).
  absl::StatusOr<proto::DrainResponse> Drain(const proto::DrainRequest& req);
  // A node cannot reach pserver req.suspect (docs/reliability.md): the
  // suspect is probed at once and declared dead when the probe fails, or
  // when such reports go on for longer than dead_timeout_ms.
  absl::StatusOr<proto::ReportSuspectResponse> ReportSuspect(
      const proto::ReportSuspectRequest& req) {
    return nodes_.ReportSuspect(req);
  }
  // A training script's tables (NodeManager::DeclareTables), durable
  // before the answer when they changed the view.
  // (In master_service.cc.)
  absl::StatusOr<proto::DeclareTablesResponse> DeclareTables(const proto::DeclareTablesRequest& req)
      ABSL_LOCKS_EXCLUDED(mu_);
  // `strata scale` (master/scaler.h; docs/operations.md, "Scaling"): the
  // workers drained or the provider started for those added, durable
  // before the answer. Refused (FailedPrecondition, saying why) as
  // Scaler::Prepare says. (In master_scale.cc.)
  absl::StatusOr<proto::ScaleResponse> Scale(const proto::ScaleRequest& req)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // The gRPC service (master/master_service.cc).
  class Service;
  std::unique_ptr<grpc::Service> NewService();

  void BackgroundLoop();
  void Tick();
  void MaybePlacePartitions();
  // Recovery (docs/reliability.md): what a node's departure means beyond
  // the membership: a worker's data tasks go back to the queue; a pserver's
  // lost partitions wait for RecoverLostPartitions (the last checkpoint),
  // or the job fails when there is none.
  void DepartedLocked(const NodeManager::Departure& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecoverLostPartitions() ABSL_LOCKS_EXCLUDED(mu_);
  // The state log (docs/reliability.md). PersistLocked queues a record of
  // what changed since the last record queued (the whole state for the
  // first one), when something did, and returns the ticket of the newest
  // record queued (0: no state directory); the state the caller saw is
  // durable once that record is. AwaitPersisted(ticket), called without
  // mu_, returns once it is synced: it writes and syncs all the records
  // queued itself unless another caller already did (group commit). When
  // the disk refuses, it is UNAVAILABLE with REASON_NOT_PERSISTED: nothing
  // may be acknowledged, and the caller retries (its retry queues a record
  // again, and the state log then writes the whole state). No disk write
  // is ever done under mu_.
  uint64_t PersistLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status AwaitPersisted(uint64_t ticket) ABSL_LOCKS_EXCLUDED(mu_) {
    return recorder_->AwaitDurable(ticket);
  }
  // Runs `body(&ticket)` (which sets ticket to its PersistLocked's) and
  // returns what it returned once that record is durable; the disk's
  // refusal instead when it is not.
  template <typename Body>
  auto Durably(Body body) ABSL_LOCKS_EXCLUDED(mu_) {
    uint64_t ticket = 0;
    auto r = body(&ticket);
    if (absl::Status s = AwaitPersisted(ticket); !s.ok()) return decltype(r)(s);
    return r;
  }
  // The records of each step of a task leased to worker `node` now
  // (elastic.batch: the job's global batch split over the workers that
  // train, or job.batch_size; job.batch_split: evenly or by their
  // measured speeds). (In master_tasks.cc, with LeaseTask.)
  int TaskBatchLocked(uint32_t node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Scale's body, for a request or the autoscaler (`why`: the event's
  // reason); and the tick's part: the scale in progress followed, the
  // autoscaler asked and its decision carried out. (In master_scale.cc.)
  absl::StatusOr<proto::ScaleResponse> ScaleLocked(const proto::ScaleRequest& req,
                                                   const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ScaleTickLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pipeline stages (model.stages > 1): true when `node` is the first
  // stage of a group in the view now (the one to lease its data tasks);
  // always true without stages.
  bool PipelineLeader(uint32_t node) const;
  // The body of LeaseTask (Durably's).
  absl::StatusOr<proto::LeaseTaskResponse> LeaseTaskUnpersisted(const proto::LeaseTaskRequest& req,
                                                                uint64_t* ticket)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A restarted master takes up `state` (replayed from its state directory).
  void RestoreLocked(const proto::MasterState& state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateJobStateLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishJobLocked(proto::JobState state, const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The status and the summary (master/master_parts.h).
  proto::JobStatus JobStatusLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return MasterJobStatus(parts_);
  }
  proto::JobSummary SummaryLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return MasterJobSummary(parts_);
  }
  // A point of the status page's charts, when one is due (or `force`).
  void SampleHistoryLocked(bool force) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RegisterMetrics();
  // The checkpoint coordinator's view of the rest of the master.
  Cluster CheckpointCluster(bool with_view) override ABSL_LOCKS_EXCLUDED(mu_);
  void FillManifestTasks(std::optional<uint64_t> cut_step, proto::CheckpointManifest* m) override
      ABSL_LOCKS_EXCLUDED(mu_);
  void StopAfterCheckpoint(uint64_t seq, const std::string& reason) override
      ABSL_LOCKS_EXCLUDED(mu_);
  void FinalCheckpointDone() override ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status ApplyResume(const ResumePoint& r) ABSL_LOCKS_EXCLUDED(mu_);

  // `size`: of the training set (SizeTrainingSet).
  MasterServer(MasterOptions options, const TrainingSetSize& size, Planted planted,
               std::unique_ptr<EventSink> sink);

  const MasterOptions options_;
  const int64_t num_records_;
  Clock* const clock_;
  // The event log and the audit log (master/event_sink.h): posted to under
  // any lock, written by the sink's own thread.
  const std::unique_ptr<EventSink> sink_;
  // The job's state, progress, events and summary (master/job_tracker.h):
  // its own lock, a leaf under mu_.
  // job.batch_split by_speed: the workers' measured speeds and the split.
  BatchSplitter splitter_ ABSL_GUARDED_BY(mu_);
  JobTracker job_;
  // The members and the view (master/node_manager.h): its own lock, a leaf
  // under mu_ (above the job tracker's).
  MetricsRegistry metrics_;
  NodeManager nodes_;
  // Checkpoints (master/checkpoint_coordinator.h): its own locks, mu_ a
  // leaf under this mu_.
  std::unique_ptr<CheckpointCoordinator> checkpoints_;

  mutable absl::Mutex mu_;
  TaskScheduler tasks_ ABSL_GUARDED_BY(mu_);
  Scaler scaler_ ABSL_GUARDED_BY(mu_);
  // Pservers a move touched this tick: sent the view once mu_ is let go.
  std::set<uint32_t> view_pushes_ ABSL_GUARDED_BY(mu_);
  // The components as one bundle, for the state and the status; read
  // under mu_ (it points at tasks_).
  MasterParts parts_ ABSL_GUARDED_BY(mu_);
  // The update ledger (JobTracker::SetLedger), read from the primaries
  // once training is over.
  void TakeLedger() ABSL_LOCKS_EXCLUDED(mu_);
  // The state log's records and their group commit (master/state_log.h).
  std::unique_ptr<StateRecorder> recorder_;
  std::atomic<bool> paused_{false};
  std::string state_where_;  // where the state is kept, for messages

  std::unique_ptr<grpc::Service> service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  int bound_port_ = 0;
  HttpServer http_;
  absl::Notification stop_;
  std::thread background_;
  bool started_ = false;
};

}  // namespace strata::master

#endif  // STRATA_MASTER_MASTER_SERVER_H_
