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
  };
  // Replays the state in etcd into *state (nullopt when there is none),
  // then writes it as a new snapshot. A snapshot that does not decode is
  // DATA_LOSS naming its key; a bad log record ends the replay there
  // (logged).
  static absl::StatusOr<std::unique_ptr<EtcdStateStore>> Open(
      Options options, std::optional<proto::MasterState>* state);

  using StateStore::Append;
  // A transaction that finds this master no longer leads fails with
  // FAILED_PRECONDITION and tells the leadership (Deposed).
  absl::Status Append(std::vector<proto::MasterState> records) override;
  const proto::MasterState& state() const override { return state_; }
  std::string where() const override;

  // How many etcd transactions the records so far took (for the bench).
  uint64_t transactions() const { return transactions_; }

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
  uint64_t transactions_ = 0;
  bool broken_ = false;
};

// The job's keys in etcd: PREFIX/JOB/.
std::string EtcdJobKeys(const std::string& prefix, const std::string& job);

}  // namespace strata::master

#endif  // STRATA_MASTER_ETCD_STATE_H_
