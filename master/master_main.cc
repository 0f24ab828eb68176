// strata-master: membership, cluster view, placement, data tasks, job status.
#include <memory>

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
DEFINE_bool(exit_when_done, false, "exit once the job has succeeded or failed");

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
  LOG(INFO) << (sig ? "signal received" : "job ended") << "; shutting down";
  const std::string state = (*master)->GetStatus().job().state();
  (*master)->Shutdown();
  return (sig == 0 && state != "succeeded") ? 1 : 0;
}
