#include "master/state_log.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/crc32c.h"
#include "common/error_reason.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace strata::master {

absl::StatusOr<std::unique_ptr<StateDirLock>> StateDirLock::Acquire(storage::FileSystem* fs,
                                                                    const std::string& dir) {
  if (absl::Status s = fs->CreateDirs(dir); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("state directory: ", s.message()));
  }
  const std::string path = storage::JoinPath(dir, "LOCK");
  absl::StatusOr<std::unique_ptr<storage::FileLock>> lock = fs->LockFile(path);
  if (absl::IsFailedPrecondition(lock.status())) {
    // The holder wrote its pid into the file.
    const absl::StatusOr<std::string> holder = fs->ReadFile(path);
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": held by another strata-master (pid ",
                     holder.ok() && !holder->empty() ? *holder : "unknown",
                     "); two masters never act on one state directory"));
  }
  if (!lock.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("state directory: ", lock.status().message()));
  }
  return std::unique_ptr<StateDirLock>(new StateDirLock(*std::move(lock)));
}

std::string EncodeStateRecord(const proto::MasterState& state) {
  const std::string bytes = state.SerializeAsString();
  const uint32_t len = static_cast<uint32_t>(bytes.size());
  const uint32_t crc = Crc32c(bytes);
  std::string out(8, '\0');
  std::memcpy(out.data(), &len, 4);
  std::memcpy(out.data() + 4, &crc, 4);
  out += bytes;
  return out;
}

StateRecords DecodeStateRecords(const std::string& path, absl::string_view bytes) {
  StateRecords r;
  size_t off = 0;
  while (off < bytes.size()) {
    if (bytes.size() - off < 8) {
      r.bad = absl::StrCat(path, ": a record header torn at offset ", off);
      break;
    }
    uint32_t len, crc;
    std::memcpy(&len, bytes.data() + off, 4);
    std::memcpy(&crc, bytes.data() + off + 4, 4);
    if (bytes.size() - off - 8 < len) {
      r.bad = absl::StrCat(path, ": the record at offset ", off, " says ", len, " bytes, ",
                           bytes.size() - off - 8, " follow (torn)");
      break;
    }
    const absl::string_view body = bytes.substr(off + 8, len);
    if (Crc32c(body) != crc) {
      r.bad = absl::StrCat(path, ": the record at offset ", off, " fails its crc32c");
      break;
    }
    proto::MasterState s;
    if (!s.ParseFromArray(body.data(), static_cast<int>(body.size()))) {
      r.bad = absl::StrCat(path, ": the record at offset ", off, " does not parse");
      break;
    }
    r.states.push_back(std::move(s));
    off += 8 + len;
  }
  return r;
}

void ApplyStateRecord(proto::MasterState record, proto::MasterState* state) {
  if (!record.delta()) {
    *state = std::move(record);
    return;
  }
  // The record's small fields are whole; the state's tasks, leases and
  // events are carried over (swapped, not copied) and the changes applied.
  proto::MasterState next = std::move(record);
  next.set_delta(false);
  if (!next.has_view()) next.mutable_view()->Swap(state->mutable_view());
  proto::MasterState changes;
  changes.mutable_tasks_done()->Swap(next.mutable_tasks_done());
  changes.mutable_task_leases()->swap(*next.mutable_task_leases());
  changes.mutable_leases_ended()->Swap(next.mutable_leases_ended());
  changes.mutable_events()->Swap(next.mutable_events());
  next.mutable_tasks_done()->Swap(state->mutable_tasks_done());
  next.mutable_task_leases()->swap(*state->mutable_task_leases());
  next.mutable_events()->Swap(state->mutable_events());
  for (uint64_t id : changes.tasks_done()) next.add_tasks_done(id);
  for (uint64_t id : changes.leases_ended()) next.mutable_task_leases()->erase(id);
  for (const auto& [id, node] : changes.task_leases()) (*next.mutable_task_leases())[id] = node;
  for (std::string& e : *changes.mutable_events()) next.add_events(std::move(e));
  *state = std::move(next);
}

absl::StatusOr<proto::MasterState> DecodeSnapshot(const std::string& where, absl::string_view bytes,
                                                  const std::string& afresh) {
  StateRecords r = DecodeStateRecords(where, bytes);
  if (!r.bad.empty() || r.states.size() != 1 || r.states[0].delta()) {
    return absl::DataLossError(absl::StrCat(
        !r.bad.empty()         ? r.bad
        : r.states.size() != 1 ? absl::StrCat(where, ": ", r.states.size(), " records, expected 1")
                               : absl::StrCat(where, ": a record of changes, not a state"),
        "; ", afresh));
  }
  return std::move(r.states[0]);
}

PreparedRecords PrepareRecords(std::vector<proto::MasterState> records, bool broken,
                               uint64_t log_bytes, uint64_t snapshot_bytes, uint64_t min_log_bytes,
                               uint64_t max_record_bytes, uint64_t* seq,
                               proto::MasterState* state) {
  PreparedRecords p;
  p.snapshot = broken;
  p.first_seq = *seq + 1;
  for (proto::MasterState& r : records) {
    r.set_record_seq(++*seq);
    if (!r.delta())
      p.snapshot = true;  // the whole state: the records before it need not be written
    if (!p.snapshot) {
      std::string rec = EncodeStateRecord(r);
      if (rec.size() > max_record_bytes) p.snapshot = true;
      p.bytes += rec.size();
      p.encoded.push_back(std::move(rec));
    }
    ApplyStateRecord(std::move(r), state);
  }
  if (!p.snapshot && log_bytes + p.bytes >= std::max(min_log_bytes, snapshot_bytes)) {
    p.snapshot = true;
  }
  if (p.snapshot) p.encoded.clear();
  return p;
}

void ReplayStateRecords(const std::string& where, std::vector<proto::MasterState> records,
                        std::optional<proto::MasterState>* state) {
  for (proto::MasterState& s : records) {
    const uint64_t seq = state->has_value() ? (*state)->record_seq() : 0;
    if (s.record_seq() <= seq && state->has_value()) continue;  // in the snapshot
    if (s.delta() && (!state->has_value() || s.record_seq() != seq + 1)) {
      // Changes to a state that is not there: the log ends before them.
      LOG(WARNING) << where << ": record " << s.record_seq() << " follows record " << seq
                   << ": the log ends there";
      break;
    }
    if (!state->has_value()) state->emplace();
    ApplyStateRecord(std::move(s), &**state);
  }
}

absl::StatusOr<std::unique_ptr<StateLog>> StateLog::Open(storage::FileSystem* fs,
                                                         const std::string& dir,
                                                         std::optional<proto::MasterState>* state,
                                                         Options options) {
  STRATA_RETURN_IF_ERROR(fs->CreateDirs(dir));
  state->reset();
  const std::string snapshot = storage::JoinPath(dir, "snapshot");
  if (fs->Exists(snapshot)) {
    STRATA_ASSIGN_OR_RETURN(std::string bytes, fs->ReadFile(snapshot));
    // The snapshot is written atomically: a bad one is not a torn write.
    STRATA_ASSIGN_OR_RETURN(*state,
                            DecodeSnapshot(snapshot, bytes,
                                           absl::StrCat("move the state directory ", dir,
                                                        " away to start the master afresh")));
  }
  const std::string log = storage::JoinPath(dir, "log");
  if (fs->Exists(log)) {
    STRATA_ASSIGN_OR_RETURN(std::string bytes, fs->ReadFile(log));
    StateRecords r = DecodeStateRecords(log, bytes);
    if (!r.bad.empty()) {
      LOG(WARNING) << r.bad << ": the log ends there (" << r.states.size()
                   << " good record(s) before it)";
    }
    ReplayStateRecords(log, std::move(r.states), state);
  }
  std::unique_ptr<StateLog> sl(new StateLog(fs, dir, options));
  if (state->has_value()) {
    sl->seq_ = (*state)->record_seq();
    sl->state_ = **state;
    STRATA_RETURN_IF_ERROR(sl->WriteSnapshot());
  }
  STRATA_RETURN_IF_ERROR(sl->StartLog());
  return sl;
}

absl::Status StateLog::WriteSnapshot() {
  const std::string bytes = EncodeStateRecord(state_);
  snapshot_bytes_ = bytes.size();
  return fs_->WriteFileAtomic(storage::JoinPath(dir_, "snapshot"), bytes);
}

absl::Status StateLog::StartLog() {
  if (log_ != nullptr) {
    (void)log_->Close();
    log_.reset();
  }
  // The snapshot is at least as new as everything in the old log (seq):
  // a new, empty one.
  const std::string log = storage::JoinPath(dir_, "log");
  STRATA_ASSIGN_OR_RETURN(log_, fs_->NewWritableFile(log));
  STRATA_RETURN_IF_ERROR(log_->Sync());
  STRATA_RETURN_IF_ERROR(fs_->SyncDir(dir_));
  log_bytes_ = 0;
  return absl::OkStatus();
}

absl::Status StateLog::Append(std::vector<proto::MasterState> records) {
  if (records.empty()) return absl::OkStatus();
  const PreparedRecords p = PrepareRecords(std::move(records), broken_, log_bytes_, snapshot_bytes_,
                                           options_.min_log_bytes, UINT64_MAX, &seq_, &state_);
  absl::Status s;
  if (p.snapshot) {
    s = WriteSnapshot();
    if (s.ok()) s = StartLog();
  } else {
    const std::string log = storage::JoinPath(dir_, "log");
    s = log_ == nullptr ? absl::FailedPreconditionError("no log open")
                        : log_->Append(absl::StrJoin(p.encoded, ""));
    if (s.ok()) s = log_->Sync();
    if (!s.ok()) s = absl::Status(s.code(), absl::StrCat(log, ": ", s.message()));
    if (s.ok()) log_bytes_ += p.bytes;
  }
  broken_ = !s.ok();
  return s;
}

StateRecorder::StateRecorder(std::shared_ptr<StateStore> log)
    : owned_(std::move(log)), log_(owned_.get()) {}

uint64_t StateRecorder::Record(proto::MasterState small, proto::MasterState tasks, size_t events,
                               const std::function<std::vector<std::string>(size_t)>& events_from,
                               const std::function<proto::MasterState()>& whole) {
  if (log_ == nullptr) return 0;
  // What changed since the last record: O(nodes + changes), never O(tasks)
  // (only the first record is the whole state).
  proto::ClusterView record_view;
  record_view.Swap(small.mutable_view());
  small.clear_view();
  std::string view = record_view.SerializeAsString();
  std::string rest = small.SerializeAsString();
  const bool tasks_changed =
      tasks.tasks_done_size() > 0 || tasks.task_leases_size() > 0 || tasks.leases_ended_size() > 0;
  absl::MutexLock l(&persist_mu_);
  const bool changed = record_whole_ || rerecord_ || tasks_changed || events != events_recorded_ ||
                       view != recorded_view_ || rest != recorded_small_;
  if (!changed) return queued_seq_;
  proto::MasterState st;
  if (record_whole_) {
    st = whole();
  } else {
    st = std::move(small);
    st.set_delta(true);
    if (view != recorded_view_) *st.mutable_view() = std::move(record_view);
    *st.mutable_tasks_done() = std::move(*tasks.mutable_tasks_done());
    *st.mutable_task_leases() = std::move(*tasks.mutable_task_leases());
    *st.mutable_leases_ended() = std::move(*tasks.mutable_leases_ended());
    for (std::string& e : events_from(events_recorded_)) st.add_events(std::move(e));
  }
  record_whole_ = false;
  rerecord_ = false;
  recorded_view_ = std::move(view);
  recorded_small_ = std::move(rest);
  events_recorded_ = events;
  queued_.push_back(std::move(st));
  return ++queued_seq_;
}

absl::Status StateRecorder::AwaitDurable(uint64_t ticket) {
  if (ticket == 0) return absl::OkStatus();
  auto refused = [](const absl::Status& why) {
    return WithReason(
        absl::UnavailableError(absl::StrCat("the master cannot record its state (", why.message(),
                                            "): nothing was acknowledged; retry")),
        proto::REASON_NOT_PERSISTED);
  };
  absl::MutexLock w(&write_mu_);
  std::vector<proto::MasterState> records;
  uint64_t seq = 0;
  {
    absl::MutexLock l(&persist_mu_);
    if (durable_seq_ >= ticket) return absl::OkStatus();
    if (failed_seq_ >= ticket || queued_.empty()) return refused(persist_error_);
    records.swap(queued_);
    seq = queued_seq_;
  }
  absl::Status s = log_->Append(std::move(records));
  absl::MutexLock l(&persist_mu_);
  if (s.ok()) {
    durable_seq_ = std::max(durable_seq_, seq);
    return absl::OkStatus();
  }
  LOG_EVERY_N(ERROR, 20) << "cannot record the master's state: " << s
                         << "; answering UNAVAILABLE until it can";
  failed_seq_ = std::max(failed_seq_, seq);
  persist_error_ = s;
  rerecord_ = true;  // the next change, or a retry, queues a record again
  return refused(s);
}

}  // namespace strata::master
