// The checkpoint coordinator (docs/checkpoint-format.md): when to take a
// checkpoint (every N steps, every N seconds, the final one, on request),
// the bsp cut, the pservers' calls that write each partition's files, the
// manifest that makes them one checkpoint, retention; and finding and
// checking the checkpoint a job resumes from.
//
// What it owns, under its lock mu_: the next sequence number; the last
// complete manifest (the base of the next incremental checkpoint, and what
// a lost partition is restored from); the counts, sizes and times of this
// run's checkpoints; when the next one is due; the final checkpoint's
// state; the progress of the one being written. run_mu_ is held across a
// whole checkpoint (one at a time); inflight_mu_ guards the pserver calls
// that a bsp checkpoint cancels when training ends before its cut.
//
// Lock order: run_mu_ → the master's lock (MasterServer::mu_) → mu_ →
// inflight_mu_. The coordinator calls the rest of the master (its Master)
// holding run_mu_ at most, and the master calls the coordinator under its
// own lock: mu_ is held only inside the coordinator's own methods.
#ifndef STRATA_MASTER_CHECKPOINT_COORDINATOR_H_
#define STRATA_MASTER_CHECKPOINT_COORDINATOR_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/failpoint.h"
#include "common/metrics.h"
#include "grpcpp/grpcpp.h"
#include "master/event_sink.h"
#include "master/pserver_calls.h"
#include "proto/checkpoint.pb.h"
#include "proto/strata.grpc.pb.h"
#include "storage/file_system.h"

namespace strata::master {

// A checkpoint a job resumes from: the checkpoint root it is under, and
// its manifest.
struct ResumePoint {
  std::string root;
  proto::CheckpointManifest manifest;
};
// The checkpoint to resume from (`resume`: "latest", the newest good one
// under checkpoint.dir; or a checkpoint directory; "" = none), checked
// against `config`; nullopt when there is none to resume from. Errors name
// the checkpoint file and what is wrong with it.
absl::StatusOr<std::optional<ResumePoint>> FindResumeCheckpoint(const JobConfig& config,
                                                                storage::FileSystem* fs,
                                                                const std::string& resume);

// Where a starting master's checkpoints stand: the checkpoint it resumes
// from (a restarted master, `restarted`: its own last one, with checkpoints
// on; a fresh one: `resume`'s, as FindResumeCheckpoint), and the seq of
// its next one (after every directory under checkpoint.dir, complete or
// not).
struct CheckpointStart {
  std::optional<ResumePoint> resumed;
  uint64_t next_seq = 1;
};
absl::StatusOr<CheckpointStart> FindCheckpointStart(const JobConfig& config,
                                                    storage::FileSystem* fs,
                                                    const std::string& resume, bool restarted);

// Thread-safe.
class CheckpointCoordinator {
 public:
  // What the coordinator needs of the rest of the master. Called holding
  // none of the coordinator's locks but run_mu_.
  class Master {
   public:
    virtual ~Master() = default;
    struct Cluster {
      // A checkpoint can be taken: the partitions placed, the cluster
      // ready, the job not ended; else why not, in a few words.
      bool ready = false;
      std::string why_not;
      bool running = false;        // the job trains (JOB_RUNNING)
      bool training_over = false;  // every data task done (JOB_EVALUATING)
      // The evaluator is chosen (JobTracker::evaluator): it steps no dense
      // allreduce ring, nor, once it says so, do the others.
      bool evaluating = false;
      proto::ClusterView view;            // with_view only
      std::vector<PServerTarget> owners;  // the pservers owning partitions
    };
    // `with_view`: the view too (a checkpoint's manifest needs it; the
    // checkpoint thread's frequent turns do not).
    virtual Cluster CheckpointCluster(bool with_view) = 0;
    // The data tasks and samples in the parameters at the cut
    // (`cut_step`; none: asp), and the next node id, into `m`.
    virtual void FillManifestTasks(std::optional<uint64_t> cut_step,
                                   proto::CheckpointManifest* m) = 0;
    // Checkpoint `seq`, asked for with a stop, is complete: stop the job.
    virtual void StopAfterCheckpoint(uint64_t seq, const std::string& reason) = 0;
    // The final checkpoint is done (or failed): the job may evaluate.
    virtual void FinalCheckpointDone() = 0;
  };

  struct Options {
    JobConfig config;                        // its checkpoint section, job and model
    storage::FileSystem* fs = nullptr;       // borrowed, required
    Clock* clock = nullptr;                  // borrowed, required
    EventSink* sink = nullptr;               // borrowed, required
    const Failpoints* failpoints = nullptr;  // borrowed, may be null
  };
  CheckpointCoordinator(Options options, Master* master);
  ~CheckpointCoordinator();
  CheckpointCoordinator(const CheckpointCoordinator&) = delete;
  CheckpointCoordinator& operator=(const CheckpointCoordinator&) = delete;

  // Starts the thread that takes the checkpoints the config asks for
  // (when checkpoints are on). Shutdown stops it, and a checkpoint
  // waiting on pservers gives up. Idempotent.
  void Start();
  void Shutdown() ABSL_LOCKS_EXCLUDED(inflight_mu_);
  // The pserver calls of a checkpoint under way are cancelled (it fails;
  // the previous checkpoint stays the latest): a paused master. The
  // checkpoint thread's checkpoint so cancelled is taken again once the
  // master acts again (Tick), the final one included.
  void CancelInflight() ABSL_LOCKS_EXCLUDED(inflight_mu_);

  // Takes a checkpoint now and answers when it is complete: every
  // pserver's files synced, then the manifest. With `stop_after`, the job
  // then stops. FailedPrecondition when checkpoints are off or the job is
  // not running; the failure of any pserver or of the disk otherwise (the
  // previous checkpoint stays the latest).
  absl::StatusOr<proto::CheckpointResponse> Checkpoint(const std::string& reason, bool stop_after)
      ABSL_LOCKS_EXCLUDED(run_mu_, mu_);
  // One turn of the checkpoint thread: asks the pservers the step when
  // checkpoints go by steps, and takes the checkpoint that is due, if one
  // is.
  void Tick() ABSL_LOCKS_EXCLUDED(run_mu_, mu_);
  // Why a checkpoint is due now at step `step` ("steps", "interval",
  // "final"), or "" when none is; `running`: the job trains. A checkpoint
  // a pause cancelled is due again at once, with its own reason.
  std::string Due(uint64_t step, bool running) ABSL_LOCKS_EXCLUDED(mu_);

  // Every data task is done: a bsp checkpoint waiting for its cut sets it
  // again, where training stopped; and the final checkpoint, when the
  // config asks for one, is due before the evaluation.
  void TrainingDone() ABSL_LOCKS_EXCLUDED(mu_, inflight_mu_);
  // The final checkpoint is due or being written.
  bool final_pending() const ABSL_LOCKS_EXCLUDED(mu_);
  // Which checkpoint holds the trained model, in words: the final one's
  // seq, the last one's and why it was taken, or none.
  std::string TrainedModel() const ABSL_LOCKS_EXCLUDED(mu_);
  // Pservers are writing a checkpoint now (calls to them in flight).
  bool writing() const ABSL_LOCKS_EXCLUDED(inflight_mu_) {
    absl::MutexLock l(&inflight_mu_);
    return !inflight_.empty();
  }

  // The checkpoint before a requested stop (`strata stop`): Checkpoint
  // with stop_after; its failure says that the job was not stopped and
  // goes on.
  absl::StatusOr<proto::CheckpointResponse> CheckpointBeforeStop(const std::string& reason)
      ABSL_LOCKS_EXCLUDED(run_mu_, mu_);
  // A preemption notice (SIGTERM on the master): a checkpoint, then the
  // job stopped, within `grace`. False when the checkpoint has not
  // completed by then (it goes on, on a thread of its own). A failed
  // checkpoint is logged and counts as done.
  bool CheckpointAndStopWithin(absl::Duration grace) ABSL_LOCKS_EXCLUDED(run_mu_, mu_);

  // The job resumes from `r`: its partitions are placed from it
  // (PlacePartitions); when it is under this job's checkpoint.dir, the
  // next checkpoints build on it (their chains name its files).
  void Resume(const ResumePoint& r) ABSL_LOCKS_EXCLUDED(mu_);
  // Sends each pserver of `targets` its partitions of `view`
  // (SendPlacement), restored from the checkpoint the job resumes from
  // while there is one (the partitions' chains only; its loading counted
  // for RestorePhase). SendPlacement's errors. Once the master has made
  // the placement its view, RestorePlaced: nothing is left to restore.
  absl::Status PlacePartitions(const proto::ClusterView& view,
                               const std::vector<PServerTarget>& targets) ABSL_LOCKS_EXCLUDED(mu_);
  void RestorePlaced() ABSL_LOCKS_EXCLUDED(mu_);
  // How far the restore at placement is ("" when none is under way), for
  // JobStatus.phase.
  std::string RestorePhase() const ABSL_LOCKS_EXCLUDED(mu_);
  // The last complete checkpoint (of this run or resumed from).
  std::optional<proto::CheckpointManifest> last_manifest() const ABSL_LOCKS_EXCLUDED(mu_);
  void set_next_seq(uint64_t seq) ABSL_LOCKS_EXCLUDED(mu_);

  // The state log: the coordinator's part of the master's state, and a
  // restarted master taking it up (`last`: its last checkpoint, found on
  // disk).
  void Save(proto::MasterState* st) const ABSL_LOCKS_EXCLUDED(mu_);
  void Restore(const proto::MasterState& st, std::optional<ResumePoint> last)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The workers' ring (model.dense_sync allreduce; docs/checkpoint-format.md,
  // "Allreduce tables"): a worker's heartbeat brings the updates its ring
  // has applied and its answers to ring checkpoints; its response carries
  // the ring checkpoint asked for now. Called under the master's lock.
  void RingBeat(uint32_t node, const proto::HeartbeatRequest& req, proto::HeartbeatResponse* resp)
      ABSL_LOCKS_EXCLUDED(mu_);
  // For a registering worker: the allreduce tables of the checkpoint the
  // job resumed from, while the ring has not gone past it.
  std::optional<proto::RingRestore> RingRestore() const ABSL_LOCKS_EXCLUDED(mu_);

  // Its part of JobStatus (the one being written, the counts, the last
  // one) and of the summary (with checkpoints on).
  void FillStatus(proto::JobStatus* js) const ABSL_LOCKS_EXCLUDED(mu_);
  void FillSummary(proto::JobSummary* s) const ABSL_LOCKS_EXCLUDED(mu_);
  // Its metrics: the strata_master_checkpoint_* gauges and histograms.
  void RegisterMetrics(MetricsRegistry* metrics) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // One round of a checkpoint's calls: every target at once. With
  // `trainings_done` (a cut set while training went on: the count of
  // TrainingDone calls when it was read), a call not yet made when
  // training has ended since is Cancelled instead (TrainingDone cancels
  // only the calls already in flight).
  std::vector<absl::StatusOr<proto::CheckpointPartitionsResponse>> CheckpointCalls(
      const std::vector<PServerTarget>& targets, const proto::CheckpointPartitionsRequest& req,
      std::optional<uint64_t> trainings_done) ABSL_LOCKS_EXCLUDED(mu_, inflight_mu_);
  uint64_t trainings_done() const ABSL_LOCKS_EXCLUDED(inflight_mu_) {
    absl::MutexLock l(&inflight_mu_);
    return trainings_done_;
  }
  // Has every target write its partitions of checkpoint req->seq(): again
  // while a pserver is busy with an earlier attempt, and (bsp) with the cut
  // set further ahead when training outran it, or where training stopped
  // when it ended first. The cut chosen is left in *req.
  // `trainings_done`: trainings_done() read before `training_over` was.
  absl::StatusOr<std::vector<proto::CheckpointPartitionsResponse>> WriteCheckpointPartitions(
      const std::vector<PServerTarget>& targets, bool training_over, uint64_t trainings_done,
      proto::CheckpointPartitionsRequest* req, std::vector<proto::RingCheckpointReport>* ring)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Why a ring's checkpoint is refused while the model is evaluated.
  absl::Status NoRingWhileEvaluating() const ABSL_LOCKS_EXCLUDED(mu_);
  // The ring's part of checkpoint `seq` at `cut` updates: asks the
  // workers (RingBeat) and waits for their shards to tile the flat space.
  // OK with the shards; OutOfRange when the ring was past the cut;
  // Cancelled when training ended first (`training_over` false) or the
  // master stops; FailedPrecondition once the evaluator is chosen (the
  // ring steps no more); DeadlineExceeded after checkpoint.timeout_seconds.
  // `give_up`: set when the pservers' part failed (Aborted then).
  absl::StatusOr<std::vector<proto::RingCheckpointReport>> AwaitRing(
      uint64_t seq, uint64_t cut, bool training_over, const std::atomic<bool>* give_up)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The most updates a worker heard from lately reports its ring has
  // applied.
  uint64_t RingUpdatesLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What registering workers restore while the ring has not gone past it:
  // the ring shards of `m` (a checkpoint under `root`), if it has any.
  void SetRingRestoreLocked(const std::string& root, const proto::CheckpointManifest& m)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The manifest's partitions: each one's new file on top of its chain in
  // the last checkpoint (base_seq).
  absl::Status ChainPartitions(const proto::ClusterView& view, uint64_t base_seq,
                               std::map<uint32_t, proto::CheckpointPartition> got,
                               proto::CheckpointManifest* m) const ABSL_LOCKS_EXCLUDED(mu_);
  // Counts checkpoint `m` (its manifest written), says so in the log and
  // the events, and makes it the base of the next.
  void Done(const std::string& reason, const std::string& dir, proto::CheckpointManifest m)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Counts a failed checkpoint (its partial directory `dir` removed).
  absl::Status Failed(uint64_t seq, const std::string& reason, const std::string& dir,
                      const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu_);

  const Options options_;
  const CheckpointSection& cfg_;  // options_.config.checkpoint
  // The floats of the tables the workers' ring keeps (0: none).
  const uint64_t ring_floats_;
  Clock* const clock_;
  Master* const master_;

  absl::Mutex run_mu_ ABSL_ACQUIRED_BEFORE(mu_);  // one checkpoint at a time
  mutable absl::Mutex mu_;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  std::optional<proto::CheckpointManifest> last_manifest_ ABSL_GUARDED_BY(mu_);
  int increments_since_full_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t done_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t failures_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t bytes_total_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t raw_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // of the last one
  uint64_t raw_total_ ABSL_GUARDED_BY(mu_) = 0;  // over this run's
  double max_stall_ ABSL_GUARDED_BY(mu_) = 0;
  double seconds_total_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_time_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  uint64_t next_step_trigger_ ABSL_GUARDED_BY(mu_) = 0;
  bool final_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool final_done_ ABSL_GUARDED_BY(mu_) = false;
  // The checkpoint being written (seq 0: none): pservers done of all, the
  // bytes they wrote, since when.
  struct Progress {
    uint64_t seq = 0;
    int done = 0, total = 0;
    uint64_t bytes = 0;
    absl::Time start;
  };
  Progress progress_ ABSL_GUARDED_BY(mu_);
  // Resume: what the pservers load of the checkpoint the partitions are
  // placed from (its seq and the partitions' chains, under
  // to_place_root_) until they are placed, and the loading (seq 0: not
  // begun).
  std::optional<proto::CheckpointManifest> to_place_ ABSL_GUARDED_BY(mu_);
  std::string to_place_root_ ABSL_GUARDED_BY(mu_);
  Progress restore_ ABSL_GUARDED_BY(mu_);
  // The ring: the checkpoint asked of it now (id 0: none), the answers
  // to it by node, each worker's last report of the ring's updates and
  // when it came, and what a resumed job's workers restore.
  proto::RingCheckpointRequest ring_ask_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, proto::RingCheckpointReport> ring_reports_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, std::pair<uint64_t, absl::Time>> ring_beats_ ABSL_GUARDED_BY(mu_);
  // Its updates a second (over a second or more of heartbeats), for the
  // cut's margin: the ask reaches it a heartbeat or two later.
  double ring_rate_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time ring_rate_since_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  uint64_t ring_rate_base_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t ring_asks_ ABSL_GUARDED_BY(mu_) = 0;  // the last ask's id: seq << 20, + the try
  std::optional<proto::RingRestore> ring_restore_ ABSL_GUARDED_BY(mu_);
  // The pserver calls of a bsp checkpoint waiting for its cut: cancelled
  // when training ends first (the cut is then set again, where training
  // stopped), and those not yet made (trainings_done_). A leaf lock.
  mutable absl::Mutex inflight_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::set<grpc::ClientContext*> inflight_ ABSL_GUARDED_BY(inflight_mu_);
  uint64_t trainings_done_ ABSL_GUARDED_BY(inflight_mu_) = 0;  // TrainingDone calls
  bool stopping_ ABSL_GUARDED_BY(inflight_mu_) = false;
  uint64_t pauses_ ABSL_GUARDED_BY(inflight_mu_) = 0;  // CancelInflight calls
  uint64_t pauses() const ABSL_LOCKS_EXCLUDED(inflight_mu_) {
    absl::MutexLock l(&inflight_mu_);
    return pauses_;
  }
  // The reason of the checkpoint thread's checkpoint a pause cancelled,
  // due again ("" when none).
  std::string again_ ABSL_GUARDED_BY(mu_);
  // Set by RegisterMetrics (null without metrics).
  Histogram* seconds_histogram_ = nullptr;
  Histogram* bytes_histogram_ = nullptr;
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace strata::master

#endif  // STRATA_MASTER_CHECKPOINT_COORDINATOR_H_
