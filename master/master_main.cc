// strata-master: membership, cluster view, placement, data tasks, job status.
#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/daemon.h"
#include "common/daemon_env.h"
#include "common/host_file.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "master/high_availability.h"
#include "master/master_server.h"
#include "master/state_log.h"
#include "storage/file_system.h"

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
DEFINE_string(provider, "",
              "what starts the daemons `strata scale` adds when the config's "
              "elastic.provider is empty: a command and its arguments, split at spaces, "
              "with {action} {role} {count} {indices} replaced (launch.sh passes its own)");
DEFINE_string(instance, "",
              "with cluster.etcd: this bring-up of the job, so that a new one does not take an "
              "earlier one's state in etcd for its own (keys PREFIX/JOB/INSTANCE/; launch.sh "
              "gives each bring-up its own; restarts keep it)");
DEFINE_string(state_dir, "",
              "the master's state directory: state changes are logged there and a master "
              "restarted on it carries on the job (docs/reliability.md); one master at a time");

int main(int argc, char** argv) {
  gflags::SetUsageMessage("strata-master --config C --hosts H [--summary F]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  strata::InitDaemon(argv[0]);
  auto hosts = strata::LoadHostFile(FLAGS_hosts);
  if (!hosts.ok()) return strata::StartFailed("master", hosts.status(), 2);
  // (Before anything else: a second master says why it may not start.)
  const auto local = strata::storage::NewPosixFileSystem();
  std::unique_ptr<strata::master::StateDirLock> lock;  // held for the life of the process
  if (!FLAGS_state_dir.empty()) {
    auto locked = strata::master::StateDirLock::Acquire(local.get(), FLAGS_state_dir);
    if (!locked.ok()) return strata::StartFailed("master", locked.status());
    lock = *std::move(locked);
  }
  strata::DaemonEnvOptions eo("master", -1, FLAGS_config, FLAGS_tls_dir, ::getenv);
  eo.failpoints = FLAGS_failpoint;
  eo.check_checkpoint_root = true;
  int code = 0;
  auto env = strata::LoadDaemonEnv(eo, &code);
  if (!env.ok()) return strata::StartFailed("master", env.status(), code);
  strata::master::MasterOptions opts;
  if (auto s = strata::CheckMasterHosts(*hosts, !env->config.cluster.etcd.endpoints.empty());
      !s.ok()) {
    return strata::StartFailed("master", s, 2);
  }
  // (Several masters: each says which of the host file's it is, so that
  // the leader key and the view name an address the nodes were given; the
  // first's by default would make every master claim the first's.)
  if (const auto masters = hosts->master_hosts();
      masters.size() > 1 &&
      std::none_of(masters.begin(), masters.end(),
                   [](const strata::HostEntry& m) { return m.host == FLAGS_host; })) {
    std::string listed;
    for (const auto& m : masters) absl::StrAppend(&listed, listed.empty() ? "" : ", ", m.host);
    return strata::StartFailed(
        "master",
        absl::InvalidArgumentError(absl::StrCat(
            FLAGS_host.empty() ? "no --host given"
                               : absl::StrCat("--host ", FLAGS_host, " is not one of them"),
            ": ", FLAGS_hosts, " lists several masters (", listed,
            "), and each master is started with --host naming its own (under systemd: "
            "STRATA_MASTER_HOST in /etc/strata/strata.env)")),
        2);
  }
  opts.config = env->config;
  opts.expected_pservers = hosts->total_pservers();
  opts.expected_workers = hosts->total_workers();
  opts.host = FLAGS_host.empty() ? hosts->master_host().host : FLAGS_host;
  opts.port = FLAGS_port >= 0 ? FLAGS_port : env->config.cluster.ports.master;
  opts.http_port = FLAGS_http_port >= -1 ? FLAGS_http_port : env->config.cluster.ports.master_http;
  opts.summary_path = FLAGS_summary;
  opts.event_log = FLAGS_event_log;
  opts.audit_log = FLAGS_audit_log;
  opts.fs = env->fs.get();
  opts.resume = FLAGS_resume;
  opts.failpoints = env->failpoints.get();
  opts.state_dir = FLAGS_state_dir;
  opts.security = env->security;
  opts.slots = hosts->Slots();
  opts.provider = absl::StrSplit(FLAGS_provider, ' ', absl::SkipEmpty());
  // With etcd (docs/reliability.md, "Master high availability"): a
  // standby until this master is elected, then the leader, with its state
  // in etcd.
  std::unique_ptr<strata::master::HighAvailability> ha;
  if (!env->config.cluster.etcd.endpoints.empty()) {
    if (!FLAGS_state_dir.empty()) {
      LOG(INFO) << "--state_dir " << FLAGS_state_dir
                << " is not used: with cluster.etcd the job's state is kept in etcd";
      opts.state_dir.clear();
    }
    int code = 1;
    auto elected = strata::master::HighAvailability::AwaitLead(&opts, FLAGS_instance, &code);
    if (!elected.ok()) return strata::StartFailed("master", elected.status(), code);
    if (*elected == nullptr) return 0;  // stopped while a standby
    ha = *std::move(elected);
  }
  auto master = strata::master::MasterServer::Create(std::move(opts));
  if (!master.ok()) return strata::StartFailed("master", master.status());
  if (ha != nullptr) ha->Attach(master->get());
  if (auto s = (*master)->Start(); !s.ok()) {
    if (ha != nullptr) ha->Attach(nullptr);
    return strata::StartFailed("master", s);
  }
  const int sig = strata::WaitForTerminationSignal(
      [&] { return FLAGS_exit_when_done && (*master)->WaitForJobEnd(absl::ZeroDuration()); });
  if (sig == SIGTERM && env->config.checkpoint.enabled &&
      !(*master)->WaitForJobEnd(absl::ZeroDuration()) &&
      !(*master)->CheckpointAndStopWithin(absl::Seconds(env->config.checkpoint.grace_seconds))) {
    // The previous checkpoint stays the latest; nothing half-written counts.
    LOG(ERROR) << "the checkpoint did not complete within the grace period; stopping anyway";
    google::FlushLogFiles(google::GLOG_INFO);
    std::_Exit(1);
  }
  LOG(INFO) << (sig ? "signal received" : "job ended") << "; shutting down";
  const bool succeeded = (*master)->GetStatus().job().job_state() == strata::proto::JOB_SUCCEEDED;
  if (ha != nullptr) ha->Attach(nullptr);
  (*master)->Shutdown();
  if (ha != nullptr) ha->Resign();  // a standby leads at once
  return (sig == 0 && !succeeded) ? 1 : 0;
}
