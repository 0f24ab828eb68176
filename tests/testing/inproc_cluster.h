// An in-process Strata cluster for integration tests: a real MasterServer
// (gRPC on 127.0.0.1, port 0), N real PServers and M real Workers in one
// process, talking over the inproc (or tcp) data-plane transport.
#ifndef STRATA_TESTS_TESTING_INPROC_CLUSTER_H_
#define STRATA_TESTS_TESTING_INPROC_CLUSTER_H_

#include <memory>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config.h"
#include "master/master_server.h"
#include "pserver/pserver.h"
#include "storage/file_system.h"
#include "transport/transport.h"
#include "worker/worker.h"

namespace strata::testing {

struct InProcClusterOptions {
  JobConfig config;
  int pservers = 2;
  int workers = 2;
  std::string transport = "inproc";  // or "tcp" (127.0.0.1)
  // Optional per-worker task sources (tests that fix the data order);
  // empty = lease from the master.
  std::vector<std::unique_ptr<worker::TaskSource>> task_sources;
  bool shuffle_within_task = true;
  int pserver_apply_threads = 1;
  // Worker i's host (its address: any of 127.0.0.0/8 binds); 127.0.0.1
  // beyond the list. Node-local aggregation groups the workers by it.
  std::vector<std::string> worker_hosts;
  // Borrowed; every daemon's file system (data, checkpoints). nullptr = a
  // POSIX one of the cluster's own.
  storage::FileSystem* fs = nullptr;
  // mTLS on every gRPC channel (docs/security.md): a directory with ca.crt
  // and master, pserver and worker .crt/.key (gen-certs.sh's HOST/); the
  // servers' token table. "" = plain text.
  std::string tls_dir;
  std::string token_file;
  std::string audit_log;  // the master's, "" = none
  std::string resume;     // MasterOptions::resume
};

// Not thread-safe; owned by one test.
class InProcCluster {
 public:
  // Starts the master and the pservers, then creates and starts the workers
  // (registered, not yet training).
  static absl::StatusOr<std::unique_ptr<InProcCluster>> Start(InProcClusterOptions options);
  ~InProcCluster();

  // Runs every worker's training loop on its own thread.
  void RunWorkers();
  // Joins the worker threads; the first error of any worker, or OK.
  absl::Status JoinWorkers();

  master::MasterServer* master() { return master_.get(); }
  pserver::PServer* pserver(int i) { return pservers_[i].get(); }
  worker::Worker* worker(int i) { return workers_[i].get(); }
  int num_workers() const { return static_cast<int>(workers_.size()); }
  storage::FileSystem* fs() { return fs_; }

  void Shutdown();

 private:
  InProcCluster() = default;
  std::unique_ptr<storage::FileSystem> own_fs_;
  storage::FileSystem* fs_ = nullptr;  // own_fs_ or the options'
  std::shared_ptr<transport::InProcNetwork> network_;
  std::unique_ptr<master::MasterServer> master_;
  std::vector<std::unique_ptr<pserver::PServer>> pservers_;
  std::vector<std::unique_ptr<worker::Worker>> workers_;
  std::vector<std::thread> threads_;
  std::vector<absl::Status> results_;
};

// A task source that hands out a fixed list of tasks, then DONE.
class FixedTaskSource : public worker::TaskSource {
 public:
  explicit FixedTaskSource(std::vector<proto::DataTask> tasks) : tasks_(std::move(tasks)) {}
  absl::StatusOr<Lease> Next() override;
  absl::Status Complete(const proto::DataTask&, int64_t, uint64_t) override {
    return absl::OkStatus();
  }

 private:
  std::vector<proto::DataTask> tasks_;
  size_t next_ = 0;
};

// A job config for tests over the Fashion-MNIST files installed by
// scripts/install-deps.sh, small and fast.
JobConfig SmallFashionMnistConfig();
// True when the Fashion-MNIST files are installed.
bool HaveFashionMnist();

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_INPROC_CLUSTER_H_
