#include "master/node_manager.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/error_reason.h"
#include "common/grpc_channel.h"
#include "common/proto_names.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "master/declared_tables.h"
#include "master/placement.h"
#include "transport/data_plane_auth.h"

namespace strata::master {
namespace {

int64_t ToUnixMs(absl::Time t) { return absl::ToUnixMillis(t); }

std::string Name(const proto::NodeInfo& n) {
  return absl::StrCat(NodeRoleName(n.role()), " ", n.index(), " (node ", n.id(), ")");
}

}  // namespace

absl::StatusOr<std::string> RegistrationIdentity(const proto::RegisterRequest& req,
                                                 const std::string& peer, const Identity& who) {
  if (req.role() != proto::PSERVER && req.role() != proto::WORKER) {
    return absl::InvalidArgumentError(
        absl::StrCat("register from ", peer, ": role must be PSERVER or WORKER"));
  }
  if (req.role() == proto::PSERVER && (req.grpc_address().empty() || req.data_address().empty())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "register from ", peer, ": a pserver must give grpc_address and data_address"));
  }
  if (who.source != "certificate") return std::string();
  const Role want = req.role() == proto::PSERVER ? Role::kPServer : Role::kWorker;
  if (who.role != want) {
    return absl::PermissionDeniedError(absl::StrCat("register from ", peer, ": certificate of ",
                                                    who.ToString(), " cannot register a ",
                                                    NodeRoleName(req.role())));
  }
  const size_t at = who.name.find('@');
  if (at == std::string::npos || who.name.substr(at + 1) != req.host()) {
    return absl::PermissionDeniedError(absl::StrCat("register from ", peer, ": certificate of ",
                                                    who.ToString(), " cannot register host ",
                                                    req.host()));
  }
  // An instance's own certificate ("worker-3@host") registers that index
  // only; a host-wide one ("worker@host") any index on its host.
  if (const int index = CertificateIndex(who.name); index >= 0 && index != req.index()) {
    return absl::PermissionDeniedError(absl::StrCat("register from ", peer, ": certificate of ",
                                                    who.ToString(), " cannot register ",
                                                    NodeRoleName(req.role()), " ", req.index()));
  }
  return who.ToString();
}

NodeManager::NodeManager(Options options)
    : options_(std::move(options)), clock_(options_.clock), job_(options_.job) {
  absl::MutexLock l(&mu_);
  view_.set_epoch(1);
  view_.set_seed(options_.seed);
  // (A restarted master keeps the chunk size of the state it restores: the
  // pservers' partitions were cut with it.)
  view_.set_chunk_bytes(static_cast<uint64_t>(options_.cluster.chunk_bytes));
  // (Likewise its aggregation key: its hosts' segments are named by it.)
  if (options_.cluster.aggregation == "node") {
    std::random_device rd;
    const uint64_t key = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    view_.set_aggregation_key(key != 0 ? key : 1);
  }
  for (const auto& t : options_.tables) *view_.add_tables() = t;
  proto::NodeInfo* self = view_.add_members();
  self->set_id(0);
  self->set_role(proto::MASTER);
  self->set_host(options_.host);
  self->set_state(proto::ALIVE);
  self->set_registered_unix_ms(ToUnixMs(clock_->Now()));
  self->set_last_heartbeat_unix_ms(ToUnixMs(clock_->Now()));
}

void NodeManager::SetMasterAddress(const std::string& grpc_address) {
  absl::MutexLock l(&mu_);
  view_.mutable_members(0)->set_grpc_address(grpc_address);
}

void NodeManager::SetMasterHttpPort(int port) {
  absl::MutexLock l(&mu_);
  view_.mutable_members(0)->set_http_port(port);
}

// --- Registration and heartbeats.

absl::Status NodeManager::CheckReplaceable(const proto::RegisterRequest& req,
                                           const std::string& identity,
                                           const std::string& peer) const {
  absl::MutexLock l(&mu_);
  // A live instance of this role and index is replaced only by the same
  // identity (its restart), never by another node's certificate.
  for (const proto::NodeInfo& n : view_.members()) {
    if (n.role() == req.role() && n.index() == req.index() && !Gone(n) &&
        n.identity() != identity) {
      return absl::AlreadyExistsError(absl::StrCat(
          "register from ", peer, ": ", NodeRoleName(req.role()), " ", req.index(),
          " is alive as node ", n.id(), " of ", n.identity().empty() ? "plaintext" : n.identity(),
          "; it cannot be replaced by ", identity.empty() ? "plaintext" : identity));
    }
  }
  return absl::OkStatus();
}

std::vector<uint32_t> NodeManager::LiveInstances(proto::Role role, int32_t index) const {
  absl::MutexLock l(&mu_);
  std::vector<uint32_t> ids;
  for (const proto::NodeInfo& n : view_.members()) {
    if (n.role() == role && n.index() == index && !Gone(n)) ids.push_back(n.id());
  }
  return ids;
}

void NodeManager::NewStubLocked(const proto::NodeInfo& n) {
  pserver_stubs_[n.id()] = proto::PServerAdmin::NewStub(NewControlChannel(
      n.grpc_address(), options_.security->ForPServers(), options_.cluster.control_connect_ms));
}

proto::NodeInfo NodeManager::Add(const proto::RegisterRequest& req, const std::string& identity,
                                 const std::string& peer) {
  proto::NodeInfo added;
  {
    absl::MutexLock l(&mu_);
    proto::NodeInfo* n = view_.add_members();
    n->set_id(next_node_id_++);
    n->set_role(req.role());
    n->set_index(req.index());
    n->set_host(req.host());
    n->set_grpc_address(req.grpc_address());
    n->set_data_address(req.data_address());
    n->set_http_port(req.http_port());
    n->set_identity(identity);
    // A worker joining a job that runs enters the bsp step set with its
    // first data task (MasterServer::LeaseTask), not before.
    n->set_state(req.role() == proto::WORKER && view_.ready() ? proto::JOINING : proto::ALIVE);
    n->set_registered_unix_ms(ToUnixMs(clock_->Now()));
    n->set_last_heartbeat_unix_ms(ToUnixMs(clock_->Now()));
    if (req.role() == proto::PSERVER) NewStubLocked(*n);
    LOG(INFO) << NodeRoleName(req.role()) << " " << req.index() << " registered as node " << n->id()
              << " from " << peer;
    const std::string joined = absl::StrCat(NodeRoleName(req.role()), " ", req.index(),
                                            " joined as node ", n->id(), " from ", req.host());
    if (view_.ready()) {
      job_->Event(joined, "node_join", n);
    } else {
      job_->sink()->Event("node_join", joined, n);
    }
    BumpEpochLocked();
    added = *n;
  }
  AddNodeMetrics(req.role(), static_cast<uint32_t>(req.index()));
  return added;
}

absl::StatusOr<proto::NodeInfo> NodeManager::Register(
    const proto::RegisterRequest& req, const std::string& peer, const Identity& who, bool job_over,
    const std::function<void(const Departure&)>& departed) {
  STRATA_ASSIGN_OR_RETURN(const std::string identity, RegistrationIdentity(req, peer, who));
  STRATA_RETURN_IF_ERROR(CheckReplaceable(req, identity, peer));
  // A restarted instance replaces its predecessor.
  for (uint32_t id : LiveInstances(req.role(), req.index())) {
    if (auto d = DeclareDead(id, "a new instance registered", job_over)) departed(*d);
  }
  return Add(req, identity, peer);
}

absl::Status NodeManager::CheckCaller(uint32_t node_id, const Identity& who) const {
  if (who.source == "plaintext") return absl::OkStatus();
  absl::MutexLock l(&mu_);
  const proto::NodeInfo* n = FindLocked(node_id);
  if (n == nullptr || n->identity() == who.ToString()) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat(who.ToString(), " cannot speak for node ", node_id, " (registered by ",
                   n->identity().empty() ? "a plaintext caller" : n->identity(), ")"));
}

absl::StatusOr<NodeManager::Beat> NodeManager::Heartbeat(const proto::HeartbeatRequest& req) {
  absl::MutexLock l(&mu_);
  proto::NodeInfo* n = FindLocked(req.node_id());
  if (n == nullptr) {
    return WithReason(
        absl::NotFoundError(absl::StrCat("heartbeat from unknown node ", req.node_id())),
        proto::REASON_UNKNOWN_NODE);
  }
  if (n->state() == proto::DEAD) {
    return WithReason(absl::FailedPreconditionError(absl::StrCat(
                          "node ", req.node_id(), " was declared dead; it must register again")),
                      proto::REASON_DECLARED_DEAD);
  }
  Beat beat;
  beat.role = n->role();
  beat.epoch = view_.epoch();
  if (n->state() == proto::DRAINED) {  // it leaves
    beat.drained = true;
    return beat;
  }
  n->set_last_heartbeat_unix_ms(ToUnixMs(clock_->Now()));
  if (n->role() == proto::PSERVER) {
    synced_replicas_[n->id()] = std::set<uint32_t>(req.replicas().begin(), req.replicas().end());
    beat_epoch_[n->id()] = req.epoch();
    // (Only an owner's word counts: a backup's may lag.)
    for (const auto& [id, bytes] : req.partition_bytes()) {
      if (id < static_cast<uint32_t>(view_.partitions_size()) &&
          view_.partitions(static_cast<int>(id)).id() == id &&
          view_.partitions(static_cast<int>(id)).owner() == n->id()) {
        sparse_bytes_[id] = bytes;
      }
    }
  }
  FillDataKeyLocked(*n, &beat.key);
  return beat;
}

// --- Failure detection and suspicion.

std::vector<std::pair<uint32_t, std::string>> NodeManager::Unresponsive() {
  absl::MutexLock l(&mu_);
  const absl::Time now = clock_->Now();
  const int64_t dead_ms = options_.cluster.dead_timeout_ms;
  std::vector<std::pair<uint32_t, std::string>> out;
  for (const proto::NodeInfo& n : view_.members()) {
    if (n.role() == proto::MASTER || Gone(n)) continue;
    if (ToUnixMs(now) - n.last_heartbeat_unix_ms() > dead_ms) {
      out.emplace_back(n.id(), absl::StrCat("missed heartbeats for ", dead_ms, " ms"));
    }
  }
  // A pserver the workers keep reporting unreachable (though the master
  // hears it) is as good as dead to the job.
  for (auto it = suspects_.begin(); it != suspects_.end();) {
    const proto::NodeInfo* n = FindLocked(it->first);
    if (n == nullptr || Gone(*n) || now - it->second.last > absl::Seconds(2)) {
      it = suspects_.erase(it);
      continue;
    }
    if (now - it->second.first > absl::Milliseconds(dead_ms)) {
      out.emplace_back(n->id(), absl::StrCat("unreachable from workers for ", dead_ms, " ms (",
                                             it->second.reason, ")"));
    }
    ++it;
  }
  return out;
}

std::optional<NodeManager::Departure> NodeManager::DeclareDead(uint32_t id, const std::string& why,
                                                               bool job_over) {
  absl::MutexLock l(&mu_);
  proto::NodeInfo* n = FindLocked(id);
  if (n == nullptr || Gone(*n)) return std::nullopt;
  n->set_state(proto::DEAD);
  RotateDataKeyLocked();  // its key stops working
  job_->Event(absl::StrCat(NodeRoleName(n->role()), " ", n->index(), " (node ", n->id(), ", ",
                           n->host(), ") declared dead: ", why),
              "node_dead", n);
  Departure d;
  d.node = *n;
  if (n->role() == proto::PSERVER) {
    synced_replicas_.erase(id);
    suspects_.erase(id);
    if (placed_ && !job_over) d.lost = FailoverLocked(id);
  }
  BumpEpochLocked();
  return d;
}

absl::StatusOr<proto::ReportSuspectResponse> NodeManager::ReportSuspect(
    const proto::ReportSuspectRequest& req) {
  absl::MutexLock l(&mu_);
  proto::ReportSuspectResponse resp;
  const proto::NodeInfo* reporter = FindLocked(req.node_id());
  if (reporter == nullptr || Gone(*reporter)) {
    return absl::FailedPreconditionError(
        absl::StrCat("suspicion report from node ", req.node_id(), ", which is not a live member"));
  }
  const proto::NodeInfo* n = FindLocked(req.suspect());
  if (n == nullptr || n->role() != proto::PSERVER) {
    return absl::InvalidArgumentError(
        absl::StrCat("suspicion report about node ", req.suspect(), ", which is not a pserver"));
  }
  if (Gone(*n)) {
    resp.set_declared_dead(true);
    return resp;
  }
  const absl::Time now = clock_->Now();
  auto [it, added] = suspects_.try_emplace(req.suspect(), Suspect{now, now, req.reason()});
  if (added) {
    LOG(WARNING) << "node " << req.node_id() << " cannot reach pserver node " << req.suspect()
                 << ": " << req.reason() << "; probing it";
  } else {
    it->second.last = now;
    // One probe per heartbeat interval at most.
    if (now - it->second.first > absl::Milliseconds(options_.cluster.heartbeat_interval_ms)) {
      it->second.probe_due = true;
    }
  }
  return resp;
}

absl::StatusOr<proto::DeclareTablesResponse> NodeManager::DeclareTables(
    const proto::DeclareTablesRequest& req, bool* changed) {
  absl::MutexLock l(&mu_);
  *changed = false;
  const proto::NodeInfo* n = FindLocked(req.node_id());
  if (n == nullptr || Gone(*n) || n->role() != proto::WORKER) {
    return absl::FailedPreconditionError(
        absl::StrCat("tables declared by node ", req.node_id(), ", which is not a live worker"));
  }
  auto describe = [this](uint32_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const proto::NodeInfo* w = FindLocked(id);
    return w == nullptr ? absl::StrCat("node ", id)
                        : absl::StrCat("worker ", w->index(), " (node ", id, ")");
  };
  const std::string who = describe(req.node_id());
  STRATA_ASSIGN_OR_RETURN(std::vector<proto::TableInfo> declared,
                          MakeDeclaredTables(req.tables(), options_.sparse_partitions, who));
  proto::DeclareTablesResponse resp;
  if (!options_.script_tables) {
    STRATA_RETURN_IF_ERROR(
        CompareDeclaredTables(view_.tables(), declared, "the config's model.tables", who));
    resp.set_initialised(true);
    return resp;
  }
  if (view_.tables().empty()) {
    for (auto& t : declared) *view_.add_tables() = std::move(t);
    view_.set_tables_declared_by(req.node_id());
    BumpEpochLocked();
    *changed = true;
    LOG(INFO) << "the job's " << view_.tables_size() << " table(s) are the model of " << who
              << ", which writes their initial values";
    resp.set_initialise(true);
    return resp;
  }
  STRATA_RETURN_IF_ERROR(CompareDeclaredTables(
      view_.tables(), declared,
      view_.tables_declared_by() == 0  // (Resume)
          ? "the tables of the checkpoint the job resumed from"
          : absl::StrCat("the tables declared by ", describe(view_.tables_declared_by())),
      who));
  if (view_.tables_initialised()) {
    resp.set_initialised(true);
    return resp;
  }
  const proto::NodeInfo* writer = FindLocked(view_.tables_declared_by());
  if (writer == nullptr || Gone(*writer)) {
    // It left before its values were in: this worker's initialise them.
    LOG(INFO) << describe(view_.tables_declared_by()) << " left before writing the tables' "
              << "initial values; " << who << " writes its own";
    view_.set_tables_declared_by(req.node_id());
    BumpEpochLocked();
    *changed = true;
  }
  if (view_.tables_declared_by() != req.node_id()) return resp;  // (wait and ask again)
  if (req.initialised() && placed_) {
    view_.set_tables_initialised(true);
    BumpEpochLocked();
    *changed = true;
    LOG(INFO) << "the tables hold the initial values of " << who;
    resp.set_initialised(true);
    return resp;
  }
  resp.set_initialise(true);
  return resp;
}

std::optional<std::string> NodeManager::AwaitedInitialValues() const {
  absl::MutexLock l(&mu_);
  if (!options_.script_tables || view_.tables().empty() || view_.tables_initialised()) {
    return std::nullopt;
  }
  const proto::NodeInfo* w = FindLocked(view_.tables_declared_by());
  return w == nullptr ? absl::StrCat("node ", view_.tables_declared_by())
                      : absl::StrCat("worker ", w->index(), " (node ", w->id(), ")");
}

std::vector<PServerTarget> NodeManager::DueProbes() {
  absl::MutexLock l(&mu_);
  std::vector<PServerTarget> probes;
  for (auto& [id, s] : suspects_) {
    if (!s.probe_due) continue;
    s.probe_due = false;
    auto stub = pserver_stubs_.find(id);
    if (stub != pserver_stubs_.end()) probes.emplace_back(id, stub->second.get());
  }
  return probes;
}

std::optional<std::string> NodeManager::Suspicion(uint32_t id) const {
  absl::MutexLock l(&mu_);
  const proto::NodeInfo* n = FindLocked(id);
  auto it = suspects_.find(id);
  if (n == nullptr || Gone(*n) || it == suspects_.end()) return std::nullopt;
  return it->second.reason;
}

std::vector<std::pair<uint32_t, absl::Status>> NodeManager::ProbeSuspects() {
  // Long enough for a new connection (its TLS handshake included) to the
  // pserver: a slow handshake is not a dead pserver.
  const absl::Duration deadline = absl::Milliseconds(
      std::max({200, options_.cluster.heartbeat_interval_ms, options_.cluster.control_connect_ms}));
  std::vector<std::pair<uint32_t, absl::Status>> failed;
  for (const PServerTarget& target : DueProbes()) {
    absl::Status s = ProbePServer(target, deadline);
    if (!s.ok()) failed.emplace_back(target.first, std::move(s));
  }
  return failed;
}

std::optional<NodeManager::Departure> NodeManager::DeclareUnreachable(uint32_t id,
                                                                      const absl::Status& probe,
                                                                      bool job_over) {
  const std::optional<std::string> reason = Suspicion(id);
  if (!reason.has_value()) return std::nullopt;
  return DeclareDead(id,
                     absl::StrCat("reported unreachable (", *reason,
                                  ") and the master's probe failed too: ", probe.message()),
                     job_over);
}

// --- Drain.

absl::StatusOr<NodeManager::Drained> NodeManager::Drain(const proto::DrainRequest& req,
                                                        proto::JobState state, uint32_t evaluator) {
  absl::MutexLock l(&mu_);
  proto::NodeInfo* n = FindLocked(req.node_id());
  if (n == nullptr) return absl::NotFoundError(absl::StrCat("no node ", req.node_id()));
  const std::string name = Name(*n);
  const std::string why = req.reason().empty() ? "request" : req.reason();
  Drained out;
  if (n->role() == proto::MASTER) {
    return absl::FailedPreconditionError(
        "the master cannot be drained; `strata stop` ends the job");
  }
  if (n->state() == proto::DRAINED) {
    *out.response.mutable_node() = *n;
    out.response.set_message(absl::StrCat(name, " was already drained"));
    return out;
  }
  if (n->state() == proto::DEAD) {
    return absl::FailedPreconditionError(absl::StrCat(name, " is dead: nothing to drain"));
  }
  if (IsJobOver(state)) {
    return absl::FailedPreconditionError(
        absl::StrCat("the job has already ended (", JobStateName(state), "): nothing to drain"));
  }
  if (n->role() == proto::WORKER) return DrainWorkerLocked(n, name, why, state, evaluator);
  return DrainPServerLocked(n, name, why);
}

absl::StatusOr<NodeManager::Drained> NodeManager::DrainWorkerLocked(proto::NodeInfo* n,
                                                                    const std::string& name,
                                                                    const std::string& why,
                                                                    proto::JobState state,
                                                                    uint32_t evaluator) {
  Drained out;
  if (n->draining()) {
    *out.response.mutable_node() = *n;
    out.response.set_message(absl::StrCat(name, " is already draining"));
    return out;
  }
  if (state == proto::JOB_EVALUATING && n->id() == evaluator) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, " is evaluating the trained model; it leaves when the job ends"));
  }
  int others = 0;
  for (const auto& m : view_.members()) {
    others += m.role() == proto::WORKER && m.id() != n->id() && !Gone(m) && !m.draining();
  }
  if (others == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(name,
                     " is the last worker: draining it would stop training "
                     "(`strata stop` ends the job, with a checkpoint)"));
  }
  n->set_draining(true);
  job_->Event(absl::StrCat(name, " draining (", why, "): it leaves after its current data task"),
              "node_draining", n);
  BumpEpochLocked();  // (the view shows it draining)
  out.changed = true;
  *out.response.mutable_node() = *n;
  out.response.set_message(
      absl::StrCat(name, " is draining: it leaves after its current data task"));
  return out;
}

absl::StatusOr<NodeManager::Drained> NodeManager::DrainPServerLocked(proto::NodeInfo* n,
                                                                     const std::string& name,
                                                                     const std::string& why) {
  // Each of its partitions goes to a backup holding its copy; those
  // without one move away first (Migrate), and it leaves then.
  if (!placed_) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, ": the partitions are not placed yet; drain it once the job runs"));
  }
  std::vector<uint32_t> primaries, unsafe;
  for (const proto::PartitionInfo& p : view_.partitions()) {
    if (p.owner() != n->id()) continue;
    primaries.push_back(p.id());
    bool backed = false;
    for (uint32_t b : p.backups()) {
      const proto::NodeInfo* bn = FindLocked(b);
      auto held = synced_replicas_.find(b);
      backed = backed || (bn != nullptr && bn->state() == proto::ALIVE &&
                          held != synced_replicas_.end() && held->second.count(p.id()) > 0);
    }
    if (!backed) unsafe.push_back(p.id());
  }
  int others = 0;
  for (const auto& m : view_.members()) {
    others += m.role() == proto::PSERVER && m.id() != n->id() && m.state() == proto::ALIVE &&
              !m.draining();
  }
  if (others == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, " is the last pserver: draining it would remove the last copy of its ",
                     primaries.size(), " partition(s) (`strata stop` ends the job)"));
  }
  if (!unsafe.empty()) {
    // Its partitions without a synced backup move first (Migrate).
    Drained out;
    *out.response.mutable_node() = *n;
    if (n->draining()) {
      out.response.set_message(absl::StrCat(name, " is already leaving: its partitions move"));
      return out;
    }
    n->set_draining(true);
    job_->Event(
        absl::StrCat(name, " leaving (", why, "): ", unsafe.size(), " of its ", primaries.size(),
                     " partition(s) have no backup in sync; they move to the others "
                     "first, then it exits"),
        "node_draining", n);
    BumpEpochLocked();
    out.changed = true;
    *out.response.mutable_node() = *n;
    out.response.set_message(
        absl::StrCat(name,
                     " is leaving: its partitions move to the other pservers while the job trains "
                     "(`strata status` shows the moves); it exits once they moved"));
    return out;
  }
  Drained out;
  n->set_state(proto::DRAINED);
  RotateDataKeyLocked();  // its key stops working
  synced_replicas_.erase(n->id());
  suspects_.erase(n->id());
  Departure d;
  d.node = *n;
  d.lost = FailoverLocked(n->id());  // its backups take over; it is no one's backup now
  job_->Event(absl::StrCat(name, " drained (", why, "): ", primaries.size(),
                           " partition(s) taken over by their backups"),
              "node_drained", n);
  BumpEpochLocked();
  out.changed = true;
  out.departure = std::move(d);
  *out.response.mutable_node() = *n;
  out.response.set_message(
      absl::StrCat(name, " drained: its ", primaries.size(),
                   " partition(s) were taken over by their backups; it exits"));
  return out;
}

// --- Workers in the job.

absl::StatusOr<proto::NodeInfo> NodeManager::LiveWorker(uint32_t id) const {
  absl::MutexLock l(&mu_);
  const proto::NodeInfo* n = FindLocked(id);
  if (n == nullptr || n->role() != proto::WORKER) {
    return WithReason(absl::NotFoundError(absl::StrCat("node ", id, " is not a registered worker")),
                      proto::REASON_UNKNOWN_NODE);
  }
  if (n->state() == proto::DEAD) {
    return WithReason(absl::FailedPreconditionError(
                          absl::StrCat("worker node ", id, " was declared dead; register again")),
                      proto::REASON_DECLARED_DEAD);
  }
  if (n->state() == proto::DRAINED) {
    return WithReason(absl::FailedPreconditionError(
                          absl::StrCat("worker node ", id, " was drained: it has left the job")),
                      proto::REASON_DECLARED_DEAD);
  }
  return *n;
}

bool NodeManager::IsDrainedWorker(uint32_t id) const {
  absl::MutexLock l(&mu_);
  const proto::NodeInfo* n = FindLocked(id);
  return n != nullptr && n->role() == proto::WORKER && n->state() == proto::DRAINED;
}

bool NodeManager::InJob(uint32_t id) const {
  absl::MutexLock l(&mu_);
  const proto::NodeInfo* n = FindLocked(id);
  return n != nullptr && !Gone(*n);
}

void NodeManager::WorkerDrained(uint32_t id) {
  absl::MutexLock l(&mu_);
  proto::NodeInfo* n = FindLocked(id);
  if (n == nullptr) return;
  n->set_state(proto::DRAINED);
  n->set_draining(false);
  RotateDataKeyLocked();  // its key stops working
  job_->Event(absl::StrCat("worker ", n->index(), " (node ", n->id(), ", ", n->host(),
                           ") drained: left after its data task"),
              "node_drained", n);
  BumpEpochLocked();  // out of the step set
}

std::vector<uint32_t> NodeManager::TrainingWorkers(uint32_t id) const {
  absl::MutexLock l(&mu_);
  std::vector<std::pair<int32_t, uint32_t>> by_index;
  const proto::NodeInfo* self = FindLocked(id);
  by_index.emplace_back(self != nullptr ? self->index() : 0, id);
  for (const auto& m : view_.members()) {
    if (m.role() != proto::WORKER || m.id() == id || m.draining() ||
        (m.state() != proto::ALIVE && m.state() != proto::JOINING)) {
      continue;
    }
    by_index.emplace_back(m.index(), m.id());
  }
  std::sort(by_index.begin(), by_index.end());
  std::vector<uint32_t> ids;
  for (const auto& [index, node] : by_index) ids.push_back(node);
  return ids;
}

void NodeManager::SetWorkerState(uint32_t id, proto::NodeState state) {
  absl::MutexLock l(&mu_);
  proto::NodeInfo* n = FindLocked(id);
  if (n == nullptr || n->state() == state) return;
  n->set_state(state);
  if (state == proto::FINISHED) {
    LOG(INFO) << "worker " << n->index() << " (node " << n->id() << ") has no more data tasks";
  }
  BumpEpochLocked();
}

// --- The cluster's shape.

int NodeManager::Count(proto::Role role, bool include_finished) const {
  absl::MutexLock l(&mu_);
  return CountLocked(role, include_finished);
}

int NodeManager::CountLocked(proto::Role role, bool include_finished) const {
  int c = 0;
  for (const auto& n : view_.members()) {
    if (n.role() != role) continue;
    if (n.state() == proto::ALIVE ||
        (include_finished && (n.state() == proto::FINISHED || n.state() == proto::JOINING))) {
      ++c;
    }
  }
  return c;
}

std::optional<uint64_t> NodeManager::MarkReady() {
  absl::MutexLock l(&mu_);
  if (view_.ready() || !placed_ || CountLocked(proto::WORKER, true) < options_.expected_workers ||
      (options_.script_tables && !view_.tables_initialised())) {
    return std::nullopt;
  }
  view_.set_ready(true);
  BumpEpochLocked();
  return view_.epoch();
}

bool NodeManager::ready() const {
  absl::MutexLock l(&mu_);
  return view_.ready();
}

bool NodeManager::placed() const {
  absl::MutexLock l(&mu_);
  return placed_;
}

int NodeManager::tables() const {
  absl::MutexLock l(&mu_);
  return view_.tables_size();
}

// --- Placement, failover and recovery.

absl::StatusOr<std::optional<NodeManager::Placement>> NodeManager::PlanPlacement() {
  absl::MutexLock l(&mu_);
  // (Tables a training script declares: placed once declared.)
  if (placed_ || view_.tables().empty()) return std::optional<Placement>();
  std::vector<uint32_t> ids;
  for (const auto& n : view_.members()) {
    if (n.role() == proto::PSERVER && n.state() == proto::ALIVE) ids.push_back(n.id());
  }
  if (static_cast<int>(ids.size()) < options_.expected_pservers) return std::optional<Placement>();
  auto parts =
      PlacePartitions(std::vector<proto::TableInfo>(view_.tables().begin(), view_.tables().end()),
                      options_.cluster.slice_bytes, ids);
  if (!parts.ok()) return parts.status();
  Placement plan;
  plan.view = view_;
  plan.view.clear_partitions();
  for (auto& p : *parts) *plan.view.add_partitions() = std::move(p);
  master::TopUpBackups(plan.view.mutable_partitions(), ids, options_.cluster.replication);
  plan.view.set_epoch(view_.epoch() + 1);
  for (uint32_t id : ids) plan.targets.emplace_back(id, pserver_stubs_[id].get());
  return std::optional<Placement>(std::move(plan));
}

void NodeManager::CommitPlacement(const proto::ClusterView& placed) {
  absl::MutexLock l(&mu_);
  *view_.mutable_partitions() = placed.partitions();
  BumpEpochLocked();
  placed_ = true;
}

void NodeManager::TopUpBackups() {
  absl::MutexLock l(&mu_);
  TopUpBackupsLocked();
}

void NodeManager::TopUpBackupsLocked() {
  const int k = options_.cluster.replication;
  if (k == 0 || !placed_) return;
  std::vector<uint32_t> live;
  std::set<uint32_t> leaving;
  for (const auto& n : view_.members()) {
    if (n.role() != proto::PSERVER || n.state() != proto::ALIVE) continue;
    live.push_back(n.id());
    if (n.draining()) leaving.insert(n.id());
  }
  if (master::TopUpBackups(view_.mutable_partitions(), live, k, leaving, sparse_bytes_) > 0) {
    BumpEpochLocked();
  }
}

std::set<uint32_t> NodeManager::FailoverLocked(uint32_t gone) {
  int promoted = 0;
  std::set<uint32_t> lost;
  std::map<uint32_t, int> to;  // new owner -> partitions
  for (proto::PartitionInfo& p : *view_.mutable_partitions()) {
    auto* b = p.mutable_backups();
    for (int i = b->size() - 1; i >= 0; --i) {
      if (b->Get(i) == gone) b->erase(b->begin() + i);
    }
    if (p.owner() != gone) continue;
    // The first live backup holding the primary's copy takes over.
    int chosen = -1;
    for (int i = 0; i < b->size() && chosen < 0; ++i) {
      const proto::NodeInfo* n = FindLocked(b->Get(i));
      auto held = synced_replicas_.find(b->Get(i));
      if (n != nullptr && n->state() == proto::ALIVE && held != synced_replicas_.end() &&
          held->second.count(p.id())) {
        chosen = i;
      }
    }
    if (chosen >= 0) {
      p.set_owner(b->Get(chosen));
      p.set_restore_seq(0);
      p.set_restore_version(0);
      b->erase(b->begin() + chosen);
      ++promoted;
      ++to[p.owner()];
    } else {
      lost.insert(p.id());
    }
  }
  failovers_ += static_cast<uint64_t>(promoted);
  if (promoted > 0) {
    std::string where;
    for (const auto& [node, n] : to) {
      absl::StrAppend(&where, where.empty() ? "" : ", ", n, " to node ", node);
    }
    job_->Event(absl::StrCat(promoted, " partition(s) of node ", gone,
                             " failed over to their backups (", where, ")"),
                "failover");
  }
  lost_.insert(lost.begin(), lost.end());
  TopUpBackupsLocked();
  return lost;
}

bool NodeManager::has_lost() const {
  absl::MutexLock l(&mu_);
  return !lost_.empty();
}

absl::StatusOr<uint64_t> NodeManager::RestoreVersion(bool bsp) const {
  if (!bsp) return 0;
  absl::StatusOr<uint64_t> v = NewestPartitionVersion(LiveOwners());
  if (!v.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "cannot read the partitions' versions to restore lost ones: ", v.status().message()));
  }
  return *v;
}

absl::Status NodeManager::RestoreLost(const proto::CheckpointManifest& m, uint64_t newest) {
  absl::MutexLock l(&mu_);
  if (lost_.empty()) return absl::OkStatus();
  std::map<uint32_t, uint64_t> saved;  // partition -> version in the checkpoint
  for (const auto& e : m.partitions()) saved[e.id()] = e.version();
  std::map<uint32_t, uint64_t> load;
  for (uint32_t id : StayingPServersLocked()) load[id] = 0;
  if (load.empty()) return absl::OkStatus();  // none to put them on yet
  for (const auto& p : view_.partitions()) {
    if (load.count(p.owner())) {
      load[p.owner()] += PartitionWeight(p, sparse_bytes_);
    }
  }
  uint64_t lost_steps = 0;
  for (proto::PartitionInfo& p : *view_.mutable_partitions()) {
    if (lost_.count(p.id()) == 0) continue;
    auto it = saved.find(p.id());
    if (it == saved.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "partition ", p.id(), " was lost and checkpoint ", m.seq(), " does not hold it"));
    }
    uint32_t best = load.begin()->first;
    for (const auto& [id, bytes] : load) {
      if (bytes < load[best]) best = id;
    }
    load[best] += PartitionWeight(p, sparse_bytes_);
    p.set_owner(best);
    p.set_restore_seq(m.seq());
    const uint64_t version = std::max(newest, it->second);
    p.set_restore_version(version);
    lost_steps += version - it->second;
    p.clear_backups();
  }
  partitions_restored_ += lost_.size();
  steps_lost_ += lost_steps;
  job_->Event(
      absl::StrCat(lost_.size(), " lost partition(s) restored from checkpoint ", m.seq(), " (step ",
                   m.step(), "): ", lost_steps, " partition-step(s) of updates lost"),
      "recovery");
  lost_.clear();
  TopUpBackupsLocked();
  BumpEpochLocked();
  return absl::OkStatus();
}

// --- Reading it.

proto::ClusterView NodeManager::View() const {
  absl::MutexLock l(&mu_);
  return view_;
}

proto::ClusterView NodeManager::StatusView() {
  absl::MutexLock l(&mu_);
  view_.mutable_members(0)->set_last_heartbeat_unix_ms(ToUnixMs(clock_->Now()));
  return view_;
}

proto::DataPlaneKey NodeManager::DataKey(uint32_t id) {
  absl::MutexLock l(&mu_);
  proto::DataPlaneKey key;
  if (const proto::NodeInfo* n = FindLocked(id); n != nullptr) FillDataKeyLocked(*n, &key);
  return key;
}

std::vector<PServerTarget> NodeManager::Owners() const {
  absl::MutexLock l(&mu_);
  return OwnersLocked(/*live_only=*/false);
}

std::vector<PServerTarget> NodeManager::LiveOwners() const {
  absl::MutexLock l(&mu_);
  return OwnersLocked(/*live_only=*/true);
}

std::vector<PServerTarget> NodeManager::OwnersLocked(bool live_only) const {
  std::set<uint32_t> owners;
  for (const auto& p : view_.partitions()) owners.insert(p.owner());
  std::vector<PServerTarget> targets;
  for (uint32_t id : owners) {
    const proto::NodeInfo* n = FindLocked(id);
    auto stub = pserver_stubs_.find(id);
    if (stub == pserver_stubs_.end()) continue;
    if (live_only && (n == nullptr || n->state() != proto::ALIVE)) continue;
    targets.emplace_back(id, stub->second.get());
  }
  return targets;
}

std::map<uint32_t, uint32_t> NodeManager::PartitionOwners() const {
  absl::MutexLock l(&mu_);
  std::map<uint32_t, uint32_t> owner;
  for (const auto& p : view_.partitions()) owner[p.id()] = p.owner();
  return owner;
}

uint32_t NodeManager::next_node_id() const {
  absl::MutexLock l(&mu_);
  return next_node_id_;
}

void NodeManager::Resume(const proto::CheckpointManifest& m) {
  absl::MutexLock l(&mu_);
  next_node_id_ = std::max(next_node_id_, m.next_node_id());
  if (!options_.script_tables || !view_.tables().empty()) return;
  for (int i = 0; i < m.tables_size(); ++i) {
    const proto::CheckpointTable& c = m.tables(i);
    proto::TableInfo* t = view_.add_tables();
    t->set_id(static_cast<uint32_t>(i));
    t->set_name(c.name());
    *t->mutable_shape() = c.shape();
    if (c.sparse()) {
      t->set_sparse(true);
      t->set_dim(c.dim());
      t->set_partitions(c.partitions());
    } else {
      uint64_t n = 1;
      for (uint64_t d : c.shape()) n *= d;
      t->set_num_elements(n);
      t->set_init("worker");
    }
  }
  view_.set_tables_initialised(true);
}

void NodeManager::FillStatus(proto::JobStatus* js) const {
  absl::MutexLock l(&mu_);
  js->set_failovers(failovers_);
  js->set_partitions_restored(partitions_restored_);
  js->set_steps_lost(steps_lost_);
  int moving = 0;
  for (const auto& p : view_.partitions()) moving += p.move_to() != 0;
  js->set_moves_in_progress(moving);
  js->set_moves_waiting(moves_waiting_);
  js->set_moves_done(moves_done_);
  js->set_moved_bytes(moved_bytes_);
}

void NodeManager::FillSummary(proto::JobSummary* s) const {
  absl::MutexLock l(&mu_);
  s->set_replication(options_.cluster.replication);
  s->set_failovers(static_cast<double>(failovers_));
  s->set_partitions_restored(static_cast<double>(partitions_restored_));
  s->set_steps_lost(static_cast<double>(steps_lost_));
}

void NodeManager::Save(proto::MasterState* st) const {
  absl::MutexLock l(&mu_);
  *st->mutable_view() = view_;
  // Heartbeat times change all the time and mean nothing to a successor.
  for (auto& n : *st->mutable_view()->mutable_members()) n.clear_last_heartbeat_unix_ms();
  st->set_next_node_id(next_node_id_);
  st->set_placed(placed_);
  st->set_failovers(failovers_);
  st->set_partitions_restored(partitions_restored_);
  st->set_steps_lost(steps_lost_);
}

void NodeManager::GraceAll() {
  absl::MutexLock l(&mu_);
  const int64_t now = ToUnixMs(clock_->Now());
  for (proto::NodeInfo& n : *view_.mutable_members()) n.set_last_heartbeat_unix_ms(now);
  suspects_.clear();
}

void NodeManager::Restore(const proto::MasterState& st) {
  absl::MutexLock l(&mu_);
  view_ = st.view();
  // Everyone gets twice the dead timeout from now to reconnect, and a new
  // epoch to fetch.
  const int64_t now = ToUnixMs(clock_->Now()) + options_.cluster.dead_timeout_ms;
  for (proto::NodeInfo& n : *view_.mutable_members()) {
    n.set_last_heartbeat_unix_ms(now);
    if (n.role() == proto::PSERVER && !Gone(n)) NewStubLocked(n);
  }
  view_.mutable_members(0)->set_state(proto::ALIVE);
  BumpEpochLocked();
  next_node_id_ = std::max(next_node_id_, st.next_node_id());
  placed_ = st.placed();
  failovers_ = st.failovers();
  partitions_restored_ = st.partitions_restored();
  steps_lost_ = st.steps_lost();
}

// --- Internals.

proto::NodeInfo* NodeManager::FindLocked(uint32_t id) {
  for (proto::NodeInfo& n : *view_.mutable_members()) {
    if (n.id() == id) return &n;
  }
  return nullptr;
}

const proto::NodeInfo* NodeManager::FindLocked(uint32_t id) const {
  for (const proto::NodeInfo& n : view_.members()) {
    if (n.id() == id) return &n;
  }
  return nullptr;
}

void NodeManager::BumpEpochLocked() { view_.set_epoch(view_.epoch() + 1); }

void NodeManager::RotateDataKeyLocked() {
  if (options_.security->plaintext) return;
  data_secret_ = transport::RandomBytes(32);
  key_epoch_ = std::max(key_epoch_ + 1, view_.epoch());
}

void NodeManager::FillDataKeyLocked(const proto::NodeInfo& n, proto::DataPlaneKey* key) {
  if (options_.security->plaintext) return;
  if (data_secret_.empty()) RotateDataKeyLocked();
  key->set_epoch(key_epoch_);
  key->set_key(transport::DeriveNodeKey(data_secret_, n.id()));
  // (Those that serve the data plane verify the others: the pservers, and
  // the workers when they keep dense tables by allreduce among themselves.)
  const bool serves = n.role() == proto::PSERVER ||
                      (n.role() == proto::WORKER &&
                       (options_.workers_serve_data ||
                        std::any_of(options_.tables.begin(), options_.tables.end(),
                                    [](const proto::TableInfo& t) { return t.allreduce(); })));
  if (serves) key->set_secret(data_secret_);
}

void NodeManager::AddNodeMetrics(proto::Role role, uint32_t index) {
  // Per node, by role and index (stable across a node's restarts): its
  // newest instance's heartbeat age and whether it is alive.
  const MetricLabels labels = {{"role", NodeRoleName(role)}, {"index", std::to_string(index)}};
  auto newest = [this, role, index]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const proto::NodeInfo* found = nullptr;
    for (const auto& m : view_.members()) {
      if (m.role() == role && m.index() == static_cast<int32_t>(index) &&
          (found == nullptr || m.id() > found->id())) {
        found = &m;
      }
    }
    return found;
  };
  options_.metrics->AddCallbackGauge(
      "strata_master_heartbeat_age_seconds", "Seconds since the node's last heartbeat",
      [this, newest]() {
        absl::MutexLock l(&mu_);
        const proto::NodeInfo* n = newest();
        if (n == nullptr) return std::nan("");
        return (ToUnixMs(clock_->Now()) - n->last_heartbeat_unix_ms()) / 1000.0;
      },
      labels);
  options_.metrics->AddCallbackGauge(
      "strata_master_node_up", "1 while the node is alive, 0 once declared dead",
      [this, newest]() {
        absl::MutexLock l(&mu_);
        const proto::NodeInfo* n = newest();
        return n != nullptr && !Gone(*n) ? 1.0 : 0.0;
      },
      labels);
}

void NodeManager::RegisterMetrics() {
  auto locked = [this](auto fn) {
    return [this, fn]() {
      absl::MutexLock l(&mu_);
      return static_cast<double>(fn());
    };
  };
  MetricsRegistry* metrics = options_.metrics;
  metrics->AddCallbackGauge(
      "strata_master_view_epoch", "Cluster view epoch",
      locked([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return view_.epoch(); }));
  for (proto::Role role : {proto::PSERVER, proto::WORKER}) {
    metrics->AddCallbackGauge(
        "strata_master_nodes_alive", "Nodes alive (workers: training or finished)",
        locked([this, role]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return CountLocked(role, true); }),
        {{"role", NodeRoleName(role)}});
  }
  metrics->AddCallbackGauge("strata_master_nodes_dead", "Nodes declared dead",
                            locked([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
                              int c = 0;
                              for (const auto& n : view_.members()) c += n.state() == proto::DEAD;
                              return c;
                            }));
}

}  // namespace strata::master
