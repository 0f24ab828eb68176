#include "pserver/pserver.h"

#include <algorithm>
#include <atomic>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/aggregation.h"
#include "common/daemon.h"
#include "common/daemon_env.h"
#include "common/error_reason.h"
#include "common/grpc_channel.h"
#include "common/grpc_status.h"
#include "common/initializer.h"
#include "common/metrics.h"
#include "common/proto_json.h"
#include "common/row_optimizer.h"
#include "common/status_macros.h"
#include "common/threads.h"
#include "glog/logging.h"
#include "pserver/partition_files.h"
#include "storage/checkpoint_format.h"
#include "transport/data_plane_auth.h"
#include "transport/transport_metrics.h"

namespace strata::pserver {

using transport::Message;
using transport::MessageType;

class PServer::AdminService final : public proto::PServerAdmin::Service {
 public:
  explicit AdminService(PServer* p) : p_(p) {}
  // The policy (docs/security.md): the master drives this service. The
  // call's place among its host's calls in progress (held until the
  // answer), or the refusal.
  absl::StatusOr<PeerCallLimiter::Slot> Admit(grpc::ServerContext* ctx, const char* method) {
    absl::StatusOr<PeerCallLimiter::Slot> slot = calls_.Enter(ctx->peer());
    absl::Status refused = slot.status();
    if (refused.ok()) {
      refused =
          p_->options_.security.Authorize(*ctx, absl::StrCat("/strata.proto.PServerAdmin/", method))
              .status();
    }
    if (refused.ok()) return slot;
    LOG_EVERY_N(WARNING, 20) << "refused " << method << " from " << ctx->peer() << ": "
                             << refused.message();
    return refused;
  }
  grpc::Status AssignPartitions(grpc::ServerContext* ctx, const proto::AssignPartitionsRequest* req,
                                proto::AssignPartitionsResponse* resp) override {
    auto slot = Admit(ctx, "AssignPartitions");
    if (!slot.ok()) return ToGrpcStatus(slot.status());
    if (req->node_id() != p_->node_id()) {
      return ToGrpcStatus(absl::FailedPreconditionError(absl::StrCat(
          "AssignPartitions for node ", req->node_id(), " sent to node ", p_->node_id())));
    }
    absl::Status s = p_->ApplyView(req->view(), req->has_restore() ? &req->restore() : nullptr,
                                   req->checkpoint_root());
    if (!s.ok()) return ToGrpcStatus(s);
    for (const auto& part : req->view().partitions()) {
      if (part.owner() == p_->node_id()) resp->add_partitions(part.id());
    }
    return grpc::Status::OK;
  }
  grpc::Status GetStatus(grpc::ServerContext* ctx, const proto::PServerStatusRequest*,
                         proto::PServerStatusResponse* resp) override {
    auto slot = Admit(ctx, "GetStatus");
    if (!slot.ok()) return ToGrpcStatus(slot.status());
    *resp = p_->Status();
    return grpc::Status::OK;
  }
  grpc::Status CheckpointPartitions(grpc::ServerContext* ctx,
                                    const proto::CheckpointPartitionsRequest* req,
                                    proto::CheckpointPartitionsResponse* resp) override {
    auto slot = Admit(ctx, "CheckpointPartitions");
    if (!slot.ok()) return ToGrpcStatus(slot.status());
    auto r = p_->Checkpoint(*req, [ctx] { return ctx->IsCancelled(); });
    if (!r.ok()) return ToGrpcStatus(r.status());
    *resp = std::move(*r);
    return grpc::Status::OK;
  }

 private:
  PServer* const p_;  // owns this service
  PeerCallLimiter calls_{kMaxCallsPerPeerHost};
};

absl::StatusOr<std::unique_ptr<PServer>> PServer::Create(PServerOptions options) {
  if (options.master_address.empty()) {
    return absl::InvalidArgumentError("pserver: master address is required");
  }
  if (options.fs == nullptr) return absl::InvalidArgumentError("PServerOptions.fs is required");
  STRATA_RETURN_IF_ERROR(Optimizer::Create(options.config.optimizer, 1).status());
  return std::unique_ptr<PServer>(new PServer(std::move(options)));
}

PServer::PServer(PServerOptions options) : options_(std::move(options)) {}

PServer::~PServer() { Shutdown(); }

std::string PServer::data_address() const { return transport_ ? transport_->listen_address() : ""; }
std::string PServer::admin_address() const { return absl::StrCat(options_.host, ":", admin_port_); }

absl::Status PServer::Start() {
  RegisterMetrics();  // before Listen: request handlers use the counters
  const int threads = options_.apply_threads > 0
                          ? options_.apply_threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (threads > 1) executor_ = std::make_unique<ShardedExecutor>(threads);
  // An mtls cluster's data plane serves members only (docs/security.md).
  transport::TransportOptions topts = options_.transport;
  // Pushes are applied from the connection's buffer (owned first where a
  // request is posted to the executor).
  topts.lend_request_payloads = true;
  if (!options_.security.plaintext) {
    membership_ = std::make_shared<transport::MembershipKeys>();
    topts.membership = membership_;
    topts.encrypt_data_plane = options_.config.security.encrypt_data_plane;
  }
  STRATA_ASSIGN_OR_RETURN(transport_, transport::CreateTransport(topts));
  STRATA_RETURN_IF_ERROR(
      transport_->Listen(options_.host, options_.data_port,
                         [this](Message req, std::shared_ptr<transport::Responder> r) {
                           HandleRequest(std::move(req), std::move(r));
                         }));
  admin_service_ = std::make_unique<AdminService>(this);
  STRATA_ASSIGN_OR_RETURN(
      admin_server_, StartControlServer("pserver", options_.host, options_.port,
                                        options_.security.server, admin_service_.get(),
                                        options_.config.cluster.control_connect_ms, &admin_port_));
  if (options_.http_port >= 0) {
    ServeStandardEndpoints(&http_, &metrics_, [this] { return ProtoJsonResponse(Status()); });
    STRATA_RETURN_IF_ERROR(SecureHttp(options_.security, &http_));
    STRATA_RETURN_IF_ERROR(http_.Start(options_.host, options_.http_port));
  }

  // Before registering: the master may place partitions (with backups)
  // as soon as this node is registered.
  replicas_ = std::make_unique<ReplicaStreams>(
      transport_.get(), [this] { return node_id_.load(); }, [this] { return epoch_.load(); },
      [this] {
        absl::MutexLock l(&mu_);
        refresh_wanted_ = true;
      },
      [this](uint32_t backup, const std::string& why) {
        absl::MutexLock l(&mu_);
        suspects_.emplace(backup, why);
      },
      absl::Milliseconds(std::max(500, options_.config.cluster.dead_timeout_ms / 2)));
  agent_ = std::make_unique<NodeAgent>(NodeAgent::DaemonOptions(
      options_.config.cluster, options_.master_address, options_.security.client,
      absl::StrCat("pserver ", options_.index), membership_));
  proto::RegisterRequest req;
  req.set_role(proto::PSERVER);
  req.set_job(options_.config.job.name);
  req.set_index(options_.index);
  req.set_host(options_.host);
  req.set_grpc_address(admin_address());
  req.set_data_address(data_address());
  req.set_http_port(options_.http_port >= 0 ? http_.port() : 0);
  STRATA_ASSIGN_OR_RETURN(proto::RegisterResponse resp,
                          agent_->Register(req, options_.register_timeout, stop_));
  node_id_ = resp.node_id();
  epoch_ = resp.view().epoch();
  RenewLease(absl::Now());
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  started_ = true;
  LOG(INFO) << "pserver " << options_.index << " is node " << node_id_ << ": data "
            << data_address() << ", admin " << admin_address() << ", http " << http_.port();
  return absl::OkStatus();
}

void PServer::Shutdown() {
  if (shutdown_.exchange(true)) return;
  stop_.Notify();
  if (heartbeat_.joinable()) heartbeat_.join();
  if (replicas_) replicas_->Shutdown();
  if (admin_server_) admin_server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  if (transport_) transport_->Shutdown();
  if (executor_) executor_->Shutdown();  // runs what is queued; replies are dropped
  http_.Shutdown();
  started_ = false;
}

std::shared_ptr<Partition> PServer::FindPartition(uint32_t id) const {
  absl::MutexLock l(&mu_);
  auto it = partitions_.find(id);
  return it == partitions_.end() ? nullptr : it->second;
}

std::shared_ptr<Partition> PServer::Share(std::unique_ptr<Partition> part) const {
  held_->fetch_add(1);
  return std::shared_ptr<Partition>(part.release(), [held = held_](Partition* p) {
    delete p;
    held->fetch_sub(1);
  });
}

std::vector<std::shared_ptr<const Partition>> PServer::Partitions() const {
  absl::MutexLock l(&mu_);
  std::vector<std::shared_ptr<const Partition>> parts;
  for (const auto& [id, p] : partitions_) parts.push_back(p);
  return parts;
}

absl::Status PServer::ApplyView(const proto::ClusterView& view,
                                const proto::CheckpointManifest* restore,
                                const std::string& checkpoint_root) {
  absl::MutexLock al(&apply_mu_);
  return ApplyViewLocked(view, restore, checkpoint_root);
}

void PServer::DisconnectTheGone(const proto::ClusterView& view) {
  for (const auto& m : view.members()) {
    // A node that left loses its open data connections now, not only its
    // key for new ones (docs/security.md): a worker declared dead, or a
    // fenced primary's replication stream.
    if ((m.state() == proto::DEAD || m.state() == proto::DRAINED) && m.id() != node_id_ &&
        transport_ != nullptr && disconnected_.insert(m.id()).second) {
      transport_->DisconnectNode(m.id());
    }
  }
}

absl::StatusOr<std::unique_ptr<Partition>> PServer::NewPartition(const proto::ClusterView& view,
                                                                 const proto::PartitionInfo& p) {
  if (p.table_id() >= static_cast<uint32_t>(view.tables_size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("partition ", p.id(), " names table ", p.table_id(), " not in the view"));
  }
  const proto::TableInfo& t = view.tables(p.table_id());
  if (t.sparse()) {
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<SparseTable> rows, MakeSparseTable(view, t, p));
    VLOG(1) << "serving partition " << p.id() << " (" << t.name() << ", virtual partition "
            << p.offset() << " of " << t.partitions() << ")";
    return std::make_unique<Partition>(p.id(), t.name(), std::move(rows), Sync());
  }
  std::vector<float> values(p.length());
  // A backup's values come with its primary's copy: only a primary's are
  // initialized (a move's target makes its partition while training waits
  // on the cores).
  if (p.owner() == node_id_) {
    STRATA_RETURN_IF_ERROR(
        InitializeSlice(InitSpec{t.init(), t.fan_in(), t.fan_out(), t.id(), view.seed()},
                        p.offset(), p.length(), values.data()));
  }
  STRATA_ASSIGN_OR_RETURN(auto opt, Optimizer::Create(options_.config.optimizer, p.length()));
  VLOG(1) << "serving partition " << p.id() << " (" << t.name() << " [" << p.offset() << ", "
          << p.offset() + p.length() << "))";
  return std::make_unique<Partition>(p.id(), t.name(), std::move(values), std::move(opt), Sync(),
                                     view.chunk_bytes() / sizeof(float));
}

absl::Status PServer::LoadPartitions(
    const std::vector<std::pair<const proto::CheckpointPartition*, Partition*>>& to_load,
    const std::string& checkpoint_root, uint64_t seq) {
  // Each load holds its files and their decoded streams (about twice the
  // files' bytes): as many at once as keep that under 1 GiB, 1 to 4.
  uint64_t largest = 1;
  for (const auto& [entry, part] : to_load) {
    uint64_t bytes = 0;
    for (const auto& f : entry->files()) bytes += f.size();
    largest = std::max(largest, bytes);
  }
  const size_t kParallelLoads =
      static_cast<size_t>(std::clamp<uint64_t>((uint64_t{1} << 30) / (2 * largest), 1, 4));
  std::vector<absl::Status> loaded(to_load.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < to_load.size(); i = next++) {
      loaded[i] =
          LoadPartition(options_.fs, checkpoint_root, *to_load[i].first, seq, to_load[i].second);
    }
  };
  std::vector<std::thread> loaders;
  for (size_t t = 1; t < std::min(kParallelLoads, to_load.size()); ++t) {
    if (!TryAddThread(&loaders, work)) break;
  }
  work();
  for (std::thread& t : loaders) t.join();
  for (const absl::Status& s : loaded) STRATA_RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

absl::Status PServer::ApplyViewLocked(const proto::ClusterView& view,
                                      const proto::CheckpointManifest* restore,
                                      const std::string& checkpoint_root) {
  VLOG(1) << "applying view epoch " << view.epoch() << " (at epoch " << epoch_.load() << ")";
  const absl::Time start = absl::Now();
  DisconnectTheGone(view);
  std::map<uint32_t, const proto::CheckpointPartition*> saved;
  if (restore != nullptr) {
    for (const auto& p : restore->partitions()) saved[p.id()] = &p;
  }
  const uint32_t self = node_id_;
  std::set<uint32_t> owned, backing;
  std::vector<const proto::PartitionInfo*> to_create;
  {
    absl::MutexLock l(&mu_);
    if (view.epoch() < epoch_.load() && !partitions_.empty()) return absl::OkStatus();
    // A view without partitions is one from before placement (the master
    // makes its placed view its own only once every pserver has taken its
    // partitions, and a node joining meanwhile bumps the epoch of the old
    // one). It cannot take partitions away: were it applied after a slow
    // restore, the restored partitions would go and come back empty.
    if (view.partitions_size() == 0 && !partitions_.empty()) {
      VLOG(1) << "view epoch " << view.epoch() << " has no partitions yet; keeping ours";
      return absl::OkStatus();
    }
    for (const auto& p : view.partitions()) {
      const bool backup =
          std::find(p.backups().begin(), p.backups().end(), self) != p.backups().end();
      if (p.owner() != self && !backup) continue;
      (p.owner() == self ? owned : backing).insert(p.id());
      // New here, served here as primary and now a backup (it moved away
      // and this node backs its new owner), or backed here for another
      // owner (a move's cut-over, a failover): a fresh backup, given the
      // new owner's copy; the old one goes, its waiting requests refused.
      // (Kept, a backup's record index from the old owner's stream would
      // not be the new owner's: it would refuse the new copy, or skip
      // records it never had.)
      auto it = partitions_.find(p.id());
      auto was = owner_of_.find(p.id());
      const bool new_owner = was != owner_of_.end() && was->second != p.owner();
      if (it == partitions_.end() ||
          (backup && (it->second->role() == PartitionRole::kPrimary || new_owner))) {
        to_create.push_back(&p);
      }
    }
  }
  // New partitions are built (and restored) without mu_, so serving and
  // heartbeats go on, then installed together: all or none.
  std::map<uint32_t, std::unique_ptr<Partition>> created;
  // Partitions to load from the checkpoint, loaded after the loop a few at
  // a time: one partition's file arrives while another's is decoded (an
  // object store answers several requests at once).
  std::vector<std::pair<const proto::CheckpointPartition*, Partition*>> to_load;
  for (const proto::PartitionInfo* pi : to_create) {
    const proto::PartitionInfo& p = *pi;
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Partition> part, NewPartition(view, p));
    const proto::TableInfo& t = view.tables(p.table_id());
    if (p.owner() != self) {
      part->MakeBackup();  // its state comes from the primary
    } else if (p.restore_seq() != 0) {
      STRATA_RETURN_IF_ERROR(RestoreLostPartition(p, part.get()));
    } else if (restore != nullptr) {
      auto it = saved.find(p.id());
      if (it == saved.end() || it->second->table() != t.name() ||
          it->second->offset() != p.offset() || it->second->length() != p.length()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "checkpoint ", restore->seq(), " under ", checkpoint_root, " has no partition ", p.id(),
            " of table ", t.name(), " at [", p.offset(), ", +", p.length(), ")"));
      }
      to_load.emplace_back(it->second, part.get());
    }
    created[p.id()] = std::move(part);
  }
  if (!to_load.empty()) {
    STRATA_RETURN_IF_ERROR(LoadPartitions(to_load, checkpoint_root, restore->seq()));
  }
  if (restore != nullptr && !created.empty()) {
    LOG(INFO) << "restored " << created.size() << " partition(s) from checkpoint " << restore->seq()
              << " under " << checkpoint_root;
  }
  const absl::Time made = absl::Now();
  const size_t made_count = created.size();
  InstallPartitions(view, std::move(created), std::move(owned), backing);
  VLOG(1) << "view epoch " << view.epoch() << " applied in "
          << absl::FormatDuration(absl::Now() - start) << " (" << made_count
          << " partition(s) made in " << absl::FormatDuration(made - start) << ")";
  return absl::OkStatus();
}

void PServer::InstallPartitions(const proto::ClusterView& view,
                                std::map<uint32_t, std::unique_ptr<Partition>> created,
                                std::set<uint32_t> owned, const std::set<uint32_t>& backing) {
  const uint32_t self = node_id_;
  std::vector<std::shared_ptr<Partition>> all;
  std::vector<Served> primaries;
  std::map<uint32_t, std::string> backup_addresses;
  // Partitions that moved away, released after mu_: the last reference
  // frees a whole table, which must not hold up lookups.
  std::vector<std::shared_ptr<Partition>> left;
  {
    absl::MutexLock l(&mu_);
    for (auto& [id, part] : created) {
      if (part->sparse() && sparse_metrics_.insert(part->table()).second) {
        AddSparseMetrics(part->table());
      }
      auto old = partitions_.find(id);
      if (old != partitions_.end()) {
        LOG(INFO) << "partition " << id << " (" << old->second->table()
                  << ") is a backup here from view epoch " << view.epoch()
                  << ": its new owner sends a copy";
        ShadowOrDropLocked(id, std::move(old->second), &left);
      }
      partitions_[id] = Share(std::move(part));
    }
    DropPartitionsLeftLocked(view.epoch(), owned, backing, &left);
    std::map<uint32_t, std::string> data_address;
    for (const auto& m : view.members()) data_address[m.id()] = m.data_address();
    owner_of_.clear();
    moving_in_.clear();
    for (const auto& p : view.partitions()) {
      owner_of_[p.id()] = p.owner();
      if (p.move_to() == self) moving_in_.insert(p.id());
      if (p.owner() != self) continue;
      auto it = partitions_.find(p.id());
      if (it == partitions_.end()) continue;
      auto shadow = shadows_.find(p.id());
      if (shadow != shadows_.end()) {
        // Promoted before the new owner's copy came: the old copy serves.
        if (!it->second->holds_copy() && it->second->role() == PartitionRole::kBackup) {
          LOG(INFO) << "partition " << p.id() << " (" << it->second->table()
                    << ") takes over from the copy its previous owner sent: the new owner's "
                       "copy never came";
          std::swap(it->second, shadow->second);
        }
        left.push_back(std::move(shadow->second));
        shadows_.erase(shadow);
      }
      std::vector<uint32_t> backups(p.backups().begin(), p.backups().end());
      for (uint32_t b : backups) backup_addresses[b] = data_address[b];
      primaries.push_back(Served{it->second, std::move(backups), p.move_to()});
    }
    std::map<uint32_t, uint64_t> since;
    for (uint32_t id : owned) {
      // (A partition made here anew, or promoted, is primary from now on.)
      auto was = primary_since_.find(id);
      since[id] =
          was != primary_since_.end() && created.count(id) == 0 ? was->second : view.epoch();
    }
    primary_since_ = std::move(since);
    owned_ = std::move(owned);
    for (auto& [id, part] : partitions_) all.push_back(part);
    if (view.epoch() >= epoch_.load()) values_writer_ = view.tables_declared_by();
    epoch_ = std::max(epoch_.load(), view.epoch());
  }
  VLOG(1) << "serving view epoch " << view.epoch();
  ServeAsPrimaries(primaries, backup_addresses);
  // Node-local aggregation: worker -> host; pipeline stages: worker -> leader.
  std::map<uint32_t, uint32_t> member_of;
  const std::set<uint32_t> step_workers =
      StepMembers(view, options_.config.model.stages, &member_of);
  for (const auto& p : all) p->SetStepWorkers(step_workers, member_of);
}

void PServer::ShadowOrDropLocked(uint32_t id, std::shared_ptr<Partition> old,
                                 std::vector<std::shared_ptr<Partition>>* left) {
  // In sync with the old owner, it holds every update acknowledged so
  // far: kept (and reported in sync) until the new owner's copy is in, so
  // that a new owner dying first leaves a copy to take over. (The new
  // owner acknowledges nothing this node does not hold: it waits for the
  // new copy's backups, see Partition::SetBackups.)
  if (old->role() != PartitionRole::kBackup || !old->synced()) {
    left->push_back(std::move(old));
    return;
  }
  auto& shadow = shadows_[id];
  if (shadow != nullptr) left->push_back(std::move(shadow));
  shadow = std::move(old);
}

void PServer::DropPartitionsLeftLocked(uint64_t epoch, const std::set<uint32_t>& owned,
                                       const std::set<uint32_t>& backing,
                                       std::vector<std::shared_ptr<Partition>>* left) {
  for (auto it = shadows_.begin(); it != shadows_.end();) {
    if (owned.count(it->first) == 0 && backing.count(it->first) == 0) {
      left->push_back(std::move(it->second));
      it = shadows_.erase(it);
    } else {
      ++it;
    }
  }
  // Partitions this node neither owns nor backs any more stop serving;
  // each is freed once the requests, replication records and checkpoint
  // still holding it let go.
  for (auto it = partitions_.begin(); it != partitions_.end();) {
    if (owned.count(it->first) == 0 && backing.count(it->first) == 0) {
      LOG(INFO) << "partition " << it->first << " (" << it->second->table()
                << ") left this pserver in view epoch " << epoch;
      left->push_back(std::move(it->second));
      it = partitions_.erase(it);
    } else {
      ++it;
    }
  }
}

void PServer::ServeAsPrimaries(const std::vector<Served>& primaries,
                               const std::map<uint32_t, std::string>& backup_addresses) {
  if (replicas_) {
    replicas_->SetBackups(backup_addresses);
    std::map<uint32_t, std::set<uint32_t>> backups_of;
    for (const Served& s : primaries) {
      backups_of[s.part->id()].insert(s.backups.begin(), s.backups.end());
    }
    replicas_->KeepOnly(backups_of);
  }
  for (const Served& s : primaries) {
    s.part->Promote();  // a backup whose primary died
    if (replicas_) s.part->SetBackups(s.backups, replicas_.get(), s.move_to);
  }
}

absl::Status PServer::CutNotPassed(const std::vector<std::shared_ptr<Partition>>& parts,
                                   uint64_t version) {
  for (const auto& p : parts) {
    const uint64_t v = p->stats().newest_chunk_version;
    if (v > version) {
      return WithReason(absl::FailedPreconditionError(absl::StrCat(
                            "partition ", p->id(), " (", p->table(), ") is at version ", v,
                            ", past the checkpoint's cut at version ", version)),
                        proto::REASON_CUT_PASSED);
    }
  }
  return absl::OkStatus();
}

absl::Status PServer::WriteSnapshot(const Partition& p, const PartitionSnapshot& snap,
                                    const proto::CheckpointPartitionsRequest& req,
                                    proto::CheckpointPartitionsResponse* resp) {
  proto::CheckpointPartition* e = resp->add_partitions();
  e->set_id(p.id());
  e->set_table(p.table());
  e->set_length(p.length());
  e->set_sparse(p.sparse());
  e->set_dim(static_cast<uint32_t>(p.sparse_dim()));
  e->set_version(snap.header.version());
  e->set_rows(snap.header.rows());
  e->set_raw_bytes(snap.raw_bytes);
  resp->set_max_stall_seconds(
      std::max(resp->max_stall_seconds(), absl::ToDoubleSeconds(snap.stall)));
  if (snap.unchanged) return absl::OkStatus();
  HitFailpoint(options_.failpoints, "pserver.checkpoint.before_file");
  STRATA_ASSIGN_OR_RETURN(proto::CheckpointFile file,
                          WritePartitionFile(options_.fs, req.root(), snap, req.zstd_level()));
  HitFailpoint(options_.failpoints, "pserver.checkpoint.after_file");
  resp->set_bytes_written(resp->bytes_written() + file.size());
  *e->add_files() = std::move(file);
  return absl::OkStatus();
}

absl::StatusOr<proto::CheckpointPartitionsResponse> PServer::Checkpoint(
    const proto::CheckpointPartitionsRequest& req, const std::function<bool()>& cancelled) {
  if (req.root().empty() || req.seq() == 0) {
    return absl::InvalidArgumentError("CheckpointPartitions: root and seq are required");
  }
  // Held for the whole checkpoint: a partition may move away meanwhile.
  std::vector<std::shared_ptr<Partition>> parts;
  {
    absl::MutexLock l(&mu_);
    // An earlier attempt given up by the master may still be finishing.
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !checkpointing_; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&idle), absl::Seconds(30))) {
      return WithReason(absl::FailedPreconditionError(absl::StrCat(
                            "pserver node ", node_id_.load(), " is already writing a checkpoint")),
                        proto::REASON_CHECKPOINT_BUSY);
    }
    checkpointing_ = true;
    for (uint32_t id : owned_) {
      auto it = partitions_.find(id);
      if (it != partitions_.end()) parts.push_back(it->second);
    }
  }
  struct Done {
    absl::Mutex mu;
    std::vector<std::pair<Partition*, absl::StatusOr<PartitionSnapshot>>> ready ABSL_GUARDED_BY(mu);
  };
  auto done = std::make_shared<Done>();
  SnapshotRequest sreq;
  sreq.job = req.job();
  sreq.seq = req.seq();
  sreq.base_seq = req.base_seq();
  sreq.at_version = req.at_version();
  sreq.version = req.version();
  const std::string dir = storage::JoinPath(req.root(), storage::CheckpointDirName(req.seq()));
  // A cut some partition has passed already fails at once, before any
  // partition copies itself for nothing.
  absl::Status status = req.at_version() ? CutNotPassed(parts, req.version()) : absl::OkStatus();
  if (status.ok()) status = options_.fs->CreateDirs(dir);
  // The new directory's entry must survive a crash too.
  if (status.ok()) status = options_.fs->SyncDir(req.root());
  size_t requested = 0;
  if (status.ok()) {
    for (const auto& shared : parts) {
      ++requested;
      // Borrowed: `parts` holds it until the snapshots are all handled.
      Partition* p = shared.get();
      p->RequestSnapshot(sreq, [done, p](absl::StatusOr<PartitionSnapshot> snap) {
        absl::MutexLock l(&done->mu);
        done->ready.emplace_back(p, std::move(snap));
      });
    }
  }
  proto::CheckpointPartitionsResponse resp;
  const absl::Time deadline =
      absl::Now() + absl::Milliseconds(req.timeout_ms() > 0 ? req.timeout_ms() : 600000);
  size_t handled = 0;
  while (status.ok() && handled < requested) {
    std::vector<std::pair<Partition*, absl::StatusOr<PartitionSnapshot>>> batch;
    {
      absl::MutexLock l(&done->mu);
      auto any = [&done]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(done->mu) { return !done->ready.empty(); };
      const absl::Time slice = std::min(deadline, absl::Now() + absl::Milliseconds(100));
      if (!done->mu.AwaitWithDeadline(absl::Condition(&any), slice) && done->ready.empty()) {
        if (cancelled && cancelled()) {
          status = absl::CancelledError(absl::StrCat(
              "checkpoint ", req.seq(), " cancelled while waiting for version ", req.version()));
          break;
        }
        if (absl::Now() < deadline) continue;
        status = absl::DeadlineExceededError(absl::StrCat(
            "checkpoint ", req.seq(), ": ", requested - handled, " partition(s) of pserver node ",
            node_id_.load(), " did not reach version ", req.version(), " in time"));
        break;
      }
      batch.swap(done->ready);
    }
    for (auto& [p, snap] : batch) {
      ++handled;
      if (!status.ok()) continue;
      if (!snap.ok()) {
        status = snap.status();
        continue;
      }
      status = WriteSnapshot(*p, *snap, req, &resp);
    }
  }
  if (!status.ok()) {
    // Snapshots still waiting for the cut are dropped; the partitions'
    // next checkpoint is a full one (their baseline moved on).
    for (const auto& p : parts) p->CancelSnapshot(req.seq());
  } else {
    status = options_.fs->SyncDir(dir);
    HitFailpoint(options_.failpoints, "pserver.checkpoint.before_reply");
  }
  {
    absl::MutexLock l(&mu_);
    checkpointing_ = false;
  }
  if (!status.ok()) {
    LOG(WARNING) << "checkpoint " << req.seq() << " failed on this pserver: " << status;
    return status;
  }
  VLOG(1) << "checkpoint " << req.seq() << ": wrote " << resp.bytes_written() << " bytes for "
          << resp.partitions_size() << " partition(s)";
  return resp;
}

absl::Status PServer::RestoreLostPartition(const proto::PartitionInfo& p, Partition* part) const {
  const CheckpointSection& c = options_.config.checkpoint;
  if (!c.enabled) {
    return absl::FailedPreconditionError(
        absl::StrCat("partition ", p.id(), " is to be restored from checkpoint ", p.restore_seq(),
                     " but this pserver's config has no checkpoint section"));
  }
  const std::string dir = storage::JoinPath(c.dir, storage::CheckpointDirName(p.restore_seq()));
  STRATA_ASSIGN_OR_RETURN(proto::CheckpointManifest m, storage::ReadManifest(options_.fs, dir));
  for (const auto& e : m.partitions()) {
    if (e.id() != p.id()) continue;
    STRATA_RETURN_IF_ERROR(LoadPartition(options_.fs, c.dir, e, m.seq(), part));
    const uint64_t saved = part->stats().version;
    part->FastForward(p.restore_version());
    LOG(WARNING) << "partition " << p.id() << " (" << part->table() << ") restored from checkpoint "
                 << m.seq() << " at version " << saved << ", moved on to version "
                 << p.restore_version() << ": "
                 << (p.restore_version() > saved ? p.restore_version() - saved : 0)
                 << " step(s) of it lost";
    return absl::OkStatus();
  }
  return absl::NotFoundError(absl::StrCat(dir, ": the manifest has no partition ", p.id()));
}

void PServer::RenewLease(absl::Time granted_at) {
  const ClusterSection& c = options_.config.cluster;
  // Shorter than the master's dead timeout: by the time the master gives
  // this node's partitions to others, it has stopped serving them.
  const int64_t lease_ms =
      std::max<int64_t>(c.dead_timeout_ms - c.heartbeat_interval_ms, c.dead_timeout_ms / 2);
  lease_until_ns_ = absl::ToUnixNanos(granted_at + absl::Milliseconds(lease_ms));
}

absl::Status PServer::ServingStatus() const {
  if (fenced_.load()) {
    return absl::UnavailableError(
        absl::StrCat("pserver node ", node_id_.load(),
                     " was declared dead by the master and serves nothing (fenced)"));
  }
  if (absl::GetCurrentTimeNanos() > lease_until_ns_.load()) {
    return absl::UnavailableError(absl::StrCat(
        "pserver node ", node_id_.load(),
        ": its lease from the master expired (no heartbeat answered); serving nothing until "
        "renewed"));
  }
  return absl::OkStatus();
}

absl::Status PServer::RequestCheckpointAndStop(absl::Duration grace) {
  return AskMasterToCheckpointAndStop(master().get(), options_.master_address,
                                      absl::StrCat("pserver ", options_.index), grace);
}

absl::StatusOr<std::unique_ptr<SparseTable>> PServer::MakeSparseTable(
    const proto::ClusterView& view, const proto::TableInfo& t,
    const proto::PartitionInfo& p) const {
  const SparseSection& c = options_.config.sparse;
  if (t.dim() < 1 || t.partitions() < 1 || p.offset() >= t.partitions()) {
    return absl::InvalidArgumentError(
        absl::StrCat("sparse table ", t.name(), " of dim ", t.dim(), " and ", t.partitions(),
                     " partitions cannot have virtual partition ", p.offset()));
  }
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<RowOptimizer> opt, RowOptimizer::Create(c.optimizer));
  // A table may fix its initializer (the wide part's weights start at 0).
  STRATA_ASSIGN_OR_RETURN(RowInitializer init,
                          RowInitializer::Create(t.init().empty() ? c.init.type : t.init(),
                                                 c.init.scale, t.id(), view.seed()));
  SparseTableOptions o;
  o.dim = static_cast<int>(t.dim());
  o.optimizer = std::move(opt);
  o.initializer = &init;
  o.admit_min_count = static_cast<uint32_t>(c.admission.min_count);
  o.admit_probability = c.admission.probability;
  o.idle_updates = c.eviction.idle_updates;
  // The table's capacity, shared out evenly (keys hash evenly).
  o.capacity_rows = c.eviction.capacity_rows == 0
                        ? 0
                        : (c.eviction.capacity_rows + t.partitions() - 1) / t.partitions();
  o.seed = view.seed() ^ (static_cast<uint64_t>(p.id()) << 32);
  return SparseTable::Create(o);
}

void PServer::AddSparseMetrics(const std::string& table) {
  auto sum = [this, table](uint64_t SparseTableStats::*field) {
    return [this, table, field]() {
      // Stats are read without holding mu_ (the copy keeps the partitions
      // alive), so a scrape never stalls FindPartition behind a partition
      // busy applying.
      double total = 0;
      for (const auto& p : Partitions()) {
        if (p->sparse() && p->table() == table) {
          total += static_cast<double>(p->sparse_stats().*field);
        }
      }
      return total;
    };
  };
  const MetricLabels labels = {{"table", table}};
  metrics_.AddCallbackGauge("strata_pserver_sparse_rows", "Rows held by sparse tables",
                            sum(&SparseTableStats::rows), labels);
  metrics_.AddCallbackGauge("strata_pserver_sparse_bytes",
                            "Bytes allocated by sparse tables (rows, index, admission counts)",
                            sum(&SparseTableStats::memory_bytes), labels);
  metrics_.AddCallbackGauge("strata_pserver_sparse_keys_admitted", "Keys that became rows",
                            sum(&SparseTableStats::admitted), labels);
  metrics_.AddCallbackGauge("strata_pserver_sparse_keys_rejected",
                            "Pushed keys not admitted (gradient dropped)",
                            sum(&SparseTableStats::rejected), labels);
  metrics_.AddCallbackGauge("strata_pserver_sparse_keys_evicted", "Rows evicted",
                            sum(&SparseTableStats::evicted_idle),
                            {{"table", table}, {"reason", "idle"}});
  metrics_.AddCallbackGauge("strata_pserver_sparse_keys_evicted", "Rows evicted",
                            sum(&SparseTableStats::evicted_capacity),
                            {{"table", table}, {"reason", "capacity"}});
}

bool PServer::PrimarySince(uint32_t partition, uint64_t epoch) const {
  absl::MutexLock l(&mu_);
  auto it = primary_since_.find(partition);
  return it != primary_since_.end() && it->second <= epoch;
}

Message PServer::EpochMismatchResponse(const transport::MessageHeader& h, MessageType answer_type,
                                       uint64_t epoch) {
  Message err;
  if (h.epoch < epoch) {
    err = transport::MakeErrorResponse(
        h, answer_type,
        WithReason(absl::FailedPreconditionError(absl::StrCat("STALE_EPOCH: request epoch ",
                                                              h.epoch, " < pserver epoch ", epoch)),
                   proto::REASON_STALE_EPOCH));
  } else {
    {
      absl::MutexLock l(&mu_);
      if (!refresh_wanted_) VLOG(1) << "request at epoch " << h.epoch << ": fetching the view";
      refresh_wanted_ = true;
    }
    err = transport::MakeErrorResponse(
        h, answer_type,
        WithReason(absl::UnavailableError(absl::StrCat(
                       "pserver epoch ", epoch, " behind request epoch ", h.epoch, "; retry")),
                   proto::REASON_EPOCH_AHEAD));
  }
  err.header.epoch = epoch;
  return err;
}

void PServer::HandleReplica(Message request, std::shared_ptr<Partition> part, uint64_t epoch,
                            std::shared_ptr<transport::Responder> responder) {
  const auto& h = request.header;
  const MessageType answer_type = MessageType::kReplicateResponse;
  absl::Status fit;
  bool moving_in = false;
  {
    absl::MutexLock l(&mu_);
    moving_in = moving_in_.count(h.partition) > 0;
    auto owner = owner_of_.find(h.partition);
    if (h.count != node_id_.load()) {
      fit = absl::FailedPreconditionError(
          absl::StrCat("replication record for node ", h.count, " reached node ", node_id_.load()));
    } else if (part == nullptr || owner == owner_of_.end() || owner->second != h.sender_id) {
      fit = absl::FailedPreconditionError(
          absl::StrCat("replication record for partition ", h.partition, " from node ", h.sender_id,
                       ", which is not its primary here (view epoch ", epoch, ")"));
    }
  }
  if (!fit.ok()) {
    responder->Respond(transport::MakeErrorResponse(h, answer_type, fit));
    return;
  }
  if (moving_in && (h.flags & transport::kFlagReplicaCopy) != 0 && options_.failpoints != nullptr) {
    // (Tests: a move held in the middle. The copy waits on a thread of its
    // own, so that this node goes on answering everything else.)
    const absl::Duration hold = options_.failpoints->Delay("pserver.move.copy_received");
    if (hold > absl::ZeroDuration()) {
      LOG(WARNING) << "failpoint pserver.move.copy_received: holding the copy of partition "
                   << h.partition << " for " << absl::FormatDuration(hold);
      request.OwnPayload();
      auto req = std::make_shared<Message>(std::move(request));
      std::thread([part, req, hold, responder = std::move(responder)]() {
        absl::SleepFor(hold);
        part->ApplyReplica(*req, responder);
      }).detach();
      return;
    }
    HitFailpoint(options_.failpoints, "pserver.move.copy_received");
  }
  if (executor_ == nullptr) {
    part->ApplyReplica(request, std::move(responder));
    if ((h.flags & transport::kFlagReplicaCaughtUp) != 0) BeatNow();
    return;
  }
  request.OwnPayload();  // (lent by the transport until we return)
  auto req = std::make_shared<Message>(std::move(request));
  const bool caught_up = (h.flags & transport::kFlagReplicaCaughtUp) != 0;
  executor_->Post(h.partition, [this, part, req, caught_up, responder = std::move(responder)]() {
    part->ApplyReplica(*req, responder);
    if (caught_up) BeatNow();
  });
}

void PServer::BeatNow() {
  absl::MutexLock l(&mu_);
  beat_now_ = true;
}

void PServer::HandleRequest(Message request, std::shared_ptr<transport::Responder> responder) {
  requests_total_->Increment();
  bytes_in_->Increment(static_cast<double>(request.payload_size()));
  const auto& h = request.header;
  const MessageType resp_type =
      h.type == MessageType::kPullRequest ? MessageType::kPullResponse : MessageType::kPushResponse;
  if (h.type == MessageType::kPing) {
    Message pong;
    pong.header = h;
    pong.header.type = MessageType::kPong;
    pong.payload = std::move(request.payload);
    responder->Respond(std::move(pong));
    return;
  }
  const bool replicate = h.type == MessageType::kReplicate;
  if (h.type != MessageType::kPullRequest && h.type != MessageType::kPushRequest && !replicate) {
    responder->Respond(transport::MakeErrorResponse(
        h, MessageType::kPushResponse,
        absl::InvalidArgumentError(absl::StrCat(
            "unexpected message type ", static_cast<int>(h.type), " from ", responder->peer()))));
    return;
  }
  const MessageType answer_type = replicate ? MessageType::kReplicateResponse : resp_type;
  if (absl::Status serving = ServingStatus(); !serving.ok()) {
    refused_total_->Increment();
    Message err = transport::MakeErrorResponse(h, answer_type, serving);
    err.header.epoch = epoch_.load();
    responder->Respond(std::move(err));
    return;
  }
  const uint64_t epoch = epoch_.load();
  // (Replication is between the views' primaries and backups: always of
  // the same view.)
  if (h.epoch != epoch && (replicate || h.epoch > epoch || !PrimarySince(h.partition, h.epoch))) {
    stale_epoch_total_->Increment();
    Message err = EpochMismatchResponse(h, answer_type, epoch);
    responder->Respond(std::move(err));
    return;
  }
  // Shared with the tasks posted below: the partition may move away
  // before they run.
  std::shared_ptr<Partition> part = FindPartition(h.partition);
  if (replicate)
    return HandleReplica(std::move(request), std::move(part), epoch, std::move(responder));
  if (part == nullptr) {
    // A sender whose view is behind (a restarted pserver took over an
    // address): it refreshes its view and retries.
    Message err = transport::MakeErrorResponse(
        h, resp_type,
        WithReason(
            absl::UnavailableError(absl::StrCat(
                "partition ", h.partition, " is not served by pserver node ", node_id_.load())),
            proto::REASON_NOT_SERVED));
    err.header.epoch = epoch;
    responder->Respond(std::move(err));
    return;
  }
  if ((h.flags & transport::kFlagInitialValues) != 0 && h.sender_id != values_writer_.load()) {
    // Only the writer the view names (a worker declared dead but alive in
    // a plaintext cluster must not mix its values into its successor's).
    responder->Respond(transport::MakeErrorResponse(
        h, resp_type,
        absl::FailedPreconditionError(absl::StrCat(
            "initial values for partition ", h.partition, " from node ", h.sender_id,
            ": the view of epoch ", epoch, " has node ", values_writer_.load(), " write them"))));
    return;
  }
  if (h.type == MessageType::kPullRequest) {
    // A sparse pull returns dim floats for each 8-byte key.
    const double out = part->sparse() ? static_cast<double>(request.payload_size()) / 8.0 *
                                            part->sparse_dim() * sizeof(float)
                                      : static_cast<double>(part->PullFloats(h) * sizeof(float));
    bytes_out_->Increment(out);
  }
  Histogram* const apply_seconds = apply_seconds_;
  if (executor_ == nullptr) {
    if (h.type == MessageType::kPullRequest) {
      part->Pull(request, std::move(responder));
    } else {
      const absl::Time t0 = absl::Now();
      part->Push(request, std::move(responder));
      apply_seconds->Observe(absl::ToDoubleSeconds(absl::Now() - t0));
    }
    return;
  }
  // Partitions apply in parallel; one partition's requests keep their order.
  const uint32_t partition = h.partition;
  request.OwnPayload();  // (lent by the transport until we return)
  auto req = std::make_shared<Message>(std::move(request));
  queued_.fetch_add(1, std::memory_order_relaxed);
  executor_->Post(partition, [this, part, req, apply_seconds, responder = std::move(responder)]() {
    queued_.fetch_sub(1, std::memory_order_relaxed);
    if (req->header.type == MessageType::kPullRequest) {
      part->Pull(*req, responder);
    } else {
      const absl::Time t0 = absl::Now();
      part->Push(*req, responder);
      apply_seconds->Observe(absl::ToDoubleSeconds(absl::Now() - t0));
    }
  });
}

absl::Status PServer::RefreshView() {
  proto::ClusterView view;
  STRATA_RETURN_IF_ERROR(agent_->FetchView(absl::Seconds(5), &view));
  // The heartbeat thread never waits behind a view being applied (a
  // restore reads a whole checkpoint): it tries again next round.
  if (!apply_mu_.TryLock()) {
    absl::MutexLock l(&mu_);
    refresh_wanted_ = true;
    return absl::OkStatus();
  }
  absl::Status s = ApplyViewLocked(view, nullptr, "");
  apply_mu_.Unlock();
  return s;
}

void PServer::HeartbeatLoop() {
  const absl::Duration interval = absl::Milliseconds(options_.config.cluster.heartbeat_interval_ms);
  absl::Time next = absl::Now();
  std::map<uint32_t, std::string> suspects;
  std::map<uint32_t, absl::Time> reported;
  // (What this process may use does not change while it runs.)
  const double cpu_cores = CpuLimitCores();
  const auto memory_limit = static_cast<uint64_t>(MemoryLimitBytes());
  while (!stop_.HasBeenNotified()) {
    bool refresh = false;
    {
      absl::MutexLock l(&mu_);
      auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return refresh_wanted_ || beat_now_ || !suspects_.empty() || stop_.HasBeenNotified();
      };
      mu_.AwaitWithDeadline(absl::Condition(&wake),
                            std::min(next, absl::Now() + absl::Milliseconds(100)));
      refresh = refresh_wanted_;
      refresh_wanted_ = false;
      if (beat_now_) next = absl::Now();
      beat_now_ = false;
      suspects.swap(suspects_);
    }
    if (stop_.HasBeenNotified()) break;
    // A backup we cannot reach: the master hears of it now, not after its
    // heartbeats time out (replication to it holds every update back).
    for (const auto& [node, why] : suspects) {
      absl::Time& last = reported[node];
      if (absl::Now() - last < interval) continue;
      last = absl::Now();
      absl::Status s = agent_->ReportSuspect(node, absl::StrCat("replication: ", why), interval);
      if (!s.ok()) LOG(WARNING) << "cannot report node " << node << ": " << s;
    }
    suspects.clear();
    if (absl::Now() >= next) {
      next = absl::Now() + interval;
      proto::HeartbeatRequest req;
      std::vector<std::shared_ptr<Partition>> stale_shadows;  // (freed after mu_)
      req.set_epoch(epoch_);
      req.set_applies(apply_seconds_->count());
      req.set_apply_seconds(apply_seconds_->sum());
      req.set_apply_queue(static_cast<uint64_t>(std::max<int64_t>(0, queued_.load())));
      req.set_cpu_seconds(ProcessCpuSeconds());
      req.set_cpu_cores(cpu_cores);
      req.set_rss_bytes(static_cast<uint64_t>(ProcessResidentBytes()));
      req.set_memory_limit_bytes(memory_limit);
      {
        absl::MutexLock l(&mu_);
        for (const auto& [id, p] : partitions_) {
          auto shadow = shadows_.find(id);
          if (shadow != shadows_.end() && p->synced()) {
            // The new owner's copy is in: the old one goes.
            stale_shadows.push_back(std::move(shadow->second));
            shadows_.erase(shadow);
          }
          if (p->synced() || shadows_.count(id) != 0) req.add_replicas(id);
          if (p->sparse() && p->role() == PartitionRole::kPrimary) {
            (*req.mutable_partition_bytes())[id] = p->sparse_stats().memory_bytes;
          }
        }
      }
      proto::HeartbeatResponse resp;
      const absl::Time sent = absl::Now();
      absl::Status s = agent_->Heartbeat(std::move(req), interval, &resp);
      if (HasReason(s, proto::REASON_DECLARED_DEAD) || HasReason(s, proto::REASON_UNKNOWN_NODE)) {
        // Declared dead while alive (paused, or cut off): others own our
        // partitions now. Serve nothing more; the process exits.
        if (!fenced_.exchange(true)) {
          LOG(ERROR) << "fenced: " << s.message()
                     << "; this pserver serves and applies nothing more and exits so that a "
                        "fresh one can join";
        }
        break;
      }
      if (!s.ok()) {
        LOG_EVERY_N(WARNING, 10) << "heartbeat failed: " << s;
      } else if (resp.drained()) {
        // `strata drain`: our partitions are the backups' now. Serve
        // nothing more; the process exits 0 (not restarted).
        drained_ = true;
        if (!fenced_.exchange(true)) {
          LOG(INFO) << "drained by the master: this pserver's partitions were taken over by "
                       "their backups; it serves nothing more and exits";
        }
        break;
      } else {
        RenewLease(sent);
        if (resp.epoch() != epoch_) refresh = true;
      }
    }
    if (refresh) {
      absl::Status s = RefreshView();
      if (!s.ok()) LOG(WARNING) << "view refresh failed: " << s;
    }
  }
}

proto::PServerStatusResponse PServer::Status() const {
  proto::PServerStatusResponse resp;
  resp.set_node_id(node_id_);
  resp.set_epoch(epoch_);
  // Stats are read without mu_ (the copy keeps the partitions alive), so
  // a partition busy (a snapshot's copy) never holds up lookups.
  for (const auto& p : Partitions()) {
    PartitionStats st = p->stats();
    proto::PartitionStatus* ps = resp.add_partitions();
    ps->set_id(p->id());
    ps->set_table(p->table());
    ps->set_length(p->length());
    ps->set_version(st.version);
    ps->set_pushes_applied(st.pushes_applied);
    ps->set_duplicate_pushes(st.duplicate_pushes);
    ps->set_open_chunks(st.open_chunks);
    ps->set_role(p->role() == PartitionRole::kPrimary ? "primary"
                 : p->synced()                        ? "backup"
                                                      : "syncing");
    for (const auto& [sender, n] : p->applied_by_sender()) {
      (*ps->mutable_applied_by_sender())[sender] = n;
    }
    for (const auto& [worker, clock] : p->ssp_clocks()) (*ps->mutable_ssp_clocks())[worker] = clock;
    if (p->sparse()) {
      const SparseTableStats ss = p->sparse_stats();
      ps->set_sparse(true);
      ps->set_rows(ss.rows);
      ps->set_memory_bytes(ss.memory_bytes);
    }
  }
  return resp;
}

void PServer::RegisterMetrics() {
  AddProcessMetrics(&metrics_);
  apply_seconds_ = metrics_.GetHistogram(
      "strata_pserver_apply_seconds",
      "Time to take in one push: check, aggregate and (at a step's last push, or asp) apply "
      "the optimizer update",
      Histogram::LatencyBounds());
  metrics_.AddCallbackGauge("strata_pserver_apply_queue_depth",
                            "Requests queued for the apply threads, not yet started",
                            [this] { return static_cast<double>(queued_.load()); });
  requests_total_ =
      metrics_.GetCounter("strata_pserver_requests_total", "Data-plane requests received");
  stale_epoch_total_ = metrics_.GetCounter("strata_pserver_stale_epoch_total",
                                           "Requests refused for an epoch mismatch");
  refused_total_ =
      metrics_.GetCounter("strata_pserver_fenced_requests_total",
                          "Requests refused because this node's lease expired or it was fenced");
  auto replication = [this](uint64_t ReplicaStreams::Stats::*field) {
    return [this, field]() {
      return replicas_ ? static_cast<double>(replicas_->stats().*field) : 0.0;
    };
  };
  metrics_.AddCallbackGauge("strata_pserver_replication_records_sent",
                            "Replication records sent to backups (first sends)",
                            replication(&ReplicaStreams::Stats::records_sent));
  metrics_.AddCallbackGauge("strata_pserver_replication_bytes_sent",
                            "Replication record bytes sent to backups",
                            replication(&ReplicaStreams::Stats::bytes_sent));
  metrics_.AddCallbackGauge("strata_pserver_replication_resends",
                            "Replication records sent again after a failure",
                            replication(&ReplicaStreams::Stats::resends));
  metrics_.AddCallbackGauge("strata_pserver_replication_ack_timeouts",
                            "Replication records left unanswered by a backup and sent again",
                            replication(&ReplicaStreams::Stats::ack_timeouts));
  metrics_.AddCallbackGauge("strata_pserver_replication_queued",
                            "Replication records not yet acknowledged by a backup",
                            replication(&ReplicaStreams::Stats::queued));
  bytes_in_ = metrics_.GetCounter("strata_pserver_bytes_received_total", "Payload bytes received");
  bytes_out_ = metrics_.GetCounter("strata_pserver_bytes_sent_total",
                                   "Payload bytes sent in pull responses");
  auto sum = [this](uint64_t PartitionStats::*field) {
    return [this, field]() {
      double total = 0;
      absl::MutexLock l(&mu_);
      for (const auto& [id, p] : partitions_) total += static_cast<double>(p->stats().*field);
      return total;
    };
  };
  transport::AddTransportGauges(&metrics_, "strata_pserver", [this] { return transport_.get(); });
  metrics_.AddCallbackGauge("strata_pserver_pushes_applied", "Gradients accepted",
                            sum(&PartitionStats::pushes_applied));
  metrics_.AddCallbackGauge("strata_pserver_updates_applied", "Optimizer updates applied",
                            sum(&PartitionStats::updates_applied));
  metrics_.AddCallbackGauge("strata_pserver_duplicate_pushes",
                            "Duplicate pushes acknowledged without applying",
                            sum(&PartitionStats::duplicate_pushes));
  metrics_.AddCallbackGauge("strata_pserver_rejected_pushes",
                            "Pushes refused (stale step, bad size)",
                            sum(&PartitionStats::rejected_pushes));
  metrics_.AddCallbackGauge("strata_pserver_pulls_served", "Pull responses sent",
                            sum(&PartitionStats::pulls_served));
  metrics_.AddCallbackGauge("strata_pserver_partitions", "Partitions served", [this]() {
    absl::MutexLock l(&mu_);
    return static_cast<double>(partitions_.size());
  });
  metrics_.AddCallbackGauge(
      "strata_pserver_partitions_held",
      "Partitions in memory: those served, and those that moved away while a request, "
      "replication record or checkpoint still holds them",
      [this]() { return static_cast<double>(partitions_held()); });
  metrics_.AddCallbackGauge("strata_pserver_view_epoch", "Cluster view epoch held",
                            [this]() { return static_cast<double>(epoch_.load()); });
}

}  // namespace strata::pserver
