// The pserver's side of replication as a primary: one ordered stream of
// kReplicate records per backup node over the data-plane transport
// (docs/reliability.md).
#ifndef STRATA_PSERVER_REPLICA_STREAMS_H_
#define STRATA_PSERVER_REPLICA_STREAMS_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "pserver/partition.h"
#include "transport/transport.h"

namespace strata::pserver {

// Records to one backup are sent in the order queued, pipelined on one
// connection, each stamped with this node's epoch when sent. When one
// fails (connection lost, the backup behind on the view, ...) every record
// not yet acknowledged is sent again, in order, after a backoff: the backup
// skips the ones it holds. A stream lives while its backup is in the view.
//
// Thread-safe. One thread sends; transport threads take the answers and
// report them to the partitions without holding this class's lock.
class ReplicaStreams final : public ReplicaSink {
 public:
  // `transport` is borrowed and outlives this. `self` and `epoch` give this
  // node's id and view epoch when a record is sent; `on_stale` is called
  // when a backup says that epoch is old. A record left unanswered for
  // `ack_timeout` is treated like a failed one: everything unacknowledged
  // goes again on a new connection, and the backup is reported unreachable
  // (the master probes it). An answer lost on the way must not hold a
  // partition's acknowledgements for good.
  ReplicaStreams(transport::Transport* transport, std::function<uint32_t()> self,
                 std::function<uint64_t()> epoch, std::function<void()> on_stale,
                 std::function<void(uint32_t backup, const std::string& why)> on_unreachable,
                 absl::Duration ack_timeout);
  ~ReplicaStreams() override;
  ReplicaStreams(const ReplicaStreams&) = delete;
  ReplicaStreams& operator=(const ReplicaStreams&) = delete;

  // Stops sending and joins the thread. Idempotent.
  void Shutdown();

  // The backups of the current view and their data addresses: streams to
  // other nodes are dropped with their records.
  void SetBackups(const std::map<uint32_t, std::string>& addresses);
  // Drops the records of a partition to a node that is no longer one of
  // its backups: `backups` has, for each partition this node serves as
  // primary now, its backups. A partition that moved away sends no more,
  // and records to a node that stopped backing one must not hold up the
  // stream to that node (it refuses them, and the stream is in order).
  void KeepOnly(const std::map<uint32_t, std::set<uint32_t>>& backups);
  // REQUIRES: `partition` is owned by a std::shared_ptr (its entry shares
  // it until acknowledged).
  void Send(Partition* partition, uint32_t backup, transport::Message record) override;

  struct Stats {
    uint64_t records_sent = 0;  // first sends
    uint64_t bytes_sent = 0;
    uint64_t resends = 0;  // records sent again after a failure
    uint64_t queued = 0;   // records not yet acknowledged, now
    uint64_t queued_bytes = 0;
    uint64_t ack_timeouts = 0;  // records unanswered for ack_timeout, sent again
  };
  Stats stats() const;

 private:
  struct Entry {
    // Shared: a record still queued keeps its partition alive after it
    // moved away from this node, until the backup acknowledges it or
    // leaves the view.
    std::shared_ptr<Partition> partition;
    transport::Message record;
    bool sent = false;
    bool acked = false;
    bool resend = false;
    absl::Time sent_at = absl::InfinitePast();
  };
  struct Stream {
    std::string address;
    std::shared_ptr<transport::Connection> conn;
    std::deque<Entry> queue;
    uint64_t generation = 0;  // bumped on failure: older answers are ignored
    int failures = 0;
    absl::Time retry_at = absl::InfinitePast();
  };
  void Loop();
  void OnAnswer(uint32_t backup, uint64_t generation, uint32_t partition, uint64_t seq,
                absl::StatusOr<transport::Message> answer);

  transport::Transport* const transport_;
  const std::function<uint32_t()> self_;
  const std::function<uint64_t()> epoch_;
  const std::function<void()> on_stale_;
  // Called (from a transport thread; must not block) when a backup cannot
  // be reached at all.
  const std::function<void(uint32_t, const std::string&)> on_unreachable_;
  const absl::Duration ack_timeout_;

  mutable absl::Mutex mu_;
  std::map<uint32_t, Stream> streams_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  Stats stats_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace strata::pserver

#endif  // STRATA_PSERVER_REPLICA_STREAMS_H_
