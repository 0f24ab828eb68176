// The master's state in etcd (docs/reliability.md, "Master high
// availability"): the same records as the state directory's (state_log.h),
// written by the leading master in transactions that check it still leads,
// so that a deposed leader cannot write (fencing by the leader key's
// create revision).
//
// Keys, under the job's KEYS (PREFIX/JOB/):
//   state/head                  proto::EtcdStateHead: the current snapshot
//   state/snap/GEN/PART         the snapshot's record, in parts of at most
//                               part_bytes (etcd refuses requests over
//                               1.5 MiB by default)
//   state/log/SEQ               one record of changes after the snapshot
// A snapshot is written part by part, then made current by one transaction
// that writes the head and deletes the log and every other snapshot; the
// store's history is then compacted, so the keyspace holds about twice the
// state at most, as the state directory does.
#ifndef STRATA_MASTER_ETCD_STATE_H_
#define STRATA_MASTER_ETCD_STATE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "master/etcd_client.h"
#include "master/leadership.h"
#include "master/state_log.h"
#include "proto/strata.pb.h"

namespace strata::master {

// Reads the state in etcd, and again as it changes: a standby follows it
// (every second), so that once elected it reads only what was written
// since. Not thread-safe.
class EtcdStateReader {
 public:
  EtcdStateReader(EtcdClient* etcd, std::string keys)  // keys: PREFIX/JOB/
      : etcd_(etcd), keys_(std::move(keys)) {}
  // Brings the state up to date: the snapshot and the log again when a new
  // snapshot is current (or none was read yet), else only the log's
  // records after the last one read. A snapshot that does not decode is
  // DATA_LOSS naming its key; a bad log record ends the state there
  // (logged).
  absl::Status Follow();
  const std::optional<proto::MasterState>& state() const { return state_; }
  uint64_t generation() const { return generation_; }
  // The log records the last Follow read.
  int records_read() const { return records_read_; }

 private:
  EtcdClient* const etcd_;
  const std::string keys_;
  std::optional<proto::MasterState> state_;
  uint64_t generation_ = 0;  // of the snapshot state_ started from; 0: none
  int records_read_ = 0;
};

// Not thread-safe: one writer (the StateRecorder) at a time.
class EtcdStateStore : public StateStore {
 public:
  struct Options {
    EtcdClient* etcd = nullptr;              // borrowed
    MasterLeadership* leadership = nullptr;  // borrowed; leading
    std::string keys;                        // PREFIX/JOB/
    uint64_t min_log_bytes = 1 << 20;        // as StateLog's
    size_t part_bytes = 512 << 10;           // of a snapshot's part
    size_t txn_bytes = 1 << 20;              // records in one transaction
    bool compact = true;                     // cluster.etcd.compact
  };
  // Replays the state in etcd into *state (nullopt when there is none),
  // then writes it as a new snapshot. A snapshot that does not decode is
  // DATA_LOSS naming its key; a bad log record ends the replay there
  // (logged).
  // `followed`: what a standby read so far (its reader, brought up to date
  // here), or null to read it all.
  static absl::StatusOr<std::unique_ptr<EtcdStateStore>> Open(
      Options options, std::optional<proto::MasterState>* state,
      EtcdStateReader* followed = nullptr);

  using StateStore::Append;
  // A transaction that finds this master no longer leads fails with
  // FAILED_PRECONDITION and tells the leadership (Deposed).
  absl::Status Append(std::vector<proto::MasterState> records) override;
  const proto::MasterState& state() const override { return state_; }
  std::string where() const override;

 private:
  explicit EtcdStateStore(Options options) : options_(std::move(options)) {}
  absl::Status WriteSnapshot();
  // One fenced transaction of `ops`.
  absl::Status Commit(std::vector<etcdserverpb::RequestOp> ops, int64_t* revision);

  const Options options_;
  proto::MasterState state_;
  uint64_t seq_ = 0;
  uint64_t generation_ = 0;  // of the current snapshot
  uint64_t log_bytes_ = 0;
  uint64_t snapshot_bytes_ = 0;
  bool broken_ = false;
};

// The job's keys in etcd: PREFIX/JOB/.
std::string EtcdJobKeys(const std::string& prefix, const std::string& job);

}  // namespace strata::master

#endif  // STRATA_MASTER_ETCD_STATE_H_
