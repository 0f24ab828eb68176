// The master: membership and failure detection, the cluster view, partition
// placement, data-task leasing, job progress, and the summary at the end.
#ifndef STRATA_MASTER_MASTER_SERVER_H_
#define STRATA_MASTER_MASTER_SERVER_H_

#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/http_server.h"
#include "common/metrics.h"
#include "grpcpp/grpcpp.h"
#include "master/task_scheduler.h"
#include "proto/strata.grpc.pb.h"
#include "storage/file_system.h"

namespace strata::master {

struct MasterOptions {
  JobConfig config;
  int expected_pservers = 1;
  int expected_workers = 1;
  std::string host = "127.0.0.1";  // bind and advertise address
  int port = 0;                     // gRPC; 0 picks a free port
  int http_port = 0;                // 0 picks a free port; -1 disables HTTP
  std::string summary_path;         // summary.json written at the end; "" = none
  Clock* clock = nullptr;           // borrowed; nullptr = RealClock()
  storage::FileSystem* fs = nullptr;  // borrowed, required; outlives the server
};

// Thread-safe. All state is guarded by one mutex; RPC handlers hold it only
// briefly and never across outgoing RPCs.
class MasterServer {
 public:
  // Validates options and reads the training-set size from the labels file.
  static absl::StatusOr<std::unique_ptr<MasterServer>> Create(
      MasterOptions options);
  ~MasterServer();
  MasterServer(const MasterServer&) = delete;
  MasterServer& operator=(const MasterServer&) = delete;

  // Starts the gRPC server, the HTTP server and the background thread.
  absl::Status Start();
  // Stops serving and joins threads. Idempotent.
  void Shutdown();

  std::string address() const;  // "host:port" of the gRPC server
  int http_port() const;

  // Blocks until the job has succeeded or failed, or `timeout` passed;
  // true when it ended.
  bool WaitForJobEnd(absl::Duration timeout);
  proto::GetStatusResponse GetStatus();
  // Runs one pass of failure detection and placement now.
  void TickForTesting() { Tick(); }

  // RPC bodies (called by the gRPC service).
  absl::StatusOr<proto::RegisterResponse> Register(const proto::RegisterRequest& req,
                                                   const std::string& peer);
  absl::StatusOr<proto::HeartbeatResponse> Heartbeat(
      const proto::HeartbeatRequest& req);
  proto::ClusterView View();
  absl::StatusOr<proto::LeaseTaskResponse> LeaseTask(
      const proto::LeaseTaskRequest& req);
  absl::Status CompleteTask(const proto::CompleteTaskRequest& req);
  absl::Status ReportProgress(const proto::ReportProgressRequest& req);

 private:
  class Service;
  struct WorkerStats {
    proto::ReportProgressRequest last;
  };

  void BackgroundLoop();
  void Tick();
  void MaybePlacePartitions();
  void BumpEpochLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  proto::NodeInfo* FindNodeLocked(uint32_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<proto::NodeInfo*> LiveWorkerLocked(uint32_t id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int CountLocked(proto::Role role, bool include_finished) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateJobStateLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishJobLocked(const std::string& state, const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  proto::JobStatus JobStatusLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string SummaryJsonLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RegisterMetrics();

  // The planted model's own test figures (data.planted), for the summary.
  struct Planted {
    bool present = false;
    double auc = 0;
    double logloss = 0;
  };
  MasterServer(MasterOptions options, int64_t num_records, Planted planted);

  const MasterOptions options_;
  const int64_t num_records_;
  const Planted planted_;
  Clock* const clock_;

  mutable absl::Mutex mu_;
  proto::ClusterView view_ ABSL_GUARDED_BY(mu_);
  uint32_t next_node_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool placed_ ABSL_GUARDED_BY(mu_) = false;
  TaskScheduler tasks_ ABSL_GUARDED_BY(mu_);
  std::string job_state_ ABSL_GUARDED_BY(mu_) = "waiting";
  std::string job_message_ ABSL_GUARDED_BY(mu_);
  absl::Time start_time_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time end_time_ ABSL_GUARDED_BY(mu_);
  absl::Time train_end_time_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  uint32_t evaluator_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t max_last_step_ ABSL_GUARDED_BY(mu_) = 0;
  bool has_accuracy_ ABSL_GUARDED_BY(mu_) = false;
  double test_accuracy_ ABSL_GUARDED_BY(mu_) = 0;
  double test_loss_ ABSL_GUARDED_BY(mu_) = 0;
  bool has_auc_ ABSL_GUARDED_BY(mu_) = false;
  double test_auc_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint32_t, WorkerStats> workers_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, std::unique_ptr<proto::PServerAdmin::Stub>> pserver_stubs_
      ABSL_GUARDED_BY(mu_);

  MetricsRegistry metrics_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  int bound_port_ = 0;
  HttpServer http_;
  absl::Notification stop_;
  std::thread background_;
  bool started_ = false;
};

}  // namespace strata::master

#endif  // STRATA_MASTER_MASTER_SERVER_H_
