#include "master/task_scheduler.h"

#include <algorithm>
#include <climits>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/data_tasks.h"
#include "common/error_reason.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "storage/criteo_reader.h"
#include "storage/idx_reader.h"

namespace strata::master {

TaskScheduler::TaskScheduler(int64_t num_records, int64_t task_records, int epochs, uint64_t seed,
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

TaskScheduler::TaskScheduler(const ByteSplit& split, int epochs, uint64_t seed,
                             absl::Duration lease_timeout)
    : lease_timeout_(lease_timeout), epochs_(epochs) {
  const double per = split.bytes_per_record > 0 ? split.bytes_per_record : 1;
  auto estimate = [per](int64_t byte) { return static_cast<int64_t>(std::llround(byte / per)); };
  for (int e = 0; e < epochs; ++e) {
    for (const auto& [b, end] :
         EpochTaskRanges(split.file_bytes, std::max<int64_t>(split.task_bytes, 1), seed, e)) {
      proto::DataTask t;
      t.set_id(tasks_.size());
      t.set_epoch(e);
      t.set_by_bytes(true);
      t.set_byte_begin(b);
      t.set_byte_end(end);
      t.set_begin(estimate(b));
      t.set_end(estimate(end));
      queue_.push_back(t.id());
      tasks_.push_back(std::move(t));
    }
  }
  completed_.assign(tasks_.size(), false);
}

int64_t TaskScheduler::RecordsOf(uint64_t id) const {
  if (id >= tasks_.size()) return 0;
  auto it = reported_records_.find(id);
  if (it != reported_records_.end()) return it->second;
  return tasks_[id].end() - tasks_[id].begin();
}

std::optional<proto::DataTask> TaskScheduler::Lease(uint32_t node, absl::Time now,
                                                    std::optional<uint64_t> first_step,
                                                    int batch_size) {
  if (queue_.empty()) return std::nullopt;
  uint64_t id = queue_.front();
  queue_.pop_front();
  leases_[id] = LeaseInfo{node, now + lease_timeout_};
  Touched(id);
  if (first_step.has_value()) {
    first_step_[id] = *first_step;
  } else {
    first_step_.erase(id);
  }
  if (batch_size > 0) {
    batch_[id] = batch_size;
  } else {
    batch_.erase(id);
  }
  return tasks_[id];
}

int TaskScheduler::BatchOf(uint64_t id) const {
  auto it = batch_.find(id);
  return it == batch_.end() ? 0 : it->second;
}

std::optional<proto::DataTask> TaskScheduler::Held(uint32_t node, absl::Time now,
                                                   std::optional<uint64_t> first_step) {
  for (auto& [id, lease] : leases_) {
    if (lease.node != node) continue;
    lease.expires = now + lease_timeout_;
    if (first_step.has_value()) {
      first_step_[id] = *first_step;
    } else {
      first_step_.erase(id);
    }
    return tasks_[id];
  }
  return std::nullopt;
}

absl::Status TaskScheduler::Complete(uint32_t node, uint64_t task_id, uint64_t last_step,
                                     std::optional<int64_t> records) {
  if (task_id >= tasks_.size()) {
    return absl::NotFoundError(absl::StrCat("unknown data task ", task_id));
  }
  if (completed_[task_id]) return absl::OkStatus();
  auto it = leases_.find(task_id);
  if (it == leases_.end() || it->second.node != node) {
    return WithReason(
        absl::FailedPreconditionError(absl::StrCat("data task ", task_id, " is not leased to node ",
                                                   node, " (its lease expired or was released)")),
        proto::REASON_LEASE_LOST);
  }
  leases_.erase(it);
  Touched(task_id);
  completed_[task_id] = true;
  Completed(task_id);
  last_step_[task_id] = last_step;
  if (records.has_value() && *records >= 0 && tasks_[task_id].by_bytes()) {
    reported_records_[task_id] = *records;
  }
  ++done_;
  return absl::OkStatus();
}

void TaskScheduler::SetFirstStep(uint32_t node, uint64_t task_id, uint64_t first_step) {
  auto it = leases_.find(task_id);
  if (it != leases_.end() && it->second.node == node) first_step_[task_id] = first_step;
}

TaskScheduler::Cut TaskScheduler::CutAt(std::optional<uint64_t> step, int batch_size) const {
  Cut cut;
  for (size_t id = 0; id < tasks_.size(); ++id) {
    const bool completed = completed_[id];
    if (!step.has_value()) {
      if (completed) cut.done.push_back(id);
      continue;
    }
    auto last = last_step_.find(id);
    if (completed && (last == last_step_.end() || last->second < *step)) {
      cut.done.push_back(id);
      continue;
    }
    // Leased now, or completed after the cut: its batches before the cut
    // are in the parameters. (A task released since, by a worker that
    // died, is trained again whole: how far it got is not known.)
    auto first = first_step_.find(id);
    if ((completed || leases_.count(id) > 0) && first != first_step_.end() &&
        first->second < *step) {
      const proto::DataTask& t = tasks_[id];
      const auto batch = batch_.find(id);
      const int64_t trained =
          t.skip_records() + static_cast<int64_t>(*step - first->second) *
                                 (batch != batch_.end() ? batch->second : batch_size);
      // A task cut by bytes has a known size only once completed: until
      // then it stays partial (its worker skips what was trained).
      const auto reported = reported_records_.find(id);
      const int64_t size = !t.by_bytes()                         ? t.end() - t.begin()
                           : reported != reported_records_.end() ? reported->second
                                                                 : INT64_MAX;
      if (trained >= size) {
        cut.done.push_back(id);
      } else {
        cut.partial.emplace_back(id, trained);
      }
    }
  }
  return cut;
}

void TaskScheduler::Save(proto::MasterState* st, bool whole) const {
  st->set_tasks_requeued(requeued_);
  st->set_records_requeued(records_requeued_);
  if (!whole) return;
  for (uint64_t id : DoneIds()) st->add_tasks_done(id);
  for (const auto& [id, lease] : leases_) (*st->mutable_task_leases())[id] = lease.node;
}

proto::MasterState TaskScheduler::TakeChangeRecord() {
  const Changes changes = TakeChanges();
  proto::MasterState r;
  for (uint64_t id : changes.done) r.add_tasks_done(id);
  for (const auto& [id, node] : changes.leased) (*r.mutable_task_leases())[id] = node;
  for (uint64_t id : changes.ended) r.add_leases_ended(id);
  return r;
}

absl::Status TaskScheduler::Restore(const proto::MasterState& st,
                                    const std::function<bool(uint32_t)>& in_job, absl::Time now) {
  absl::Status s =
      Resume(std::vector<uint64_t>(st.tasks_done().begin(), st.tasks_done().end()), {});
  std::map<uint64_t, uint32_t> leases;
  for (const auto& [id, node] : st.task_leases()) {
    if (in_job(node)) leases[id] = node;
  }
  RestoreLeases(leases, now);
  requeued_ = st.tasks_requeued();
  records_requeued_ = st.records_requeued();
  return s;
}

void TaskScheduler::FillStatus(proto::JobStatus* js) const {
  js->set_epoch(current_epoch());
  js->set_tasks_total(total());
  js->set_tasks_done(done());
  js->set_tasks_requeued(requeued());
}

void TaskScheduler::FillManifest(std::optional<uint64_t> step, int batch_size,
                                 proto::CheckpointManifest* m) const {
  const Cut cut = CutAt(step, batch_size);
  uint64_t samples = 0;
  for (uint64_t id : cut.done) {
    m->add_tasks_done(id);
    samples += RecordsOf(id);
  }
  for (const auto& [id, records] : cut.partial) {
    proto::CheckpointTask* t = m->add_tasks_partial();
    t->set_id(id);
    t->set_trained_records(records);
    samples += records;
  }
  m->set_samples(samples);
}

absl::Status TaskScheduler::ResumeFrom(const proto::CheckpointManifest& m) {
  std::vector<std::pair<uint64_t, int64_t>> partial;
  for (const auto& t : m.tasks_partial()) partial.emplace_back(t.id(), t.trained_records());
  return Resume(std::vector<uint64_t>(m.tasks_done().begin(), m.tasks_done().end()), partial);
}

absl::Status TaskScheduler::Resume(const std::vector<uint64_t>& done,
                                   const std::vector<std::pair<uint64_t, int64_t>>& partial) {
  for (uint64_t id : done) {
    if (id >= tasks_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("data task ", id, " is not one of the ",
                                                     tasks_.size(), " tasks of this job"));
    }
    if (!completed_[id]) {
      completed_[id] = true;
      Completed(id);
      ++done_;
    }
  }
  for (const auto& [id, records] : partial) {
    if (id >= tasks_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("data task ", id, " is not one of the ",
                                                     tasks_.size(), " tasks of this job"));
    }
    proto::DataTask& t = tasks_[id];
    if (t.by_bytes()) {  // its size is not known here: the worker skips
      t.set_skip_records(std::max<int64_t>(records, 0));
      continue;
    }
    if (records >= t.end() - t.begin() && !completed_[id]) {
      completed_[id] = true;
      Completed(id);
      ++done_;
    }
    t.set_skip_records(std::clamp<int64_t>(records, 0, t.end() - t.begin()));
  }
  std::deque<uint64_t> queue;
  for (uint64_t id : queue_) {
    if (!completed_[id]) queue.push_back(id);
  }
  queue_.swap(queue);
  return absl::OkStatus();
}

void TaskScheduler::RenewLeases(uint32_t node, absl::Time now) {
  for (auto& [id, lease] : leases_) {
    if (lease.node == node) lease.expires = now + lease_timeout_;
  }
}

std::map<uint64_t, uint32_t> TaskScheduler::Leases() const {
  std::map<uint64_t, uint32_t> out;
  for (const auto& [id, lease] : leases_) out[id] = lease.node;
  return out;
}

void TaskScheduler::RestoreLeases(const std::map<uint64_t, uint32_t>& leases, absl::Time now) {
  for (const auto& [id, node] : leases) {
    if (id >= tasks_.size() || completed_[id]) continue;
    auto it = std::find(queue_.begin(), queue_.end(), id);
    if (it != queue_.end()) queue_.erase(it);
    leases_[id] = LeaseInfo{node, now + lease_timeout_};
    Touched(id);
  }
}

std::vector<uint64_t> TaskScheduler::DoneIds() const {
  std::vector<uint64_t> ids;
  for (size_t i = 0; i < tasks_.size(); ++i) {
    if (completed_[i]) ids.push_back(i);
  }
  return ids;
}

int64_t TaskScheduler::RecordsDone() const {
  int64_t n = 0;
  for (size_t i = 0; i < tasks_.size(); ++i) {
    if (completed_[i]) n += RecordsOf(i);
  }
  return n;
}

int TaskScheduler::RequeueLeases(const std::function<bool(const LeaseInfo&)>& which,
                                 std::vector<uint64_t>* ids) {
  int n = 0;
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (which(it->second)) {
      if (ids != nullptr) ids->push_back(it->first);
      queue_.push_front(it->first);
      Touched(it->first);
      it = leases_.erase(it);
      ++n;
    } else {
      ++it;
    }
  }
  return n;
}

int TaskScheduler::ReleaseNode(uint32_t node) {
  std::vector<uint64_t> ids;
  const int n = RequeueLeases([node](const LeaseInfo& l) { return l.node == node; }, &ids);
  requeued_ += static_cast<uint64_t>(n);
  for (uint64_t id : ids) records_requeued_ += RecordsOf(id);
  return n;
}

int TaskScheduler::ExpireLeases(absl::Time now) {
  return RequeueLeases([now](const LeaseInfo& l) { return l.expires <= now; }, nullptr);
}

TaskScheduler::Changes TaskScheduler::TakeChanges() {
  Changes c;
  c.done.swap(done_since_);
  for (uint64_t id : leases_touched_) {
    auto it = leases_.find(id);
    if (it != leases_.end()) {
      c.leased[id] = it->second.node;
    } else {
      c.ended.push_back(id);
    }
  }
  leases_touched_.clear();
  return c;
}

int TaskScheduler::current_epoch() const {
  for (size_t i = 0; i < tasks_.size(); ++i) {
    if (!completed_[i]) return tasks_[i].epoch();
  }
  return epochs_;
}

absl::StatusOr<TrainingSetSize> SizeTrainingSet(storage::FileSystem* fs, const DataSection& data,
                                                bool by_records) {
  int64_t n = 0;
  std::optional<TaskScheduler::ByteSplit> split;
  if (data.format == "criteo") {
    // Records are lines. A plain-text file is cut into byte ranges from its
    // size alone (each task is the lines starting in its range; a worker
    // reads just that): only its first MiB is read here, to check it and
    // to estimate the record count. A gzipped one cannot be cut so, nor
    // can the first data.train_limit records be found without counting:
    // then the lines are counted, not parsed (a worker's bad-line policy
    // may skip some; their tasks are then a little shorter).
    storage::CriteoReadOptions read;
    read.bad_lines =
        data.bad_lines == "skip" ? storage::BadLinePolicy::kSkip : storage::BadLinePolicy::kFail;
    STRATA_ASSIGN_OR_RETURN(storage::CriteoTextShape shape,
                            storage::ProbeCriteoFile(fs, data.train, read));
    if (shape.gzipped || data.train_limit > 0 || by_records) {
      STRATA_ASSIGN_OR_RETURN(n, storage::CountCriteoLines(fs, data.train));
      if (n == 0) return absl::InvalidArgumentError(absl::StrCat(data.train, ": no records"));
    } else {
      split = TaskScheduler::ByteSplit{
          static_cast<int64_t>(shape.file_bytes),
          std::max<int64_t>(1, std::llround(data.task_records * shape.bytes_per_record)),
          shape.bytes_per_record};
      n = std::max<int64_t>(1, std::llround(shape.file_bytes / shape.bytes_per_record));
      LOG(INFO) << data.train << ": " << shape.file_bytes << " bytes, about " << n << " records ("
                << absl::StrFormat("%.1f", shape.bytes_per_record) << " bytes each in its first "
                << shape.sample_bytes << " bytes); cut into data tasks of " << split->task_bytes
                << " bytes";
    }
  } else {
    // The training-set size from the files' headers and sizes: nothing is
    // read whole here (the data may be on a shared file system or in an
    // object store; the workers read it).
    STRATA_ASSIGN_OR_RETURN(std::vector<uint32_t> labels,
                            storage::ReadIdxShape(fs, data.train_labels));
    if (labels.size() != 1 || labels[0] == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(data.train_labels, ": expected a non-empty 1-d label file"));
    }
    STRATA_ASSIGN_OR_RETURN(std::vector<uint32_t> images,
                            storage::ReadIdxShape(fs, data.train_images));
    if (images.empty() || images[0] != labels[0]) {
      return absl::InvalidArgumentError(
          absl::StrCat(data.train_images, " has ", images.empty() ? 0 : images[0], " examples but ",
                       data.train_labels, " has ", labels[0], " labels"));
    }
    n = labels[0];
  }
  if (data.train_limit > 0) n = std::min<int64_t>(n, data.train_limit);
  return TrainingSetSize{n, split};
}

TaskScheduler JobTasks(const TrainingSetSize& size, const JobConfig& config) {
  const absl::Duration lease = absl::Milliseconds(config.cluster.task_lease_timeout_ms);
  if (size.split.has_value()) {
    return TaskScheduler(*size.split, config.job.epochs, config.job.seed, lease);
  }
  return TaskScheduler(size.records, config.data.task_records, config.job.epochs, config.job.seed,
                       lease);
}

}  // namespace strata::master
