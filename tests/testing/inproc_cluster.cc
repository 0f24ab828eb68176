#include "tests/testing/inproc_cluster.h"

#include <unistd.h>

#include "common/status_macros.h"

namespace strata::testing {

constexpr char kFmnist[] = "/usr/share/datasets/fashion-mnist/";

bool HaveFashionMnist() {
  return access((std::string(kFmnist) + "train-labels-idx1-ubyte.gz").c_str(), R_OK) == 0;
}

JobConfig SmallFashionMnistConfig() {
  JobConfig c;
  c.job.name = "test-fmnist";
  c.job.epochs = 1;
  c.job.batch_size = 32;
  c.job.progress_every_steps = 20;
  c.model.layers = {784, 32, 10};
  c.optimizer.type = "adam";
  c.optimizer.learning_rate = 0.002;
  c.data.train_images = std::string(kFmnist) + "train-images-idx3-ubyte.gz";
  c.data.train_labels = std::string(kFmnist) + "train-labels-idx1-ubyte.gz";
  c.data.test_images = std::string(kFmnist) + "t10k-images-idx3-ubyte.gz";
  c.data.test_labels = std::string(kFmnist) + "t10k-labels-idx1-ubyte.gz";
  c.data.train_limit = 4000;
  c.data.task_records = 500;
  c.cluster.slice_bytes = 64 << 10;  // several partitions per table
  c.cluster.heartbeat_interval_ms = 100;
  c.cluster.dead_timeout_ms = 2000;
  c.cluster.request_timeout_ms = 30000;
  return c;
}

absl::StatusOr<worker::TaskSource::Lease> FixedTaskSource::Next() {
  Lease lease;
  if (next_ >= tasks_.size()) {
    lease.outcome = proto::LeaseTaskResponse::DONE;
    return lease;
  }
  lease.outcome = proto::LeaseTaskResponse::TASK;
  lease.task = tasks_[next_++];
  return lease;
}

absl::StatusOr<std::unique_ptr<InProcCluster>> InProcCluster::Start(InProcClusterOptions options) {
  std::unique_ptr<InProcCluster> c(new InProcCluster());
  if (options.fs == nullptr) c->own_fs_ = storage::NewPosixFileSystem();
  c->fs_ = options.fs != nullptr ? options.fs : c->own_fs_.get();
  c->network_ = transport::NewInProcNetwork();
  transport::TransportOptions topts;
  topts.kind = options.transport;
  topts.inproc_network = c->network_;

  master::MasterOptions mopts;
  mopts.config = options.config;
  mopts.expected_pservers = options.pservers;
  mopts.expected_workers = options.workers;
  mopts.port = 0;
  mopts.http_port = 0;
  mopts.fs = c->fs_;
  mopts.resume = options.resume;
  mopts.audit_log = options.audit_log;
  // Each daemon's credentials, as its main() makes them.
  auto security = [&](const char* role) -> absl::StatusOr<ControlPlaneSecurity> {
    if (options.tls_dir.empty()) return ControlPlaneSecurity::Plaintext();
    TlsOptions t;
    t.dir = options.tls_dir;
    t.cert_name = role;
    t.token_file = options.token_file;
    return MakeControlPlaneSecurity(t);
  };
  STRATA_ASSIGN_OR_RETURN(mopts.security, security("master"));
  STRATA_ASSIGN_OR_RETURN(c->master_, master::MasterServer::Create(std::move(mopts)));
  STRATA_RETURN_IF_ERROR(c->master_->Start());

  for (int i = 0; i < options.pservers; ++i) {
    pserver::PServerOptions p;
    p.config = options.config;
    p.master_address = c->master_->address();
    p.index = i;
    p.port = 0;
    p.data_port = 0;
    p.http_port = 0;
    p.transport = topts;
    p.apply_threads = options.pserver_apply_threads;
    p.fs = c->fs_;
    STRATA_ASSIGN_OR_RETURN(p.security, security("pserver"));
    STRATA_ASSIGN_OR_RETURN(auto ps, pserver::PServer::Create(std::move(p)));
    STRATA_RETURN_IF_ERROR(ps->Start());
    c->pservers_.push_back(std::move(ps));
  }
  for (int i = 0; i < options.workers; ++i) {
    worker::WorkerOptions w;
    w.config = options.config;
    w.master_address = c->master_->address();
    w.index = i;
    if (i < static_cast<int>(options.worker_hosts.size())) w.host = options.worker_hosts[i];
    w.http_port = 0;
    w.transport = topts;
    w.fs = c->fs_;
    STRATA_ASSIGN_OR_RETURN(w.security, security("worker"));
    w.shuffle_within_task = options.shuffle_within_task;
    if (i < static_cast<int>(options.task_sources.size())) {
      w.task_source = std::move(options.task_sources[i]);
    }
    STRATA_ASSIGN_OR_RETURN(auto wk, worker::Worker::Create(std::move(w)));
    STRATA_RETURN_IF_ERROR(wk->Start());
    c->workers_.push_back(std::move(wk));
  }
  return c;
}

void InProcCluster::RunWorkers() {
  results_.assign(workers_.size(), absl::OkStatus());
  for (size_t i = 0; i < workers_.size(); ++i) {
    threads_.emplace_back([this, i] { results_[i] = workers_[i]->Run(); });
  }
}

absl::Status InProcCluster::JoinWorkers() {
  for (auto& t : threads_) t.join();
  threads_.clear();
  for (const auto& s : results_) STRATA_RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

void InProcCluster::Shutdown() {
  for (auto& w : workers_) w->Shutdown();
  for (auto& t : threads_) t.join();
  threads_.clear();
  for (auto& p : pservers_) p->Shutdown();
  if (master_) master_->Shutdown();
}

InProcCluster::~InProcCluster() { Shutdown(); }

}  // namespace strata::testing
