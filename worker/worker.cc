#include "worker/worker.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/daemon.h"
#include "common/daemon_env.h"
#include "common/data_tasks.h"
#include "common/error_reason.h"
#include "common/grpc_channel.h"
#include "common/grpc_status.h"
#include "common/initializer.h"
#include "common/model_spec.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "storage/checkpoint_format.h"
#include "storage/ring_checkpoint.h"
#include "transport/data_plane_auth.h"
#include "transport/transport_metrics.h"
#include "worker/ctr_trainer.h"
#include "worker/mlp_trainer.h"

namespace strata::worker {

// Leases tasks from the master over gRPC.
class Worker::MasterTaskSource : public TaskSource {
 public:
  explicit MasterTaskSource(Worker* w) : w_(w) {}
  absl::StatusOr<Lease> Next() override {
    proto::LeaseTaskRequest req;
    req.set_node_id(w_->node_id_);
    if (w_->options_.config.job.consistency == Consistency::kBsp && w_->stats().steps > 0) {
      // Where this task's batches start: a checkpoint's cut needs it.
      req.set_has_next_step(true);
      req.set_next_step(w_->next_step_);
    }
    w_->lease_had_next_step_ = req.has_next_step();
    req.set_cannot_evaluate(w_->cannot_evaluate_);
    proto::LeaseTaskResponse resp;
    STRATA_RETURN_IF_ERROR(w_->CallMaster(
        [&](grpc::ClientContext* ctx) { return w_->master()->LeaseTask(ctx, req, &resp); }));
    return Lease{resp.outcome(), resp.task(), resp.min_version(), resp.drained(),
                 resp.batch_size()};
  }
  absl::Status Complete(const proto::DataTask& task, int64_t records, uint64_t last_step) override {
    proto::CompleteTaskRequest req;
    req.set_node_id(w_->node_id_);
    req.set_task_id(task.id());
    req.set_records(records);
    req.set_last_step(last_step);
    proto::CompleteTaskResponse resp;
    return w_->CallMaster(
        [&](grpc::ClientContext* ctx) { return w_->master()->CompleteTask(ctx, req, &resp); });
  }

 private:
  Worker* const w_;  // owns this source
};

namespace {

// Workers one host's aggregation segment has room for (a slot each; tmpfs
// gives pages only to the slots used).
constexpr uint32_t kHostSlots = 64;

// The worker's device from worker.* in the config (docs/gpu.md).
absl::StatusOr<std::unique_ptr<Device>> ChooseDevice(const WorkerOptions& options) {
  const WorkerSection& w = options.config.worker;
  DeviceChoice choice;
  choice.device = w.device;
  choice.gpu = w.gpu;
  STRATA_ASSIGN_OR_RETURN(choice.precision, ParsePrecision(w.precision));
  choice.cpu_threads = options.cpu_threads;
  std::string note;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Device> device, NewDevice(choice, &note));
  LOG(INFO) << (note.empty() ? absl::StrCat("device: ", device->Describe()) : note);
  return device;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Worker>> Worker::Create(WorkerOptions options) {
  if (options.fs == nullptr) return absl::InvalidArgumentError("WorkerOptions.fs is required");
  if (options.master_address.empty() && !options.local_only) {
    return absl::InvalidArgumentError("worker: master address is required");
  }
  STRATA_RETURN_IF_ERROR(ParseActivation(options.config.model.activation).status());
  // The device first: a worker told to use a GPU it does not have fails
  // here, saying why, before it loads anything.
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Device> device, ChooseDevice(options));
  const bool ctr = options.config.model.type == "wide_deep";
  if (ctr && options.local_only) {
    return absl::UnimplementedError(
        "training a wide_deep model alone (--local) is not supported: its sparse tables "
        "live on pservers");
  }
  if (options.config.model.type == "script" && !options.script) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.config.source,
                     ": model.type script is trained by the training script of "
                     "worker.command, not by strata-worker's built-in models"));
  }
  std::unique_ptr<Worker> worker(new Worker(std::move(options), std::move(device)));
  // The model family, chosen here once: nothing else asks which it is.
  if (worker->options_.script) {
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<ScriptTrainer> script,
                            ScriptTrainer::Create(worker.get()));
    worker->script_ = script.get();
    worker->trainer_ = std::move(script);
    return worker;
  }
  STRATA_ASSIGN_OR_RETURN(worker->trainer_,
                          ctr ? CtrTrainer::Create(worker.get(), worker->device_.get())
                              : MlpTrainer::Create(worker.get(), worker->device_.get()));
  return worker;
}

Worker::Worker(WorkerOptions options, std::unique_ptr<Device> device)
    : options_(std::move(options)), device_(std::move(device)) {
  tasks_ = std::move(options_.task_source);
}

Worker::~Worker() {
  Shutdown();
  // (Again: one started after a Shutdown; its thread pushes through
  // params_, which uses members destroyed before aggregator_ is.)
  if (aggregator_ != nullptr) aggregator_->Stop();
  AwaitRingWriter(/*close=*/true);
  // (The trainer outlives the members below it: its exchanges go now.)
  if (script_ != nullptr) script_->DropExchanges();
}

void Worker::Shutdown() {
  if (shutdown_.exchange(true)) return;
  stop_.Notify();
  if (params_) params_->Cancel();
  if (heartbeat_.joinable()) heartbeat_.join();
  // (A ring step the aggregator's thread waits in ends now, not at the
  // ring's timeout: the member it waits for may have left with the job.)
  if (dense_sync_ != nullptr) dense_sync_->Abort(absl::CancelledError("the worker is stopping"));
  http_.Shutdown();
  if (transport_) transport_->Shutdown();
  if (aggregator_ != nullptr) aggregator_->Stop();
  // (After the aggregator's thread, which steps a hierarchical ring: a
  // shard cut after this is written in place.)
  AwaitRingWriter(/*close=*/true);
  if (trace_ != nullptr) {
    if (absl::Status s = trace_->Close(); !s.ok()) LOG(WARNING) << s;
  }
}

absl::Time Worker::TraceSpan(const char* name, const char* category, absl::Time from,
                             const std::string& args) {
  const absl::Time now = absl::Now();
  if (trace_ != nullptr && now > from) trace_->Span(name, category, 1, from, now, args);
  return now;
}

Worker::Stats Worker::stats() const {
  absl::MutexLock l(&mu_);
  return stats_;
}

void Worker::RegisterModelMemory() {
  // The parameter tensors are where pulls land, the gradient tensors what
  // pushes send: registered once, an rdma pull response is written straight
  // into the parameters and a push is sent straight from the gradients (a
  // no-op on tcp).
  using Use = transport::Transport::MemoryUse;
  absl::Status registered;
  for (const auto& table : trainer_->params()) {
    if (!registered.ok()) break;
    if (table.empty()) continue;  // a sparse table: its rows come per batch
    registered = transport_->RegisterMemory(const_cast<float*>(table.data()),
                                            table.size() * sizeof(float), Use::kReceiveDestination);
  }
  for (const auto& table : trainer_->grads()) {
    if (!registered.ok()) break;
    if (table.empty()) continue;
    // Registration pins the memory; kSendSource lets nothing write to it.
    registered = transport_->RegisterMemory(const_cast<float*>(table.data()),
                                            table.size() * sizeof(float), Use::kSendSource);
  }
  if (!registered.ok()) {
    LOG(WARNING) << "worker " << options_.index
                 << ": pushes and pulls will be copied: " << registered.message();
  }
}

absl::Status Worker::Start() {
  // An mtls cluster's data plane serves members only (docs/security.md).
  transport::TransportOptions topts = options_.transport;
  if (!options_.security.plaintext && !options_.local_only) {
    membership_ = std::make_shared<transport::MembershipKeys>();
    topts.membership = membership_;
    topts.encrypt_data_plane = options_.config.security.encrypt_data_plane;
  }
  STRATA_ASSIGN_OR_RETURN(transport_, transport::CreateTransport(topts));
  RegisterModelMemory();
  const bool allreduce = options_.config.model.dense_sync == "allreduce" && !options_.local_only;
  const bool staged = options_.config.model.stages > 1 && !options_.local_only;
  if (allreduce || staged) STRATA_RETURN_IF_ERROR(ListenForPeers());
  if (!options_.trace_path.empty()) {
    STRATA_ASSIGN_OR_RETURN(trace_, TraceWriter::Open(options_.trace_path, options_.index + 1,
                                                      absl::StrCat("worker ", options_.index)));
    trace_->ThreadName(1, "steps");
    trace_->ThreadName(2, "push requests");
    trace_->ThreadName(3, "pull requests");
  }
  step_compute_seconds_ = metrics_.GetHistogram(
      "strata_worker_step_seconds",
      "Time of a training step by phase: compute (forward, backward, batch assembly) and "
      "wait (on pushes and pulls)",
      Histogram::LatencyBounds(), {{"phase", "compute"}});
  step_wait_seconds_ = metrics_.GetHistogram("strata_worker_step_seconds", "",
                                             Histogram::LatencyBounds(), {{"phase", "wait"}});
  samples_per_second_ =
      metrics_.GetGauge("strata_worker_samples_per_second",
                        "Samples trained per second over the last progress window");
  comm_share_ = metrics_.GetGauge("strata_worker_comm_share",
                                  "Share of step time spent waiting on pushes and pulls, so far");
  AddProcessMetrics(&metrics_);
  if (options_.http_port >= 0) {
    metrics_.GetGauge("strata_worker_up", "1 while the worker runs")->Set(1);
    auto stat = [this](double Stats::*field) { return [this, field]() { return stats().*field; }; };
    metrics_.AddCallbackGauge("strata_worker_steps", "Training steps done",
                              [this] { return static_cast<double>(stats().steps); });
    metrics_.AddCallbackGauge("strata_worker_samples", "Samples trained",
                              [this] { return static_cast<double>(stats().samples); });
    metrics_.AddCallbackGauge("strata_worker_stale_pushes", "Gradients dropped as stale",
                              [this] { return static_cast<double>(stats().stale_pushes); });
    metrics_.AddCallbackGauge("strata_worker_busy_seconds", "Time in training steps",
                              stat(&Stats::busy_seconds));
    metrics_.AddCallbackGauge("strata_worker_comm_seconds", "Time waiting on push/pull",
                              stat(&Stats::comm_seconds));
    metrics_.AddCallbackGauge("strata_worker_loss", "Recent mean training loss",
                              stat(&Stats::recent_loss));
    transport::AddTransportGauges(&metrics_, "strata_worker", [this] { return transport_.get(); });
    trainer_->AddMetrics(&metrics_);
    ServeStandardEndpoints(&http_, &metrics_, [this] {
      Stats s = stats();
      return HttpResponse{
          200, "application/json",
          absl::StrFormat("{\"node_id\": %d, \"index\": %d, \"steps\": %d, "
                          "\"samples\": %d, \"last_step\": %d, \"loss\": %.5f, "
                          "\"comm_share\": %.4f}\n",
                          node_id_.load(), options_.index, s.steps, s.samples, s.last_step,
                          s.recent_loss,
                          s.busy_seconds > 0 ? s.comm_seconds / s.busy_seconds : 0.0)};
    });
    STRATA_RETURN_IF_ERROR(SecureHttp(options_.security, &http_));
    STRATA_RETURN_IF_ERROR(http_.Start(options_.host, options_.http_port));
  }
  if (options_.local_only) return absl::OkStatus();
  agent_ = std::make_unique<NodeAgent>(NodeAgent::DaemonOptions(
      options_.config.cluster, options_.master_address, options_.security.client,
      absl::StrCat("worker ", options_.index), membership_));
  proto::RegisterRequest req;
  req.set_role(proto::WORKER);
  req.set_job(options_.config.job.name);
  req.set_index(options_.index);
  req.set_host(options_.host);
  req.set_http_port(options_.http_port >= 0 ? http_.port() : 0);
  if (allreduce || staged) req.set_data_address(transport_->listen_address());
  STRATA_ASSIGN_OR_RETURN(proto::RegisterResponse resp,
                          agent_->Register(req, options_.register_timeout, stop_));
  node_id_ = resp.node_id();
  if (allreduce) STRATA_RETURN_IF_ERROR(StartDenseSync(resp.ring_restore()));
  params_ = std::make_unique<ParamClient>(
      transport_.get(), node_id_, [this] { return FetchView(); },
      absl::Milliseconds(options_.config.cluster.request_timeout_ms));
  params_->SetView(resp.view());
  params_->SetMetrics(&metrics_);
  if (trace_ != nullptr) params_->SetTracer(trace_.get());
  params_->SetSuspectReporter(
      [this](uint32_t node, const std::string& why) {
        // One report per pserver per heartbeat interval is plenty. (Called
        // by the training thread and the host aggregator's.)
        const absl::Time now = absl::Now();
        absl::MutexLock l(&suspect_mu_);
        absl::Time& last = suspect_reported_[node];
        if (now - last < absl::Milliseconds(options_.config.cluster.heartbeat_interval_ms)) return;
        last = now;
        absl::Status s = agent_->ReportSuspect(node, why, absl::Seconds(1));
        if (!s.ok()) {
          LOG_EVERY_N(WARNING, 10) << "cannot report pserver node " << node << ": " << s;
        }
      },
      // Half the dead timeout: a paused or cut-off pserver is reported well
      // before its heartbeats (if they stop at all) would tell.
      absl::Milliseconds(options_.config.cluster.dead_timeout_ms / 2),
      absl::Milliseconds(std::max(100, options_.config.cluster.heartbeat_interval_ms)));
  if (tasks_ == nullptr) tasks_ = std::make_unique<MasterTaskSource>(this);
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  LOG(INFO) << "worker " << options_.index << " is node " << node_id_ << "; http port "
            << http_.port() << "; " << trainer_->DescribeData();
  return absl::OkStatus();
}

absl::Status Worker::CallMaster(const std::function<grpc::Status(grpc::ClientContext*)>& call) {
  return agent_->Call(call, &stop_);
}

absl::Status Worker::RequestCheckpointAndStop(absl::Duration grace) {
  return AskMasterToCheckpointAndStop(master().get(), options_.master_address,
                                      absl::StrCat("worker ", options_.index), grace);
}

absl::StatusOr<proto::ClusterView> Worker::FetchView() {
  proto::ClusterView view;
  STRATA_RETURN_IF_ERROR(CallMaster([&](grpc::ClientContext* ctx) {
    return master()->GetClusterView(ctx, proto::GetClusterViewRequest(), &view);
  }));
  return view;
}

void Worker::HeartbeatLoop() {
  const absl::Duration interval = absl::Milliseconds(options_.config.cluster.heartbeat_interval_ms);
  while (!stop_.WaitForNotificationWithTimeout(interval)) {
    proto::HeartbeatRequest req;
    req.set_epoch(params_->epoch());
    std::set<uint64_t> sent;  // the ring checkpoint answers this beat carries
    if (dense_ring_ != nullptr) {
      req.set_evaluating(evaluating_.load());  // (the progress report may be lost)
      req.set_ring_updates(ring_updates_.load());
      absl::MutexLock l(&ring_ckpt_mu_);
      for (const auto& r : ring_reports_) {
        *req.add_ring_checkpoints() = r;
        sent.insert(r.id());
      }
    }
    proto::HeartbeatResponse resp;
    absl::Status s = agent_->Heartbeat(std::move(req), interval, &resp);
    if (s.ok() && dense_ring_ != nullptr) {
      // An answer goes on in the heartbeats until the master asks for a
      // newer one, or asks for none once it has had the answer. (One made
      // after this beat left goes on: the ring may have learned of the
      // ask before this worker's heartbeats did.)
      absl::MutexLock l(&ring_ckpt_mu_);
      ring_ask_ = resp.ring_checkpoint();
      const uint64_t asked = ring_ask_.id();
      ring_reports_.erase(std::remove_if(ring_reports_.begin(), ring_reports_.end(),
                                         [&](const proto::RingCheckpointReport& r) {
                                           return r.id() < asked ||
                                                  (asked == 0 && sent.count(r.id()) > 0);
                                         }),
                          ring_reports_.end());
    }
    if (HasReason(s, proto::REASON_DECLARED_DEAD)) {
      LOG(ERROR) << s;
      declared_dead_ = true;
      continue;
    }
    if (!s.ok()) {
      LOG_EVERY_N(WARNING, 10) << "heartbeat failed: " << s;
      continue;
    }
    const bool evaluating = resp.job_state() == proto::JOB_EVALUATING && resp.evaluator() != 0;
    if (dense_sync_ != nullptr && !ring_aborted_ &&
        (resp.job_state() == proto::JOB_SUCCEEDED || evaluating)) {
      // Training is over: a step this worker idles in (it waits for tasks)
      // may wait on the member that evaluates, for as long as its test
      // pass takes, or that evaluated and left; it ends now, and the
      // training thread asks the master what to do. (Only once the
      // evaluator is in its ring with the trained model and says so,
      // after the final checkpoint, whose ring shards are cut in the
      // steps: no member trains after that. A stopped or failed job's
      // members finish their step and hear of it from the master.)
      ring_aborted_ = true;
      const std::string why =
          evaluating
              ? absl::StrCat("training is over (node ", resp.evaluator(), " evaluates)")
              : absl::StrCat("the job is over (", proto::JobState_Name(resp.job_state()), ")");
      LOG(INFO) << "worker " << options_.index << ": " << why << ": no dense allreduce step "
                << "from now on";
      dense_sync_->Abort(absl::CancelledError(absl::StrCat("dense allreduce: ", why)));
    }
    // (A ring's member checks each newer view itself: the parameter
    // client may have taken it already.)
    if (resp.epoch() != params_->epoch() ||
        (dense_sync_ != nullptr && resp.epoch() > ring_view_checked_)) {
      // One try: this thread must go on heartbeating.
      proto::ClusterView view;
      if (agent_->FetchView(interval, &view).ok()) {
        params_->SetView(view);
        if (dense_sync_ != nullptr) {
          // A ring member gone (dead, drained): this worker's wait in its
          // step ends now. (Every worker in the job, not only the hosts'
          // members of a hierarchical ring: one handing its seat to a
          // lower node id steps on until the ring forms without it.)
          std::vector<uint32_t> in_job;
          for (const DenseSync::Member& m : DenseRing::MembersOf(view)) {
            in_job.push_back(m.node_id);
          }
          dense_sync_->AbortIfLeft(view.epoch(), in_job);
          ring_view_checked_ = std::max(ring_view_checked_, view.epoch());
        }
      }
    }
  }
}

absl::StatusOr<proto::DeclareTablesResponse> Worker::CallDeclareTables(
    const std::vector<TableSpec>& tables, bool initialised) {
  proto::DeclareTablesRequest req;
  req.set_node_id(node_id_);
  req.set_initialised(initialised);
  for (const TableSpec& t : tables) {
    proto::TableInfo* d = req.add_tables();
    d->set_name(t.name);
    for (uint64_t e : t.shape) d->add_shape(e);
    d->set_sparse(t.sparse);
    d->set_dim(static_cast<uint32_t>(t.dim));
  }
  proto::DeclareTablesResponse resp;
  STRATA_RETURN_IF_ERROR(CallMaster(
      [&](grpc::ClientContext* ctx) { return master()->DeclareTables(ctx, req, &resp); }));
  return resp;
}

absl::Status Worker::DeclareTables(std::vector<TableSpec> tables) {
  if (script_ == nullptr || !ScriptDeclaresTables(options_.config.model)) {
    return absl::FailedPreconditionError(
        absl::StrCat(options_.config.source,
                     " declares the job's tables (model.tables): the script's model "
                     "must match them, it does not declare its own"));
  }
  // The master's check first: tables it refuses are not this worker's.
  STRATA_RETURN_IF_ERROR(CallDeclareTables(tables, false).status());
  const bool first = !script_->declared().HasBeenNotified();
  STRATA_RETURN_IF_ERROR(script_->Declare(std::move(tables)));
  if (first) RegisterModelMemory();
  return absl::OkStatus();
}

absl::Status Worker::ShareInitialValues(absl::Time deadline) {
  if (script_ == nullptr || !script_->declared().HasBeenNotified()) {
    return absl::FailedPreconditionError("no tables declared (DeclareTables) to share values of");
  }
  while (!stop_.HasBeenNotified()) {
    STRATA_ASSIGN_OR_RETURN(proto::DeclareTablesResponse resp,
                            CallDeclareTables(script_->tables(), false));
    if (resp.initialised()) {
      script_->ValuesIn();
      return absl::OkStatus();
    }
    if (resp.initialise()) {
      STRATA_ASSIGN_OR_RETURN(proto::ClusterView view, FetchView());
      if (view.partitions_size() > 0) {  // placed: the pservers hold the partitions
        params_->SetView(view);
        STRATA_RETURN_IF_ERROR(params_->PushInitialValues(script_->params()));
        STRATA_ASSIGN_OR_RETURN(resp, CallDeclareTables(script_->tables(), true));
        if (resp.initialised()) {
          LOG(INFO) << "worker " << options_.index << ": its model's values initialise the job's "
                    << script_->tables().size() << " table(s)";
          script_->ValuesIn();
          return absl::OkStatus();
        }
      }
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError("the tables' initial values are not in yet");
    }
    stop_.WaitForNotificationWithTimeout(absl::Milliseconds(200));
  }
  return absl::CancelledError("worker shut down");
}

absl::Status Worker::WaitForReadyView() {
  if (agent_ == nullptr) return absl::OkStatus();
  // Tables the script declares: known here once it has (distribute()),
  // and pulled into only once its values are shared (the script writes
  // them until then).
  while (script_ != nullptr && !script_->values_in().HasBeenNotified()) {
    if (stop_.WaitForNotificationWithTimeout(absl::Milliseconds(100))) {
      return absl::CancelledError("worker shut down");
    }
  }
  while (!stop_.HasBeenNotified()) {
    STRATA_ASSIGN_OR_RETURN(proto::ClusterView view, FetchView());
    if (view.ready()) {
      STRATA_RETURN_IF_ERROR(CheckViewMatchesModel(view));
      params_->SetView(view);
      return absl::OkStatus();
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  return absl::CancelledError("worker shut down");
}

absl::Status Worker::CheckViewMatchesModel(const proto::ClusterView& view) const {
  const std::vector<TableSpec> mine =
      script_ != nullptr ? script_->tables() : ModelTables(options_.config.model);
  std::string mismatch;
  if (static_cast<size_t>(view.tables_size()) != mine.size()) {
    mismatch = absl::StrCat(mine.size(), " tables here, ", view.tables_size(), " in the job");
  }
  for (size_t i = 0; mismatch.empty() && i < mine.size(); ++i) {
    if (view.tables(i).sparse() != mine[i].sparse ||
        (mine[i].sparse && view.tables(i).dim() != static_cast<uint32_t>(mine[i].dim))) {
      mismatch = absl::StrCat(
          "table ", i, " (", mine[i].name, ") is ",
          mine[i].sparse ? absl::StrCat("sparse of dim ", mine[i].dim) : "dense", " here, ",
          view.tables(i).sparse() ? absl::StrCat("sparse of dim ", view.tables(i).dim()) : "dense",
          " in the job");
    } else if (view.tables(i).name() != mine[i].name ||
               view.tables(i).num_elements() != mine[i].num_elements()) {
      mismatch = absl::StrCat("table ", i, " is ", mine[i].name, " of ", mine[i].num_elements(),
                              " elements here, ", view.tables(i).name(), " of ",
                              view.tables(i).num_elements(), " in the job");
    }
  }
  if (!mismatch.empty()) {
    // FailedPrecondition: this worker is misconfigured, the job is not.
    return absl::FailedPreconditionError(absl::StrCat(
        ScriptDeclaresTables(options_.config.model)
            ? "the tables this worker's script declared do not"
            : absl::StrCat(
                  options_.config.model.type == "mlp" ? "model.layers of "
                                                      : "the model section of ",
                  options_.config.source.empty() ? "the worker's config" : options_.config.source,
                  " does not"),
        " match the job at master ", options_.master_address, " (", mismatch,
        "): the worker and the master must use the same model config"));
  }
  for (const auto& p : view.partitions()) {
    if (p.table_id() < mine.size() && mine[p.table_id()].sparse)
      continue;  // checked by ParamClient
    if (p.table_id() >= mine.size() ||
        p.offset() + p.length() > mine[p.table_id()].num_elements()) {
      return absl::FailedPreconditionError(absl::StrCat("cluster view from master ",
                                                        options_.master_address, ": partition ",
                                                        p.id(), " lies outside its table"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<float>>> Worker::PullParams(uint64_t min_version) {
  std::vector<std::vector<float>> tables;
  STRATA_RETURN_IF_ERROR(params_->PullAll(min_version, &tables).status());
  return tables;
}

absl::Status Worker::Run() {
  if (options_.local_only) return RunLocal();
  absl::Status s = RunLoop();
  // (A wait that ended because the host's aggregating thread failed: its
  // error is the cause.)
  if (!s.ok() && aggregator_ != nullptr && aggregator_->failed()) s = aggregator_->fatal();
  if (absl::IsInvalidArgument(s) || absl::IsDataLoss(s) || absl::IsNotFound(s)) {
    // Bad input stops every worker the same way: tell the master so the
    // job fails with the real cause.
    ReportProgress(false, 0, 0, std::string(s.message()));
  }
  return s;
}

absl::Status Worker::StartHostAggregation() {
  const uint64_t key = params_->aggregation_key();
  if (key == 0 || aggregator_ != nullptr) return absl::OkStatus();
  if (stop_.HasBeenNotified()) return absl::CancelledError("worker shut down");
  SparseLayout sparse;
  if (!trainer_->AggregatesOnHost(&sparse)) {
    return absl::FailedPreconditionError(
        absl::StrCat("cluster.aggregation: node is built for model.type mlp and wide_deep; "
                     "this worker trains ",
                     std::string(trainer_->family())));
  }
  std::vector<size_t> sizes;
  for (const auto& t : trainer_->params()) sizes.push_back(t.size());
  STRATA_ASSIGN_OR_RETURN(
      std::unique_ptr<HostSegment> segment,
      HostSegment::Open(HostSegment::NameFor(key, options_.host), sizes, kHostSlots, sparse));
  LOG(INFO) << "worker " << options_.index << ": node-local aggregation through "
            << segment->name();
  aggregator_ = std::make_unique<HostAggregator>(
      std::move(segment), params_.get(),
      HostAggregator::Options{
          node_id_, options_.host, absl::Milliseconds(options_.config.cluster.request_timeout_ms),
          hierarchical() ? dense_ring_.get() : nullptr, hierarchical() ? &ring_tables_ : nullptr},
      sizes);
  aggregator_->Start();
  return absl::OkStatus();
}

absl::Status Worker::RunLoop() {
  STRATA_RETURN_IF_ERROR(WaitForReadyView());
  STRATA_RETURN_IF_ERROR(StartHostAggregation());
  window_start_ = absl::Now();
  while (!stop_.HasBeenNotified()) {
    if (declared_dead_) {
      return absl::AbortedError(
          absl::StrCat("worker ", options_.index, " was declared dead by the master"));
    }
    // (Hierarchical allreduce: the host's ring member gave up re-forming.)
    if (aggregator_ != nullptr) STRATA_RETURN_IF_ERROR(aggregator_->fatal());
    STRATA_ASSIGN_OR_RETURN(TaskSource::Lease lease, tasks_->Next());
    switch (lease.outcome) {
      case proto::LeaseTaskResponse::TASK: {
        if (!lease_had_next_step_ && options_.config.job.consistency == Consistency::kBsp) {
          task_start_unknown_ = lease.task.id();
        }
        task_batch_.store(lease.batch_size, std::memory_order_relaxed);
        STRATA_ASSIGN_OR_RETURN(const int64_t records,
                                trainer_->TrainTask(lease.task, /*local=*/nullptr));
        task_start_unknown_.reset();
        // The task is done when its last gradient is acknowledged: before
        // telling the master (which may then end our part in the step set).
        STRATA_RETURN_IF_ERROR(SettlePush());
        if (absl::Status s = tasks_->Complete(lease.task, records, stats().last_step);
            HasReason(s, proto::REASON_LEASE_LOST)) {
          // The lease went elsewhere (expired while the master could not
          // hear us); the other holder completes it.
          LOG(WARNING) << s;
        } else if (!s.ok()) {
          return s;
        }
        ReportProgress(false, 0, 0);
        break;
      }
      case proto::LeaseTaskResponse::EVALUATE:
        STRATA_RETURN_IF_ERROR(Settle());
        ReportProgress(false, 0, 0);
        // (Allreduce: this worker's tables are the ring's, once it is in
        // it; hierarchical: the host's, as its ring member published them.)
        if (hierarchical() && aggregator_ != nullptr) {
          // (Those after the job's last step: the host's member may not
          // have published them yet, and its step of them may need this
          // worker's post.)
          STRATA_RETURN_IF_ERROR(aggregator_
                                     ->AwaitFinalParams(lease.min_version, &trainer_->params(),
                                                        idle_zeros_,
                                                        [this] { return stop_.HasBeenNotified(); })
                                     .status());
        } else if (dense_ring_ != nullptr) {
          STRATA_ASSIGN_OR_RETURN(const bool holds, RingHoldsTrainedModel(lease.min_version));
          if (!holds) break;  // (it asks again, saying it cannot evaluate)
        }
        if (dense_sync_ != nullptr) {
          // This worker has the trained model: the others' idle steps,
          // which would wait on it while it evaluates, end (they hear of
          // it in their heartbeats).
          evaluating_ = true;
          ReportProgress(false, 0, 0);
        }
        STRATA_RETURN_IF_ERROR(Evaluate(lease.min_version));
        break;
      case proto::LeaseTaskResponse::DONE:
        if (absl::Status s = Settle(); !s.ok()) LOG(WARNING) << s;
        if (lease.drained) {
          // (Its progress reports are refused now: it has left.)
          LOG(INFO) << "worker " << options_.index
                    << ": drained by the master; its last data task is done, it leaves";
          return absl::OkStatus();
        }
        ReportProgress(false, 0, 0);
        // (A worker of the host killed on the way could not let go of it.)
        if (aggregator_ != nullptr) aggregator_->segment()->Unlink();
        LOG(INFO) << "worker " << options_.index << ": job done";
        return absl::OkStatus();
      default:  // WAIT
        STRATA_RETURN_IF_ERROR(Settle());
        if (hierarchical() && aggregator_ != nullptr) {
          // The host's steps need this worker's, with no samples.
          aggregator_->IdleFor(absl::Milliseconds(100), idle_zeros_,
                               [this] { return stop_.HasBeenNotified(); });
        } else if (dense_ring_ != nullptr) {
          // The others' steps need this worker's, with no samples.
          STRATA_RETURN_IF_ERROR(dense_ring_->IdleFor(absl::Milliseconds(100)));
        } else if (trainer_->pipelined()) {
          // A stage after the first: its leader's steps, as they come.
          const absl::Time t0 = absl::Now();
          STRATA_RETURN_IF_ERROR(trainer_->Follow(absl::Milliseconds(500)));
          stop_.WaitForNotificationWithTimeout(absl::Milliseconds(100) - (absl::Now() - t0));
        } else {
          stop_.WaitForNotificationWithTimeout(absl::Milliseconds(100));
        }
        break;
    }
  }
  return absl::OkStatus();
}

std::function<absl::StatusOr<DenseSync::CheckpointState>()> Worker::LostStateReader(size_t total) {
  // (The last one read is kept: a forming that timed out while this member
  // read tries again, and takes it from here. One thread forms at a time:
  // the training thread, or the host aggregator's.)
  auto last = std::make_shared<std::pair<uint64_t, storage::RingState>>();
  return [this, total, last]() -> absl::StatusOr<DenseSync::CheckpointState> {
    uint64_t seq = 0;
    STRATA_ASSIGN_OR_RETURN(
        storage::RingState state,
        storage::ReadNewestRingState(options_.fs, options_.config.checkpoint.dir, total,
                                     options_.config.job.name, options_.config.optimizer.type, &seq,
                                     last->first != 0 ? &last->second : nullptr, last->first));
    if (seq != last->first) {
      // (Only the state is taken: the values are not copied.)
      last->first = seq;
      last->second.step = state.step;
      last->second.updates = state.updates;
      last->second.state_vectors = state.state_vectors;
      last->second.state = state.state;
    }
    return DenseSync::CheckpointState{seq, state.step, std::move(state.state)};
  };
}

absl::StatusOr<bool> Worker::RingHoldsTrainedModel(uint64_t min_version) {
  absl::Status joined = dense_ring_->Join();
  // (Training ended meanwhile, the ring's forming cut short: whether this
  // worker holds the ring's last parameters.)
  if (!joined.ok() && dense_ring_->over()) joined = dense_ring_->Join();
  bool cannot = !joined.ok() && dense_ring_->over();
  if (joined.ok() && dense_ring_->in_ring() && dense_ring_->next_step() < min_version) {
    // A ring formed after training ended, of no member that trained and no
    // checkpoint: its parameters are not the trained model.
    joined = absl::FailedPreconditionError(absl::StrCat(
        "dense allreduce: node ", node_id_.load(), "'s ring is at step ", dense_ring_->next_step(),
        ", before the job's last step ", min_version - 1,
        " (it formed after training ended, of no member that trained and no checkpoint)"));
    cannot = true;
  }
  if (cannot) {
    // No ring forms again to bring them (it joined after training ended, a
    // restart, or its ring failed): another worker evaluates, one that
    // holds them.
    LOG(WARNING) << "worker " << options_.index
                 << " cannot evaluate the trained model; the master gives the evaluation to "
                    "another worker: "
                 << joined.message();
    cannot_evaluate_ = true;
    return false;
  }
  STRATA_RETURN_IF_ERROR(joined);
  return true;
}

absl::Status Worker::InitLocalTables() {
  const std::vector<TableSpec> tables = ModelTables(options_.config.model);
  auto& params = trainer_->params();
  for (size_t t = 0; t < tables.size(); ++t) {
    if (tables[t].sparse) continue;  // (its rows come from the pservers)
    STRATA_RETURN_IF_ERROR(
        InitializeSlice(InitSpec{tables[t].init, tables[t].fan_in, tables[t].fan_out,
                                 static_cast<uint32_t>(t), options_.config.job.seed},
                        0, params[t].size(), params[t].data()));
  }
  return absl::OkStatus();
}

void Worker::SetPipelineStage(std::shared_ptr<PipelineStage> stage) {
  std::vector<std::pair<transport::Message, std::shared_ptr<transport::Responder>>> pending;
  {
    absl::MutexLock l(&stage_mu_);
    stage_ = stage;
    if (stage != nullptr) pending.swap(stage_pending_);
  }
  for (auto& [request, responder] : pending) stage->Handle(std::move(request), responder);
}

absl::Status Worker::ListenForPeers() {
  // The other workers' messages come to this worker's own data-plane
  // listener (advertised as its data address when it registers).
  return transport_->Listen(
      options_.host, 0,
      [this](transport::Message request, std::shared_ptr<transport::Responder> responder) {
        if (request.header.type == transport::MessageType::kStage &&
            options_.config.model.stages > 1) {
          std::shared_ptr<PipelineStage> stage;
          {
            absl::MutexLock l(&stage_mu_);
            stage = stage_;
            if (stage == nullptr && stage_pending_.size() < 4096) {
              // (Before this worker has taken its seat: the stage takes it
              // then, or the sender's timeout ends it.)
              request.OwnPayload();
              stage_pending_.emplace_back(std::move(request), std::move(responder));
              return;
            }
          }
          if (stage != nullptr) {
            stage->Handle(std::move(request), std::move(responder));
          } else {
            const transport::MessageHeader h = request.header;
            responder->Respond(transport::MakeErrorResponse(
                h, transport::MessageType::kStageResponse,
                absl::UnavailableError(absl::StrCat("worker ", options_.index,
                                                    " has no pipeline stage yet and holds 4096 "
                                                    "micro-batches for it already: ",
                                                    responder->peer(), " tries again later"))));
          }
          return;
        }
        DenseSync* sync = dense_sync_handler_.load();
        if (sync == nullptr || request.header.type != transport::MessageType::kCollective) {
          const transport::MessageHeader h = request.header;
          responder->Respond(transport::MakeErrorResponse(
              h, transport::ResponseTypeFor(h.type),
              absl::FailedPreconditionError(absl::StrCat(
                  "worker ", options_.index, ": message type ", static_cast<int>(h.type), " from ",
                  responder->peer(),
                  sync == nullptr ? " before it has joined the job" : " is not for a worker"))));
          return;
        }
        sync->Handle(std::move(request), std::move(responder));
      });
}

absl::Status Worker::StartDenseSync(const proto::RingRestore& restore) {
  STRATA_RETURN_IF_ERROR(InitLocalTables());
  // The ring's tables: the dense ones (a CTR model's sparse tables stay on
  // the pservers).
  const std::vector<TableSpec> specs = ModelTables(options_.config.model);
  std::vector<size_t> ring_tables, sizes, rows;
  for (size_t t = 0; t < specs.size(); ++t) {
    if (!specs[t].allreduce) continue;
    ring_tables.push_back(t);
    sizes.push_back(trainer_->params()[t].size());
    rows.push_back(specs[t].shape.size() == 2 ? specs[t].shape[1] : 1);
  }
  // Hierarchical: the ring's tables are the host aggregator's, apart from
  // the model's (the training thread computes on them meanwhile).
  std::vector<std::vector<float>>* tables = &trainer_->params();
  if (hierarchical()) {
    ring_tables_ = trainer_->params();
    tables = &ring_tables_;
    for (const auto& t : trainer_->params()) idle_zeros_.emplace_back(t.size(), 0.f);
  }
  DenseSync::Options o;
  o.node_id = node_id_;
  o.optimizer = options_.config.optimizer;
  // A member's wait for the others covers their evaluation and their
  // calls to the master between tasks.
  o.timeout = absl::Milliseconds(std::max(options_.config.cluster.request_timeout_ms, 10000));
  // Buckets where a backward pass hands them over (MlpTrainer, CtrTrainer,
  // a script's backward(): DenseRing::BeginStep); a host's sum
  // (hierarchical) comes whole.
  if (!hierarchical()) {
    o.bucket_bytes = static_cast<size_t>(options_.config.model.allreduce_bucket_kib) << 10;
    o.row_floats = rows;
  }
  if (options_.config.checkpoint.enabled) {
    // A segment whose owner and replica left together: its state from the
    // newest checkpoint with the ring's shards (read only then).
    const size_t total = std::accumulate(sizes.begin(), sizes.end(), size_t{0});
    o.checkpoint_state = LostStateReader(total);
  }
  STRATA_ASSIGN_OR_RETURN(dense_sync_, DenseSync::Create(transport_.get(), o, sizes));
  if (restore.shards_size() > 0) {
    // A resumed job: the checkpoint's tables and optimizer state, which
    // the first ring takes (unless one went on without this worker).
    const std::vector<proto::CheckpointRingShard> shards(restore.shards().begin(),
                                                         restore.shards().end());
    STRATA_ASSIGN_OR_RETURN(
        storage::RingState state,
        storage::ReadRingState(options_.fs, restore.root(), shards, dense_sync_->total(),
                               options_.config.job.name, options_.config.optimizer.type));
    if (state.state_vectors != dense_sync_->state_vectors()) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint ", restore.seq(), " under ", restore.root(), ": ",
                       state.state_vectors, " optimizer state vectors per parameter, optimizer ",
                       options_.config.optimizer.type, " keeps ", dense_sync_->state_vectors()));
    }
    std::vector<float*> ptrs;
    for (size_t t : ring_tables) ptrs.push_back((*tables)[t].data());
    if (absl::Status s = dense_sync_->Restore(state.step, state.updates, std::move(state.values),
                                              std::move(state.state), ptrs);
        !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("checkpoint ", restore.seq(), " under ",
                                                 restore.root(), ": ", s.message()));
    }
    ring_updates_ = state.updates;
    LOG(INFO) << "worker " << options_.index << ": allreduce tables from checkpoint "
              << restore.seq() << " (step " << state.step << ", " << state.updates << " updates)";
  }
  dense_sync_handler_.store(dense_sync_.get());
  DenseRing::Hooks hooks;
  hooks.fetch_view = [this] { return FetchView(); };
  hooks.epoch_seen = [this] { return params_->epoch(); };
  hooks.stopping = [this] { return stop_.HasBeenNotified(); };
  if (options_.config.checkpoint.enabled) {
    hooks.checkpoint_ask = [this] {
      ring_updates_ = dense_sync_->updates();
      absl::MutexLock l(&ring_ckpt_mu_);
      return DenseSync::CheckpointAsk{ring_ask_.id(), ring_ask_.seq(), ring_ask_.cut()};
    };
    hooks.checkpoint_cut = [this](const DenseSync::CheckpointAsk& ask, DenseSync::Snapshot* snap,
                                  const absl::Status& error) { WriteRingShard(ask, snap, error); };
  }
  // A ring that failed: the next view comes once the master has declared
  // the lost member dead; past twice that and a request timeout, this
  // worker gives up (its restart makes a view of its own).
  const absl::Duration reform = absl::Milliseconds(2 * options_.config.cluster.dead_timeout_ms +
                                                   options_.config.cluster.request_timeout_ms);
  dense_ring_ =
      std::make_unique<DenseRing>(dense_sync_.get(), node_id_, tables, std::move(ring_tables),
                                  std::move(hooks), reform, /*by_host=*/hierarchical());
  metrics_.AddCallbackGauge("strata_worker_allreduce_rings_formed",
                            "Rings of the dense allreduce this worker has formed",
                            [this] { return static_cast<double>(dense_ring_->rings_formed()); });
  metrics_.AddCallbackGauge(
      "strata_worker_allreduce_steps_overlapped",
      "Dense allreduce steps begun as their compute began (overlapping the backward pass)",
      [this] { return static_cast<double>(dense_ring_->steps_overlapped()); });
  metrics_.AddCallbackGauge("strata_worker_allreduce_steps_failed",
                            "Dense allreduce steps that failed here (and were retried)",
                            [this] { return static_cast<double>(dense_ring_->steps_failed()); });
  LOG(INFO) << "worker " << options_.index << ": dense tables by allreduce among the workers"
            << (hierarchical() ? " (hierarchical: each host's sum first)" : "")
            << "; data-plane listener " << transport_->listen_address();
  return absl::OkStatus();
}

void Worker::WriteRingShard(const DenseSync::CheckpointAsk& ask, DenseSync::Snapshot* snap,
                            const absl::Status& error) {
  if (snap == nullptr || !error.ok()) {
    AddRingReport(RingShardReport(ask, nullptr, error));
    return;
  }
  // The shard is the snapshot's copy: the ring trains on while it is
  // written (DESIGN.md: checkpoints are written asynchronously). A write
  // still in flight (an earlier checkpoint's) is waited for first.
  absl::MutexLock l(&ring_writer_mu_);
  if (ring_writer_.joinable()) ring_writer_.join();
  if (ring_writer_closed_) {
    // Shutting down: no thread is started that nobody would join.
    AddRingReport(RingShardReport(ask, snap, absl::OkStatus()));
    return;
  }
  ring_writer_ = std::thread([this, ask, shard = std::move(*snap)] {
    AddRingReport(RingShardReport(ask, &shard, absl::OkStatus()));
  });
}

void Worker::AwaitRingWriter(bool close) {
  absl::MutexLock l(&ring_writer_mu_);
  if (ring_writer_.joinable()) ring_writer_.join();
  if (close) ring_writer_closed_ = true;
}

void Worker::AddRingReport(proto::RingCheckpointReport r) {
  absl::MutexLock l(&ring_ckpt_mu_);
  ring_reports_.push_back(std::move(r));
  while (ring_reports_.size() > 4) ring_reports_.erase(ring_reports_.begin());
}

proto::RingCheckpointReport Worker::RingShardReport(const DenseSync::CheckpointAsk& ask,
                                                    const DenseSync::Snapshot* snap,
                                                    const absl::Status& error) {
  proto::RingCheckpointReport r;
  r.set_id(ask.id);
  r.set_seq(ask.seq);
  r.set_cut(ask.cut);
  if (!error.ok()) {
    r.set_error(std::string(error.message()));
    return r;
  }
  if (snap == nullptr) {
    r.set_passed(true);
    return r;
  }
  proto::CheckpointRingShardHeader h;
  h.set_format_version(storage::kCheckpointFormatVersion);
  h.set_job(options_.config.job.name);
  h.set_seq(ask.seq);
  h.set_rank(snap->rank);
  h.set_ring_size(snap->ring_size);
  h.set_ring_epoch(snap->ring_epoch);
  h.set_begin(snap->begin);
  h.set_end(snap->end);
  h.set_total(snap->total);
  h.set_optimizer(options_.config.optimizer.type);
  h.set_state_vectors(snap->state_vectors);
  h.set_state_count(snap->state_count);
  h.set_step(snap->step);
  h.set_updates(snap->updates);
  const absl::Time t0 = absl::Now();
  absl::StatusOr<proto::CheckpointFile> f =
      storage::WriteRingShard(options_.fs, options_.config.checkpoint.dir, h, snap->values,
                              snap->state, options_.config.checkpoint.compression_level);
  if (!f.ok()) {
    LOG(ERROR) << "worker " << options_.index << ": checkpoint " << ask.seq
               << ": writing its ring shard failed: " << f.status();
    r.set_error(std::string(f.status().message()));
  } else {
    proto::CheckpointRingShard* shard = r.mutable_shard();
    shard->set_rank(snap->rank);
    shard->set_begin(snap->begin);
    shard->set_end(snap->end);
    *shard->mutable_file() = *f;
    shard->set_node_id(node_id_);
    VLOG(1) << "checkpoint " << ask.seq << ": ring shard " << f->path() << " written in "
            << absl::Now() - t0;
  }
  r.set_ring_size(snap->ring_size);
  r.set_ring_epoch(snap->ring_epoch);
  r.set_floats(snap->total);
  r.set_step(snap->step);
  r.set_updates(snap->updates);
  return r;
}

absl::Status Worker::RunLocal() {
  STRATA_RETURN_IF_ERROR(InitLocalTables());
  for (const auto& table : trainer_->params()) {
    STRATA_ASSIGN_OR_RETURN(auto opt, Optimizer::Create(options_.config.optimizer, table.size()));
    local_optimizers_.push_back(std::move(opt));
  }
  // The master's tasks, in its order, trained by this process alone.
  const int64_t n = trainer_->loaded_examples();
  const int64_t per = options_.config.data.task_records;
  const absl::Time start = absl::Now();
  window_start_ = start;
  uint64_t id = 0;
  for (int e = 0; e < options_.config.job.epochs; ++e) {
    for (const auto& [b, end] : EpochTaskRanges(n, per, options_.config.job.seed, e)) {
      proto::DataTask task;
      task.set_id(id++);
      task.set_epoch(e);
      task.set_begin(b);
      task.set_end(end);
      STRATA_RETURN_IF_ERROR(trainer_->TrainTask(task, &local_optimizers_).status());
    }
  }
  ReportProgress(false, 0, 0);
  const double secs = absl::ToDoubleSeconds(absl::Now() - start);
  STRATA_ASSIGN_OR_RETURN(const EvalMetrics m, trainer_->Evaluate(std::nullopt));
  local_test_accuracy_ = m.accuracy;
  const Stats s = stats();
  LOG(INFO) << absl::StrFormat(
      "local: %d samples in %.2f s: %.0f samples/s; test accuracy %.4f, test loss %.4f", s.samples,
      secs, s.samples / secs, m.accuracy, m.loss);
  return absl::OkStatus();
}

absl::Status Worker::SettlePush() {
  if (exchanges_.push == nullptr) return absl::OkStatus();
  absl::Status s = exchanges_.push->Finish();
  exchanges_.push.reset();
  absl::MutexLock l(&mu_);
  stats_.stale_pushes += exchanges_.push_result.stale_partitions > 0;
  return s;
}

absl::Status Worker::Settle() {
  absl::Status s = SettlePush();
  if (exchanges_.pull != nullptr) {
    s.Update(exchanges_.pull->Finish());
    exchanges_.pull.reset();
  }
  return s;
}

std::vector<int64_t> Worker::TaskRecordOrder(const proto::DataTask& task, int64_t begin,
                                             int64_t end) const {
  std::vector<int64_t> order(end - begin);
  std::iota(order.begin(), order.end(), begin);
  if (options_.shuffle_within_task) {
    std::mt19937_64 rng(options_.config.job.seed * 7919 + task.id());
    std::shuffle(order.begin(), order.end(), rng);
  }
  // Records already trained before a resumed checkpoint's cut.
  const auto skip = static_cast<size_t>(std::clamp<int64_t>(task.skip_records(), 0, order.size()));
  order.erase(order.begin(), order.begin() + skip);
  return order;
}

void Worker::RecordStep(int n, uint64_t version, double loss, int64_t correct, absl::Duration busy,
                        absl::Duration comm, bool stale) {
  {
    absl::MutexLock l(&mu_);
    stats_.steps++;
    stats_.samples += n;
    stats_.last_step = version;
    stats_.stale_pushes += stale;
    stats_.busy_seconds += absl::ToDoubleSeconds(busy);
    stats_.comm_seconds += absl::ToDoubleSeconds(comm);
  }
  next_step_ = version + 1;
  if (trace_ != nullptr && options_.trace_max_steps > 0 &&
      stats().steps >= static_cast<uint64_t>(options_.trace_max_steps) && trace_->enabled()) {
    trace_->set_enabled(false);
    LOG(INFO) << "trace " << trace_->path() << ": the first " << options_.trace_max_steps
              << " steps traced; tracing stops";
  }
  if (step_compute_seconds_ != nullptr) {
    step_compute_seconds_->Observe(
        absl::ToDoubleSeconds(std::max(busy - comm, absl::ZeroDuration())));
    step_wait_seconds_->Observe(absl::ToDoubleSeconds(comm));
  }
  window_samples_ += n;
  window_loss_ += loss;
  window_correct_ += correct;
  ++window_steps_;
  if (task_start_unknown_.has_value()) {
    // The first batch of a task whose start the master does not know.
    task_start_ = std::make_pair(*task_start_unknown_, version);
    task_start_unknown_.reset();
  }
  if (task_start_.has_value() ||
      window_steps_ >= static_cast<uint64_t>(options_.config.job.progress_every_steps)) {
    ReportProgress(false, 0, 0);
  }
}

void Worker::ReportProgress(bool has_eval, double accuracy, double test_loss,
                            const std::string& error, const double* auc) {
  const absl::Time now = absl::Now();
  const double secs = absl::ToDoubleSeconds(now - window_start_);
  Stats s;
  {
    absl::MutexLock l(&mu_);
    if (window_samples_ > 0) {
      stats_.recent_loss = window_loss_ / window_samples_;
      stats_.recent_accuracy = static_cast<double>(window_correct_) / window_samples_;
    }
    s = stats_;
  }
  if (window_samples_ > 0 && secs > 0) recent_sps_ = window_samples_ / secs;
  if (samples_per_second_ != nullptr) {
    samples_per_second_->Set(recent_sps_);
    comm_share_->Set(s.busy_seconds > 0 ? s.comm_seconds / s.busy_seconds : 0);
  }
  if (window_steps_ > 0 && error.empty()) {
    const double comm = s.busy_seconds > 0 ? s.comm_seconds / s.busy_seconds : 0;
    LOG(INFO) << absl::StrFormat(
        "progress: worker %d epoch %d/%d step %d samples/s %.0f loss %.4f comm %.0f%%",
        options_.index, current_epoch_ + 1, options_.config.job.epochs, s.last_step, recent_sps_,
        s.recent_loss, 100 * comm);
  }
  window_start_ = now;
  window_samples_ = 0;
  window_loss_ = 0;
  window_correct_ = 0;
  window_steps_ = 0;
  if (agent_ == nullptr || options_.local_only) return;
  proto::ReportProgressRequest req;
  req.set_node_id(node_id_);
  if (task_start_.has_value()) {
    req.set_has_task_start(true);
    req.set_task_id(task_start_->first);
    req.set_task_first_step(task_start_->second);
    task_start_.reset();
  }
  req.set_epoch(current_epoch_);
  req.set_step(s.last_step);
  req.set_steps_done(s.steps);
  req.set_samples(s.samples);
  req.set_loss(s.recent_loss);
  req.set_train_accuracy(s.recent_accuracy);
  req.set_samples_per_sec(recent_sps_);
  req.set_busy_seconds(s.busy_seconds);
  req.set_comm_seconds(s.comm_seconds);
  for (const auto& [partition, n] : params_->AckedPushes()) {
    (*req.mutable_acked_pushes())[partition] = n;
  }
  req.set_evaluating(evaluating_.load());
  req.set_has_test_accuracy(has_eval);
  req.set_test_accuracy(accuracy);
  req.set_test_loss(test_loss);
  req.set_error(error);
  if (auc != nullptr) {
    req.set_has_test_auc(true);
    req.set_test_auc(*auc);
  }
  proto::ReportProgressResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  absl::Status st = FromGrpcStatus(master()->ReportProgress(&ctx, req, &resp),
                                   "master " + options_.master_address);
  if (!st.ok()) LOG(WARNING) << "progress report failed: " << st;
}

absl::Status Worker::Evaluate(uint64_t min_version) {
  STRATA_ASSIGN_OR_RETURN(const EvalMetrics m, trainer_->Evaluate(min_version));
  if (m.auc.has_value()) {
    LOG(INFO) << absl::StrFormat(
        "evaluation: test AUC %.4f, log-loss %.4f, accuracy %.4f over %d examples", *m.auc, m.loss,
        m.accuracy, m.examples);
    ReportProgress(true, m.accuracy, m.loss, "", &*m.auc);
    return absl::OkStatus();
  }
  LOG(INFO) << absl::StrFormat("evaluation: test accuracy %.4f, test loss %.4f", m.accuracy,
                               m.loss);
  ReportProgress(true, m.accuracy, m.loss);
  return absl::OkStatus();
}

}  // namespace strata::worker
