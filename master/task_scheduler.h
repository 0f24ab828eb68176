// Data tasks: record ranges of the training set, one list per training epoch,
// leased to workers with a timeout.
#ifndef STRATA_MASTER_TASK_SCHEDULER_H_
#define STRATA_MASTER_TASK_SCHEDULER_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "proto/strata.pb.h"

namespace strata::master {

// Not thread-safe: the master guards it with its own mutex.
class TaskScheduler {
 public:
  // Tasks of `task_records` records over [0, num_records), for `epochs`
  // passes, in the order of EpochTaskRanges (common/data_tasks.h).
  TaskScheduler(int64_t num_records, int64_t task_records, int epochs,
                uint64_t seed, absl::Duration lease_timeout);

  // The next pending task, leased to `node` until now + lease_timeout;
  // nullopt when none is pending (some may still be leased).
  std::optional<proto::DataTask> Lease(uint32_t node, absl::Time now);
  // NotFound for an unknown task; FailedPrecondition when the task is not
  // leased to `node` (its lease expired and went elsewhere). Completing a
  // completed task again is OK (idempotent).
  absl::Status Complete(uint32_t node, uint64_t task_id);
  // Extends all of `node`'s leases to now + lease_timeout (the node is alive).
  void RenewLeases(uint32_t node, absl::Time now);
  // Returns all of `node`'s leases to the front of the queue; their count.
  int ReleaseNode(uint32_t node);
  // Returns expired leases to the queue; their count.
  int ExpireLeases(absl::Time now);

  bool AllDone() const { return done_ == tasks_.size(); }
  uint64_t total() const { return tasks_.size(); }
  uint64_t done() const { return done_; }
  uint64_t pending() const { return queue_.size(); }
  uint64_t leased() const { return leases_.size(); }
  // Lowest epoch that still has unfinished tasks (epochs when all done).
  int current_epoch() const;

 private:
  struct LeaseInfo {
    uint32_t node;
    absl::Time expires;
  };
  absl::Duration lease_timeout_;
  int epochs_;
  std::vector<proto::DataTask> tasks_;  // index == task id
  std::vector<bool> completed_;
  std::deque<uint64_t> queue_;          // pending task ids
  std::map<uint64_t, LeaseInfo> leases_;
  uint64_t done_ = 0;
};

}  // namespace strata::master

#endif  // STRATA_MASTER_TASK_SCHEDULER_H_
