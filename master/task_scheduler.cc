#include "master/task_scheduler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/data_tasks.h"

namespace strata::master {

TaskScheduler::TaskScheduler(int64_t num_records, int64_t task_records,
                             int epochs, uint64_t seed,
                             absl::Duration lease_timeout)
    : lease_timeout_(lease_timeout), epochs_(epochs) {
  for (int e = 0; e < epochs; ++e) {
    for (const auto& [b, end] : EpochTaskRanges(num_records, task_records, seed, e)) {
      proto::DataTask t;
      t.set_id(tasks_.size());
      t.set_epoch(e);
      t.set_begin(b);
      t.set_end(end);
      queue_.push_back(t.id());
      tasks_.push_back(std::move(t));
    }
  }
  completed_.assign(tasks_.size(), false);
}

std::optional<proto::DataTask> TaskScheduler::Lease(uint32_t node,
                                                    absl::Time now) {
  if (queue_.empty()) return std::nullopt;
  uint64_t id = queue_.front();
  queue_.pop_front();
  leases_[id] = LeaseInfo{node, now + lease_timeout_};
  return tasks_[id];
}

absl::Status TaskScheduler::Complete(uint32_t node, uint64_t task_id) {
  if (task_id >= tasks_.size()) {
    return absl::NotFoundError(absl::StrCat("unknown data task ", task_id));
  }
  if (completed_[task_id]) return absl::OkStatus();
  auto it = leases_.find(task_id);
  if (it == leases_.end() || it->second.node != node) {
    return absl::FailedPreconditionError(absl::StrCat(
        "data task ", task_id, " is not leased to node ", node,
        " (its lease expired or was released)"));
  }
  leases_.erase(it);
  completed_[task_id] = true;
  ++done_;
  return absl::OkStatus();
}

void TaskScheduler::RenewLeases(uint32_t node, absl::Time now) {
  for (auto& [id, lease] : leases_) {
    if (lease.node == node) lease.expires = now + lease_timeout_;
  }
}

int TaskScheduler::ReleaseNode(uint32_t node) {
  int n = 0;
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.node == node) {
      queue_.push_front(it->first);
      it = leases_.erase(it);
      ++n;
    } else {
      ++it;
    }
  }
  return n;
}

int TaskScheduler::ExpireLeases(absl::Time now) {
  int n = 0;
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.expires <= now) {
      queue_.push_front(it->first);
      it = leases_.erase(it);
      ++n;
    } else {
      ++it;
    }
  }
  return n;
}

int TaskScheduler::current_epoch() const {
  for (size_t i = 0; i < tasks_.size(); ++i) {
    if (!completed_[i]) return tasks_[i].epoch();
  }
  return epochs_;
}

}  // namespace strata::master
