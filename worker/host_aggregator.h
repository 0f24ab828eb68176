// Node-local aggregation (cluster.aggregation: node; docs/architecture.md,
// "Node-local aggregation"): the workers of one host sum their gradients
// in a POSIX shared-memory segment, and the host's aggregating worker (its
// lowest live node id; with a hierarchical ring, its ring member:
// common/aggregation.h) pushes the sum once per step
// and publishes the parameters it pulls back for all of them.
//
// HostSegment is the segment: a slot per worker, where it posts the
// gradient of a step, and the published parameters with their version.
// Every process of the host maps it; nothing in it passes through the
// kernel but the futex that wakes waiters. Slots and parameters are each
// guarded by a sequence word (a seqlock): a writer marks the data
// unreadable, writes it, then stamps it; a reader checks the stamp before
// and after copying.
//
// HostAggregator is a worker's side of it: the training thread posts its
// gradient and waits for the next parameters (as every worker of the host
// does), and a thread of its own does the aggregating worker's part while
// the view makes this worker the one: it waits until every live worker of
// the host has posted the step, sums, pushes the sum (for the host: the
// pservers count one push a step per host), pulls the next version and
// publishes it. (Hierarchical allreduce: it steps the sum through the
// ring of the hosts' aggregating workers instead, dense_ring.h, and
// publishes the ring's parameters.) When that worker dies the next one by node id takes over
// at the step the host is at: its push of a step the old one had pushed is
// dropped by the pservers (the host's gradient is in already), so nothing
// is applied twice, and nothing acknowledged is lost.
#ifndef STRATA_WORKER_HOST_AGGREGATOR_H_
#define STRATA_WORKER_HOST_AGGREGATOR_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "worker/dense_ring.h"
#include "worker/param_client.h"

namespace strata::worker {

// The sparse tables whose gradient rows a host's workers merge per key
// (the CTR family: docs/sparse.md): each table's id and row width, and the
// most distinct keys one worker posts for a step (its batch's keys).
struct SparseLayout {
  std::vector<uint32_t> tables;
  std::vector<int> dims;
  size_t max_keys = 0;
  bool empty() const { return tables.empty(); }
};
// A worker's sparse gradient of one step: distinct keys[0, n) and, per
// table of the layout, rows[t][i * dims[t] ..] for keys[i].
struct SparseGrads {
  const uint64_t* keys = nullptr;
  size_t n = 0;
  std::vector<const float*> rows;
};
// The host's rows merged per key: keys in the order first posted, rows[t]
// their summed gradient rows.
struct MergedRows {
  std::vector<uint64_t> keys;
  std::vector<std::vector<float>> rows;
  absl::flat_hash_map<uint64_t, uint32_t> index;  // key -> place in keys
};

class HostSegment {
 public:
  // The segment's name for a job's aggregation key on `host`
  // ("/strata-agg-<key>-<host>").
  static std::string NameFor(uint64_t key, const std::string& host);
  // Creates the segment or maps the one there, sized for tensors of
  // `table_sizes` floats, `slots` workers and (a model with sparse tables)
  // `sparse`'s rows in each slot (their pages taken as keys come).
  // FailedPrecondition naming the segment when the one there was made for
  // another model. The keys a slot holds are the creator's sparse.max_keys.
  static absl::StatusOr<std::unique_ptr<HostSegment>> Open(const std::string& name,
                                                           const std::vector<size_t>& table_sizes,
                                                           uint32_t slots,
                                                           SparseLayout sparse = {});
  // Unmaps it; the last process to let go removes the name.
  ~HostSegment();
  HostSegment(const HostSegment&) = delete;
  HostSegment& operator=(const HostSegment&) = delete;

  const std::string& name() const { return name_; }
  const SparseLayout& sparse() const { return sparse_; }
  // Removes the name now (the job is over: no worker will map it again);
  // mappings stay valid.
  void Unlink() const;

  // A worker's gradient for `step`, summed over `count` samples, into its
  // slot (claimed at its first post), with its sparse rows when the
  // segment has a sparse layout. ResourceExhausted when every slot is
  // taken; InvalidArgument when the rows are more than the layout's
  // max_keys or do not match its tables.
  absl::Status Post(uint32_t worker, uint64_t step, uint64_t count,
                    const std::vector<std::vector<float>>& grads,
                    const SparseGrads* sparse = nullptr);
  // The version of the parameters published (none before the first).
  std::optional<uint64_t> published() const;
  // Copies the published parameters into *params (resized to the tables)
  // when their version is >= want; returns that version, or nullopt.
  std::optional<uint64_t> ReadParams(uint64_t want, std::vector<std::vector<float>>* params) const;
  // The gradients `workers` posted for `step`, summed into *sum (resized),
  // and their sparse rows merged per key into *merged (with a sparse
  // layout); returns the samples they sum over, or nullopt while one of
  // them has not posted that step.
  std::optional<uint64_t> Sum(uint64_t step, const std::vector<uint32_t>& workers,
                              std::vector<std::vector<float>>* sum,
                              MergedRows* merged = nullptr) const;
  // Publishes parameters of `version` unless newer ones are published
  // (true either way); false while another process publishes, unless that
  // one died in the middle of it (it left them locked): they are taken
  // over then.
  bool Publish(uint64_t version, const std::vector<std::vector<float>>& params);
  // Frees the slot of a worker that left the job for good.
  void Release(uint32_t worker);
  // True when `worker` has a slot (has posted once).
  bool HasSlot(uint32_t worker) const { return FindSlot(worker) >= 0; }

  // A counter that moves on at every post, publication and release, and
  // waiting on it: returns once it differs from `seen` or after `timeout`.
  uint32_t generation() const;
  void WaitChange(uint32_t seen, absl::Duration timeout) const;

 private:
  struct Header;
  struct Slot;
  HostSegment(std::string name, int fd, char* base, size_t size, std::vector<size_t> table_sizes,
              uint32_t slots, SparseLayout sparse);
  Header* header() const;
  Slot* slot(uint32_t i) const;
  float* slot_floats(uint32_t i) const;
  // A slot's sparse area: its keys, then table t's rows.
  uint64_t* slot_keys(uint32_t i) const;
  float* slot_rows(uint32_t i, size_t t) const;
  // Bytes of a slot's data (after its header): the dense floats, then the
  // sparse area.
  size_t slot_data_bytes() const;
  // Gives slot i (this process's) the pages of its first n sparse rows.
  absl::Status ReserveKeys(uint32_t i, size_t n, uint32_t worker);
  // Merges slot i's rows into *merged.
  void MergeRows(uint32_t i, size_t n, MergedRows* merged) const;
  float* params() const;
  void Wake();
  // The slot `worker` owns, or -1.
  int FindSlot(uint32_t worker) const;

  const std::string name_;
  const int fd_;  // kept to give a slot its pages when it is claimed
  char* const base_;
  const size_t size_;
  const std::vector<size_t> table_sizes_;
  const size_t floats_;
  const uint32_t slots_;
  const SparseLayout sparse_;
  std::vector<size_t> keys_ready_;  // per slot: sparse rows with pages (this process's slot)
  bool attached_ = false;           // counted in the header's `attached`
};

class HostAggregator {
 public:
  struct Options {
    uint32_t self = 0;  // this worker's node id
    std::string host;   // its host, as registered
    absl::Duration request_timeout = absl::Seconds(60);
    // Hierarchical allreduce (model.dense_sync allreduce): the ring the
    // host's sum of the dense tables steps through while this worker is
    // the host's member of it (RingLeadersByHost), instead of the
    // pservers; `ring_tables` are the tables the ring writes the
    // parameters into (this thread's alone). Both borrowed; null: the
    // pservers. (Sparse rows still go to the pservers.)
    DenseRing* ring = nullptr;
    std::vector<std::vector<float>>* ring_tables = nullptr;
  };
  // `params` (borrowed) must outlive Stop().
  HostAggregator(std::unique_ptr<HostSegment> segment, ParamClient* params, Options options,
                 std::vector<size_t> table_sizes);
  ~HostAggregator();
  HostAggregator(const HostAggregator&) = delete;
  HostAggregator& operator=(const HostAggregator&) = delete;

  // Starts the thread that aggregates while this worker is the host's
  // aggregating worker; Stop ends it (idempotent).
  void Start();
  void Stop();
  // Any thread: why the aggregating thread ended by itself (OK while it
  // runs): its ring could not be formed again within its time
  // (DenseRing::gave_up); the worker exits with it, and its restart makes
  // a new view, as a flat ring's member does.
  absl::Status fatal() const ABSL_LOCKS_EXCLUDED(fatal_mu_);
  bool failed() const { return failed_.load(); }  // fatal() is not OK

  // Training thread. Waits until parameters of version >= want are
  // published and copies them into *params; returns their version.
  // Cancelled once `stopping` says so; DeadlineExceeded when nothing new is
  // published for the request timeout.
  absl::StatusOr<uint64_t> AwaitParams(uint64_t want, std::vector<std::vector<float>>* params,
                                       const std::function<bool()>& stopping);
  // Training thread, hierarchical allreduce: the worker that evaluates
  // takes the parameters of version >= want (the version after the job's
  // last step), posting no samples (`zeros`) to each version published
  // before it meanwhile, since the host's steps need every worker's post.
  // When nothing new is published for the request timeout, it takes those
  // published (logged: the host is behind the job's last step).
  absl::StatusOr<uint64_t> AwaitFinalParams(uint64_t want, std::vector<std::vector<float>>* params,
                                            const std::vector<std::vector<float>>& zeros,
                                            const std::function<bool()>& stopping);
  absl::Status Post(uint64_t step, uint64_t count, const std::vector<std::vector<float>>& grads,
                    const SparseGrads* sparse = nullptr) {
    return segment_->Post(options_.self, step, count, grads, sparse);
  }
  HostSegment* segment() { return segment_.get(); }
  // Training thread, hierarchical allreduce: a worker with no data task
  // posts no samples to each version the host publishes, for about
  // `duration`, so that its host steps on with the ring (as a flat ring's
  // member steps idle).
  void IdleFor(absl::Duration duration, const std::vector<std::vector<float>>& zeros,
               const std::function<bool()>& stopping);
  // Steps this worker pushed for its host.
  uint64_t steps_pushed() const { return steps_pushed_.load(); }

 private:
  // AwaitParams, posting `idle` (no samples) to each version published
  // meanwhile when given (AwaitFinalParams).
  absl::StatusOr<uint64_t> Await(uint64_t want, std::vector<std::vector<float>>* params,
                                 const std::function<bool()>& stopping,
                                 const std::vector<std::vector<float>>* idle);
  void Loop();
  // One round as the aggregating worker: publishes a first version, or
  // pushes the step the host is at once everyone has posted it. False when
  // there was nothing to do yet.
  absl::StatusOr<bool> LeadOnce(const std::vector<uint32_t>& workers);
  // LeadOnce's hierarchical allreduce: the host's sum through the ring.
  absl::StatusOr<bool> LeadRingOnce(const std::vector<uint32_t>& workers);
  // True while this worker leads its host: the lowest live worker (with a
  // ring, the host's member of it: its lowest ALIVE or FINISHED worker).
  bool Leads(const std::vector<uint32_t>& workers) const;
  void PublishOrStop(uint64_t version, const std::vector<std::vector<float>>& params);

  std::unique_ptr<HostSegment> segment_;
  ParamClient* const params_;
  const Options options_;
  const std::vector<size_t> table_sizes_;
  // Pushes the host's merged sparse rows of `step` (over `count` samples)
  // to every virtual partition of each sparse table, and waits until each
  // has applied the step: StartRows, then FinishRows.
  absl::Status PushRows(uint64_t step, uint64_t count);
  struct RowsInFlight {
    std::vector<PushResult> results;
    std::vector<std::unique_ptr<ParamClient::Exchange>> pushes, barriers;
  };
  absl::StatusOr<RowsInFlight> StartRows(uint64_t step, uint64_t count);
  absl::Status FinishRows(RowsInFlight* rows);
  // LeadRingOnce's step of the host's sum (sum_, over `count` samples) of
  // version `at` through the ring, its rows in flight; then publishes.
  absl::Status RingStep(uint64_t at, uint64_t count, RowsInFlight* rows);

  // The agent thread's:
  std::vector<std::vector<float>> sum_;
  std::vector<std::vector<float>> pulled_;
  MergedRows merged_;
  ParamClient::SparseKeys grouped_;
  ParamClient::SparseKeys no_keys_;
  std::vector<uint32_t> perm_;
  std::vector<std::vector<float>> push_rows_;
  bool leading_ = false;
  // The host's version whose sum the ring stepped last (hierarchical).
  std::optional<uint64_t> ring_stepped_;
  std::atomic<uint64_t> steps_pushed_{0};
  absl::Notification stop_;
  std::thread thread_;
  mutable absl::Mutex fatal_mu_;
  absl::Status fatal_ ABSL_GUARDED_BY(fatal_mu_);
  std::atomic<bool> failed_{false};
};

}  // namespace strata::worker

#endif  // STRATA_WORKER_HOST_AGGREGATOR_H_
