// The worker's view of the parameter servers: pulls every partition of the
// model into per-table tensors and pushes per-table gradients back, all
// partitions in parallel, following the cluster view (epochs, owners).
#ifndef STRATA_WORKER_PARAM_CLIENT_H_
#define STRATA_WORKER_PARAM_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "common/trace.h"
#include "proto/strata.pb.h"
#include "transport/transport.h"

namespace strata::worker {

struct PushResult {
  int stale_partitions = 0;  // partitions that dropped the gradient as stale
  // The exchange's bookkeeping of partitions pushed in chunks: chunks
  // acknowledged so far, and those with a stale chunk (counted once).
  std::map<uint32_t, uint32_t> chunks_acked;
  std::set<uint32_t> stale;
};

// Thread-safe: SetView may run on the heartbeat thread while the training
// thread pulls and pushes. The transport is borrowed and must outlive this.
class ParamClient {
 public:
  // `refresh_view` fetches the current view from the master; it is called
  // when a pserver says our epoch is stale.
  ParamClient(transport::Transport* transport, uint32_t node_id,
              std::function<absl::StatusOr<proto::ClusterView>()> refresh_view,
              absl::Duration request_timeout);
  ParamClient(const ParamClient&) = delete;
  ParamClient& operator=(const ParamClient&) = delete;

  // Installs a view (ignored when older than the one held).
  void SetView(const proto::ClusterView& view);
  uint64_t epoch() const;
  // Node-local aggregation (common/aggregation.h), from the view held now:
  // its key (0: the job does not aggregate), the live workers of `host` by
  // node id (the first aggregates the host's gradients), and the workers
  // that left the job for good (dead or drained: node ids are not reused).
  uint64_t aggregation_key() const;
  std::vector<uint32_t> HostWorkers(const std::string& host) const;
  std::set<uint32_t> WorkersGone() const;
  // Workers in the view held now, whatever their state.
  int WorkersInView() const;
  // The members of the view held now (and its epoch and aggregation key).
  proto::ClusterView Members() const;
  // Element offsets where the partitions of table t begin, ascending.
  std::vector<uint64_t> PartitionStarts(uint32_t table) const;
  // Makes every current and later PullAll/PushAll return Cancelled at its
  // next retry. Thread-safe.
  void Cancel() { cancelled_ = true; }
  // Called (on the training thread) with a pserver's node id and what
  // failed when a request to it fails at the connection level, so that the
  // master hears of it at once (docs/reliability.md). Set before training.
  // A request unanswered for longer than `suspect_after` makes the client
  // ping its pserver on a new connection (waiting up to `ping_timeout`): a
  // pserver that is merely holding a bsp pull answers, one that is paused
  // or cut off does not, and is reported.
  void SetSuspectReporter(std::function<void(uint32_t node, const std::string& why)> report,
                          absl::Duration suspect_after = absl::InfiniteDuration(),
                          absl::Duration ping_timeout = absl::Milliseconds(500)) {
    report_suspect_ = std::move(report);
    suspect_after_ = suspect_after;
    ping_timeout_ = ping_timeout;
  }
  // Observes every push and pull request into `metrics` (borrowed; it must
  // outlive this client): strata_worker_{push,pull}_seconds, from sending to
  // the answer (a bsp pull includes the pserver holding it until the step
  // is applied), and strata_worker_{push,pull}_bytes_total. Call before the
  // first exchange.
  void SetMetrics(MetricsRegistry* metrics);
  // Writes a span per push (lane 2) and pull (lane 3) request to `trace`
  // (borrowed; it must outlive this client). Call before the first exchange.
  void SetTracer(TraceWriter* trace) { trace_ = trace; }
  // The update ledger: pushes acknowledged as applied, by partition id.
  std::map<uint32_t, uint64_t> AckedPushes() const;

  // Pulls every partition at version >= min_version into (*tables)[t],
  // resized to the table sizes. Returns the lowest version received.
  absl::StatusOr<uint64_t> PullAll(uint64_t min_version, std::vector<std::vector<float>>* tables);
  // Pushes gradients summed over `count` samples for `step`. Each call uses
  // a new sequence number; retries reuse it, so a retried push is applied
  // at most once.
  absl::StatusOr<PushResult> PushAll(const std::vector<std::vector<float>>& grads, uint64_t step,
                                     uint64_t count);
  // PullAll and PushAll of the dense tables [begin, end) only (a pipeline
  // stage's, worker/pipeline_runner.h).
  absl::StatusOr<uint64_t> PullTables(uint64_t min_version, uint32_t begin, uint32_t end,
                                      std::vector<std::vector<float>>* tables);
  absl::StatusOr<PushResult> PushTables(const std::vector<std::vector<float>>& grads,
                                        uint32_t begin, uint32_t end, uint64_t step,
                                        uint64_t count);
  // Writes `values` (one tensor per table; sparse tables' are empty) as
  // the dense partitions' initial values (transport::kFlagInitialValues):
  // a training script's first worker, for the tables it declared
  // (docs/python.md). Refused by a partition that has been trained.
  absl::Status PushInitialValues(const std::vector<std::vector<float>>& values);
  // PushAll then PullAll(min_version, tables) without a round trip between
  // them: the pulls are sent right behind the pushes on the same
  // connections (a pserver answers a pull after the pushes before it, in
  // bsp once the step is applied). Returns the lowest version pulled.
  absl::StatusOr<uint64_t> PushThenPull(const std::vector<std::vector<float>>& grads, uint64_t step,
                                        uint64_t count, uint64_t min_version,
                                        std::vector<std::vector<float>>* tables,
                                        PushResult* result = nullptr);
  class PushPull;

  struct Route {
    uint32_t partition;
    uint32_t table;
    uint64_t offset;  // dense: first element; sparse: the virtual partition
    uint64_t length;  // dense: elements; sparse (in an exchange): the keys' floats
    std::string address;
    uint32_t owner = 0;  // the primary's node id
    // In an exchange, a dense partition larger than the view's chunk_bytes
    // goes as `chunks` requests, this one for chunk `chunk` (offset and
    // length are the chunk's); chunks == 1: the whole partition.
    uint32_t chunk = 0;
    uint32_t chunks = 1;
  };
  // An exchange's request: partition id << 32 | chunk.
  using RouteId = uint64_t;

  // A batch's keys of the sparse tables (docs/sparse.md), deduplicated and
  // grouped by virtual partition: the keys of partition v are
  // keys[begin[v] .. begin[v + 1]). Every sparse table of a job has the same
  // number of virtual partitions, so one grouping serves them all.
  struct SparseKeys {
    std::vector<uint64_t> keys;
    std::vector<uint32_t> begin;  // partitions + 1 entries
  };
  // Groups `unique_keys` by virtual partition into *out, keeping their
  // order within a partition; perm[i] is the new place of unique_keys[i].
  // FailedPrecondition when the view has no sparse table.
  absl::Status GroupKeys(const std::vector<uint64_t>& unique_keys, SparseKeys* out,
                         std::vector<uint32_t>* perm) const;
  // The row width of sparse table `table` (0 when it is not one).
  int SparseDim(uint32_t table) const;
  using MakeRequest = std::function<transport::Message(const Route&)>;
  using OnResponse = std::function<absl::Status(const Route&, const transport::Message&)>;
  using Destination = std::function<std::pair<char*, size_t>(const Route&)>;
  struct Round;

  // One pull or push over every partition, issued piece by piece so the
  // worker can overlap it with computation: a push's partitions are sent as
  // the backward pass produces their gradients, the next step's pull of a
  // partition right behind its push (a bsp pserver holds it until the step
  // is applied), and the forward pass waits only for the partitions it
  // reads next.
  // Finish() settles everything: it waits for the answers and retries what
  // needs it (stale epoch, lagging pserver, broken connection) until the
  // request timeout. Used by one thread; the ParamClient must outlive it.
  class Exchange {
   public:
    // `sparse`: an exchange with the virtual partitions of one sparse table
    // that have keys in *sparse (all of them when every_partition) rather
    // than with every dense partition; *sparse must outlive the exchange.
    Exchange(ParamClient* client, MakeRequest make_request, OnResponse on_response,
             Destination destination, int sparse_table = -1, const SparseKeys* sparse = nullptr,
             bool every_partition = false);
    Exchange(const Exchange&) = delete;
    Exchange& operator=(const Exchange&) = delete;
    // With calls still unanswered that may still touch the caller's memory
    // (a push sent in place from the gradient, a pull writing into its
    // destination), drops their connections, so the transport stops
    // reading the gradient and writing the destination once this is gone
    // (rdma: at once; tcp: once its thread sees the socket closed).
    ~Exchange();

    // Sends the first attempt (once) for the partitions of `table` that lie
    // within its elements [0, end).
    void IssueRange(uint32_t table, uint64_t end);
    // Payload bytes of all its requests.
    uint64_t total_bytes() const { return total_bytes_; }
    void IssueAll();
    // Dense exchanges: only the partitions of tables [begin, end). Before
    // anything is issued.
    void OnlyTables(uint32_t begin, uint32_t end);
    // Waits until the partitions of `table` that hold any of its elements
    // [0, end) are answered successfully (issuing those not yet sent); if
    // any is not, or any request of the exchange needs a retry first,
    // settles the whole exchange (Finish).
    absl::Status WaitRange(uint32_t table, uint64_t end);
    // WaitRange without the settling: true when those partitions were all
    // answered successfully, false when one needs a retry (the caller then
    // calls Finish, after settling whatever that retry depends on). Returns
    // false as soon as any answer of the exchange needs a retry, without
    // waiting for the rest: their answers may wait on that retry (a bsp
    // partition acknowledges its chunks once its whole step is replicated).
    absl::StatusOr<bool> AwaitRange(uint32_t table, uint64_t end);
    // Restarts the request timeout (an exchange carried into a new step).
    void RenewDeadline();
    // Idempotent.
    absl::Status Finish();

   private:
    // OnlyTables.
    uint32_t tables_begin_ = 0;
    uint32_t tables_end_ = UINT32_MAX;
    void LoadRoutes();
    void Send(RouteId id);
    // After a view change: gives up waiting on requests to partitions that
    // moved to another pserver (their old owner may never answer: paused),
    // so that they are sent again to the new one.
    void AbandonMoved();
    // Tells the master (report_suspect_) of pservers whose requests failed
    // at the connection level, without waiting for the other answers.
    void ReportFailures();
    // Pings the owners of requests unanswered for longer than
    // suspect_after_ and reports those that do not answer.
    void ProbeSlowOwners();
    std::set<uint32_t> reported_;            // owners reported by this exchange
    std::map<uint32_t, absl::Time> pinged_;  // owner -> last ping
    absl::Status Await(const std::function<bool()>& done);
    absl::Status FinishOnce();

    ParamClient* const client_;
    const int sparse_table_;
    const SparseKeys* const sparse_;
    const bool every_partition_;
    const MakeRequest make_request_;
    const OnResponse on_response_;
    const Destination destination_;
    absl::Time deadline_;
    std::shared_ptr<Round> round_;
    std::map<RouteId, Route> routes_;
    uint64_t epoch_ = 0;
    uint64_t total_bytes_ = 0;  // payload of all partitions
    absl::Status view_error_;
    std::set<RouteId> issued_;  // routes sent at least once
    // Where calls went that touch the caller's memory until their answer.
    std::set<std::string> borrowing_;
    bool finished_ = false;
    absl::Status finish_status_;
  };

  // Prepares a pull of every partition (version >= min_version) into
  // *tables (resized to the view's tables); nothing is sent until
  // IssueRange / IssueAll / WaitRange / Finish.
  // *lowest receives the lowest version received once Finish() is OK.
  // `tables` and `lowest` must outlive the exchange.
  std::unique_ptr<Exchange> StartPull(uint64_t min_version, std::vector<std::vector<float>>* tables,
                                      uint64_t* lowest);
  // A push of (*grads) for `step` over `count` samples; nothing is sent
  // until Issue(table) / Finish(). `grads` and `result` must outlive it, and
  // a table's gradient must not change once issued, until the exchange is
  // finished or destroyed (the transport may send it in place until the
  // answer: Message::payload_ref_until_response).
  std::unique_ptr<Exchange> StartPush(const std::vector<std::vector<float>>* grads, uint64_t step,
                                      uint64_t count, PushResult* result);

  // PushThenPull issued table by table: a table's push (and, in a small
  // exchange, its pull right behind) goes out as soon as its gradient is
  // ready (Issue), while the caller computes the others'; Finish sends the
  // rest and settles both. Used by one thread; `grads` and `tables` must
  // outlive it, and a table's gradient must not change once issued.
  class PushPull {
   public:
    PushPull(ParamClient* client, const std::vector<std::vector<float>>* grads, uint64_t step,
             uint64_t count, uint64_t min_version, std::vector<std::vector<float>>* tables);
    void Issue(uint32_t table);
    // Issues every partition's push with its pull right behind it
    // (whatever the size), partition by partition: a pserver answers the
    // first pulls while the later pushes are still on the wire.
    void IssueInterleaved();
    // The lowest version pulled; *result gets the push's outcome.
    absl::StatusOr<uint64_t> Finish(PushResult* result = nullptr);
    // Finish in two halves, so that the caller computes while the pulls
    // land: FinishPush settles the push (*result its outcome) with every
    // pull issued; WaitTable(t) waits for table t's pulls; FinishPull
    // settles the rest (the lowest version pulled). Not with Finish.
    absl::Status FinishPush(PushResult* result);
    absl::Status WaitTable(uint32_t table);
    absl::StatusOr<uint64_t> FinishPull();

   private:
    PushResult pushed_;
    uint64_t lowest_ = 0;
    std::unique_ptr<Exchange> push_;
    std::unique_ptr<Exchange> pull_;
    bool pull_behind_;
    ParamClient* const client_;
    const std::vector<std::vector<float>>* const grads_;
  };

  // A pull of the rows of sparse table `table` for keys->keys into
  // rows[0 .. keys->keys.size() * dim) (responses land in place), at
  // version >= min_version (bsp). With every_partition (bsp) a request goes
  // to every virtual partition, with keys or not: the wait for the version
  // is what lets the next push to it be for that version. `keys` and
  // `rows` must outlive it. With `lowest`, the lowest version answered goes
  // there (UINT64_MAX when nothing was asked).
  std::unique_ptr<Exchange> StartSparsePull(uint32_t table, const SparseKeys* keys, float* rows,
                                            uint64_t min_version, bool every_partition = false,
                                            uint64_t* lowest = nullptr);
  // A push of the gradient rows grads[i * dim ..] of keys->keys[i] for
  // `step` over `count` samples. In bsp (every_partition) a request goes to
  // every virtual partition, empty or not, so each partition's step can
  // complete. The payloads are copied: the caller may reuse grads once
  // this returns.
  std::unique_ptr<Exchange> StartSparsePush(uint32_t table, const SparseKeys* keys,
                                            const float* grads, uint64_t step, uint64_t count,
                                            bool every_partition, PushResult* result);

 private:
  // A push's answer: acknowledged (counted per partition), a stale gradient
  // dropped by design (counted in *result), or the error, naming the
  // pserver.
  absl::Status OnPushAnswer(const Route& r, const transport::Message& resp, PushResult* result);
  // One Exchange over every partition, settled.
  absl::Status CallAll(const MakeRequest& make_request, const OnResponse& on_response,
                       const Destination& destination = {});
  absl::StatusOr<std::shared_ptr<transport::Connection>> ConnectionTo(const std::string& address);
  // Releases the connections to these addresses (a later call reconnects).
  void DropConnections(const std::set<std::string>& addresses);

  transport::Transport* const transport_;
  const uint32_t node_id_;
  const std::function<absl::StatusOr<proto::ClusterView>()> refresh_view_;
  const absl::Duration request_timeout_;
  std::atomic<bool> cancelled_{false};
  std::function<void(uint32_t, const std::string&)> report_suspect_;
  absl::Duration suspect_after_ = absl::InfiniteDuration();
  absl::Duration ping_timeout_ = absl::Milliseconds(500);
  // Null until SetMetrics.
  Histogram* push_seconds_ = nullptr;
  Histogram* pull_seconds_ = nullptr;
  Counter* push_bytes_ = nullptr;
  Counter* pull_bytes_ = nullptr;
  TraceWriter* trace_ = nullptr;
  // The address partition `r` lives at in the view held now.
  std::string CurrentAddressLocked(const Route& r, int sparse_table) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  proto::ClusterView members_ ABSL_GUARDED_BY(mu_);  // the view's members and aggregation key
  std::vector<Route> routes_ ABSL_GUARDED_BY(mu_);   // dense partitions
  std::vector<uint64_t> table_sizes_ ABSL_GUARDED_BY(mu_);  // sparse: 0
  // Sparse table id -> its routes by virtual partition; and row widths.
  std::map<uint32_t, std::vector<Route>> sparse_routes_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, int> sparse_dims_ ABSL_GUARDED_BY(mu_);
  uint32_t sparse_partitions_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status view_error_ ABSL_GUARDED_BY(mu_);  // a view we cannot use
  std::map<std::string, std::shared_ptr<transport::Connection>> conns_ ABSL_GUARDED_BY(mu_);
  // When DropConnections last closed the connection to each address: the
  // requests that fail with it failed by our hand (a partition moved
  // away from a pserver that lives on), which is no sign of a dead one.
  std::map<std::string, absl::Time> dropped_at_ ABSL_GUARDED_BY(mu_);
  bool DroppedRecently(const std::string& address) const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint32_t, uint64_t> acked_pushes_ ABSL_GUARDED_BY(mu_);
  uint64_t chunk_floats_ ABSL_GUARDED_BY(mu_) = 0;  // the view's chunk_bytes / 4
};

}  // namespace strata::worker

#endif  // STRATA_WORKER_PARAM_CLIENT_H_
