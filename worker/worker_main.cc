// strata-worker: trains on leased data tasks, pulling parameters and pushing
// gradients; evaluates the final model when the master asks.
#include <csignal>
#include <cstdlib>
#include <thread>

#include "absl/synchronization/notification.h"
#include "common/daemon.h"
#include "common/daemon_env.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "transport/transport_config.h"
#include "worker/worker.h"

DEFINE_string(config, "", "job config (YAML), required");
DEFINE_string(tls_dir, "",
              "certificates (ca.crt, worker.crt, worker.key): overrides security.tls_dir");
DEFINE_string(master, "", "master address host:port (required unless --local)");
DEFINE_int32(index, 0, "instance index of this worker (0-based)");
DEFINE_string(host, "127.0.0.1", "address to advertise and bind HTTP on");
DEFINE_bool(local, false,
            "train alone: no master, no pservers, the optimizer in this process "
            "(the baseline for the cost of distribution)");
DEFINE_int32(cpu_threads, 1, "OpenBLAS threads");
DEFINE_int32(http_port, -2, "HTTP port (default: cluster.ports.worker_http + index; -1 = off)");
DEFINE_string(trace, "",
              "write a Chrome trace-event JSON of the training steps here (chrome://tracing, "
              "Perfetto): per step and per table the compute and waits, every push and pull");
DEFINE_int64(trace_max_steps, 2000, "trace only the first N steps (0 = all)");

int main(int argc, char** argv) {
  gflags::SetUsageMessage("strata-worker --config C --master HOST:PORT --index I");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  strata::InitDaemon(argv[0]);
  strata::DaemonEnvOptions eo("worker", FLAGS_index, FLAGS_config, FLAGS_tls_dir, ::getenv);
  eo.security = !FLAGS_local;
  int code = 0;
  auto env = strata::LoadDaemonEnv(eo, &code);
  if (!env.ok()) return strata::StartFailed("worker", env.status(), code);
  strata::worker::WorkerOptions opts;
  opts.config = env->config;
  opts.master_address = FLAGS_master;
  opts.index = FLAGS_index;
  opts.trace_path = FLAGS_trace;
  opts.trace_max_steps = FLAGS_trace_max_steps;
  opts.host = FLAGS_host;
  opts.http_port =
      FLAGS_http_port >= -1 ? FLAGS_http_port : env->config.cluster.ports.worker_http + FLAGS_index;
  opts.transport = strata::transport::TransportOptionsFor(env->config.cluster);
  opts.fs = env->fs.get();
  opts.local_only = FLAGS_local;
  opts.cpu_threads = FLAGS_cpu_threads;
  opts.security = env->security;
  auto worker = strata::worker::Worker::Create(std::move(opts));
  if (!worker.ok()) return strata::StartFailed("worker", worker.status());
  if (auto s = (*worker)->Start(); !s.ok()) return strata::StartFailed("worker", s);
  // Training runs on its own thread so a signal can stop it between steps.
  absl::Status result;
  absl::Notification finished;
  std::thread trainer([&] {
    result = (*worker)->Run();
    finished.Notify();
  });
  const int sig = strata::WaitForTerminationSignal([&] { return finished.HasBeenNotified(); });
  if (sig == SIGTERM && env->config.checkpoint.enabled && !FLAGS_local) {
    strata::CheckpointBeforeStopping(env->config, [&](absl::Duration grace) {
      return (*worker)->RequestCheckpointAndStop(grace);
    });
  } else if (sig != 0) {
    LOG(INFO) << "signal received; stopping";
  }
  (*worker)->Shutdown();
  trainer.join();
  (*worker)->Shutdown();  // (what Run started after the first)
  if (!result.ok() && sig == 0) {
    LOG(ERROR) << "worker failed: " << result.message();
    return 1;
  }
  return 0;
}
