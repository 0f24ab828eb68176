#include "master/master_server.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/daemon.h"
#include "common/error_reason.h"
#include "common/grpc_channel.h"
#include "common/grpc_status.h"
#include "common/json.h"
#include "common/model_spec.h"
#include "common/proto_json.h"
#include "common/proto_names.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "master/placement.h"
#include "master/status_page.h"
#include "storage/checkpoint_format.h"
#include "storage/criteo_reader.h"
#include "storage/idx_reader.h"
#include "transport/data_plane_auth.h"

namespace strata::master {
namespace {

int64_t ToUnixMs(absl::Time t) { return absl::ToUnixMillis(t); }

}  // namespace

absl::StatusOr<std::unique_ptr<MasterServer>> MasterServer::Create(MasterOptions options) {
  if (options.fs == nullptr) {
    return absl::InvalidArgumentError("MasterOptions.fs is required");
  }
  if (options.expected_pservers < 1 || options.expected_workers < 1) {
    return absl::InvalidArgumentError("the cluster needs at least one pserver and one worker");
  }
  if (options.config.cluster.replication >= options.expected_pservers) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.config.source.empty() ? "config" : options.config.source,
                     ": cluster.replication ", options.config.cluster.replication,
                     " needs at least ", options.config.cluster.replication + 1,
                     " pservers; the cluster has ", options.expected_pservers));
  }
  const DataSection& data = options.config.data;
  STRATA_ASSIGN_OR_RETURN(const TrainingSetSize size, SizeTrainingSet(options.fs, data));
  const int64_t n = size.records;
  const std::optional<TaskScheduler::ByteSplit>& split = size.split;
  Planted planted;
  if (!data.planted.empty()) {
    STRATA_ASSIGN_OR_RETURN(planted, ReadPlanted(options.fs, data.planted));
  }
  // A restarted master: its state directory says where the job is.
  std::optional<proto::MasterState> saved;
  std::unique_ptr<StateLog> state_log;
  if (!options.state_dir.empty()) {
    STRATA_ASSIGN_OR_RETURN(state_log, StateLog::Open(options.fs, options.state_dir, &saved));
  }
  std::optional<ResumePoint> resumed;
  if (saved.has_value() && options.config.checkpoint.enabled) {
    // Its last checkpoint is the base of the next (and what a lost
    // partition is restored from).
    STRATA_ASSIGN_OR_RETURN(resumed, FindResumeCheckpoint(options.config, options.fs, "latest"));
  } else if (!saved.has_value()) {
    STRATA_ASSIGN_OR_RETURN(resumed,
                            FindResumeCheckpoint(options.config, options.fs, options.resume));
  }
  uint64_t next_seq = 1;
  if (options.config.checkpoint.enabled) {
    // New checkpoints go after every directory there, complete or not.
    STRATA_ASSIGN_OR_RETURN(auto existing,
                            storage::ListCheckpoints(options.fs, options.config.checkpoint.dir));
    if (!existing.empty()) next_seq = existing.back().seq + 1;
  }
  EventSink::Options so;
  so.fs = options.fs;
  so.event_log = options.event_log;
  so.audit_log = options.audit_log;
  so.job = options.config.job.name;
  so.clock = options.clock;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<EventSink> sink, EventSink::Open(std::move(so)));
  std::unique_ptr<MasterServer> m(
      new MasterServer(std::move(options), n, split, planted, std::move(sink)));
  m->recorder_ = std::make_unique<StateRecorder>(std::move(state_log));
  m->checkpoints_->set_next_seq(next_seq);
  if (saved.has_value()) {
    m->checkpoints_->Restore(*saved, std::move(resumed));
    absl::MutexLock l(&m->mu_);
    m->RestoreLocked(*saved);
    return m;
  }
  if (resumed.has_value()) STRATA_RETURN_IF_ERROR(m->ApplyResume(*resumed));
  return m;
}

MasterServer::MasterServer(MasterOptions options, int64_t num_records,
                           std::optional<TaskScheduler::ByteSplit> split, Planted planted,
                           std::unique_ptr<EventSink> sink)
    : options_(std::move(options)),
      num_records_(num_records),
      clock_(options_.clock ? options_.clock : RealClock()),
      sink_(std::move(sink)),
      job_(JobTracker::Options{options_.config.job.name, options_.config.job.consistency,
                               options_.config.job.epochs, planted, clock_, sink_.get()}),
      nodes_(NodeManager::Options{
          options_.host, options_.expected_pservers, options_.expected_workers,
          options_.config.cluster, options_.config.job.seed,
          MakeTableInfos(ModelTables(options_.config.model),
                         static_cast<uint32_t>(options_.config.sparse.partitions)),
          &options_.security, clock_, &job_, &metrics_}),
      checkpoints_(std::make_unique<CheckpointCoordinator>(
          CheckpointCoordinator::Options{options_.config, options_.fs, clock_, sink_.get(),
                                         options_.failpoints},
          static_cast<CheckpointCoordinator::Master*>(this))),
      tasks_(
          split.has_value()
              ? TaskScheduler(*split, options_.config.job.epochs, options_.config.job.seed,
                              absl::Milliseconds(options_.config.cluster.task_lease_timeout_ms))
              : TaskScheduler(num_records, options_.config.data.task_records,
                              options_.config.job.epochs, options_.config.job.seed,
                              absl::Milliseconds(options_.config.cluster.task_lease_timeout_ms))) {
  absl::MutexLock l(&mu_);
  if (!options_.state_dir.empty()) tasks_.TrackChanges();  // for the state log's records
}

MasterServer::~MasterServer() { Shutdown(); }

absl::Status MasterServer::Start() {
  if (!options_.security.plaintext && sink_->auditing()) {
    tls_listener_ = ListenForTlsFailures([this](const std::string& reason) {
      absl::MutexLock l(&tls_failures_mu_);
      if (tls_failures_.size() < 64) {
        tls_failures_.push_back(reason);
      } else {
        ++tls_failures_dropped_;
      }
    });
  }
  service_ = NewService();
  grpc::ServerBuilder builder;
  const std::string addr = absl::StrCat(options_.host, ":", options_.port);
  builder.AddListeningPort(addr, options_.security.server, &bound_port_);
  ApplyServerLimits(&builder, options_.config.cluster.control_connect_ms);
  builder.RegisterService(service_.get());
  grpc_server_ = builder.BuildAndStart();
  if (grpc_server_ == nullptr || bound_port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("master: cannot listen on ", addr, " (port in use?)"));
  }
  nodes_.SetMasterAddress(address());
  if (options_.http_port >= 0) {
    RegisterMetrics();
    ServeStandardEndpoints(&http_, &metrics_, [this] { return ProtoJsonResponse(GetStatus()); });
    http_.Handle("/", [this](const HttpRequest& req) {
      // ?refresh=N sets the page's reload interval (0: none); 5 s by default.
      int refresh = 5;
      for (absl::string_view kv : absl::StrSplit(req.query, '&')) {
        if (absl::ConsumePrefix(&kv, "refresh=") && !absl::SimpleAtoi(kv, &refresh)) refresh = 5;
      }
      return HttpResponse{
          200, "text/html; charset=utf-8",
          RenderStatusPage(GetStatus(), ToUnixMs(clock_->Now()), std::clamp(refresh, 0, 3600))};
    });
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
  uint64_t total_tasks = 0;
  {
    absl::MutexLock l(&mu_);
    total_tasks = tasks_.total();
  }
  LOG(INFO) << "master listening on " << address() << ", http port " << http_port()
            << "; waiting for " << options_.expected_pservers << " pserver(s) and "
            << options_.expected_workers << " worker(s); " << num_records_ << " training records, "
            << total_tasks << " data tasks";
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
  if (tls_listener_ >= 0) {
    StopListeningForTlsFailures(std::exchange(tls_listener_, -1));
    AuditTlsFailures();
  }
  sink_->Flush();  // what the last RPCs logged
}

void MasterServer::AuditTlsFailures() {
  std::vector<std::string> failures;
  uint64_t dropped = 0;
  {
    absl::MutexLock l(&tls_failures_mu_);
    failures.swap(tls_failures_);
    dropped = std::exchange(tls_failures_dropped_, 0);
  }
  if (dropped > 0) {
    LOG(WARNING) << dropped << " more failed TLS handshake(s) not audited one by one";
  }
  // (gRPC does not say from where; one record a second per reason.)
  for (const std::string& reason : failures) {
    sink_->AuditRefusal("", "unknown (gRPC does not name the peer of a failed handshake)",
                        "tls handshake", absl::UnauthenticatedError(reason));
  }
}

std::string MasterServer::address() const { return absl::StrCat(options_.host, ":", bound_port_); }
int MasterServer::http_port() const { return http_.port(); }

void MasterServer::BackgroundLoop() {
  const absl::Duration tick =
      std::min(absl::Milliseconds(200),
               absl::Milliseconds(options_.config.cluster.heartbeat_interval_ms) / 2);
  while (!stop_.WaitForNotificationWithTimeout(tick)) {
    Tick();
    AuditTlsFailures();
  }
}

void MasterServer::Tick() {
  uint64_t ticket = 0;
  {
    absl::MutexLock l(&mu_);
    for (const auto& [id, why] : nodes_.Unresponsive()) {
      if (auto d = nodes_.DeclareDead(id, why, job_.over())) DepartedLocked(*d);
    }
    int expired = tasks_.ExpireLeases(clock_->Now());
    if (expired > 0) LOG(WARNING) << expired << " data task lease(s) expired";
    if (!job_.over()) nodes_.TopUpBackups();
    UpdateJobStateLocked();
    SampleHistoryLocked(/*force=*/false);
    ticket = PersistLocked();
  }
  AwaitPersisted(ticket).IgnoreError();  // (logged; the next tick tries again)
  ProbeSuspects();
  RecoverLostPartitions();
  MaybePlacePartitions();
  TakeLedger();
}

proto::MasterState MasterServer::SmallStateLocked() const {
  proto::MasterState st;
  nodes_.Save(&st);
  job_.Save(&st);
  checkpoints_->Save(&st);
  st.set_tasks_requeued(tasks_requeued_);
  st.set_records_requeued(records_requeued_);
  return st;
}

proto::MasterState MasterServer::StateLocked() const {
  proto::MasterState st = SmallStateLocked();
  for (uint64_t id : tasks_.DoneIds()) st.add_tasks_done(id);
  for (const auto& [id, node] : tasks_.Leases()) (*st.mutable_task_leases())[id] = node;
  for (std::string& e : job_.EventsFrom(0)) st.add_events(std::move(e));
  return st;
}

uint64_t MasterServer::PersistLocked() {
  if (options_.state_dir.empty()) return 0;
  TaskScheduler::Changes changes = tasks_.TakeChanges();
  proto::MasterState tasks;
  for (uint64_t id : changes.done) tasks.add_tasks_done(id);
  for (const auto& [id, node] : changes.leased) (*tasks.mutable_task_leases())[id] = node;
  for (uint64_t id : changes.ended) tasks.add_leases_ended(id);
  return recorder_->Record(
      SmallStateLocked(), std::move(tasks), job_.events_size(),
      [this](size_t from) { return job_.EventsFrom(from); },
      [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return StateLocked(); });  // (under mu_)
}

absl::Status MasterServer::AwaitPersisted(uint64_t ticket) {
  return recorder_->AwaitDurable(ticket);
}

void MasterServer::RestoreLocked(const proto::MasterState& st) {
  nodes_.Restore(st);
  const uint32_t restarts = job_.Restore(st);
  absl::Status s =
      tasks_.Resume(std::vector<uint64_t>(st.tasks_done().begin(), st.tasks_done().end()), {});
  if (!s.ok()) LOG(ERROR) << "the recorded state's data tasks: " << s;
  // Live workers keep the tasks they hold; a dead one's go back.
  std::map<uint64_t, uint32_t> leases;
  for (const auto& [id, node] : st.task_leases()) {
    if (nodes_.InJob(node)) leases[id] = node;
  }
  tasks_.RestoreLeases(leases, clock_->Now());
  tasks_requeued_ = st.tasks_requeued();
  records_requeued_ = st.records_requeued();
  job_.Event(
      absl::StrCat("master restarted (restart ", restarts, "): state of epoch ", st.view().epoch(),
                   " replayed from ", options_.state_dir, "; ", tasks_.done(), " of ",
                   tasks_.total(), " data tasks done, job ", JobStateName(job_.state())),
      "master_restart");
}

void MasterServer::DepartedLocked(const NodeManager::Departure& d) {
  const proto::NodeInfo& n = d.node;
  if (n.role() == proto::WORKER) {
    std::vector<uint64_t> ids;
    const int released = tasks_.ReleaseNode(n.id(), &ids);
    for (uint64_t id : ids) records_requeued_ += tasks_.RecordsOf(id);
    if (released > 0) {
      tasks_requeued_ += static_cast<uint64_t>(released);
      job_.Event(
          absl::StrCat(released, " data task(s) of worker ", n.index(), " returned to the queue"),
          "tasks_requeued", &n);
    }
  }
  if (d.lost.empty()) return;
  // Restored from the last checkpoint by RecoverLostPartitions, or the job
  // fails.
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
  uint64_t ticket = 0;
  absl::StatusOr<proto::DrainResponse> r = DrainUnpersisted(req, &ticket);
  STRATA_RETURN_IF_ERROR(AwaitPersisted(ticket));
  return r;
}

absl::StatusOr<proto::DrainResponse> MasterServer::DrainUnpersisted(const proto::DrainRequest& req,
                                                                    uint64_t* ticket) {
  absl::MutexLock l(&mu_);
  STRATA_ASSIGN_OR_RETURN(NodeManager::Drained d,
                          nodes_.Drain(req, job_.state(), job_.evaluator()));
  if (d.departure.has_value()) DepartedLocked(*d.departure);
  if (d.changed) *ticket = PersistLocked();
  return std::move(d.response);
}

void MasterServer::RecoverLostPartitions() {
  if (!nodes_.has_lost() || job_.over()) return;
  const std::optional<proto::CheckpointManifest> last = checkpoints_->last_manifest();
  if (!last.has_value()) return;
  // A restored partition rejoins at the step the others reached (bsp: the
  // workers push that step next); what it trained since the checkpoint
  // is lost, and counted.
  uint64_t newest = 0;
  if (options_.config.job.consistency == Consistency::kBsp) {
    auto v = NewestPartitionVersion(nodes_.LiveOwners());
    if (!v.ok()) {
      LOG_EVERY_N(WARNING, 10) << "cannot read the partitions' versions to restore lost ones: "
                               << v.status();
      return;
    }
    newest = *v;
  }
  absl::MutexLock l(&mu_);
  if (job_.over()) return;
  if (absl::Status s = nodes_.RestoreLost(*last, newest); !s.ok()) {
    FinishJobLocked(proto::JOB_FAILED, std::string(s.message()));
  }
}

void MasterServer::ProbeSuspects() {
  for (const auto& [id, stub] : nodes_.DueProbes()) {
    grpc::ClientContext ctx;
    // Long enough for a new connection (its TLS handshake included) to
    // the pserver: a slow handshake is not a dead pserver.
    ctx.set_deadline(absl::ToChronoTime(
        absl::Now() +
        absl::Milliseconds(std::max({200, options_.config.cluster.heartbeat_interval_ms,
                                     options_.config.cluster.control_connect_ms}))));
    proto::PServerStatusResponse resp;
    grpc::Status s = stub->GetStatus(&ctx, proto::PServerStatusRequest(), &resp);
    if (s.ok()) continue;
    absl::MutexLock l(&mu_);
    const std::optional<std::string> reason = nodes_.Suspicion(id);
    if (!reason.has_value()) continue;
    if (auto d = nodes_.DeclareDead(
            id,
            absl::StrCat("reported unreachable (", *reason,
                         ") and the master's probe failed too: ", s.error_message()),
            job_.over())) {
      DepartedLocked(*d);
    }
  }
}

absl::StatusOr<proto::ReportSuspectResponse> MasterServer::ReportSuspect(
    const proto::ReportSuspectRequest& req) {
  return nodes_.ReportSuspect(req);
}

void MasterServer::TakeLedger() {
  // Once every data task is done no push is left: the counts are final.
  if (job_.ledger_taken() || job_.state() != proto::JOB_EVALUATING) return;
  const std::vector<PServerTarget> targets = nodes_.Owners();
  std::map<uint32_t, uint32_t> owner = nodes_.PartitionOwners();
  std::map<uint32_t, std::map<uint32_t, uint64_t>> applied;
  for (const auto& [id, stub] : targets) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    proto::PServerStatusResponse resp;
    grpc::Status s = stub->GetStatus(&ctx, proto::PServerStatusRequest(), &resp);
    if (!s.ok()) return;  // next tick
    for (const auto& ps : resp.partitions()) {
      if (owner[ps.id()] != id) continue;  // a backup's copy
      for (const auto& [sender, n] : ps.applied_by_sender()) applied[ps.id()][sender] = n;
    }
  }
  job_.SetLedger(std::move(applied));
}

void MasterServer::MaybePlacePartitions() {
  proto::ClusterView view;
  std::vector<PServerTarget> targets;
  std::optional<proto::CheckpointManifest> restore;
  std::string restore_root;
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
    if (restore_.has_value()) {
      // The pservers need the partitions' chains only.
      restore.emplace();
      restore->set_seq(restore_->manifest.seq());
      *restore->mutable_partitions() = restore_->manifest.partitions();
      restore_root = restore_->root;
    }
  }
  if (restore.has_value()) {
    absl::MutexLock l(&mu_);
    restore_op_ = LongOp{restore->seq(), 0, static_cast<int>(targets.size()), clock_->Now()};
  }
  // Outgoing RPCs without the lock. Stubs live as long as the server.
  absl::Status sent =
      SendPlacement(view, targets, restore.has_value() ? &*restore : nullptr, restore_root, [&] {
        absl::MutexLock l(&mu_);
        ++restore_op_.done;
        LOG(INFO) << "restoring checkpoint " << restore->seq() << ": " << restore_op_.done << " of "
                  << restore_op_.total << " pserver(s) loaded their partitions";
      });
  if (absl::IsUnavailable(sent)) {
    LOG(WARNING) << sent.message() << "; will retry";
    return;
  }
  if (!sent.ok()) {
    absl::MutexLock l(&mu_);
    FinishJobLocked(proto::JOB_FAILED, std::string(sent.message()));
    return;
  }
  uint64_t ticket = 0;
  {
    absl::MutexLock l(&mu_);
    restore_op_ = LongOp();
    nodes_.CommitPlacement(view);
    restore_.reset();
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
  uint64_t ticket = 0;
  absl::StatusOr<proto::RegisterResponse> r = RegisterUnpersisted(req, peer, who, &ticket);
  STRATA_RETURN_IF_ERROR(AwaitPersisted(ticket));  // before the node learns its id
  return r;
}

absl::StatusOr<proto::RegisterResponse> MasterServer::RegisterUnpersisted(
    const proto::RegisterRequest& req, const std::string& peer, const Identity& who,
    uint64_t* ticket) {
  STRATA_ASSIGN_OR_RETURN(const std::string identity, RegistrationIdentity(req, peer, who));
  absl::MutexLock l(&mu_);
  STRATA_RETURN_IF_ERROR(nodes_.CheckReplaceable(req, identity, peer));
  // A restarted instance replaces its predecessor.
  for (uint32_t id : nodes_.LiveInstances(req.role(), req.index())) {
    if (auto d = nodes_.DeclareDead(id, "a new instance registered", job_.over())) {
      DepartedLocked(*d);
    }
  }
  const proto::NodeInfo n = nodes_.Add(req, identity, peer);
  UpdateJobStateLocked();
  *ticket = PersistLocked();
  proto::RegisterResponse resp;
  resp.set_node_id(n.id());
  *resp.mutable_view() = nodes_.View();
  *resp.mutable_data_key() = nodes_.DataKey(n.id());
  return resp;
}

absl::Status MasterServer::CheckNodeCaller(uint32_t node_id, const Identity& who) {
  return nodes_.CheckCaller(node_id, who);
}

absl::StatusOr<proto::HeartbeatResponse> MasterServer::Heartbeat(
    const proto::HeartbeatRequest& req) {
  absl::MutexLock l(&mu_);
  STRATA_ASSIGN_OR_RETURN(NodeManager::Beat beat, nodes_.Heartbeat(req));
  proto::HeartbeatResponse resp;
  resp.set_epoch(beat.epoch);
  resp.set_job_state(job_.state());
  if (beat.drained) {  // it leaves
    resp.set_drained(true);
    return resp;
  }
  if (beat.role == proto::PSERVER) {
    job_.RecordApplies(req.node_id(), req.applies(), req.apply_seconds());
  }
  // A live worker keeps its data-task leases.
  if (beat.role == proto::WORKER) tasks_.RenewLeases(req.node_id(), clock_->Now());
  *resp.mutable_data_key() = std::move(beat.key);
  return resp;
}

proto::ClusterView MasterServer::View() { return nodes_.View(); }

absl::StatusOr<proto::LeaseTaskResponse> MasterServer::LeaseTask(
    const proto::LeaseTaskRequest& req) {
  // The update ledger is read before anyone evaluates, so that the summary
  // written at the end has it (the background tick takes it too, but an
  // evaluation may end before its next turn).
  TakeLedger();
  uint64_t ticket = 0;
  absl::StatusOr<proto::LeaseTaskResponse> r = LeaseTaskUnpersisted(req, &ticket);
  STRATA_RETURN_IF_ERROR(AwaitPersisted(ticket));  // before the worker hears of its task
  return r;
}

absl::StatusOr<proto::LeaseTaskResponse> MasterServer::LeaseTaskUnpersisted(
    const proto::LeaseTaskRequest& req, uint64_t* ticket) {
  absl::MutexLock l(&mu_);
  if (nodes_.IsDrainedWorker(req.node_id())) {
    // Drained, and asking again (its answer was lost): the same answer,
    // so that it leaves rather than fails and is restarted.
    proto::LeaseTaskResponse resp;
    resp.set_outcome(proto::LeaseTaskResponse::DONE);
    resp.set_drained(true);
    return resp;
  }
  STRATA_ASSIGN_OR_RETURN(const proto::NodeInfo n, nodes_.LiveWorker(req.node_id()));
  proto::LeaseTaskResponse resp;
  if (!nodes_.ready() || job_.state() == proto::JOB_WAITING) {
    resp.set_outcome(proto::LeaseTaskResponse::WAIT);
    return resp;
  }
  if (job_.over()) {
    resp.set_outcome(proto::LeaseTaskResponse::DONE);
    return resp;
  }
  // Where the task's batches start (bsp), unless the worker is coming back
  // from the finished ones (the steps went on without it).
  std::optional<uint64_t> first_step;
  if (req.has_next_step() && n.state() == proto::ALIVE) first_step = req.next_step();
  // A worker holds one data task at a time and asks for the next once it
  // has completed it. One that asks while it still holds a task never got
  // the answer that leased it (this master went down between recording the
  // lease and answering): it gets that task again, else the task would
  // stay leased to a live worker that does not know it, and the job would
  // never finish.
  std::optional<proto::DataTask> task = tasks_.Held(n.id(), clock_->Now(), first_step);
  if (task.has_value()) {
    LOG(WARNING) << "worker " << n.index() << " (node " << n.id() << ") asks for a task "
                 << "but holds data task " << task->id() << ": its lease answer was lost; "
                 << "the same task again";
  } else if (n.draining()) {
    // Drained: its last data task is done; it leaves, the job goes on.
    nodes_.WorkerDrained(n.id());
    UpdateJobStateLocked();
    *ticket = PersistLocked();
    resp.set_outcome(proto::LeaseTaskResponse::DONE);
    resp.set_drained(true);
    return resp;
  } else {
    task = tasks_.Lease(n.id(), clock_->Now(), first_step);
  }
  if (task.has_value()) {
    // (A finished worker is back in the step set.)
    if (n.state() == proto::FINISHED) nodes_.SetWorkerState(n.id(), proto::ALIVE);
    *ticket = PersistLocked();
    resp.set_outcome(proto::LeaseTaskResponse::TASK);
    *resp.mutable_task() = *task;
    return resp;
  }
  // No training work left for this worker: it leaves the step set.
  if (n.state() == proto::ALIVE) nodes_.SetWorkerState(n.id(), proto::FINISHED);
  UpdateJobStateLocked();
  // The evaluation waits for the ledger (a moment: LeaseTask reads it),
  // unless the pservers do not answer for it within 10 s.
  if (job_.state() == proto::JOB_EVALUATING && !checkpoints_->final_pending() &&
      job_.ReadyToEvaluate()) {
    if (const uint32_t ev = job_.evaluator(); ev == 0 || !nodes_.InJob(ev)) {
      job_.set_evaluator(n.id());  // none yet, or it left
    }
    if (job_.evaluator() == n.id()) {
      resp.set_outcome(proto::LeaseTaskResponse::EVALUATE);
      resp.set_min_version(
          options_.config.job.consistency == Consistency::kBsp ? job_.max_last_step() + 1 : 0);
      return resp;
    }
  }
  resp.set_outcome(proto::LeaseTaskResponse::WAIT);
  return resp;
}

absl::Status MasterServer::CompleteTask(const proto::CompleteTaskRequest& req) {
  uint64_t ticket = 0;
  {
    absl::MutexLock l(&mu_);
    STRATA_ASSIGN_OR_RETURN(const proto::NodeInfo n, nodes_.LiveWorker(req.node_id()));
    STRATA_RETURN_IF_ERROR(tasks_.Complete(n.id(), req.task_id(), req.last_step(), req.records()));
    job_.TaskCompleted(req.last_step());
    UpdateJobStateLocked();
    ticket = PersistLocked();
  }
  return AwaitPersisted(ticket);  // before the worker hears that its task is done
}

absl::Status MasterServer::ReportProgress(const proto::ReportProgressRequest& req) {
  absl::MutexLock l(&mu_);
  STRATA_ASSIGN_OR_RETURN(const proto::NodeInfo n, nodes_.LiveWorker(req.node_id()));
  if (req.has_test_accuracy() && n.id() != job_.evaluator()) {
    return absl::FailedPreconditionError(
        absl::StrCat("node ", n.id(), " reported a test accuracy but is not the evaluator"));
  }
  job_.RecordProgress(n.id(), req);
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
  if (!options_.summary_path.empty()) {
    absl::Status s =
        options_.fs->WriteFileAtomic(options_.summary_path, SummaryJson(SummaryLocked()));
    if (!s.ok())
      LOG(ERROR) << "cannot write summary: " << s;
    else
      LOG(INFO) << "wrote " << options_.summary_path;
  }
}

void MasterServer::SampleHistoryLocked(bool force) {
  job_.SampleHistory(force, [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {  // (called here, under mu_)
    return JobStatusLocked();
  });
}

proto::JobStatus MasterServer::JobStatusLocked() const {
  proto::JobStatus js;
  job_.FillStatus(nodes_.View(), &js);
  js.set_epoch(tasks_.current_epoch());
  js.set_tasks_total(tasks_.total());
  js.set_tasks_done(tasks_.done());
  // Where bring-up stands, and what runs now.
  const int pservers = nodes_.Count(proto::PSERVER, false);
  const int workers = nodes_.Count(proto::WORKER, true);
  js.set_pservers_registered(pservers);
  js.set_pservers_expected(options_.expected_pservers);
  js.set_workers_registered(workers);
  js.set_workers_expected(options_.expected_workers);
  js.set_phase(PhaseLocked(pservers, workers));
  js.set_security(options_.security.plaintext                   ? options_.security.ModeString()
                  : options_.config.security.encrypt_data_plane ? "mtls, data plane sealed"
                                                                : "mtls");
  if (sink_->auditing()) {
    const storage::AuditHead head = sink_->audit_head();  // (a leaf lock)
    js.set_audit_records(head.seq);
    js.set_audit_head(head.hash);
  }
  checkpoints_->FillStatus(&js);
  nodes_.FillStatus(&js);
  js.set_tasks_requeued(tasks_requeued_);
  return js;
}

std::string MasterServer::PhaseLocked(int pservers, int workers) const {
  const proto::JobState state = job_.state();
  if (state == proto::JOB_RUNNING) {
    return absl::StrFormat("training: epoch %d of %d, %d of %d data tasks",
                           std::min(tasks_.current_epoch() + 1, options_.config.job.epochs),
                           options_.config.job.epochs, tasks_.done(), tasks_.total());
  }
  if (state != proto::JOB_WAITING) return JobStateName(state);
  if (pservers < options_.expected_pservers) {
    return absl::StrCat("waiting for pservers: ", pservers, " of ", options_.expected_pservers,
                        " registered");
  }
  const bool placed = nodes_.placed();
  if (!placed && restore_op_.seq > 0) {
    return absl::StrFormat("restoring checkpoint %d: %d of %d pserver(s) loaded", restore_op_.seq,
                           restore_op_.done, restore_op_.total);
  }
  if (!placed) {
    return absl::StrCat("placing ", nodes_.tables(), " table(s) on ", pservers, " pserver(s)");
  }
  return absl::StrCat("waiting for workers: ", workers, " of ", options_.expected_workers,
                      " registered");
}

proto::GetStatusResponse MasterServer::GetStatus() {
  absl::MutexLock l(&mu_);
  proto::GetStatusResponse resp;
  *resp.mutable_view() = nodes_.StatusView();
  *resp.mutable_job() = JobStatusLocked();
  return resp;
}

proto::JobSummary MasterServer::SummaryLocked() const {
  const proto::JobStatus js = JobStatusLocked();
  proto::JobSummary s = job_.Summary(js, nodes_.View());
  checkpoints_->FillSummary(&s);
  if (options_.config.checkpoint.enabled)
    s.set_resumed_from(static_cast<double>(js.resumed_from_seq()));
  nodes_.FillSummary(&s);
  s.set_tasks_requeued(static_cast<double>(tasks_requeued_));
  s.set_records_requeued(static_cast<double>(records_requeued_));
  s.set_records_done(static_cast<double>(tasks_.RecordsDone()));
  return s;
}

bool MasterServer::WaitForJobEnd(absl::Duration timeout) { return job_.AwaitEnd(timeout); }

void MasterServer::RegisterMetrics() {
  AddProcessMetrics(&metrics_);
  checkpoints_->RegisterMetrics(&metrics_);
  nodes_.RegisterMetrics();
  auto locked = [this](auto fn) {
    return [this, fn]() {
      absl::MutexLock l(&mu_);
      return static_cast<double>(fn());
    };
  };
  metrics_.AddCallbackGauge(
      "strata_master_tasks_total", "Data tasks of the job",
      locked([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return tasks_.total(); }));
  metrics_.AddCallbackGauge(
      "strata_master_tasks_done", "Data tasks completed",
      locked([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return tasks_.done(); }));
  metrics_.AddCallbackGauge(
      "strata_master_tasks_leased", "Data tasks leased now",
      locked([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return tasks_.leased(); }));
  metrics_.AddCallbackGauge("strata_job_samples_per_second", "Job training throughput",
                            locked([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
                              return JobStatusLocked().samples_per_sec();
                            }));
  metrics_.AddCallbackGauge(
      "strata_job_comm_share", "Share of worker step time waiting on push/pull",
      locked([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return JobStatusLocked().comm_share(); }));
  metrics_.AddCallbackGauge(
      "strata_job_samples", "Samples trained",
      locked([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return JobStatusLocked().samples(); }));
}

// Checkpoints (master/checkpoint_coordinator.h): the coordinator's calls,
// and the master's part of them.

absl::StatusOr<proto::CheckpointResponse> MasterServer::Checkpoint(const std::string& reason,
                                                                   bool stop_after) {
  return checkpoints_->Checkpoint(reason, stop_after);
}

bool MasterServer::CheckpointAndStopWithin(absl::Duration grace) {
  LOG(INFO) << "SIGTERM: checkpointing before stopping (grace " << absl::FormatDuration(grace)
            << ")";
  // The checkpoint runs on a thread of its own, which outlives this call
  // when it takes too long (the caller then exits the process).
  auto done = std::make_shared<absl::Notification>();
  std::thread([this, done] {
    auto r = Checkpoint("sigterm on master", /*stop_after=*/true);
    if (!r.ok()) LOG(WARNING) << "no checkpoint before stopping: " << r.status();
    done->Notify();
  }).detach();
  return done->WaitForNotificationWithTimeout(grace);
}

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
    absl::StatusOr<proto::CheckpointResponse> c = Checkpoint(reason, /*stop_after=*/true);
    if (!c.ok()) {
      return absl::Status(
          c.status().code(),
          absl::StrCat("not stopped: the checkpoint before the stop failed (", c.status().message(),
                       "); the job goes on (stop without one: no_checkpoint)"));
    }
    resp.set_checkpointed(true);
    *resp.mutable_checkpoint() = std::move(*c);
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
  std::vector<uint64_t> done(m.tasks_done().begin(), m.tasks_done().end());
  std::vector<std::pair<uint64_t, int64_t>> partial;
  for (const auto& t : m.tasks_partial()) partial.emplace_back(t.id(), t.trained_records());
  STRATA_RETURN_IF_ERROR(tasks_.Resume(done, partial));
  restore_ = r;
  job_.Resume(m.seq(), m.samples(), m.step() > 0 ? m.step() - 1 : 0);
  nodes_.ReserveNodeIds(m.next_node_id());
  LOG(INFO) << "resuming from checkpoint " << m.seq() << " (" << m.reason() << ", step " << m.step()
            << "): " << tasks_.done() << " of " << tasks_.total() << " data tasks done, "
            << partial.size() << " partly";
  return absl::OkStatus();
}

CheckpointCoordinator::Master::Cluster MasterServer::CheckpointCluster(bool with_view) {
  absl::MutexLock l(&mu_);
  Cluster c;
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
  if (with_view) c.view = nodes_.View();
  c.owners = nodes_.Owners();
  return c;
}

void MasterServer::FillManifestTasks(std::optional<uint64_t> cut_step,
                                     proto::CheckpointManifest* m) {
  absl::MutexLock l(&mu_);
  const TaskScheduler::Cut cut = tasks_.CutAt(cut_step, options_.config.job.batch_size);
  for (uint64_t id : cut.done) m->add_tasks_done(id);
  for (const auto& [id, records] : cut.partial) {
    proto::CheckpointTask* t = m->add_tasks_partial();
    t->set_id(id);
    t->set_trained_records(records);
  }
  // The samples in the parameters at the cut: the records of the tasks
  // done and of the parts trained.
  uint64_t samples = 0;
  for (uint64_t id : cut.done) samples += tasks_.RecordsOf(id);
  for (const auto& [id, records] : cut.partial) samples += records;
  m->set_samples(samples);
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
