// strata-worker: trains on leased data tasks, pulling parameters and pushing
// gradients; evaluates the final model when the master asks.
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_join.h"
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

namespace {

// worker.command (docs/python.md): the training script runs in this
// process's place, with the worker's identity in its environment. Returns
// only when the exec fails.
int ExecTrainingScript(const strata::JobConfig& config) {
  namespace fs = std::filesystem;
  const std::vector<std::string>& command = config.worker.command;
  // A relative path is looked up in the working directory, then beside
  // the config file, then in the config's parent directory (a repository's
  // conf/ and examples/).
  const fs::path config_dir = fs::absolute(FLAGS_config).parent_path();
  std::vector<std::string> args = command;
  for (size_t i = 1; i < args.size(); ++i) {
    const fs::path p(args[i]);
    if (p.is_absolute() || fs::exists(p)) continue;
    for (const fs::path& dir : {config_dir, config_dir.parent_path()}) {
      if (fs::exists(dir / p)) {
        args[i] = (dir / p).string();
        break;
      }
    }
  }
  setenv("STRATA_CONFIG", fs::absolute(FLAGS_config).c_str(), 1);
  setenv("STRATA_MASTER", FLAGS_master.c_str(), 1);
  setenv("STRATA_INDEX", std::to_string(FLAGS_index).c_str(), 1);
  setenv("STRATA_TLS_DIR", FLAGS_tls_dir.c_str(), 1);
  setenv("STRATA_HOST", FLAGS_host.c_str(), 1);
  const int http_port =
      FLAGS_http_port >= -1 ? FLAGS_http_port : config.cluster.ports.worker_http + FLAGS_index;
  setenv("STRATA_HTTP_PORT", std::to_string(http_port).c_str(), 1);
  if (!FLAGS_trace.empty()) {  // the worker core traces the script's steps
    setenv("STRATA_TRACE", fs::absolute(FLAGS_trace).c_str(), 1);
    setenv("STRATA_TRACE_MAX_STEPS", std::to_string(FLAGS_trace_max_steps).c_str(), 1);
  }
  // The package beside these binaries (a build tree's build/python) first.
  std::error_code ec;
  const fs::path package = fs::canonical("/proc/self/exe", ec).parent_path() / ".." / "python";
  if (!ec && fs::exists(package / "strata")) {
    const char* old = getenv("PYTHONPATH");
    const std::string path = fs::weakly_canonical(package).string() +
                             (old != nullptr && *old != '\0' ? std::string(":") + old : "");
    setenv("PYTHONPATH", path.c_str(), 1);
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  LOG(INFO) << "worker " << FLAGS_index << ": running the training script "
            << absl::StrJoin(args, " ") << " (worker.command of " << FLAGS_config << ")";
  google::FlushLogFiles(google::GLOG_INFO);
  execvp(argv[0], argv.data());
  LOG(ERROR) << "cannot run worker.command " << args[0] << ": " << strerror(errno);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("strata-worker --config C --master HOST:PORT --index I");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  strata::InitDaemon(argv[0]);
  strata::DaemonEnvOptions eo("worker", FLAGS_index, FLAGS_config, FLAGS_tls_dir, ::getenv);
  eo.security = !FLAGS_local;
  int code = 0;
  auto env = strata::LoadDaemonEnv(eo, &code);
  if (!env.ok()) return strata::StartFailed("worker", env.status(), code);
  if (!env->config.worker.command.empty() && !FLAGS_local) {
    return ExecTrainingScript(env->config);
  }
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
