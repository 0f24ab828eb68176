// The node manager: the cluster's members and the view the nodes fetch —
// registration, heartbeats, failure detection and suspicion, drain, who is
// declared dead, and where a departed pserver's partitions go (to a synced
// backup, or lost until restored from a checkpoint); placement's bookkeeping;
// the data plane's membership keys; the pservers' admin stubs.
//
// What it owns, all under its lock mu_: the view (members, tables,
// partitions, epoch, ready), whether the partitions are placed, the next
// node id, the data-plane secret and key epoch, the pservers' stubs, the
// backups each pserver holds in sync, the suspicions, the partitions lost,
// the counts of failovers and restores.
//
// Lock order: mu_ is taken under the master's lock (MasterServer::mu_),
// and the job tracker's (events) and the metrics registry's under mu_. It
// knows nothing of data tasks or checkpoints: a call that makes a node
// leave returns a Departure, and the master does what that means for the
// node's data tasks and for partitions lost with it.
#ifndef STRATA_MASTER_NODE_MANAGER_H_
#define STRATA_MASTER_NODE_MANAGER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/metrics.h"
#include "common/security.h"
#include "master/job_tracker.h"
#include "master/pserver_calls.h"
#include "proto/checkpoint.pb.h"
#include "proto/strata.grpc.pb.h"

namespace strata::master {

// Who may register what (docs/security.md): a certificate's role must be
// the one registered, and its name "role@host" (or "role-N@host": index N
// only) the host registered. The identity to record ("" in plain text),
// or PermissionDenied.
absl::StatusOr<std::string> RegistrationIdentity(const proto::RegisterRequest& req,
                                                 const std::string& peer, const Identity& who);

// Thread-safe.
class NodeManager {
 public:
  struct Options {
    std::string host;  // the master's
    int expected_pservers = 1;
    int expected_workers = 1;
    ClusterSection cluster;  // heartbeats, timeouts, replication, slices
    uint64_t seed = 0;
    std::vector<proto::TableInfo> tables;
    // The training script declares the tables (model.type script without
    // model.tables; `tables` is empty): DeclareTables fixes them, with
    // sparse_partitions virtual partitions per sparse table.
    bool script_tables = false;
    uint32_t sparse_partitions = 0;
    const ControlPlaneSecurity* security = nullptr;  // borrowed, required
    Clock* clock = nullptr;                          // borrowed, required
    JobTracker* job = nullptr;                       // borrowed, required: events
    MetricsRegistry* metrics = nullptr;              // borrowed, required: per-node gauges
    // Workers serve the data plane to each other (model.stages > 1: a
    // stage's micro-batches come from the one before), so they are given
    // the key epoch's secret to verify one another, as with allreduce.
    bool workers_serve_data = false;
  };
  explicit NodeManager(Options options);
  NodeManager(const NodeManager&) = delete;
  NodeManager& operator=(const NodeManager&) = delete;

  // A node that left the job (declared dead, or a pserver drained), as it
  // was then, and the partitions lost with it (a pserver's, with no
  // synced backup; they wait for RestoreLost).
  struct Departure {
    proto::NodeInfo node;
    std::set<uint32_t> lost;
  };

  // The master's own addresses, in the view once it listens.
  void SetMasterAddress(const std::string& grpc_address) ABSL_LOCKS_EXCLUDED(mu_);
  void SetMasterHttpPort(int port) ABSL_LOCKS_EXCLUDED(mu_);

  // Registration. CheckReplaceable: a live instance of this role and index
  // is replaced only by the same identity (AlreadyExists otherwise).
  // LiveInstances: the ids of those the new one replaces (the master
  // declares them dead first). Add: the new member, alive, with a new id.
  absl::Status CheckReplaceable(const proto::RegisterRequest& req, const std::string& identity,
                                const std::string& peer) const ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<uint32_t> LiveInstances(proto::Role role, int32_t index) const
      ABSL_LOCKS_EXCLUDED(mu_);
  proto::NodeInfo Add(const proto::RegisterRequest& req, const std::string& identity,
                      const std::string& peer) ABSL_LOCKS_EXCLUDED(mu_);
  // The whole of a registration: the caller's identity checked
  // (RegistrationIdentity, CheckReplaceable), the live instances it
  // replaces declared dead — each departure handed to `departed` (called
  // without this lock, before the new member is added: the master handles
  // it there) — and the new member added, alive, with a new id.
  absl::StatusOr<proto::NodeInfo> Register(const proto::RegisterRequest& req,
                                           const std::string& peer, const Identity& who,
                                           bool job_over,
                                           const std::function<void(const Departure&)>& departed)
      ABSL_LOCKS_EXCLUDED(mu_);
  // OK unless node `node_id` was registered by an identity other than
  // `who` (PermissionDenied): a node speaks only for itself.
  absl::Status CheckCaller(uint32_t node_id, const Identity& who) const ABSL_LOCKS_EXCLUDED(mu_);

  // A heartbeat: the node's liveness, and a pserver's synced backups.
  // REASON_UNKNOWN_NODE, or REASON_DECLARED_DEAD (it registers again).
  struct Beat {
    proto::Role role = proto::ROLE_UNSPECIFIED;
    uint64_t epoch = 0;
    bool drained = false;     // it leaves (no key then)
    proto::DataPlaneKey key;  // mtls clusters
  };
  absl::StatusOr<Beat> Heartbeat(const proto::HeartbeatRequest& req) ABSL_LOCKS_EXCLUDED(mu_);

  // Failure detection: the nodes to declare dead now, with why — silent
  // for dead_timeout_ms, or a pserver the workers have reported
  // unreachable for as long (old suspicions are forgotten on the way).
  std::vector<std::pair<uint32_t, std::string>> Unresponsive() ABSL_LOCKS_EXCLUDED(mu_);
  // Marks node `id` dead (nullopt when it is unknown or already gone): a
  // new data-plane key, an event, a new epoch; a pserver's partitions fail
  // over to their synced backups unless the job is over or nothing is
  // placed yet.
  std::optional<Departure> DeclareDead(uint32_t id, const std::string& why, bool job_over)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A node cannot reach pserver req.suspect: recorded; the master probes.
  absl::StatusOr<proto::ReportSuspectResponse> ReportSuspect(const proto::ReportSuspectRequest& req)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A worker's tables (its training script's model): with script_tables,
  // the first declaration becomes the job's tables and its worker writes
  // their initial values (then calls again with req.initialised), or the
  // next worker to call when that one left first; otherwise they are
  // checked against the config's. FailedPrecondition naming the first
  // table that differs; InvalidArgument for a malformed declaration.
  // *changed: the view changed (the state log records it).
  absl::StatusOr<proto::DeclareTablesResponse> DeclareTables(const proto::DeclareTablesRequest& req,
                                                             bool* changed)
      ABSL_LOCKS_EXCLUDED(mu_);
  // While tables a script declared wait for their initial values: who
  // writes them ("worker 0 (node 3)"); nullopt otherwise.
  std::optional<std::string> AwaitedInitialValues() const ABSL_LOCKS_EXCLUDED(mu_);
  // The suspects due a probe (one per heartbeat interval at most).
  std::vector<PServerTarget> DueProbes() ABSL_LOCKS_EXCLUDED(mu_);
  // Of pservers `ids`, those alive (with their stubs).
  std::vector<PServerTarget> LivePServers(const std::set<uint32_t>& ids) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Why pserver `id` is suspected, while it is (and alive).
  std::optional<std::string> Suspicion(uint32_t id) const ABSL_LOCKS_EXCLUDED(mu_);
  // Probes the suspects due a probe (their admin service's status, with
  // no lock held): the failed probes, by node. The master then declares
  // each dead with DeclareUnreachable, under its own lock, and handles the
  // departure there.
  std::vector<std::pair<uint32_t, absl::Status>> ProbeSuspects() ABSL_LOCKS_EXCLUDED(mu_);
  // Declares pserver `id` dead when it is still suspected (nullopt
  // otherwise), its failed `probe` in the reason.
  std::optional<Departure> DeclareUnreachable(uint32_t id, const absl::Status& probe, bool job_over)
      ABSL_LOCKS_EXCLUDED(mu_);

  // `strata drain` (MasterServer::Drain says when it is refused). `state`
  // and `evaluator`: the job's now. changed: the state changed (the
  // master records it); departure: a drained pserver.
  struct Drained {
    proto::DrainResponse response;
    bool changed = false;
    std::optional<Departure> departure;
  };
  absl::StatusOr<Drained> Drain(const proto::DrainRequest& req, proto::JobState state,
                                uint32_t evaluator) ABSL_LOCKS_EXCLUDED(mu_);

  // A worker's place in the job, for leases and reports.
  // LiveWorker: REASON_UNKNOWN_NODE, or REASON_DECLARED_DEAD when it is
  // dead or drained.
  absl::StatusOr<proto::NodeInfo> LiveWorker(uint32_t id) const ABSL_LOCKS_EXCLUDED(mu_);
  bool IsDrainedWorker(uint32_t id) const ABSL_LOCKS_EXCLUDED(mu_);
  bool InJob(uint32_t id) const ABSL_LOCKS_EXCLUDED(mu_);  // known and not gone
  // A draining worker finished its data task: it leaves (a new key, an
  // event, a new epoch).
  void WorkerDrained(uint32_t id) ABSL_LOCKS_EXCLUDED(mu_);
  // A worker in (ALIVE) or out of (FINISHED) the bsp step set: a new epoch
  // when that changes.
  void SetWorkerState(uint32_t id, proto::NodeState state) ABSL_LOCKS_EXCLUDED(mu_);

  // The workers that train now or are about to (alive or joining, not
  // draining), and `id` whatever its state, by index (then node id): their
  // node ids, over which the job's global batch is split (elastic.batch,
  // job.batch_split).
  std::vector<uint32_t> TrainingWorkers(uint32_t id) const ABSL_LOCKS_EXCLUDED(mu_);
  // Members alive of `role` (workers: also those finished or joining with
  // `include_finished`).
  int Count(proto::Role role, bool include_finished) const ABSL_LOCKS_EXCLUDED(mu_);
  // The cluster is ready once the partitions are placed and every
  // expected worker registered: marks it so (a new epoch, returned) the
  // first time.
  std::optional<uint64_t> MarkReady() ABSL_LOCKS_EXCLUDED(mu_);
  bool ready() const ABSL_LOCKS_EXCLUDED(mu_);
  bool placed() const ABSL_LOCKS_EXCLUDED(mu_);
  int tables() const ABSL_LOCKS_EXCLUDED(mu_);

  // Placement. PlanPlacement: once every expected pserver is alive and
  // nothing is placed yet, the candidate view (a new epoch) and its
  // pservers; nullopt before; the error when the tables cannot be placed.
  // CommitPlacement: the candidate's partitions become the view's, once
  // every pserver accepted them.
  struct Placement {
    proto::ClusterView view;
    std::vector<PServerTarget> targets;
  };
  absl::StatusOr<std::optional<Placement>> PlanPlacement() ABSL_LOCKS_EXCLUDED(mu_);
  void CommitPlacement(const proto::ClusterView& placed) ABSL_LOCKS_EXCLUDED(mu_);
  // New backups where some are missing (cluster.replication), once placed.
  void TopUpBackups() ABSL_LOCKS_EXCLUDED(mu_);

  // Live partition migration (master/placement.h PlanMoves;
  // docs/reliability.md, "Moving partitions"), one turn on the master's
  // tick. Moves under way end: cut over once their target reported the
  // copy in sync (a new view: the target serves it), or abandoned when the
  // target or the source left. Pservers leaving (a pserver drained, or a
  // scale in) that hold nothing any more are drained: they exit. With
  // `rebalance` (a pserver scale in progress), or while a pserver leaves,
  // new moves are planned and up to max_moves run at once, started while
  // `credit` (bytes; elastic.move_rate_mb_per_s) is positive; with
  // `hold_cutover` (a checkpoint is being written) none cuts over.
  struct MigrateOptions {
    bool rebalance = false;
    int max_moves = 2;
    double credit = 0;
    bool hold_cutover = false;
  };
  struct Migration {
    int in_progress = 0;  // moves under way after this turn
    int waiting = 0;      // planned and not started
    uint64_t started_bytes = 0;
    std::vector<Departure> departed;  // pservers that left (nothing lost)
    bool changed = false;             // the view changed: record it
    // The pservers a move started, cut over or was abandoned on: the
    // master sends them the view at once (PushView), not at their next
    // heartbeat, so that a cut-over stalls training for a round trip.
    std::set<uint32_t> touched;
  };
  Migration Migrate(const MigrateOptions& o) ABSL_LOCKS_EXCLUDED(mu_);
  // Pservers `ids` applied view `epoch` (PushView answered), as a
  // heartbeat at that epoch would say.
  void ViewApplied(const std::vector<uint32_t>& ids, uint64_t epoch) ABSL_LOCKS_EXCLUDED(mu_);
  // Pservers `ids` leave (a scale in): they are marked draining, nothing
  // new is placed on them, and Migrate moves their partitions away.
  void MarkLeaving(const std::vector<uint32_t>& ids, const std::string& why)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Recovery of lost partitions from checkpoint `m`: each goes to the
  // least loaded live pserver, to rejoin at version `newest` (bsp: the
  // step the others reached; what it trained since the checkpoint is lost
  // and counted). FailedPrecondition when `m` lacks one (the job fails).
  bool has_lost() const ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status RestoreLost(const proto::CheckpointManifest& m, uint64_t newest)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The version a restored partition rejoins at (RestoreLost's `newest`):
  // bsp, the newest the live pservers hold, read from them with no lock
  // held (UNAVAILABLE, saying so, when they do not answer: later); asp 0.
  absl::StatusOr<uint64_t> RestoreVersion(bool bsp) const ABSL_LOCKS_EXCLUDED(mu_);

  // The view (the master's heartbeat time set to now with `now`).
  proto::ClusterView View() const ABSL_LOCKS_EXCLUDED(mu_);
  proto::ClusterView StatusView() ABSL_LOCKS_EXCLUDED(mu_);
  // Node `id`'s data-plane key (and a pserver's secret), in mtls clusters.
  proto::DataPlaneKey DataKey(uint32_t id) ABSL_LOCKS_EXCLUDED(mu_);
  // The pservers owning partitions; those of them alive; each partition's
  // owner.
  std::vector<PServerTarget> Owners() const ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<PServerTarget> LiveOwners() const ABSL_LOCKS_EXCLUDED(mu_);
  std::map<uint32_t, uint32_t> PartitionOwners() const ABSL_LOCKS_EXCLUDED(mu_);
  uint32_t next_node_id() const ABSL_LOCKS_EXCLUDED(mu_);
  // A job resumed from checkpoint `m`: its node ids go on after the
  // checkpoint's, and tables a script declares are the checkpoint's, their
  // values restored from it (the workers' declarations must match them).
  void Resume(const proto::CheckpointManifest& m) ABSL_LOCKS_EXCLUDED(mu_);

  // Its part of JobStatus (recovery counts) and of the state log: Save
  // (the view without heartbeat times), Restore (a restarted master:
  // everyone gets twice the dead timeout from now to reconnect, and a new
  // epoch).
  void FillStatus(proto::JobStatus* js) const ABSL_LOCKS_EXCLUDED(mu_);
  void FillSummary(proto::JobSummary* s) const ABSL_LOCKS_EXCLUDED(mu_);
  void Save(proto::MasterState* st) const ABSL_LOCKS_EXCLUDED(mu_);
  void Restore(const proto::MasterState& st) ABSL_LOCKS_EXCLUDED(mu_);
  // Every node's last heartbeat set to now: a master that did not hear them
  // for a while (paused) gives each the dead timeout anew.
  void GraceAll() ABSL_LOCKS_EXCLUDED(mu_);
  // The strata_master_view_epoch and strata_master_nodes_* gauges.
  void RegisterMetrics() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  proto::NodeInfo* FindLocked(uint32_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const proto::NodeInfo* FindLocked(uint32_t id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int CountLocked(proto::Role role, bool include_finished) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void BumpEpochLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A new data-plane secret: the keys of nodes that left stop working.
  void RotateDataKeyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FillDataKeyLocked(const proto::NodeInfo& n, proto::DataPlaneKey* key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Promotes a synced backup of each partition pserver `gone` owned; the
  // ones without are lost (returned). Then tops up the backups.
  std::set<uint32_t> FailoverLocked(uint32_t gone) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TopUpBackupsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<PServerTarget> OwnersLocked(bool live_only) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Drained> DrainWorkerLocked(proto::NodeInfo* n, const std::string& name,
                                            const std::string& why, proto::JobState state,
                                            uint32_t evaluator) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Drained> DrainPServerLocked(proto::NodeInfo* n, const std::string& name,
                                             const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Migrate's steps: moves under way cut over or abandoned (their
  // count); pservers leaving that hold nothing drained; new moves started
  // (with `start` false, only counted as waiting).
  int FinishMovesLocked(bool hold_cutover, Migration* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DrainEmptiedLocked(Migration* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartMovesLocked(const MigrateOptions& o, bool start, Migration* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a new owner from a cut-over has yet to apply its view (those
  // that have, or left, are forgotten).
  bool CutOverSettlingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pservers alive that stay (not leaving).
  std::vector<uint32_t> StayingPServersLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Heartbeat age and liveness gauges of node (role, index); idempotent.
  void AddNodeMetrics(proto::Role role, uint32_t index) ABSL_LOCKS_EXCLUDED(mu_);
  void NewStubLocked(const proto::NodeInfo& n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  Clock* const clock_;
  JobTracker* const job_;

  mutable absl::Mutex mu_;
  proto::ClusterView view_ ABSL_GUARDED_BY(mu_);
  bool placed_ ABSL_GUARDED_BY(mu_) = false;
  uint32_t next_node_id_ ABSL_GUARDED_BY(mu_) = 1;
  // The data plane's membership keys (transport/data_plane_auth.h): a new
  // secret and key epoch whenever a node leaves; empty in plain text.
  std::string data_secret_ ABSL_GUARDED_BY(mu_);
  uint64_t key_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  // Each pserver's admin stub: it lives as long as the node manager (a
  // PServerTarget points at it).
  std::map<uint32_t, std::unique_ptr<proto::PServerAdmin::Stub>> pserver_stubs_
      ABSL_GUARDED_BY(mu_);
  // Partitions each pserver holds as a synced backup (its last heartbeat).
  std::map<uint32_t, std::set<uint32_t>> synced_replicas_ ABSL_GUARDED_BY(mu_);
  std::set<uint32_t> lost_ ABSL_GUARDED_BY(mu_);  // partitions with no live copy
  struct Suspect {
    absl::Time first;
    absl::Time last;
    std::string reason;
    bool probe_due = true;
  };
  std::map<uint32_t, Suspect> suspects_ ABSL_GUARDED_BY(mu_);
  // Each pserver's view epoch at its last heartbeat, and the epoch each
  // move began in: a move cuts over on a heartbeat of its epoch or later.
  std::map<uint32_t, uint64_t> beat_epoch_ ABSL_GUARDED_BY(mu_);
  // Sparse partitions' bytes as their owners measure them (heartbeats),
  // for placement (PartitionWeight).
  std::map<uint32_t, uint64_t> sparse_bytes_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, uint64_t> move_epoch_ ABSL_GUARDED_BY(mu_);
  // The new owners of partitions just cut over, and the view that made
  // them owners: no move starts until each has applied it (a copy made
  // meanwhile, under the lock of a partition the same workers wait for,
  // would add its pause to the cut-over's in one step).
  std::map<uint32_t, uint64_t> cutover_wait_ ABSL_GUARDED_BY(mu_);
  // The newest view each pserver answered a PushView of.
  std::map<uint32_t, uint64_t> applied_epoch_ ABSL_GUARDED_BY(mu_);
  uint64_t moves_done_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t moved_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int moves_waiting_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t failovers_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t partitions_restored_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t steps_lost_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace strata::master

#endif  // STRATA_MASTER_NODE_MANAGER_H_
