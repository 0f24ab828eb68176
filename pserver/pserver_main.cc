// strata-pserver: holds parameter partitions, aggregates and applies updates.
#include <csignal>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/daemon.h"
#include "common/grpc_channel.h"
#include "common/security.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "pserver/pserver.h"
#include "storage/file_system.h"
#include "storage/s3_file_system.h"
#include "transport/transport_config.h"

DEFINE_string(config, "", "job config (YAML), required");
DEFINE_string(tls_dir, "",
              "certificates (ca.crt, pserver.crt, pserver.key): overrides security.tls_dir");
DEFINE_string(master, "", "master address host:port, required");
DEFINE_int32(index, 0, "instance index of this pserver (0-based)");
DEFINE_string(host, "127.0.0.1", "address to bind and advertise");
DEFINE_int32(port, -1, "admin gRPC port (default: cluster.ports.pserver + index; 0 = any)");
DEFINE_int32(data_port, -1, "data-plane port (default: cluster.ports.pserver_data + index)");
DEFINE_int32(apply_threads, 1,
             "threads applying updates, partitions spread over them (1 = the transport "
             "thread, 0 = one per core)");
DEFINE_string(failpoint, "", "tests: NAME[@N],... kills this process there (common/failpoint.h)");
DEFINE_int32(http_port, -2, "HTTP port (default: cluster.ports.pserver_http + index; -1 = off)");

int main(int argc, char** argv) {
  gflags::SetUsageMessage("strata-pserver --config C --master HOST:PORT --index I");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  strata::InitDaemon(argv[0]);

  auto config = strata::LoadJobConfig(FLAGS_config);
  if (!config.ok()) {
    LOG(ERROR) << config.status().message();
    return 2;
  }
  const auto& ports = config->cluster.ports;
  strata::pserver::PServerOptions opts;
  opts.config = *config;
  opts.master_address = FLAGS_master;
  opts.index = FLAGS_index;
  opts.host = FLAGS_host;
  opts.port = FLAGS_port >= 0 ? FLAGS_port : ports.pserver + FLAGS_index;
  opts.data_port = FLAGS_data_port >= 0 ? FLAGS_data_port : ports.pserver_data + FLAGS_index;
  opts.http_port = FLAGS_http_port >= -1 ? FLAGS_http_port : ports.pserver_http + FLAGS_index;
  opts.transport = strata::transport::TransportOptionsFor(config->cluster);
  opts.apply_threads = FLAGS_apply_threads;
  {
    // Refuses to start on a key readable by others or a missing certificate.
    auto security = strata::DaemonSecurity(config->security, FLAGS_tls_dir, "pserver", FLAGS_index);
    if (!security.ok()) {
      LOG(ERROR) << "cannot start pserver: " << security.status().message();
      return 2;
    }
    opts.security = *std::move(security);
  }
  std::string fs_note;
  auto fs = strata::storage::NewFileSystemForConfig(config->s3, ::getenv, &fs_note);
  if (!fs.ok()) {
    LOG(ERROR) << "cannot start pserver: " << fs.status().message();
    return 2;
  }
  if (!fs_note.empty()) LOG(INFO) << fs_note;
  if (auto s = strata::storage::CheckCheckpointRoot(fs->get(), config->checkpoint); !s.ok()) {
    LOG(ERROR) << "cannot start pserver: " << s.message();
    return 1;
  }
  opts.fs = fs->get();
  auto failpoints = strata::Failpoints::Parse(FLAGS_failpoint);
  if (!failpoints.ok()) {
    LOG(ERROR) << failpoints.status().message();
    return 2;
  }
  opts.failpoints = failpoints->get();

  auto server = strata::pserver::PServer::Create(std::move(opts));
  if (!server.ok()) {
    LOG(ERROR) << "cannot start pserver: " << server.status().message();
    return 1;
  }
  if (auto s = (*server)->Start(); !s.ok()) {
    LOG(ERROR) << "cannot start pserver: " << s.message();
    return 1;
  }
  const int sig = strata::WaitForTerminationSignal([&server] { return (*server)->fenced(); });
  if (sig == 0 && (*server)->drained()) {
    (*server)->Shutdown();
    LOG(INFO) << "drained: exiting";
    return 0;  // done, not failed: neither launch.sh nor systemd restarts it
  }
  if (sig == 0) {
    // Fenced: declared dead while alive. A fresh process joins as a new
    // node (launch.sh's supervision or systemd's Restart=on-failure).
    (*server)->Shutdown();
    return 75;
  }
  if (sig == SIGTERM && config->checkpoint.enabled) {
    // A preemption notice: the job is checkpointed and stopped first.
    LOG(INFO) << "SIGTERM: asking the master for a checkpoint and a clean stop (grace "
              << config->checkpoint.grace_seconds << " s)";
    absl::Status s =
        (*server)->RequestCheckpointAndStop(absl::Seconds(config->checkpoint.grace_seconds));
    if (absl::IsFailedPrecondition(s)) {
      LOG(INFO) << "no checkpoint before stopping: " << s.message();  // the job is over
    } else if (!s.ok()) {
      LOG(WARNING) << "no checkpoint before stopping: " << s;
    }
  }
  LOG(INFO) << "signal received; shutting down";
  (*server)->Shutdown();
  return 0;
}
