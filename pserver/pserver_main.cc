// strata-pserver: holds parameter partitions, aggregates and applies updates.
#include <csignal>
#include <cstdlib>

#include "common/daemon.h"
#include "common/daemon_env.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "pserver/pserver.h"
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
  strata::DaemonEnvOptions eo("pserver", FLAGS_index, FLAGS_config, FLAGS_tls_dir, ::getenv);
  eo.failpoints = FLAGS_failpoint;
  eo.check_checkpoint_root = true;
  int code = 0;
  auto env = strata::LoadDaemonEnv(eo, &code);
  if (!env.ok()) return strata::StartFailed("pserver", env.status(), code);
  const auto& ports = env->config.cluster.ports;
  strata::pserver::PServerOptions opts;
  opts.config = env->config;
  opts.master_address = FLAGS_master;
  opts.index = FLAGS_index;
  opts.host = FLAGS_host;
  opts.port = FLAGS_port >= 0 ? FLAGS_port : ports.pserver + FLAGS_index;
  opts.data_port = FLAGS_data_port >= 0 ? FLAGS_data_port : ports.pserver_data + FLAGS_index;
  opts.http_port = FLAGS_http_port >= -1 ? FLAGS_http_port : ports.pserver_http + FLAGS_index;
  opts.transport = strata::transport::TransportOptionsFor(env->config.cluster);
  opts.apply_threads = FLAGS_apply_threads;
  opts.security = env->security;
  opts.fs = env->fs.get();
  opts.failpoints = env->failpoints.get();
  auto server = strata::pserver::PServer::Create(std::move(opts));
  if (!server.ok()) return strata::StartFailed("pserver", server.status());
  if (auto s = (*server)->Start(); !s.ok()) return strata::StartFailed("pserver", s);
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
  if (sig == SIGTERM && env->config.checkpoint.enabled) {
    strata::CheckpointBeforeStopping(env->config, [&](absl::Duration grace) {
      return (*server)->RequestCheckpointAndStop(grace);
    });
  }
  LOG(INFO) << "signal received; shutting down";
  (*server)->Shutdown();
  return 0;
}
