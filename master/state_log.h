// The master's state directory (docs/reliability.md): an append-only log of
// its states with a checksum on every record, and a snapshot that starts
// the log anew every so often, so that a restarted master replays them and
// carries on.
#ifndef STRATA_MASTER_STATE_LOG_H_
#define STRATA_MASTER_STATE_LOG_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/strata.pb.h"
#include "storage/file_system.h"

namespace strata::master {

// Where the master keeps its state: a state directory (StateLog, below) or
// etcd (EtcdStateStore, master/etcd_state.h). Both write records of
// changes, replaced by a snapshot of the whole state every so often, and
// replay them when opened. Not thread-safe: one writer at a time.
class StateStore {
 public:
  virtual ~StateStore() = default;
  // Writes `records` (their record_seq set here), in order, durably, at
  // once (group commit). A whole state replaces the state and starts the
  // records anew; a delta is applied to the state. After a failed write,
  // the next Append writes the whole state, so the records of a failed
  // Append are durable once a later one succeeds. Errors name where.
  virtual absl::Status Append(std::vector<proto::MasterState> records) = 0;
  absl::Status Append(proto::MasterState record) {
    std::vector<proto::MasterState> one;
    one.push_back(std::move(record));
    return Append(std::move(one));
  }
  // The state the records so far make (what a replay would find, once
  // they are durable).
  virtual const proto::MasterState& state() const = 0;
  // Where it is, for messages ("state directory D", "etcd ... key K").
  virtual std::string where() const = 0;
};

// Files: DIR/snapshot (one record: the whole state) and DIR/log (records
// after it). A record is [u32 length][u32 crc32c of the bytes][bytes: a
// proto::MasterState], little-endian, with a record_seq. A record is either
// the whole state or, mostly, what changed since the record before
// (MasterState.delta: the tasks completed, the leases given and ended, the
// events added, the view when it changed, the small fields whole), so that
// a completed task costs a record of O(what changed), not O(tasks).
//
// Replay takes the snapshot and applies the log's records after it in
// order (those at or below the snapshot's seq are skipped: a crash between
// writing a snapshot and starting the log anew loses nothing); a torn or
// corrupt tail (a crash in the middle of an append) loses only that
// record, and replay ends at it. The log is replaced by a snapshot of the
// state once it has grown to the snapshot's size (at least min_log_bytes),
// so replay reads at most about twice the state, and the snapshots' cost
// per record stays O(what changed), amortised.
//
// Not thread-safe: the master calls it from one writer at a time.
class StateLog : public StateStore {
 public:
  struct Options {
    // The log is not replaced by a snapshot before it holds this much.
    uint64_t min_log_bytes = 1 << 20;
  };

  // Opens (creating) `dir` on `fs` (borrowed; outlives this) and replays
  // the state into *state (nullopt when there is none). A bad record ends
  // the replay there, logged with the file and offset; a snapshot that
  // does not parse is an error naming it. Then writes what it found as the
  // new snapshot and starts an empty log.
  static absl::StatusOr<std::unique_ptr<StateLog>> Open(storage::FileSystem* fs,
                                                        const std::string& dir,
                                                        std::optional<proto::MasterState>* state,
                                                        Options options);
  static absl::StatusOr<std::unique_ptr<StateLog>> Open(storage::FileSystem* fs,
                                                        const std::string& dir,
                                                        std::optional<proto::MasterState>* state) {
    return Open(fs, dir, state, Options());
  }
  StateLog(const StateLog&) = delete;
  StateLog& operator=(const StateLog&) = delete;

  // StateStore: syncs once for all the records. A whole state is written
  // as the snapshot, the log started anew; a delta is appended to the log.
  // After a failed write, the next Append writes the whole state as the
  // snapshot (nothing is appended after a tail that may be torn). Disk
  // errors name the file.
  using StateStore::Append;
  absl::Status Append(std::vector<proto::MasterState> records) override;
  const proto::MasterState& state() const override { return state_; }
  std::string where() const override { return "state directory " + dir_; }
  const std::string& dir() const { return dir_; }

 private:
  StateLog(storage::FileSystem* fs, std::string dir, Options options)
      : fs_(fs), dir_(std::move(dir)), options_(options) {}
  absl::Status WriteSnapshot();
  absl::Status StartLog();

  storage::FileSystem* const fs_;
  const std::string dir_;
  const Options options_;
  std::unique_ptr<storage::WritableFile> log_;
  proto::MasterState state_;
  uint64_t seq_ = 0;             // of the last record
  uint64_t log_bytes_ = 0;       // in the log since the snapshot
  uint64_t snapshot_bytes_ = 0;  // of the last snapshot
  bool broken_ = false;          // the last write failed
};

// The master's side of its state log: what each record holds, and when it
// is durable. Record is called under the master's lock and only queues (its
// lock, persist_mu_, is a leaf there); AwaitDurable, called without the
// master's lock, writes and syncs what is queued (group commit; write_mu_
// is held while a batch is written, never with the master's lock).
//
// Owns: the state log (under write_mu_); the queue, the tickets, the last
// write's failure, and what the last record queued said (under
// persist_mu_). Thread-safe.
class StateRecorder {
 public:
  // `log` null: nothing is kept (Record returns 0).
  explicit StateRecorder(std::shared_ptr<StateStore> log);
  StateRecorder(const StateRecorder&) = delete;
  StateRecorder& operator=(const StateRecorder&) = delete;

  // Queues a record of what changed since the last record queued, when
  // something did, and returns the ticket of the newest record queued (0:
  // nothing kept); the state the caller saw is durable once that record
  // is. `small`: the state without tasks, leases or events (its view's
  // heartbeat times cleared), compared whole with the last; `tasks`: the
  // data tasks completed (tasks_done), leased (task_leases) and ended
  // (leases_ended) since; `events`: how many the job has, and
  // `events_from(i)` those from the ith. The first record, and the first
  // after a failed write, is the whole state: `whole()`.
  uint64_t Record(proto::MasterState small, proto::MasterState tasks, size_t events,
                  const std::function<std::vector<std::string>(size_t)>& events_from,
                  const std::function<proto::MasterState()>& whole)
      ABSL_LOCKS_EXCLUDED(persist_mu_);
  // Returns once record `ticket` is synced, writing what is queued itself
  // unless another caller already did. When the disk refuses, UNAVAILABLE
  // with REASON_NOT_PERSISTED: nothing may be acknowledged, and the
  // caller retries (its retry queues a record again, which is then the
  // whole state).
  absl::Status AwaitDurable(uint64_t ticket) ABSL_LOCKS_EXCLUDED(write_mu_, persist_mu_);

 private:
  absl::Mutex write_mu_ ABSL_ACQUIRED_BEFORE(persist_mu_);
  const std::shared_ptr<StateStore> owned_;  // (log_'s owner)
  StateStore* const log_ ABSL_PT_GUARDED_BY(write_mu_);
  absl::Mutex persist_mu_;
  bool record_whole_ ABSL_GUARDED_BY(persist_mu_) = true;
  std::string recorded_view_ ABSL_GUARDED_BY(persist_mu_);   // serialized
  std::string recorded_small_ ABSL_GUARDED_BY(persist_mu_);  // the rest, serialized
  size_t events_recorded_ ABSL_GUARDED_BY(persist_mu_) = 0;
  std::vector<proto::MasterState> queued_ ABSL_GUARDED_BY(persist_mu_);  // not written yet
  bool rerecord_ ABSL_GUARDED_BY(persist_mu_) = false;       // a write failed: queue one again
  uint64_t queued_seq_ ABSL_GUARDED_BY(persist_mu_) = 0;     // the newest one's ticket
  uint64_t durable_seq_ ABSL_GUARDED_BY(persist_mu_) = 0;    // newest ticket synced
  uint64_t failed_seq_ ABSL_GUARDED_BY(persist_mu_) = 0;     // newest ticket refused by the disk
  absl::Status persist_error_ ABSL_GUARDED_BY(persist_mu_);  // why
};

// Applies `delta` (a record of changes) to `state`; a record that is the
// whole state replaces it.
void ApplyStateRecord(proto::MasterState record, proto::MasterState* state);

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

// The one record of a snapshot's bytes (`where` names it in errors): the
// whole state. DATA_LOSS saying what is wrong and `afresh` (how to start
// the master without it) when the bytes are not exactly one good record of
// a whole state.
absl::StatusOr<proto::MasterState> DecodeSnapshot(const std::string& where, absl::string_view bytes,
                                                  const std::string& afresh);

// What a StateStore's Append writes (StateLog and EtcdStateStore share the
// decision): `records` are numbered after *seq and applied to *state; the
// whole state is written as a snapshot when one of them is the whole state,
// when the last write failed (`broken`), when the log would reach the
// snapshot's size (at least min_log_bytes), or when a record is over
// max_record_bytes; else the records' bytes are appended (`encoded`, the
// first of seq `first_seq`).
struct PreparedRecords {
  bool snapshot = false;
  std::vector<std::string> encoded;
  uint64_t first_seq = 0;
  uint64_t bytes = 0;
};
PreparedRecords PrepareRecords(std::vector<proto::MasterState> records, bool broken,
                               uint64_t log_bytes, uint64_t snapshot_bytes, uint64_t min_log_bytes,
                               uint64_t max_record_bytes, uint64_t* seq, proto::MasterState* state);

// Applies the records of a log, in order, to *state (the snapshot's, or
// none): those at or below the state's seq are skipped (in the snapshot);
// a record of changes that does not follow the one before ends the replay
// there, logged naming `where`.
void ReplayStateRecords(const std::string& where, std::vector<proto::MasterState> records,
                        std::optional<proto::MasterState>* state);

}  // namespace strata::master

#endif  // STRATA_MASTER_STATE_LOG_H_
