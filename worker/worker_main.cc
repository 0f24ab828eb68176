// strata-worker: trains on leased data tasks, pulling parameters and pushing
// gradients; evaluates the final model when the master asks.
#include <csignal>
#include <memory>
#include <thread>

#include "absl/synchronization/notification.h"
#include "common/config.h"
#include "common/daemon.h"
#include "common/grpc_channel.h"
#include "common/security.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "storage/file_system.h"
#include "storage/s3_file_system.h"
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

  auto config = strata::LoadJobConfig(FLAGS_config);
  if (!config.ok()) {
    LOG(ERROR) << config.status().message();
    return 2;
  }
  std::string fs_note;
  auto fs = strata::storage::NewFileSystemForConfig(config->s3, ::getenv, &fs_note);
  if (!fs.ok()) {
    LOG(ERROR) << "cannot start worker: " << fs.status().message();
    return 2;
  }
  if (!fs_note.empty()) LOG(INFO) << fs_note;
  strata::worker::WorkerOptions opts;
  opts.config = *config;
  opts.master_address = FLAGS_master;
  opts.index = FLAGS_index;
  opts.trace_path = FLAGS_trace;
  opts.trace_max_steps = FLAGS_trace_max_steps;
  opts.host = FLAGS_host;
  opts.http_port =
      FLAGS_http_port >= -1 ? FLAGS_http_port : config->cluster.ports.worker_http + FLAGS_index;
  opts.transport = strata::transport::TransportOptionsFor(config->cluster);
  opts.fs = fs->get();
  opts.local_only = FLAGS_local;
  opts.cpu_threads = FLAGS_cpu_threads;
  if (!FLAGS_local) {
    // Refuses to start on a key readable by others or a missing certificate.
    auto security = strata::DaemonSecurity(config->security, FLAGS_tls_dir, "worker", FLAGS_index);
    if (!security.ok()) {
      LOG(ERROR) << "cannot start worker: " << security.status().message();
      return 2;
    }
    opts.security = *std::move(security);
  }

  auto worker = strata::worker::Worker::Create(std::move(opts));
  if (!worker.ok()) {
    LOG(ERROR) << "cannot start worker: " << worker.status().message();
    return 1;
  }
  if (auto s = (*worker)->Start(); !s.ok()) {
    LOG(ERROR) << "cannot start worker: " << s.message();
    return 1;
  }
  // Training runs on its own thread so a signal can stop it between steps.
  absl::Status result;
  absl::Notification finished;
  std::thread trainer([&] {
    result = (*worker)->Run();
    finished.Notify();
  });
  const int sig = strata::WaitForTerminationSignal([&] { return finished.HasBeenNotified(); });
  if (sig == SIGTERM && config->checkpoint.enabled && !FLAGS_local) {
    // A preemption notice: the job is checkpointed and stopped first.
    LOG(INFO) << "SIGTERM: asking the master for a checkpoint and a clean stop (grace "
              << config->checkpoint.grace_seconds << " s)";
    absl::Status s =
        (*worker)->RequestCheckpointAndStop(absl::Seconds(config->checkpoint.grace_seconds));
    if (absl::IsFailedPrecondition(s)) {
      LOG(INFO) << "no checkpoint before stopping: " << s.message();  // the job is over
    } else if (!s.ok()) {
      LOG(WARNING) << "no checkpoint before stopping: " << s;
    }
  } else if (sig != 0) {
    LOG(INFO) << "signal received; stopping";
  }
  (*worker)->Shutdown();
  trainer.join();
  (*worker)->Shutdown();
  if (!result.ok() && sig == 0) {
    LOG(ERROR) << "worker failed: " << result.message();
    return 1;
  }
  return 0;
}
