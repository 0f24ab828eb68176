// The job tracker: the job's life (waiting → running → evaluating →
// succeeded | failed | stopped) and what it reports while it runs and when
// it ends — the workers' progress, the final test figures, the job's event
// list, the progress history of the status page's charts, the update
// ledger, and the summary (summary.json).
//
// What it owns, all under its own lock mu_: the job state and message and
// when the job started, finished training and ended; the evaluator; the
// newest step a completed data task reached; each worker's last progress
// report and each pserver's apply counts; the final test figures; the
// events; the history; the ledger; what a resumed job had trained before.
//
// Lock order: mu_ is taken under the master's lock (MasterServer::mu_) and
// never held while calling anything but the event sink, whose lock is a
// leaf. It knows nothing of the cluster's members, data tasks or
// checkpoints: the master hands it the view where it needs one, and adds
// the other components' parts to the status and the summary.
#ifndef STRATA_MASTER_JOB_TRACKER_H_
#define STRATA_MASTER_JOB_TRACKER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/metrics.h"
#include "master/event_sink.h"
#include "proto/strata.pb.h"
#include "storage/file_system.h"

namespace strata::master {

// Out of the cluster: declared dead, or drained on request.
inline bool Gone(const proto::NodeInfo& n) {
  return n.state() == proto::DEAD || n.state() == proto::DRAINED;
}

// The planted model's own test figures (data.planted), for the summary.
struct Planted {
  bool present = false;
  double auc = 0;
  double logloss = 0;
};
// data.planted, checked: its figures, or why it is not such a file.
absl::StatusOr<Planted> ReadPlanted(storage::FileSystem* fs, const std::string& path);

// What the job does now, in a few words (JobStatus.phase), from its
// status `js` (state, epoch, tasks, the nodes registered and expected):
// while it waits, what it waits for — pservers, the placement of `tables`
// tables (`placed`: done), the restore of a checkpoint (`restoring`, as
// CheckpointCoordinator::RestorePhase says; "" none), workers.
std::string JobPhase(const proto::JobStatus& js, bool placed, int tables,
                     const std::string& restoring);

// The summary as summary.json: protobuf's JSON printer, every field of it
// printed (the optional ones when set), with the proto's field names.
std::string SummaryJson(const proto::JobSummary& summary);

// Thread-safe.
class JobTracker {
 public:
  struct Options {
    std::string name;  // job.name
    Consistency consistency = Consistency::kBsp;
    int epochs = 1;
    Planted planted;
    Clock* clock = nullptr;     // borrowed, required
    EventSink* sink = nullptr;  // borrowed, required
  };
  explicit JobTracker(Options options);
  JobTracker(const JobTracker&) = delete;
  JobTracker& operator=(const JobTracker&) = delete;

  // The event sink it posts to (for events that are not the job's own).
  EventSink* sink() const { return options_.sink; }

  proto::JobState state() const ABSL_LOCKS_EXCLUDED(mu_);
  // Succeeded, failed or stopped.
  bool over() const ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until the job has ended or `timeout` passed; true when it ended.
  bool AwaitEnd(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);

  // Waiting → running: the cluster is ready at view epoch `epoch`.
  void Start(uint64_t epoch) ABSL_LOCKS_EXCLUDED(mu_);
  // Running → evaluating: all `tasks` data tasks are done.
  void TrainingDone(uint64_t tasks) ABSL_LOCKS_EXCLUDED(mu_);
  // The job ends in `state` (succeeded, failed or stopped), with why.
  void Finish(proto::JobState state, const std::string& message) ABSL_LOCKS_EXCLUDED(mu_);

  // A cluster event: in the job's event list (status, summary, the state
  // log), logged, and in the event log and the audit log (the sink's
  // Event alone puts it in those two only). `node`: the node it is about.
  void Event(const std::string& what, const char* kind = "event",
             const proto::NodeInfo* node = nullptr) ABSL_LOCKS_EXCLUDED(mu_);
  size_t events_size() const ABSL_LOCKS_EXCLUDED(mu_);
  // The events from the `from`th on.
  std::vector<std::string> EventsFrom(size_t from) const ABSL_LOCKS_EXCLUDED(mu_);

  // Worker `node`, out of data tasks, asks for work: when the job
  // evaluates and the evaluation may start (the ledger is read, or the
  // pservers did not answer for it within 10 s of the end of training), it
  // becomes
  // the evaluator unless another is (one that left the job,
  // `!evaluator_in_job`, is replaced). The version the evaluator must
  // pull (bsp: past the newest step trained; asp: 0) when `node` is it.
  std::optional<uint64_t> ClaimEvaluation(uint32_t node, bool evaluator_in_job)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Worker `node` cannot evaluate (it holds no dense allreduce ring's
  // parameters, LeaseTaskRequest.cannot_evaluate): it is no longer the
  // evaluator, and ClaimEvaluation never makes it one again.
  void DeclineEvaluation(uint32_t node) ABSL_LOCKS_EXCLUDED(mu_);
  // Every one of `workers` (those in the job) has declined: nobody can
  // evaluate the trained model.
  bool AllDeclined(const std::vector<uint32_t>& workers) const ABSL_LOCKS_EXCLUDED(mu_);
  // The evaluator (0: none chosen yet).
  uint32_t evaluator() const ABSL_LOCKS_EXCLUDED(mu_);
  // The evaluator `node` holds the trained model's parameters and
  // evaluates (a dense allreduce ring's worker joined its ring first):
  // the other workers need step no ring again. Ignored from another node.
  void EvaluationStarted(uint32_t node) ABSL_LOCKS_EXCLUDED(mu_);
  // The evaluator once it has said so (0 before).
  uint32_t evaluating() const ABSL_LOCKS_EXCLUDED(mu_);

  // A data task completed at bsp step `last_step`.
  void TaskCompleted(uint64_t last_step) ABSL_LOCKS_EXCLUDED(mu_);
  // The newest step a completed data task reached.
  uint64_t max_last_step() const ABSL_LOCKS_EXCLUDED(mu_);
  // Worker node `node`'s progress report (its test figures: Evaluated).
  void RecordProgress(uint32_t node, const proto::ReportProgressRequest& report)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The evaluator's test figures (the caller then finishes the job).
  void Evaluated(const proto::ReportProgressRequest& report) ABSL_LOCKS_EXCLUDED(mu_);
  // Pserver node `node`'s pushes taken in and seconds spent, so far.
  void RecordApplies(uint32_t node, uint64_t applies, double seconds) ABSL_LOCKS_EXCLUDED(mu_);
  // The update ledger: each partition's applied pushes by sender, read
  // from the primaries once training is over.
  bool ledger_taken() const ABSL_LOCKS_EXCLUDED(mu_);
  void SetLedger(std::map<uint32_t, std::map<uint32_t, uint64_t>> applied) ABSL_LOCKS_EXCLUDED(mu_);

  // A job resumed from checkpoint `seq`, which held `samples` samples, cut
  // after bsp step `max_last_step`.
  void Resume(uint64_t seq, uint64_t samples, uint64_t max_last_step) ABSL_LOCKS_EXCLUDED(mu_);

  // The job's part of JobStatus, with the workers' progress (members:
  // `view`'s): name, state and message, consistency, epochs, steps,
  // samples, loss and accuracy, the times and the throughput, the test
  // figures, the history, the events, what was resumed from.
  void FillStatus(const proto::ClusterView& view, proto::JobStatus* js) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Adds a point to the history when its interval has passed since the
  // last one (or `force`), once some worker has reported; `status` makes
  // the status it is taken from, and is called only then (without mu_).
  template <typename StatusFn>
  void SampleHistory(bool force, StatusFn status) ABSL_LOCKS_EXCLUDED(mu_) {
    if (HistoryDue(force)) AddHistory(status());
  }
  // The job's part of the summary, from its status `js` (FillStatus's,
  // completed by the master) and `view`: the figures, the events, the
  // planted model, the ledger, the step phases, the workers.
  proto::JobSummary Summary(const proto::JobStatus& js, const proto::ClusterView& view) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Its gauges (strata_job_samples_per_second, strata_job_comm_share,
  // strata_job_samples): from the workers' reports, members as `view`
  // says at each scrape (called without mu_).
  void RegisterMetrics(MetricsRegistry* metrics, std::function<proto::ClusterView()> view);

  // The state log (docs/reliability.md): the job's part of the master's
  // state (no events: EventsFrom), and a restarted master taking it up
  // (returns the master's restarts so far, this one included).
  void Save(proto::MasterState* st) const ABSL_LOCKS_EXCLUDED(mu_);
  uint32_t Restore(const proto::MasterState& st) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct WorkerTotals {
    uint64_t steps = 0, samples = 0;
    double busy = 0, comm = 0, samples_per_sec = 0, loss = 0, accuracy = 0;
  };
  WorkerTotals WorkerProgressLocked(const proto::ClusterView& view, proto::JobStatus* js) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LedgerLocked(const proto::ClusterView& view, proto::JobSummary* s) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool HistoryDue(bool force) const ABSL_LOCKS_EXCLUDED(mu_);
  bool ReadyToEvaluateLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddHistory(const proto::JobStatus& js) ABSL_LOCKS_EXCLUDED(mu_);

  const Options options_;
  Clock* const clock_;

  mutable absl::Mutex mu_;
  proto::JobState state_ ABSL_GUARDED_BY(mu_) = proto::JOB_WAITING;
  std::string message_ ABSL_GUARDED_BY(mu_);
  absl::Time start_time_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time end_time_ ABSL_GUARDED_BY(mu_);
  absl::Time train_end_time_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  uint32_t evaluator_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t evaluating_ ABSL_GUARDED_BY(mu_) = 0;      // EvaluationStarted
  std::set<uint32_t> declined_ ABSL_GUARDED_BY(mu_);  // DeclineEvaluation
  uint64_t max_last_step_ ABSL_GUARDED_BY(mu_) = 0;
  bool has_accuracy_ ABSL_GUARDED_BY(mu_) = false;
  double test_accuracy_ ABSL_GUARDED_BY(mu_) = 0;
  double test_loss_ ABSL_GUARDED_BY(mu_) = 0;
  bool has_auc_ ABSL_GUARDED_BY(mu_) = false;
  double test_auc_ ABSL_GUARDED_BY(mu_) = 0;
  // Each worker's last progress report, by node id.
  std::map<uint32_t, proto::ReportProgressRequest> workers_ ABSL_GUARDED_BY(mu_);
  // Each pserver's (pushes taken in, seconds), from its last heartbeat.
  std::map<uint32_t, std::pair<uint64_t, double>> pserver_applies_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> events_ ABSL_GUARDED_BY(mu_);
  // The job's progress over time, for the status page's charts: at most
  // kMaxHistory points; when full, every other one is dropped and the
  // interval doubles. Not persisted: a restarted master starts anew.
  std::vector<proto::JobSample> history_ ABSL_GUARDED_BY(mu_);
  absl::Duration history_interval_ ABSL_GUARDED_BY(mu_) = absl::Milliseconds(500);
  absl::Time last_sample_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool ledger_taken_ ABSL_GUARDED_BY(mu_) = false;
  std::map<uint32_t, std::map<uint32_t, uint64_t>> ledger_applied_ ABSL_GUARDED_BY(mu_);
  uint64_t resumed_from_seq_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t samples_base_ ABSL_GUARDED_BY(mu_) = 0;  // trained before the resume
  uint32_t restarts_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace strata::master

#endif  // STRATA_MASTER_JOB_TRACKER_H_
