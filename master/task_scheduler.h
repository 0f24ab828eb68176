// Data tasks: record ranges of the training set, one list per training epoch,
// leased to workers with a timeout.
#ifndef STRATA_MASTER_TASK_SCHEDULER_H_
#define STRATA_MASTER_TASK_SCHEDULER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/config.h"
#include "proto/checkpoint.pb.h"
#include "proto/strata.pb.h"
#include "storage/file_system.h"

namespace strata::master {

// Not thread-safe: the master guards it with its own mutex.
class TaskScheduler {
 public:
  // Tasks of `task_records` records over [0, num_records), for `epochs`
  // passes, in the order of EpochTaskRanges (common/data_tasks.h).
  TaskScheduler(int64_t num_records, int64_t task_records, int epochs, uint64_t seed,
                absl::Duration lease_timeout);
  // A text training set cut by bytes (DataTask.by_bytes): tasks of
  // `task_bytes` over [0, file_bytes), in the order of EpochTaskRanges;
  // their record ranges are estimates at `bytes_per_record`.
  struct ByteSplit {
    int64_t file_bytes = 0;
    int64_t task_bytes = 0;
    double bytes_per_record = 0;
  };
  TaskScheduler(const ByteSplit& split, int epochs, uint64_t seed, absl::Duration lease_timeout);

  // The next pending task, leased to `node` until now + lease_timeout;
  // nullopt when none is pending (some may still be leased). `first_step`:
  // the step (bsp version) of the task's first batch, when known;
  // `batch_size`: the records of each of its steps (0: the job's
  // job.batch_size, as CutAt is told).
  std::optional<proto::DataTask> Lease(uint32_t node, absl::Time now,
                                       std::optional<uint64_t> first_step = std::nullopt,
                                       int batch_size = 0);
  // The task leased to `node` (the first, should it hold several), its
  // lease renewed to now + lease_timeout and its first step set as Lease
  // does; nullopt when it holds none.
  std::optional<proto::DataTask> Held(uint32_t node, absl::Time now,
                                      std::optional<uint64_t> first_step = std::nullopt);
  // The batch Lease gave task `id` (0: none given, or it is not leased).
  int BatchOf(uint64_t id) const;
  // NotFound for an unknown task; FailedPrecondition when the task is not
  // leased to `node` (its lease expired and went elsewhere). Completing a
  // completed task again is OK (idempotent). `last_step`: the step of its
  // last batch. `records`: how many the task had, when the worker says (a
  // task cut by bytes; otherwise its range tells).
  absl::Status Complete(uint32_t node, uint64_t task_id, uint64_t last_step = 0,
                        std::optional<int64_t> records = std::nullopt);
  // Extends all of `node`'s leases to now + lease_timeout (the node is alive).
  void RenewLeases(uint32_t node, absl::Time now);
  // Returns all of `node`'s leases to the front of the queue (the node
  // left the job); their count. Counted in requeued() and
  // records_requeued().
  int ReleaseNode(uint32_t node);
  // Tasks of departed nodes leased again (ReleaseNode), and their records.
  uint64_t requeued() const { return requeued_; }
  int64_t records_requeued() const { return records_requeued_; }
  // Records of all the completed tasks.
  int64_t RecordsDone() const;
  // Ids of the completed tasks, ascending.
  std::vector<uint64_t> DoneIds() const;
  // Leased tasks and their holders; and taking them up again (a restarted
  // master), each until now + lease_timeout. Unknown or completed tasks
  // are skipped.
  std::map<uint64_t, uint32_t> Leases() const;
  void RestoreLeases(const std::map<uint64_t, uint32_t>& leases, absl::Time now);
  // Returns expired leases to the queue; their count.
  int ExpireLeases(absl::Time now);

  // What changed since the last call (for the state log's records of
  // changes, master/state_log.h): tasks completed, leases given (task ->
  // node, the holder now), leases ended (completed or taken back). O(what
  // changed), not O(tasks).
  struct Changes {
    std::vector<uint64_t> done;
    std::map<uint64_t, uint32_t> leased;
    std::vector<uint64_t> ended;
    bool empty() const { return done.empty() && leased.empty() && ended.empty(); }
  };
  Changes TakeChanges();
  // The state log's part of the master's state (docs/reliability.md): the
  // requeue counts, and with `whole` the tasks done and the leases (O(tasks));
  // TakeChanges as a record of changes (tasks_done, task_leases,
  // leases_ended); and a restarted master taking it up, the leases of the
  // nodes still in the job (`in_job`) kept until now + lease_timeout, the
  // others' tasks back in the queue. Restore's error names what of the
  // state is not this job's (the rest is taken up).
  void Save(proto::MasterState* st, bool whole) const;
  proto::MasterState TakeChangeRecord();
  absl::Status Restore(const proto::MasterState& st, const std::function<bool(uint32_t)>& in_job,
                       absl::Time now);
  // Changes are kept for TakeChanges from now on (not before: a master
  // without a state log would only pile them up).
  void TrackChanges() { track_changes_ = true; }

  bool AllDone() const { return done_ == tasks_.size(); }
  uint64_t total() const { return tasks_.size(); }
  uint64_t done() const { return done_; }
  uint64_t pending() const { return queue_.size(); }
  uint64_t leased() const { return leases_.size(); }
  // Records of task `id` (0 for an unknown one): as its worker reported,
  // for a completed task cut by bytes; else from its range (an estimate
  // for a task cut by bytes).
  int64_t RecordsOf(uint64_t id) const;
  // A worker says where a task it holds started (its first batch's step),
  // when its lease could not (the worker's first task). Ignored for a task
  // not leased to `node`.
  void SetFirstStep(uint32_t node, uint64_t task_id, uint64_t first_step);
  // Lowest epoch that still has unfinished tasks (epochs when all done).
  int current_epoch() const;
  // Its part of JobStatus: the epoch, the tasks done of all, requeued.
  void FillStatus(proto::JobStatus* js) const;

  // Checkpoints. The tasks whose records are all in the parameters at the
  // bsp cut `step` (every step < `step` applied), and those partly in
  // them with how many of their records (the batch their lease gave per
  // step from their first step, else `batch_size`). With no cut (asp), the tasks completed now.
  struct Cut {
    std::vector<uint64_t> done;
    std::vector<std::pair<uint64_t, int64_t>> partial;  // (task, records trained)
  };
  Cut CutAt(std::optional<uint64_t> step, int batch_size) const;
  // A checkpoint manifest's part: CutAt's tasks, and the samples in the
  // parameters at the cut (the records of the tasks done and of the parts
  // trained).
  void FillManifest(std::optional<uint64_t> step, int batch_size,
                    proto::CheckpointManifest* m) const;
  // Resumes from a checkpoint's cut: `done` tasks are finished, `partial`
  // ones skip their first records when leased. InvalidArgument for a task
  // id this job does not have.
  absl::Status Resume(const std::vector<uint64_t>& done,
                      const std::vector<std::pair<uint64_t, int64_t>>& partial);
  // Resume from what FillManifest put in a checkpoint's manifest.
  absl::Status ResumeFrom(const proto::CheckpointManifest& m);

 private:
  struct LeaseInfo {
    uint32_t node;
    absl::Time expires;
  };
  // Puts the tasks of the leases `which` picks back at the front of the
  // queue (their ids appended to *ids when given); how many.
  int RequeueLeases(const std::function<bool(const LeaseInfo&)>& which, std::vector<uint64_t>* ids);
  absl::Duration lease_timeout_;
  int epochs_;
  std::vector<proto::DataTask> tasks_;  // index == task id
  std::vector<bool> completed_;
  // Steps of each task's first and last batch, when known (for cuts).
  std::map<uint64_t, uint64_t> first_step_;
  std::map<uint64_t, uint64_t> last_step_;
  // The batch of each task leased with one (elastic.batch; for cuts).
  std::map<uint64_t, int> batch_;
  // Records of completed tasks cut by bytes, as their workers reported.
  std::map<uint64_t, int64_t> reported_records_;
  std::deque<uint64_t> queue_;  // pending task ids
  std::map<uint64_t, LeaseInfo> leases_;
  uint64_t done_ = 0;
  uint64_t requeued_ = 0;
  int64_t records_requeued_ = 0;
  // Since the last TakeChanges: tasks completed, and tasks whose lease
  // was given or ended.
  bool track_changes_ = false;
  std::vector<uint64_t> done_since_;
  std::set<uint64_t> leases_touched_;
  void Touched(uint64_t id) {
    if (track_changes_) leases_touched_.insert(id);
  }
  void Completed(uint64_t id) {
    if (track_changes_) done_since_.push_back(id);
  }
};

// The training set's size in records, and (a plain-text CTR file) its cut
// by bytes: from the files' headers and sizes (of a CTR text file, its
// first MiB), never read whole — the data may be on a shared file system or
// in an object store, and the workers read it. A gzipped CTR file, one
// with data.train_limit, or one read by a training script (by_records: it
// indexes records, not bytes) has its lines counted. Errors name the file.
struct TrainingSetSize {
  int64_t records = 0;
  std::optional<TaskScheduler::ByteSplit> split;
};
absl::StatusOr<TrainingSetSize> SizeTrainingSet(storage::FileSystem* fs, const DataSection& data,
                                                bool by_records = false);
// The data tasks of a job over a training set of `size`: by records
// (data.task_records each) or by bytes (size.split), for job.epochs,
// shuffled by job.seed, leased for cluster.task_lease_timeout_ms.
TaskScheduler JobTasks(const TrainingSetSize& size, const JobConfig& config);

}  // namespace strata::master

#endif  // STRATA_MASTER_TASK_SCHEDULER_H_
