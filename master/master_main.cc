// strata-master: membership, cluster view, placement, data tasks, job status.
#include <csignal>
#include <cstdlib>
#include <memory>
#include <thread>

#include "absl/synchronization/notification.h"

#include "common/config.h"
#include "common/daemon.h"
#include "common/host_file.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "master/master_server.h"
#include "storage/file_system.h"

DEFINE_string(config, "", "job config (YAML), required");
DEFINE_string(hosts, "", "host file, required: gives the pserver and worker counts");
DEFINE_string(host, "", "address to bind and advertise (default: the master's host in --hosts)");
DEFINE_int32(port, -1, "gRPC port (default: cluster.ports.master; 0 = any)");
DEFINE_int32(http_port, -2, "HTTP port (default: cluster.ports.master_http; 0 = any, -1 = off)");
DEFINE_string(summary, "", "write the job summary JSON here when the job ends");
DEFINE_bool(exit_when_done, false, "exit once the job has succeeded, failed or stopped");
DEFINE_string(failpoint, "", "tests: NAME[@N],... kills this process there (common/failpoint.h)");
DEFINE_string(resume, "",
              "resume from a checkpoint: 'latest' (the newest good one under checkpoint.dir; "
              "a fresh start when there is none) or a checkpoint directory");

int main(int argc, char** argv) {
  gflags::SetUsageMessage("strata-master --config C --hosts H [--summary F]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  strata::InitDaemon(argv[0]);

  auto config = strata::LoadJobConfig(FLAGS_config);
  if (!config.ok()) {
    LOG(ERROR) << config.status().message();
    return 2;
  }
  auto hosts = strata::LoadHostFile(FLAGS_hosts);
  if (!hosts.ok()) {
    LOG(ERROR) << hosts.status().message();
    return 2;
  }
  auto failpoints = strata::Failpoints::Parse(FLAGS_failpoint);
  if (!failpoints.ok()) {
    LOG(ERROR) << failpoints.status().message();
    return 2;
  }
  auto fs = strata::storage::NewPosixFileSystem();
  strata::master::MasterOptions opts;
  opts.config = *config;
  opts.expected_pservers = hosts->total_pservers();
  opts.expected_workers = hosts->total_workers();
  opts.host = FLAGS_host.empty() ? hosts->master_host().host : FLAGS_host;
  opts.port = FLAGS_port >= 0 ? FLAGS_port : config->cluster.ports.master;
  opts.http_port = FLAGS_http_port >= -1 ? FLAGS_http_port : config->cluster.ports.master_http;
  opts.summary_path = FLAGS_summary;
  opts.fs = fs.get();
  opts.resume = FLAGS_resume;
  opts.failpoints = failpoints->get();

  auto master = strata::master::MasterServer::Create(std::move(opts));
  if (!master.ok()) {
    LOG(ERROR) << "cannot start master: " << master.status().message();
    return 1;
  }
  if (auto s = (*master)->Start(); !s.ok()) {
    LOG(ERROR) << "cannot start master: " << s.message();
    return 1;
  }
  const int sig = strata::WaitForTerminationSignal([&] {
    return FLAGS_exit_when_done && (*master)->WaitForJobEnd(absl::ZeroDuration());
  });
  const std::string job_state = (*master)->GetStatus().job().state();
  const bool job_over =
      job_state == "succeeded" || job_state == "failed" || job_state == "stopped";
  if (sig == SIGTERM && config->checkpoint.enabled && !job_over) {
    // A preemption notice: checkpoint, then stop the job cleanly, within
    // the grace period.
    LOG(INFO) << "SIGTERM: checkpointing before stopping (grace "
              << config->checkpoint.grace_seconds << " s)";
    absl::Notification done;
    std::thread ckpt([&] {
      auto r = (*master)->Checkpoint("sigterm on master", /*stop_after=*/true);
      if (!r.ok()) LOG(WARNING) << "no checkpoint before stopping: " << r.status();
      done.Notify();
    });
    if (!done.WaitForNotificationWithTimeout(absl::Seconds(config->checkpoint.grace_seconds))) {
      // The previous checkpoint stays the latest; nothing half-written
      // counts (no manifest).
      LOG(ERROR) << "the checkpoint did not complete within the grace period; stopping anyway";
      google::FlushLogFiles(google::GLOG_INFO);
      std::_Exit(1);
    }
    ckpt.join();
  }
  LOG(INFO) << (sig ? "signal received" : "job ended") << "; shutting down";
  const std::string state = (*master)->GetStatus().job().state();
  (*master)->Shutdown();
  return (sig == 0 && state != "succeeded") ? 1 : 0;
}
