// strata-master: membership, cluster view, placement, data tasks, job status.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "common/config.h"
#include "common/daemon.h"
#include "common/grpc_channel.h"
#include "common/host_file.h"
#include "common/security.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "master/master_server.h"
#include "storage/file_system.h"
#include "storage/s3_file_system.h"

DEFINE_string(config, "", "job config (YAML), required");
DEFINE_string(tls_dir, "",
              "certificates (ca.crt, master.crt, master.key): overrides security.tls_dir");
DEFINE_string(hosts, "", "host file, required: gives the pserver and worker counts");
DEFINE_string(host, "", "address to bind and advertise (default: the master's host in --hosts)");
DEFINE_int32(port, -1, "gRPC port (default: cluster.ports.master; 0 = any)");
DEFINE_int32(http_port, -2, "HTTP port (default: cluster.ports.master_http; 0 = any, -1 = off)");
DEFINE_string(summary, "", "write the job summary JSON here when the job ends");
DEFINE_string(event_log, "",
              "append cluster events (joins, deaths, failovers, recoveries, checkpoints, job "
              "states) here as JSON lines");
DEFINE_string(audit_log, "",
              "the audit log: who did what, when, from where and the result, as hash-chained "
              "JSON lines (docs/security.md; strata audit verify)");
DEFINE_bool(exit_when_done, false, "exit once the job has succeeded, failed or stopped");
DEFINE_string(failpoint, "", "tests: NAME[@N],... kills this process there (common/failpoint.h)");
DEFINE_string(resume, "",
              "resume from a checkpoint: 'latest' (the newest good one under checkpoint.dir; "
              "a fresh start when there is none) or a checkpoint directory");

DEFINE_string(state_dir, "",
              "the master's state directory: state changes are logged there and a master "
              "restarted on it carries on the job (docs/reliability.md); one master at a time");

namespace {

// Holds DIR/LOCK (flock) for the life of the process, so that two masters
// never act on one state directory; false (with the reason) when another
// holds it.
bool LockStateDir(const std::string& dir, std::string* why) {
  if (::mkdir(dir.c_str(), 0750) != 0 && errno != EEXIST) {
    *why = dir + ": " + std::strerror(errno);
    return false;
  }
  const std::string path = dir + "/LOCK";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0640);
  if (fd < 0) {
    *why = path + ": " + std::strerror(errno);
    return false;
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    char holder[32] = {0};
    (void)!::pread(fd, holder, sizeof(holder) - 1, 0);
    *why = path + ": held by another strata-master (pid " + std::string(holder) +
           "); two masters never act on one state directory";
    ::close(fd);
    return false;
  }
  const std::string pid = std::to_string(::getpid());
  (void)!::ftruncate(fd, 0);
  (void)!::pwrite(fd, pid.data(), pid.size(), 0);
  return true;  // the descriptor stays open: the lock lasts as long as we do
}

}  // namespace

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
  if (!FLAGS_state_dir.empty()) {
    std::string why;
    if (!LockStateDir(FLAGS_state_dir, &why)) {
      LOG(ERROR) << "cannot start the master: " << why;
      return 1;
    }
  }
  std::string fs_note;
  auto fs = strata::storage::NewFileSystemForConfig(config->s3, ::getenv, &fs_note);
  if (!fs.ok()) {
    LOG(ERROR) << "cannot start master: " << fs.status().message();
    return 2;
  }
  if (!fs_note.empty()) LOG(INFO) << fs_note;
  // A wrong key, a missing bucket or an unwritable directory shows now,
  // not at the first checkpoint.
  if (auto s = strata::storage::CheckCheckpointRoot(fs->get(), config->checkpoint); !s.ok()) {
    LOG(ERROR) << "cannot start master: " << s.message();
    return 1;
  }
  strata::master::MasterOptions opts;
  opts.config = *config;
  opts.expected_pservers = hosts->total_pservers();
  opts.expected_workers = hosts->total_workers();
  opts.host = FLAGS_host.empty() ? hosts->master_host().host : FLAGS_host;
  opts.port = FLAGS_port >= 0 ? FLAGS_port : config->cluster.ports.master;
  opts.http_port = FLAGS_http_port >= -1 ? FLAGS_http_port : config->cluster.ports.master_http;
  opts.summary_path = FLAGS_summary;
  opts.event_log = FLAGS_event_log;
  opts.audit_log = FLAGS_audit_log;
  opts.fs = fs->get();
  opts.resume = FLAGS_resume;
  opts.failpoints = failpoints->get();
  opts.state_dir = FLAGS_state_dir;
  {
    // Refuses to start on a key readable by others or a missing certificate.
    auto security = strata::DaemonSecurity(config->security, FLAGS_tls_dir, "master");
    if (!security.ok()) {
      LOG(ERROR) << "cannot start master: " << security.status().message();
      return 2;
    }
    opts.security = *std::move(security);
  }

  auto master = strata::master::MasterServer::Create(std::move(opts));
  if (!master.ok()) {
    LOG(ERROR) << "cannot start master: " << master.status().message();
    return 1;
  }
  if (auto s = (*master)->Start(); !s.ok()) {
    LOG(ERROR) << "cannot start master: " << s.message();
    return 1;
  }
  const int sig = strata::WaitForTerminationSignal(
      [&] { return FLAGS_exit_when_done && (*master)->WaitForJobEnd(absl::ZeroDuration()); });
  const std::string job_state = (*master)->GetStatus().job().state();
  const bool job_over = job_state == "succeeded" || job_state == "failed" || job_state == "stopped";
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
