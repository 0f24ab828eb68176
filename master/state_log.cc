#include "master/state_log.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
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

absl::StatusOr<std::unique_ptr<StateLog>> StateLog::Open(storage::FileSystem* fs,
                                                         const std::string& dir,
                                                         std::optional<proto::MasterState>* state) {
  STRATA_RETURN_IF_ERROR(fs->CreateDirs(dir));
  state->reset();
  const std::string snapshot = storage::JoinPath(dir, "snapshot");
  if (fs->Exists(snapshot)) {
    STRATA_ASSIGN_OR_RETURN(std::string bytes, fs->ReadFile(snapshot));
    StateRecords r = DecodeStateRecords(snapshot, bytes);
    // The snapshot is written atomically: a bad one is not a torn write.
    if (!r.bad.empty() || r.states.size() != 1) {
      return absl::DataLossError(absl::StrCat(
          r.bad.empty() ? absl::StrCat(snapshot, ": ", r.states.size(), " records, expected 1")
                        : r.bad,
          "; move the state directory ", dir, " away to start the master afresh"));
    }
    *state = std::move(r.states[0]);
  }
  const std::string log = storage::JoinPath(dir, "log");
  if (fs->Exists(log)) {
    STRATA_ASSIGN_OR_RETURN(std::string bytes, fs->ReadFile(log));
    StateRecords r = DecodeStateRecords(log, bytes);
    if (!r.bad.empty()) {
      LOG(WARNING) << r.bad << ": the log ends there (" << r.states.size()
                   << " good record(s) before it)";
    }
    for (proto::MasterState& s : r.states) {
      if (!state->has_value() || s.record_seq() > (*state)->record_seq()) *state = std::move(s);
    }
  }
  std::unique_ptr<StateLog> sl(new StateLog(fs, dir));
  if (state->has_value()) sl->seq_ = (*state)->record_seq();
  if (state->has_value()) STRATA_RETURN_IF_ERROR(sl->WriteSnapshot(**state));
  STRATA_RETURN_IF_ERROR(sl->StartLog());
  return sl;
}

absl::Status StateLog::WriteSnapshot(const proto::MasterState& state) {
  return fs_->WriteFileAtomic(storage::JoinPath(dir_, "snapshot"), EncodeStateRecord(state));
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
  records_ = 0;
  return absl::OkStatus();
}

absl::Status StateLog::Append(proto::MasterState state) {
  state.set_record_seq(++seq_);
  if (records_ >= kSnapshotEvery) {
    STRATA_RETURN_IF_ERROR(WriteSnapshot(state));
    return StartLog();
  }
  const std::string log = storage::JoinPath(dir_, "log");
  absl::Status s = log_->Append(EncodeStateRecord(state));
  if (s.ok()) s = log_->Sync();
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat(log, ": ", s.message()));
  ++records_;
  return absl::OkStatus();
}

}  // namespace strata::master
