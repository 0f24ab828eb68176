// The master's state directory (docs/reliability.md): an append-only log of
// its states with a checksum on every record, and a snapshot that starts
// the log anew every so often, so that a restarted master replays them and
// carries on.
#ifndef STRATA_MASTER_STATE_LOG_H_
#define STRATA_MASTER_STATE_LOG_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "proto/strata.pb.h"
#include "storage/file_system.h"

namespace strata::master {

// Files: DIR/snapshot (one record) and DIR/log (records after it). A record
// is [u32 length][u32 crc32c of the bytes][bytes: a proto::MasterState],
// little-endian. Each record holds the whole state (small: the view and the
// completed tasks) and a record_seq; the good record with the highest seq,
// in the snapshot or the log, is the state, so a crash between writing a
// snapshot and starting the log anew loses nothing, and a torn or corrupt
// tail (a crash in the middle of an append) only loses that record.
//
// Not thread-safe: the master calls it under its lock.
class StateLog {
 public:
  // Records per log before a snapshot replaces it.
  static constexpr int kSnapshotEvery = 64;

  // Opens (creating) `dir` on `fs` (borrowed; outlives this) and reads the
  // newest good state into *state (nullopt when there is none). A bad
  // record ends the replay there, logged with the file and offset; a
  // snapshot that does not parse is an error naming it. Then writes what
  // it found as the new snapshot and starts an empty log.
  static absl::StatusOr<std::unique_ptr<StateLog>> Open(storage::FileSystem* fs,
                                                        const std::string& dir,
                                                        std::optional<proto::MasterState>* state);
  StateLog(const StateLog&) = delete;
  StateLog& operator=(const StateLog&) = delete;

  // Appends `state` (its record_seq set here) to the log and syncs it;
  // every kSnapshotEvery records
  // the snapshot is rewritten (atomically) and the log started anew.
  // Disk errors name the file.
  absl::Status Append(proto::MasterState state);

  const std::string& dir() const { return dir_; }

 private:
  StateLog(storage::FileSystem* fs, std::string dir) : fs_(fs), dir_(std::move(dir)) {}
  absl::Status WriteSnapshot(const proto::MasterState& state);
  absl::Status StartLog();

  storage::FileSystem* const fs_;
  const std::string dir_;
  std::unique_ptr<storage::WritableFile> log_;
  int records_ = 0;
  uint64_t seq_ = 0;  // of the last record written
};

// Holds DIR/LOCK (FileSystem::LockFile: flock, with this process's pid in
// it) while it lives, so that two masters never act on one state directory
// (docs/reliability.md). Creates DIR when missing. FailedPrecondition naming
// the lock file and the holder's pid when another process holds it, and
// naming what failed otherwise. Not thread-safe; one per process.
class StateDirLock {
 public:
  // `fs` is borrowed; the lock does not need it after Acquire.
  static absl::StatusOr<std::unique_ptr<StateDirLock>> Acquire(storage::FileSystem* fs,
                                                               const std::string& dir);
  StateDirLock(const StateDirLock&) = delete;
  StateDirLock& operator=(const StateDirLock&) = delete;

 private:
  explicit StateDirLock(std::unique_ptr<storage::FileLock> lock) : lock_(std::move(lock)) {}
  const std::unique_ptr<storage::FileLock> lock_;
};

// One record's bytes, and the records in `bytes` (of file `path`, for
// errors): the good ones before the first bad one, and the reason it is bad.
std::string EncodeStateRecord(const proto::MasterState& state);
struct StateRecords {
  std::vector<proto::MasterState> states;
  std::string bad;  // "" when every record was good
};
StateRecords DecodeStateRecords(const std::string& path, absl::string_view bytes);

}  // namespace strata::master

#endif  // STRATA_MASTER_STATE_LOG_H_
