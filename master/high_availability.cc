#include "master/high_availability.h"

#include <atomic>
#include <cstdlib>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/daemon.h"
#include "common/http_server.h"
#include "common/metrics.h"
#include "common/security.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "master/etcd_state.h"
#include "master/standby.h"
#include "storage/file_system.h"

namespace strata::master {
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> EtcdCredentials(const MasterOptions& o) {
  if (!o.config.cluster.etcd.tls) return std::shared_ptr<grpc::ChannelCredentials>();
  const ControlPlaneSecurity& sec = o.security;
  if (sec.plaintext || sec.ca_file.empty()) {
    return absl::InvalidArgumentError(
        "cluster.etcd.tls: true needs security.mode mtls (the master's certificate is what it "
        "shows etcd)");
  }
  const auto local = storage::NewPosixFileSystem();
  grpc::SslCredentialsOptions ssl;
  for (auto [path, out] :
       {std::pair{sec.ca_file, &ssl.pem_root_certs}, std::pair{sec.cert_file, &ssl.pem_cert_chain},
        std::pair{sec.key_file, &ssl.pem_private_key}}) {
    auto bytes = local->ReadFile(path);
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("cluster.etcd.tls: ", bytes.status().message()));
    }
    *out = *std::move(bytes);
  }
  return grpc::SslCredentials(ssl);
}

absl::StatusOr<std::unique_ptr<HighAvailability>> HighAvailability::AwaitLead(
    MasterOptions* opts, const std::string& instance, int* exit_code) {
  const EtcdSection& e = opts->config.cluster.etcd;
  *exit_code = 2;
  EtcdClient::Options eo;
  eo.endpoints = e.endpoints;
  eo.request_timeout = absl::Milliseconds(e.request_timeout_ms);
  auto creds = EtcdCredentials(*opts);
  if (!creds.ok()) return creds.status();
  eo.credentials = *std::move(creds);
  std::unique_ptr<HighAvailability> ha(new HighAvailability());
  auto etcd = EtcdClient::Connect(std::move(eo));
  if (!etcd.ok()) return etcd.status();
  ha->etcd_ = *std::move(etcd);
  *exit_code = 1;

  // A standby: the redirect on the master's port, while it campaigns.
  int port = 0;
  std::unique_ptr<grpc::Service> standby;
  std::unique_ptr<grpc::Server> server;
  const std::string keys =
      EtcdJobKeys(e.prefix, opts->config.job.name) + (instance.empty() ? "" : instance + "/");
  // (The address is known once the port is bound: the leadership is made
  // after, and the redirect asks it through this pointer.)
  std::atomic<MasterLeadership*> lead{nullptr};
  standby = NewStandbyService(HostPort(opts->host, opts->port), [&lead] {
    MasterLeadership* l = lead.load();
    return l != nullptr ? l->leader() : std::string();
  });
  auto started = StartControlServer("master", opts->host, opts->port, opts->security.server,
                                    standby.get(), opts->config.cluster.control_connect_ms, &port);
  if (!started.ok()) return started.status();
  server = *std::move(started);
  const std::string address = HostPort(opts->host, port);
  // And its HTTP endpoints on the master's HTTP port: its own health and
  // metrics, the leader's pages redirected there. Elected, it hands the
  // port to the leader's own (MasterServer::Start).
  MetricsRegistry standby_metrics;
  AddProcessMetrics(&standby_metrics);
  HttpServer http;
  std::string http_address;
  if (opts->http_port >= 0) {
    ServeStandbyHttp(
        &http, &standby_metrics,
        [&lead] {
          // (Elected, until its own server takes the port: 503, not a
          // redirect to itself.)
          MasterLeadership* l = lead.load();
          return l != nullptr && !l->leading() ? LeaderAddresses{l->leader(), l->leader_http()}
                                               : LeaderAddresses{};
        },
        !opts->security.plaintext);
    STRATA_RETURN_IF_ERROR(SecureHttp(opts->security, &http, nullptr));
    STRATA_RETURN_IF_ERROR(http.Start(opts->host, opts->http_port));
    http_address = HostPort(opts->host, http.port());
  }
  ha->leadership_ = std::make_unique<MasterLeadership>(
      MasterLeadership::Options{ha->etcd_.get(), keys, address, http_address, e.lease_seconds});
  lead = ha->leadership_.get();
  LOG(INFO) << "master " << address << ": a standby, campaigning for the lead of job "
            << opts->config.job.name << " in etcd " << ha->etcd_->endpoint() << " (" << keys
            << "leader)";

  // A standby follows the job's state in etcd, once a second: elected, it
  // reads only what was written since.
  EtcdStateReader follower(ha->etcd_.get(), keys);
  absl::Time followed = absl::InfinitePast();
  std::string follow_error;
  auto follow = [&] {
    if (absl::Now() - followed < absl::Seconds(1)) return;
    followed = absl::Now();
    absl::Status s = follower.Follow();
    if (!s.ok() && s.ToString() != follow_error) {
      LOG(WARNING) << "standby: following the job's state in etcd: " << s << "; trying again";
    }
    follow_error = s.ok() ? "" : s.ToString();
  };
  std::atomic<bool> stop{false}, done{false};
  absl::Status campaign;
  std::thread campaigner([&] {
    campaign = ha->leadership_->Campaign([&stop] { return stop.load(); }, follow);
    done = true;
  });
  const int sig = WaitForTerminationSignal([&done] { return done.load(); });
  stop = true;
  campaigner.join();
  server->Shutdown(absl::ToChronoTime(absl::Now()));
  server.reset();
  http.Shutdown();
  lead = nullptr;
  if (sig != 0 || !campaign.ok()) {
    // (Elected just as the signal came: the lead is handed on at once.)
    if (campaign.ok()) ha->leadership_->Resign();
    LOG(INFO) << "stopped while a standby";
    return std::unique_ptr<HighAvailability>();
  }
  // The leader: from here on, a lease not renewed in time ends the process
  // before another master can be elected (leadership.h).
  HighAvailability* self = ha.get();
  ha->leadership_->KeepLeading(MasterLeadership::Callbacks{
      [self](const std::string&) { self->Pause(); }, [self] { self->Resume(); },
      [](const std::string& why) {
        LOG(ERROR) << "exiting at once so that the new leader alone acts (" << why
                   << "); restarted, this master is a standby";
        google::FlushLogFiles(google::GLOG_INFO);
        std::_Exit(3);
      }});
  opts->port = port;
  if (opts->http_port >= 0) opts->http_port = http.port();
  STRATA_RETURN_IF_ERROR(ha->TakeUpState(opts, keys, &follower));
  return ha;
}

absl::Status HighAvailability::TakeUpState(MasterOptions* opts, const std::string& keys,
                                           EtcdStateReader* follower) {
  std::optional<proto::MasterState> replayed;
  const uint64_t had = follower->state().has_value() ? follower->state()->record_seq() : 0;
  // (An etcd member down, or a read at a revision another job's compaction
  // just dropped, passes: tried again while the lease lasts.)
  absl::StatusOr<std::unique_ptr<EtcdStateStore>> store;
  for (int attempt = 0;; ++attempt) {
    EtcdStateStore::Options so{etcd_.get(), leadership_.get(), keys};
    so.compact = opts->config.cluster.etcd.compact;
    store = EtcdStateStore::Open(so, &replayed, follower);
    const absl::Status& s = store.status();
    if (s.ok() || absl::IsDataLoss(s) || absl::IsFailedPrecondition(s) || attempt >= 5) break;
    LOG(WARNING) << "reading the job's state in etcd: " << s << "; trying again";
    absl::SleepFor(absl::Milliseconds(200));
  }
  if (!store.ok()) return store.status();
  LOG(INFO) << "the job's state in etcd: "
            << (replayed.has_value() ? absl::StrCat("replayed to record ", replayed->record_seq(),
                                                    had > 0 ? absl::StrCat(" (followed to record ",
                                                                           had, " while a standby)")
                                                            : std::string())
                                     : std::string("none yet (a new job)"));
  opts->state_store = *std::move(store);
  opts->state_replayed = std::move(replayed);
  return absl::OkStatus();
}

void HighAvailability::Attach(MasterServer* master) {
  absl::MutexLock l(&mu_);
  master_ = master;
  if (master_ != nullptr && paused_) master_->Pause();
}

void HighAvailability::Pause() {
  absl::MutexLock l(&mu_);
  paused_ = true;
  if (master_ != nullptr) master_->Pause();
}

void HighAvailability::Resume() {
  absl::MutexLock l(&mu_);
  paused_ = false;
  if (master_ != nullptr) master_->Resume();
}

}  // namespace strata::master
