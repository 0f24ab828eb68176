#include "master/master_server.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/daemon.h"
#include "common/error_reason.h"
#include "common/model_spec.h"
#include "common/proto_json.h"
#include "common/proto_names.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "master/master_parts.h"
#include "master/placement.h"
#include "master/pserver_calls.h"
#include "master/standby.h"
#include "master/status_page.h"

namespace strata::master {
namespace {

// JobStatus.security.
std::string SecurityMode(const MasterOptions& o) {
  if (o.security.plaintext) return o.security.ModeString();
  return o.config.security.encrypt_data_plane ? "mtls, data plane sealed" : "mtls";
}

}  // namespace

absl::StatusOr<std::unique_ptr<MasterServer>> MasterServer::Create(MasterOptions options) {
  if (options.fs == nullptr) return absl::InvalidArgumentError("MasterOptions.fs is required");
  STRATA_RETURN_IF_ERROR(
      CheckClusterSize(options.config, options.expected_pservers, options.expected_workers));
  const DataSection& data = options.config.data;
  STRATA_ASSIGN_OR_RETURN(const TrainingSetSize size,
                          SizeTrainingSet(options.fs, data, options.config.model.type == "script"));
  Planted planted;
  if (!data.planted.empty()) {
    STRATA_ASSIGN_OR_RETURN(planted, ReadPlanted(options.fs, data.planted));
  }
  // A restarted master: its state directory says where the job is.
  std::optional<proto::MasterState> saved;
  std::shared_ptr<StateStore> state_log;
  if (!options.state_dir.empty()) {
    STRATA_ASSIGN_OR_RETURN(state_log, StateLog::Open(options.fs, options.state_dir, &saved));
  } else if (options.state_store != nullptr) {
    state_log = options.state_store;
    saved = std::move(options.state_replayed);
  }
  STRATA_ASSIGN_OR_RETURN(
      CheckpointStart start,
      FindCheckpointStart(options.config, options.fs, options.resume, saved.has_value()));
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<EventSink> sink,
                          EventSink::Open({options.fs, options.event_log, options.audit_log,
                                           options.config.job.name, options.clock}));
  std::unique_ptr<MasterServer> m(
      new MasterServer(std::move(options), size, planted, std::move(sink)));
  if (state_log != nullptr) m->state_where_ = state_log->where();
  m->recorder_ = std::make_unique<StateRecorder>(std::move(state_log));
  m->checkpoints_->set_next_seq(start.next_seq);
  if (saved.has_value()) {
    m->checkpoints_->Restore(*saved, std::move(start.resumed));
    absl::MutexLock l(&m->mu_);
    m->RestoreLocked(*saved);
    return m;
  }
  if (start.resumed.has_value()) STRATA_RETURN_IF_ERROR(m->ApplyResume(*start.resumed));
  return m;
}

MasterServer::MasterServer(MasterOptions options, const TrainingSetSize& size, Planted planted,
                           std::unique_ptr<EventSink> sink)
    : options_(std::move(options)),
      num_records_(size.records),
      clock_(options_.clock ? options_.clock : RealClock()),
      sink_(std::move(sink)),
      job_(JobTracker::Options{options_.config.job.name, options_.config.job.consistency,
                               options_.config.job.epochs, planted, clock_, sink_.get()}),
      nodes_(NodeManager::Options{
          options_.host, options_.expected_pservers, options_.expected_workers,
          options_.config.cluster, options_.config.job.seed,
          MakeTableInfos(ModelTables(options_.config.model),
                         static_cast<uint32_t>(options_.config.sparse.partitions)),
          ScriptDeclaresTables(options_.config.model),
          static_cast<uint32_t>(options_.config.sparse.partitions), &options_.security, clock_,
          &job_, &metrics_, options_.config.model.stages > 1}),
      checkpoints_(std::make_unique<CheckpointCoordinator>(
          CheckpointCoordinator::Options{options_.config, options_.fs, clock_, sink_.get(),
                                         options_.failpoints},
          static_cast<CheckpointCoordinator::Master*>(this))),
      tasks_(JobTasks(size, options_.config)),
      scaler_(Scaler::Options{options_.config.elastic, options_.slots,
                              options_.config.elastic.provider.empty()
                                  ? options_.provider
                                  : options_.config.elastic.provider,
                              clock_}) {
  absl::MutexLock l(&mu_);
  if (options_.keeps_state()) tasks_.TrackChanges();  // for the state log's records
  parts_ = MasterParts{&nodes_,
                       &job_,
                       checkpoints_.get(),
                       &tasks_,
                       &scaler_,
                       sink_.get(),
                       options_.expected_pservers,
                       options_.expected_workers,
                       SecurityMode(options_),
                       options_.config.checkpoint.enabled};
}

MasterServer::~MasterServer() { Shutdown(); }

absl::Status MasterServer::Start() {
  if (!options_.security.plaintext) sink_->WatchTlsHandshakes();
  service_ = NewService();
  STRATA_ASSIGN_OR_RETURN(
      grpc_server_,
      StartControlServer("master", options_.host, options_.port, options_.security.server,
                         service_.get(), options_.config.cluster.control_connect_ms, &bound_port_));
  nodes_.SetMasterAddress(address());
  if (options_.http_port >= 0) {
    RegisterMetrics();
    ServeStandardEndpoints(&http_, &metrics_, [this] { return ProtoJsonResponse(GetStatus()); });
    ServeStatusPage(
        &http_, [this] { return GetStatus(); }, clock_);
    STRATA_RETURN_IF_ERROR(
        SecureHttp(options_.security, &http_,
                   [this](const std::string& who, const HttpRequest& req, const absl::Status& why) {
                     sink_->AuditRefusal(who, req.peer, absl::StrCat("http GET ", req.path), why);
                   }));
    STRATA_RETURN_IF_ERROR(http_.Start(options_.host, options_.http_port));
    nodes_.SetMasterHttpPort(http_.port());
  }
  background_ = std::thread([this] { BackgroundLoop(); });
  checkpoints_->Start();
  started_ = true;
  absl::MutexLock l(&mu_);
  LOG(INFO) << "master listening on " << address() << ", http port " << http_port()
            << "; waiting for " << options_.expected_pservers << " pserver(s) and "
            << options_.expected_workers << " worker(s); " << num_records_ << " training records, "
            << tasks_.total() << " data tasks";
  return absl::OkStatus();
}

void MasterServer::Shutdown() {
  if (!started_) return;
  started_ = false;
  stop_.Notify();
  if (background_.joinable()) background_.join();
  checkpoints_->Shutdown();  // (a checkpoint waiting on pservers gives up)
  http_.Shutdown();
  if (grpc_server_) grpc_server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  sink_->StopWatchingTlsHandshakes();
  sink_->Flush();  // what the last RPCs logged
}

void MasterServer::Pause() {
  if (paused_.exchange(true)) return;
  checkpoints_->CancelInflight();  // (a checkpoint under way fails; the last stays the latest)
  LOG(WARNING) << "master paused: it cannot renew its lead in etcd; answering as a standby";
}

void MasterServer::Resume() {
  if (!paused_.load()) return;
  nodes_.GraceAll();
  paused_ = false;
  absl::MutexLock l(&mu_);
  job_.Event(
      "master resumed: its lead in etcd renewed after a pause (every node has the dead "
      "timeout anew)",
      "master_resumed");
}

std::string MasterServer::address() const { return absl::StrCat(options_.host, ":", bound_port_); }
int MasterServer::http_port() const { return http_.port(); }

void MasterServer::BackgroundLoop() {
  const absl::Duration tick =
      std::min(absl::Milliseconds(200),
               absl::Milliseconds(options_.config.cluster.heartbeat_interval_ms) / 2);
  while (!stop_.WaitForNotificationWithTimeout(tick)) {
    if (paused_.load()) continue;
    Tick();
    sink_->AuditTlsFailures();
  }
}

void MasterServer::Tick() {
  uint64_t ticket = 0;
  std::set<uint32_t> pushes;
  {
    absl::MutexLock l(&mu_);
    for (const auto& [id, why] : nodes_.Unresponsive()) {
      if (auto d = nodes_.DeclareDead(id, why, job_.over())) DepartedLocked(*d);
    }
    int expired = tasks_.ExpireLeases(clock_->Now());
    if (expired > 0) LOG(WARNING) << expired << " data task lease(s) expired";
    if (!job_.over()) nodes_.TopUpBackups();
    ScaleTickLocked();
    UpdateJobStateLocked();
    SampleHistoryLocked(/*force=*/false);
    ticket = PersistLocked();
    pushes.swap(view_pushes_);
  }
  const absl::Status persisted = AwaitPersisted(ticket);  // (logged; the next tick tries again)
  // Nothing goes out that could not be recorded (a restarted or elected
  // master starts from what is), nor once paused (a leader of several
  // whose lease may have run out while it waited; docs/reliability.md).
  if (paused_.load() || !persisted.ok()) {
    absl::MutexLock l(&mu_);
    view_pushes_.insert(pushes.begin(), pushes.end());
    return;
  }
  // (Recorded first: a view a pserver acts on survives a master restart.)
  if (!pushes.empty()) {
    const proto::ClusterView view = nodes_.View();
    nodes_.ViewApplied(PushView(view, nodes_.LivePServers(pushes), absl::Seconds(1)), view.epoch());
  }
  if (paused_.load()) return;
  for (const auto& [id, probe] : nodes_.ProbeSuspects()) {
    absl::MutexLock l(&mu_);
    if (auto d = nodes_.DeclareUnreachable(id, probe, job_.over())) DepartedLocked(*d);
  }
  if (paused_.load()) return;
  RecoverLostPartitions();
  if (paused_.load()) return;
  MaybePlacePartitions();
  TakeLedger();
}

uint64_t MasterServer::PersistLocked() {
  if (!options_.keeps_state()) return 0;
  return recorder_->Record(
      SaveMasterState(parts_, /*whole=*/false), tasks_.TakeChangeRecord(), job_.events_size(),
      [this](size_t from) { return job_.EventsFrom(from); },
      [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {  // (called here, under mu_)
        return SaveMasterState(parts_, /*whole=*/true);
      });
}

void MasterServer::RestoreLocked(const proto::MasterState& st) {
  nodes_.Restore(st);
  scaler_.Restore(st);
  const uint32_t restarts = job_.Restore(st);
  // Live workers keep the tasks they hold; a dead one's go back.
  absl::Status s = tasks_.Restore(
      st, [this](uint32_t node) { return nodes_.InJob(node); }, clock_->Now());
  if (!s.ok()) LOG(ERROR) << "the recorded state's data tasks: " << s;
  job_.Event(
      absl::StrCat("master restarted (restart ", restarts, "): state of epoch ", st.view().epoch(),
                   " replayed from ", state_where_, "; ", tasks_.done(), " of ", tasks_.total(),
                   " data tasks done, job ", JobStateName(job_.state())),
      "master_restart");
}

void MasterServer::DepartedLocked(const NodeManager::Departure& d) {
  const proto::NodeInfo& n = d.node;
  if (n.role() == proto::WORKER) {
    splitter_.Forget(n.id());
    if (const int released = tasks_.ReleaseNode(n.id()); released > 0) {
      job_.Event(
          absl::StrCat(released, " data task(s) of worker ", n.index(), " returned to the queue"),
          "tasks_requeued", &n);
    }
  }
  if (d.lost.empty()) return;
  // Restored from the last checkpoint by RecoverLostPartitions, or the job fails.
  const std::optional<proto::CheckpointManifest> last = checkpoints_->last_manifest();
  job_.Event(
      absl::StrCat(
          d.lost.size(), " partition(s) of node ", n.id(), " lost with it (no synced backup)",
          last.has_value() ? absl::StrCat("; restoring them from checkpoint ", last->seq()) : ""),
      "partitions_lost");
  if (last.has_value()) return;
  FinishJobLocked(
      proto::JOB_FAILED,
      absl::StrCat("pserver ", n.index(), " (node ", n.id(), ", ", n.host(), ") died with ",
                   d.lost.size(), " partition(s) and no replica to take over",
                   options_.config.checkpoint.enabled
                       ? " and no checkpoint yet to restore them from; restart the job"
                       : "; set cluster.replication or a checkpoint section so that the job can "
                         "go on"));
}

absl::StatusOr<proto::DrainResponse> MasterServer::Drain(const proto::DrainRequest& req) {
  return Durably([&](uint64_t* ticket) -> absl::StatusOr<proto::DrainResponse> {
    absl::MutexLock l(&mu_);
    STRATA_ASSIGN_OR_RETURN(NodeManager::Drained d,
                            nodes_.Drain(req, job_.state(), job_.evaluator()));
    if (d.departure.has_value()) DepartedLocked(*d.departure);
    if (d.changed) *ticket = PersistLocked();
    return std::move(d.response);
  });
}

void MasterServer::RecoverLostPartitions() {
  if (!nodes_.has_lost() || job_.over()) return;
  const std::optional<proto::CheckpointManifest> last = checkpoints_->last_manifest();
  if (!last.has_value()) return;
  // A restored partition rejoins at the step the others reached (bsp: the
  // workers push that step next); what it trained since the checkpoint is
  // lost, and counted.
  const absl::StatusOr<uint64_t> newest =
      nodes_.RestoreVersion(options_.config.job.consistency == Consistency::kBsp);
  LOG_IF_EVERY_N(WARNING, !newest.ok(), 10) << newest.status().message();
  if (!newest.ok()) return;
  absl::MutexLock l(&mu_);
  if (job_.over()) return;
  if (absl::Status s = nodes_.RestoreLost(*last, *newest); !s.ok()) {
    FinishJobLocked(proto::JOB_FAILED, std::string(s.message()));
  }
}

void MasterServer::TakeLedger() {
  // Once every data task is done no push is left: the counts are final.
  if (job_.ledger_taken() || job_.state() != proto::JOB_EVALUATING) return;
  absl::StatusOr<Ledger> ledger = ReadLedger(nodes_.Owners(), nodes_.PartitionOwners());
  if (ledger.ok()) job_.SetLedger(*std::move(ledger));  // (else: the next tick)
}

void MasterServer::MaybePlacePartitions() {
  proto::ClusterView view;
  std::vector<PServerTarget> targets;
  {
    absl::MutexLock l(&mu_);
    if (job_.over()) return;
    absl::StatusOr<std::optional<NodeManager::Placement>> plan = nodes_.PlanPlacement();
    if (!plan.ok()) {
      FinishJobLocked(proto::JOB_FAILED, plan.status().ToString());
      return;
    }
    if (!plan->has_value()) return;
    // The candidate view becomes the master's only once every pserver has
    // accepted its partitions.
    view = std::move((*plan)->view);
    targets = std::move((*plan)->targets);
  }
  // Outgoing RPCs without the lock. Stubs live as long as the server.
  const absl::Status sent = checkpoints_->PlacePartitions(view, targets);
  if (absl::IsUnavailable(sent)) {
    LOG(WARNING) << sent.message() << "; will retry";
    return;
  }
  uint64_t ticket = 0;
  {
    absl::MutexLock l(&mu_);
    if (!sent.ok()) return FinishJobLocked(proto::JOB_FAILED, std::string(sent.message()));
    nodes_.CommitPlacement(view);
    checkpoints_->RestorePlaced();
    LOG(INFO) << "placed " << view.partitions_size() << " partition(s) of " << view.tables_size()
              << " table(s) on " << targets.size() << " pserver(s)";
    UpdateJobStateLocked();
    ticket = PersistLocked();
  }
  AwaitPersisted(ticket).IgnoreError();  // (logged; the next tick tries again)
}

absl::StatusOr<proto::RegisterResponse> MasterServer::Register(const proto::RegisterRequest& req,
                                                               const std::string& peer,
                                                               const Identity& who) {
  if (!req.job().empty() && req.job() != options_.config.job.name) {
    return WithReason(absl::FailedPreconditionError(absl::StrCat(
                          "register from ", peer, ": ", NodeRoleName(req.role()), " ", req.index(),
                          " belongs to job '", req.job(), "', this master runs job '",
                          options_.config.job.name, "' (two jobs on the same ports?)")),
                      proto::REASON_WRONG_JOB);
  }
  // Durable before the node learns its id.
  return Durably([&](uint64_t* ticket) -> absl::StatusOr<proto::RegisterResponse> {
    absl::MutexLock l(&mu_);
    STRATA_ASSIGN_OR_RETURN(
        const proto::NodeInfo n,
        nodes_.Register(req, peer, who, job_.over(),
                        [this](const NodeManager::Departure& d) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                          DepartedLocked(d);  // (called here, under mu_)
                        }));
    UpdateJobStateLocked();
    *ticket = PersistLocked();
    proto::RegisterResponse resp;
    resp.set_node_id(n.id());
    *resp.mutable_view() = nodes_.View();
    *resp.mutable_data_key() = nodes_.DataKey(n.id());
    if (req.role() == proto::WORKER) {
      if (auto ring = checkpoints_->RingRestore()) *resp.mutable_ring_restore() = *std::move(ring);
    }
    return resp;
  });
}

absl::StatusOr<proto::HeartbeatResponse> MasterServer::Heartbeat(
    const proto::HeartbeatRequest& req) {
  absl::MutexLock l(&mu_);
  STRATA_ASSIGN_OR_RETURN(NodeManager::Beat beat, nodes_.Heartbeat(req));
  proto::HeartbeatResponse resp;
  resp.set_epoch(beat.epoch);
  resp.set_job_state(job_.state());
  resp.set_evaluator(job_.evaluating());
  resp.set_drained(beat.drained);
  if (beat.drained) return resp;  // it leaves
  if (beat.role == proto::PSERVER) {
    job_.RecordApplies(req.node_id(), req.applies(), req.apply_seconds());
    scaler_.autoscaler().PServerBeat(req.node_id(), clock_->Now(), req);
  }
  // A live worker keeps its data-task leases.
  if (beat.role == proto::WORKER) {
    tasks_.RenewLeases(req.node_id(), clock_->Now());
    if (req.evaluating()) job_.EvaluationStarted(req.node_id());
    checkpoints_->RingBeat(req.node_id(), req, &resp);
  }
  *resp.mutable_data_key() = std::move(beat.key);
  return resp;
}

absl::Status MasterServer::ReportProgress(const proto::ReportProgressRequest& req) {
  absl::MutexLock l(&mu_);
  STRATA_ASSIGN_OR_RETURN(const proto::NodeInfo n, nodes_.LiveWorker(req.node_id()));
  if (req.has_test_accuracy() && n.id() != job_.evaluator()) {
    return absl::FailedPreconditionError(
        absl::StrCat("node ", n.id(), " reported a test accuracy but is not the evaluator"));
  }
  job_.RecordProgress(n.id(), req);
  if (req.evaluating()) job_.EvaluationStarted(n.id());
  splitter_.Observe(n.id(), req.samples(), req.busy_seconds() - req.comm_seconds());
  if (req.has_task_start()) tasks_.SetFirstStep(n.id(), req.task_id(), req.task_first_step());
  if (!req.error().empty() && !job_.over()) {
    FinishJobLocked(proto::JOB_FAILED,
                    absl::StrCat("worker ", n.index(), " (node ", n.id(), "): ", req.error()));
    return absl::OkStatus();
  }
  if (req.has_test_accuracy()) {
    job_.Evaluated(req);
    FinishJobLocked(proto::JOB_SUCCEEDED, "");
  }
  return absl::OkStatus();
}

void MasterServer::UpdateJobStateLocked() {
  if (job_.over()) return;
  if (const std::optional<uint64_t> epoch = nodes_.MarkReady()) job_.Start(*epoch);
  if (job_.state() == proto::JOB_RUNNING && tasks_.AllDone()) {
    job_.TrainingDone(tasks_.total());
    // (The trained model is saved before it is evaluated.)
    checkpoints_->TrainingDone();
  }
  if (const proto::JobState state = job_.state();
      state == proto::JOB_RUNNING || state == proto::JOB_EVALUATING) {
    if (nodes_.Count(proto::WORKER, true) == 0) {
      FinishJobLocked(proto::JOB_FAILED,
                      absl::StrCat("no live worker left with ", tasks_.total() - tasks_.done(),
                                   " data task(s) unfinished"));
    }
  }
}

void MasterServer::FinishJobLocked(proto::JobState state, const std::string& message) {
  job_.Finish(state, message);
  SampleHistoryLocked(/*force=*/true);  // the end of the charts
  PersistLocked();                      // (synced by the caller's AwaitPersisted, or the next tick)
  if (options_.summary_path.empty()) return;
  const absl::Status s =
      options_.fs->WriteFileAtomic(options_.summary_path, SummaryJson(SummaryLocked()));
  LOG_IF(ERROR, !s.ok()) << "cannot write summary: " << s;
  LOG_IF(INFO, s.ok()) << "wrote " << options_.summary_path;
}

void MasterServer::SampleHistoryLocked(bool force) {
  job_.SampleHistory(force, [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {  // (called here, under mu_)
    return JobStatusLocked();
  });
}

proto::GetStatusResponse MasterServer::GetStatus() {
  absl::MutexLock l(&mu_);
  proto::GetStatusResponse resp;
  *resp.mutable_view() = nodes_.StatusView();
  *resp.mutable_job() = JobStatusLocked();
  return resp;
}

void MasterServer::RegisterMetrics() {
  AddProcessMetrics(&metrics_);
  checkpoints_->RegisterMetrics(&metrics_);
  nodes_.RegisterMetrics();
  job_.RegisterMetrics(&metrics_, [this] { return nodes_.View(); });
  auto tasks = [this](uint64_t (TaskScheduler::*count)() const) {
    return [this, count] {
      absl::MutexLock l(&mu_);
      return static_cast<double>((tasks_.*count)());
    };
  };
  metrics_.AddCallbackGauge("strata_master_tasks_total", "Data tasks of the job",
                            tasks(&TaskScheduler::total));
  metrics_.AddCallbackGauge("strata_master_tasks_done", "Data tasks completed",
                            tasks(&TaskScheduler::done));
  metrics_.AddCallbackGauge("strata_master_tasks_leased", "Data tasks leased now",
                            tasks(&TaskScheduler::leased));
  AddLeaderMetric(&metrics_, [this] { return !paused(); });
}

// Checkpoints (master/checkpoint_coordinator.h): the coordinator's calls,
// and the master's part of them.

absl::StatusOr<proto::StopResponse> MasterServer::Stop(const std::string& reason,
                                                       bool no_checkpoint) {
  bool checkpoint = false;
  {
    absl::MutexLock l(&mu_);
    if (job_.over()) {
      return WithReason(absl::FailedPreconditionError(absl::StrCat("the job has already ended: it ",
                                                                   JobStateName(job_.state()))),
                        proto::REASON_JOB_NOT_RUNNING);
    }
    checkpoint =
        options_.config.checkpoint.enabled && !no_checkpoint && nodes_.placed() && nodes_.ready();
  }
  proto::StopResponse resp;
  if (checkpoint) {
    STRATA_ASSIGN_OR_RETURN(*resp.mutable_checkpoint(), checkpoints_->CheckpointBeforeStop(reason));
    resp.set_checkpointed(true);
    return resp;
  }
  absl::MutexLock l(&mu_);
  if (!job_.over()) {
    FinishJobLocked(proto::JOB_STOPPED, absl::StrCat("stopped on request (", reason, ")"));
  }
  return resp;
}

absl::Status MasterServer::ApplyResume(const ResumePoint& r) {
  checkpoints_->Resume(r);
  absl::MutexLock l(&mu_);
  const proto::CheckpointManifest& m = r.manifest;
  STRATA_RETURN_IF_ERROR(tasks_.ResumeFrom(m));
  job_.Resume(m.seq(), m.samples(), m.step() > 0 ? m.step() - 1 : 0);
  nodes_.Resume(m);
  LOG(INFO) << "resuming from checkpoint " << m.seq() << " (" << m.reason() << ", step " << m.step()
            << "): " << tasks_.done() << " of " << tasks_.total() << " data tasks done, "
            << m.tasks_partial_size() << " partly";
  return absl::OkStatus();
}

CheckpointCoordinator::Master::Cluster MasterServer::CheckpointCluster(bool with_view) {
  absl::MutexLock l(&mu_);
  Cluster c;
  if (paused_.load()) {
    c.why_not = "the master is paused (its lead in etcd is not renewed)";
    return c;
  }
  const proto::JobState state = job_.state();
  const bool placed = nodes_.placed();
  c.ready = placed && nodes_.ready() && !IsJobOver(state);
  if (!c.ready) {
    c.why_not =
        absl::StrCat("the job is ", JobStateName(state), placed ? "" : " (partitions not placed)");
    return c;
  }
  c.running = state == proto::JOB_RUNNING;
  c.training_over = state == proto::JOB_EVALUATING;
  c.evaluating = c.training_over && job_.evaluator() != 0;
  if (with_view) c.view = nodes_.View();
  c.owners = nodes_.Owners();
  return c;
}

void MasterServer::FillManifestTasks(std::optional<uint64_t> cut_step,
                                     proto::CheckpointManifest* m) {
  absl::MutexLock l(&mu_);
  tasks_.FillManifest(cut_step, options_.config.job.batch_size, m);
  m->set_next_node_id(nodes_.next_node_id());
}

void MasterServer::StopAfterCheckpoint(uint64_t seq, const std::string& reason) {
  absl::MutexLock l(&mu_);
  if (!job_.over()) {
    FinishJobLocked(proto::JOB_STOPPED,
                    absl::StrCat("stopped after checkpoint ", seq, " (", reason, ")"));
  }
}

void MasterServer::FinalCheckpointDone() {
  absl::MutexLock l(&mu_);
  UpdateJobStateLocked();
}

}  // namespace strata::master
