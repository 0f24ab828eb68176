// The pserver: serves its partitions over the data-plane transport, takes
// placement from the master (PServerAdmin gRPC), heartbeats, and follows the
// cluster view (epoch checks, the BSP step set).
#ifndef STRATA_PSERVER_PSERVER_H_
#define STRATA_PSERVER_PSERVER_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/config.h"
#include "common/failpoint.h"
#include "common/grpc_channel.h"
#include "common/http_server.h"
#include "common/metrics.h"
#include "common/node_agent.h"
#include "common/security.h"
#include "common/sharded_executor.h"
#include "grpcpp/grpcpp.h"
#include "proto/strata.grpc.pb.h"
#include "pserver/partition.h"
#include "pserver/replica_streams.h"
#include "storage/file_system.h"
#include "transport/transport.h"

namespace strata::pserver {

struct PServerOptions {
  JobConfig config;
  std::string master_address;      // "host:port"
  int index = 0;                   // instance index
  std::string host = "127.0.0.1";  // bind and advertise address
  int port = 0;                    // admin gRPC; 0 = any
  int data_port = 0;               // data plane; 0 = any
  int http_port = 0;               // 0 = any, -1 = off
  transport::TransportOptions transport;
  // Threads that apply pushes and answer pulls, partitions spread over them
  // (each partition's requests stay in arrival order). 1 = on the
  // transport's thread (best on small machines: see docs/performance.md);
  // 0 = one per core.
  int apply_threads = 1;
  absl::Duration register_timeout = absl::Seconds(60);
  // Checkpoint files are written and read through this (borrowed; must
  // outlive the PServer). Required.
  storage::FileSystem* fs = nullptr;
  // Crash points for tests (common/failpoint.h); borrowed, may be null.
  const Failpoints* failpoints = nullptr;
  // Control-plane credentials and policy (docs/security.md); plain text
  // unless set.
  ControlPlaneSecurity security = ControlPlaneSecurity::Plaintext();
};

// Thread-safe. Start() once, Shutdown() once (idempotent).
class PServer {
 public:
  static absl::StatusOr<std::unique_ptr<PServer>> Create(PServerOptions options);
  ~PServer();
  PServer(const PServer&) = delete;
  PServer& operator=(const PServer&) = delete;

  // Listens (data plane, admin gRPC, HTTP), registers with the master
  // (retrying until register_timeout) and starts heartbeating.
  absl::Status Start();
  void Shutdown();

  uint32_t node_id() const { return node_id_; }
  std::string data_address() const;
  std::string admin_address() const;
  int http_port() const { return http_.port(); }
  uint64_t epoch() const { return epoch_.load(); }
  // True once the master declared this node dead while it lived (it was
  // paused or cut off): it serves and applies nothing more, and its process
  // should exit so that its supervisor starts a fresh one
  // (docs/reliability.md).
  bool fenced() const { return fenced_.load(); }
  // Fenced because the master drained this node (`strata drain`).
  bool drained() const { return drained_.load(); }

  // Installs a cluster view: creates newly owned partitions, updates the
  // epoch and the BSP step set. With `restore`, new partitions load their
  // state from its files under `checkpoint_root`; either every new
  // partition is created or none. Errors: bad initializer / optimizer
  // config; a checkpoint file missing, corrupt or not fitting (naming it).
  absl::Status ApplyView(const proto::ClusterView& view,
                         const proto::CheckpointManifest* restore = nullptr,
                         const std::string& checkpoint_root = "");
  // Writes this pserver's partitions into checkpoint req.seq: snapshots
  // each (at req.version in bsp), writes and syncs the files on the
  // calling thread while training goes on. One checkpoint at a time
  // (FailedPrecondition otherwise); DeadlineExceeded when a partition
  // does not reach the cut in time; disk errors name the file.
  // `cancelled` (optional) is polled while waiting for the cut: true
  // gives up with Cancelled.
  absl::StatusOr<proto::CheckpointPartitionsResponse> Checkpoint(
      const proto::CheckpointPartitionsRequest& req, const std::function<bool()>& cancelled = {});
  // A preemption notice (SIGTERM): asks the master for a checkpoint and a
  // clean stop, waiting at most `grace`.
  absl::Status RequestCheckpointAndStop(absl::Duration grace);
  proto::PServerStatusResponse Status() const;
  // A partition by id, or null. Shared: a partition that moves away lives
  // on while someone holds it, and is freed when the last holder lets go.
  // Its replication sink is this PServer's: send it nothing after the
  // PServer is gone.
  std::shared_ptr<Partition> FindPartition(uint32_t id) const;
  // Partition objects alive: those served plus those that moved away and
  // are still held (a request in flight, a replication record, a
  // checkpoint). The strata_pserver_partitions_held gauge.
  int64_t partitions_held() const { return held_->load(); }
  // Whether this node has been the primary of `partition` since view
  // `epoch` or earlier, through the view it serves now: a worker's request
  // of that older view is routed as today's would be, and is served (a
  // view change stalls only the requests of the partitions it moves).
  bool PrimarySince(uint32_t partition, uint64_t epoch) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  class AdminService;
  // This node's data-plane keys (mtls clusters; null in plain text).
  std::shared_ptr<transport::MembershipKeys> membership_;
  explicit PServer(PServerOptions options);
  void HandleRequest(transport::Message request, std::shared_ptr<transport::Responder> responder);
  // A kReplicate record for `part` (null: not held here), checked against
  // the view of `epoch` (its primary, its addressee) and applied.
  void HandleReplica(transport::Message request, std::shared_ptr<Partition> part, uint64_t epoch,
                     std::shared_ptr<transport::Responder> responder);
  // The answer to a request of another view epoch than ours: an older one
  // is stale (the sender refreshes); a newer one means this node is behind,
  // so it asks the heartbeat thread to refresh, and the sender retries.
  transport::Message EpochMismatchResponse(const transport::MessageHeader& h,
                                           transport::MessageType answer_type, uint64_t epoch);
  void HeartbeatLoop();
  absl::Status RefreshView();
  absl::Status ApplyViewLocked(const proto::ClusterView& view,
                               const proto::CheckpointManifest* restore,
                               const std::string& checkpoint_root)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(apply_mu_);
  // ApplyViewLocked's steps. Closes the data connections of nodes that
  // left (a worker declared dead, a fenced primary's stream).
  void DisconnectTheGone(const proto::ClusterView& view) ABSL_EXCLUSIVE_LOCKS_REQUIRED(apply_mu_);
  // Drops the partitions neither `owned` nor `backing` (into `left`, freed
  // by the caller after mu_).
  void DropPartitionsLeftLocked(uint64_t epoch, const std::set<uint32_t>& owned,
                                const std::set<uint32_t>& backing,
                                std::vector<std::shared_ptr<Partition>>* left)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Installs the partitions `created` (replacing those there: a backup's
  // old copy may stay a shadow), drops those left, promotes the owned
  // ones (from a shadow where the new copy never came) and serves them,
  // every partition with the view's bsp step set (its live workers, each
  // host's as one with node-local aggregation: common/aggregation.h).
  void InstallPartitions(const proto::ClusterView& view,
                         std::map<uint32_t, std::unique_ptr<Partition>> created,
                         std::set<uint32_t> owned, const std::set<uint32_t>& backing)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(apply_mu_);
  // A partition replaced by a fresh backup (its owner changed): kept in
  // shadows_ if it was in sync, else into `left`.
  void ShadowOrDropLocked(uint32_t id, std::shared_ptr<Partition> old,
                          std::vector<std::shared_ptr<Partition>>* left)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A partition this node is primary of, with its backups and the move's
  // target among them (0: none).
  struct Served {
    std::shared_ptr<Partition> part;
    std::vector<uint32_t> backups;
    uint32_t move_to = 0;
  };
  // The replication streams follow `primaries` (records of moved
  // partitions, or to nodes that back them no more, dropped), then each
  // is promoted and sends its copy to new backups.
  void ServeAsPrimaries(const std::vector<Served>& primaries,
                        const std::map<uint32_t, std::string>& backup_addresses);
  // The job's consistency (and ssp staleness) for its partitions.
  SyncMode Sync() const {
    return SyncMode(options_.config.job.consistency,
                    static_cast<uint32_t>(options_.config.job.staleness));
  }
  // Partition p of the view, new: a sparse table's rows, or a dense
  // slice's initial values and its optimizer.
  absl::StatusOr<std::unique_ptr<Partition>> NewPartition(const proto::ClusterView& view,
                                                          const proto::PartitionInfo& p);
  // Loads each (checkpoint entry, partition) of checkpoint `seq` under
  // `checkpoint_root`, a few at once.
  absl::Status LoadPartitions(
      const std::vector<std::pair<const proto::CheckpointPartition*, Partition*>>& to_load,
      const std::string& checkpoint_root, uint64_t seq);
  // Checkpoint's steps: FailedPrecondition (REASON_CUT_PASSED) when some
  // partition is past the cut at `version`; a partition's snapshot into
  // the response, its file written unless it did not change.
  static absl::Status CutNotPassed(const std::vector<std::shared_ptr<Partition>>& parts,
                                   uint64_t version);
  absl::Status WriteSnapshot(const Partition& p, const PartitionSnapshot& snap,
                             const proto::CheckpointPartitionsRequest& req,
                             proto::CheckpointPartitionsResponse* resp);
  void RegisterMetrics();
  // Why this node may not serve now (its lease expired, or it was fenced),
  // or OK.
  absl::Status ServingStatus() const;
  void RenewLease(absl::Time granted_at);
  // Loads partition `p` (new, owned) from checkpoint p.restore_seq() under
  // the config's checkpoint.dir, then moves it on to p.restore_version().
  absl::Status RestoreLostPartition(const proto::PartitionInfo& p, Partition* part) const;
  // The row store of sparse partition p of table t, from the config's
  // sparse section.
  absl::StatusOr<std::unique_ptr<SparseTable>> MakeSparseTable(const proto::ClusterView& view,
                                                               const proto::TableInfo& t,
                                                               const proto::PartitionInfo& p) const;
  // /metrics gauges of one sparse table (rows, bytes, admission, eviction).
  void AddSparseMetrics(const std::string& table);
  // Takes `part` into shared ownership, counted in held_ until freed.
  std::shared_ptr<Partition> Share(std::unique_ptr<Partition> part) const;
  // The partitions served now, for reading without mu_ (they stay alive
  // while the copy holds them).
  std::vector<std::shared_ptr<const Partition>> Partitions() const;

  const PServerOptions options_;
  std::unique_ptr<transport::Transport> transport_;
  std::unique_ptr<ShardedExecutor> executor_;  // null: apply on the transport thread
  std::atomic<int64_t> queued_{0};             // requests posted to executor_, not yet started
  Histogram* apply_seconds_ = nullptr;         // set by RegisterMetrics, before Listen
  // Outgoing replication (created once registered: it needs the node id).
  std::unique_ptr<ReplicaStreams> replicas_;
  // Membership with the master (register, heartbeats, keys); null until
  // Start registers.
  std::unique_ptr<NodeAgent> agent_;
  std::unique_ptr<proto::Master::Stub> master() const { return agent_->master(); }
  std::unique_ptr<AdminService> admin_service_;
  std::unique_ptr<grpc::Server> admin_server_;
  int admin_port_ = 0;
  HttpServer http_;
  MetricsRegistry metrics_;
  Counter* requests_total_ = nullptr;
  Counter* stale_epoch_total_ = nullptr;
  Counter* bytes_in_ = nullptr;
  Counter* bytes_out_ = nullptr;

  std::atomic<uint32_t> node_id_{0};
  std::atomic<uint64_t> epoch_{0};
  // The worker that writes a script's declared tables' initial values, as
  // the view of epoch_ says (0: none).
  std::atomic<uint32_t> values_writer_{0};
  // Held across ApplyView (which may read a checkpoint for minutes) so
  // views apply one at a time; mu_ only briefly inside it. Taken before mu_.
  absl::Mutex apply_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  // Nodes that left whose data connections were closed (DisconnectNode).
  std::set<uint32_t> disconnected_ ABSL_GUARDED_BY(apply_mu_);
  mutable absl::Mutex mu_;
  // Shared with whoever uses a partition past the lookup (see
  // FindPartition): dropping one here frees it once its last user is done.
  std::map<uint32_t, std::shared_ptr<Partition>> partitions_ ABSL_GUARDED_BY(mu_);
  // Backups whose partition got a new owner (a move's cut-over, a
  // failover): the copy in sync with the old owner, kept until the fresh
  // backup in partitions_ holds the new owner's copy. Reported in sync
  // meanwhile; promoted if the new owner dies before its copy came.
  std::map<uint32_t, std::shared_ptr<Partition>> shadows_ ABSL_GUARDED_BY(mu_);
  std::set<uint32_t> owned_ ABSL_GUARDED_BY(mu_);  // of the view applied last
  // For each of owned_, the view epoch from which on this node has been its
  // primary (PrimarySince).
  std::map<uint32_t, uint64_t> primary_since_ ABSL_GUARDED_BY(mu_);
  // Partitions alive (partitions_held()). Shared with each partition's
  // deleter: a partition may outlive the PServer in its last holder.
  const std::shared_ptr<std::atomic<int64_t>> held_ = std::make_shared<std::atomic<int64_t>>(0);
  // Replication: the owner of every partition in the view applied last
  // (a record is taken only from the partition's primary).
  std::map<uint32_t, uint32_t> owner_of_ ABSL_GUARDED_BY(mu_);
  // Partitions moving to this node (the view's move_to): their copy
  // passes the failpoint pserver.move.copy_received.
  std::set<uint32_t> moving_in_ ABSL_GUARDED_BY(mu_);
  bool refresh_wanted_ ABSL_GUARDED_BY(mu_) = false;
  // A backup caught up (a move's target now in sync): the heartbeat that
  // tells the master goes now, not at the next interval (the cut-over
  // waits on it).
  bool beat_now_ ABSL_GUARDED_BY(mu_) = false;
  void BeatNow() ABSL_LOCKS_EXCLUDED(mu_);
  // Backups found unreachable, to report to the master (heartbeat thread).
  std::map<uint32_t, std::string> suspects_ ABSL_GUARDED_BY(mu_);
  bool checkpointing_ ABSL_GUARDED_BY(mu_) = false;
  std::set<std::string> sparse_metrics_ ABSL_GUARDED_BY(mu_);  // tables with gauges

  // The lease: serving is allowed until then (unix ns); renewed by each
  // answered heartbeat, for less than the master's dead timeout.
  std::atomic<int64_t> lease_until_ns_{0};
  std::atomic<bool> fenced_{false};
  std::atomic<bool> drained_{false};
  Counter* refused_total_ = nullptr;
  std::atomic<bool> shutdown_{false};
  absl::Notification stop_;
  std::thread heartbeat_;
  bool started_ = false;
};

}  // namespace strata::pserver

#endif  // STRATA_PSERVER_PSERVER_H_
