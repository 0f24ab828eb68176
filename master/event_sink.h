// The master's event sink: the event log (JSON lines, docs/operations.md)
// and the audit log (storage/audit_log.h, docs/security.md).
//
// The other components post to it while holding their own locks: posting
// only queues, under the sink's own leaf lock. The sink's writer thread
// appends what was posted to the files, in the order posted, holding no
// other component's lock, so a slow or failing disk never holds up an RPC.
// Flush waits until everything posted before it is written (the audit
// records synced).
//
// Owns: the queue (guarded by mu_, a leaf lock); the files, written only by
// the writer thread. A failed write is logged (the event has happened): the
// event log warns once, the audit log each time.
#ifndef STRATA_MASTER_EVENT_SINK_H_
#define STRATA_MASTER_EVENT_SINK_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "proto/strata.pb.h"
#include "storage/audit_log.h"
#include "storage/file_system.h"

namespace strata::master {

class EventSink {
 public:
  struct Options {
    storage::FileSystem* fs = nullptr;  // borrowed, required; outlives the sink
    std::string event_log;              // "" = none
    std::string audit_log;              // "" = none
    std::string job;                    // the job's name, in each event line
    Clock* clock = nullptr;             // borrowed; nullptr = RealClock()
    // How often the writer writes what was posted, when nobody flushes.
    absl::Duration write_every = absl::Milliseconds(200);
  };

  // Opens the audit log (which must verify: storage::AuditLog::Open) and
  // starts the writer.
  static absl::StatusOr<std::unique_ptr<EventSink>> Open(Options options);
  // Writes what is queued, then stops the writer.
  ~EventSink();
  EventSink(const EventSink&) = delete;
  EventSink& operator=(const EventSink&) = delete;

  // A cluster event: a line of the event log, {"unix_ms", "time", "job",
  // "kind", "message", and "role", "index", "node" when `node` is given},
  // and an audit record by "master".
  void Event(const char* kind, const std::string& what, const proto::NodeInfo* node = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_);
  // An audit record of a caller's action (an admin action, a refusal).
  void Audit(storage::AuditRecord record) ABSL_LOCKS_EXCLUDED(mu_);
  // Returns once everything posted before the call is written.
  void Flush() ABSL_LOCKS_EXCLUDED(mu_);
  // An admin action's audit record, returned once it is written (synced);
  // nothing without an audit log. A failure to write it is logged (the
  // action has happened).
  void AuditAction(storage::AuditRecord record) ABSL_LOCKS_EXCLUDED(mu_);
  // Audits a refused request (gRPC or HTTP; `who` "" when unauthenticated:
  // counted by host, not by connection), the same refusal of the same
  // caller at most once a second, with how many were left out before it:
  // a node retrying in a loop does not flood the log.
  void AuditRefusal(const std::string& who, const std::string& peer, const std::string& action,
                    const absl::Status& s) ABSL_LOCKS_EXCLUDED(mu_, refusals_mu_);

  // Failed TLS handshakes of this process's gRPC servers
  // (common/security.h ListenForTlsFailures), from WatchTlsHandshakes until
  // StopWatchingTlsHandshakes or the sink's end; nothing without an audit
  // log. The listener runs on gRPC's threads and only queues them (64 at
  // most, the rest counted); AuditTlsFailures audits what is queued, each
  // as a refusal, and is called by the owner's background thread. Watch
  // and StopWatching are not thread-safe: the owner's start and stop.
  void WatchTlsHandshakes() ABSL_LOCKS_EXCLUDED(tls_mu_);
  void StopWatchingTlsHandshakes() ABSL_LOCKS_EXCLUDED(tls_mu_);
  void AuditTlsFailures() ABSL_LOCKS_EXCLUDED(tls_mu_, mu_, refusals_mu_);

  bool auditing() const { return audit_ != nullptr; }
  // The audit log's head (seq 0 without an audit log).
  storage::AuditHead audit_head() const;

 private:
  struct Item {
    std::string line;                           // of the event log; "" = none
    std::optional<storage::AuditRecord> audit;  // of the audit log
    absl::Time at;
  };
  EventSink(Options options, std::unique_ptr<storage::AuditLog> audit);
  void Post(Item item) ABSL_LOCKS_EXCLUDED(mu_);
  void WriterLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // Appends `batch` to the files; the writer thread's only.
  void Write(const std::vector<Item>& batch) ABSL_LOCKS_EXCLUDED(mu_);

  const Options options_;
  Clock* const clock_;
  const std::unique_ptr<storage::AuditLog> audit_;  // null without options_.audit_log
  bool event_log_failed_ = false;                   // the writer's; warned once

  mutable absl::Mutex mu_;
  std::vector<Item> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t posted_ ABSL_GUARDED_BY(mu_) = 0;   // items posted so far
  uint64_t written_ ABSL_GUARDED_BY(mu_) = 0;  // of them, written
  uint64_t wanted_ ABSL_GUARDED_BY(mu_) = 0;   // a Flush waits for this many
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread writer_;
  // The refusals audited lately (AuditRefusal): a leaf lock of its own.
  struct Refusal {
    absl::Time last = absl::InfinitePast();
    int skipped = 0;
  };
  absl::Mutex refusals_mu_;
  std::map<std::string, Refusal> refusals_ ABSL_GUARDED_BY(refusals_mu_);
  int tls_listener_ = -1;  // WatchTlsHandshakes's; -1 = none
  absl::Mutex tls_mu_;     // a leaf lock
  std::vector<std::string> tls_failures_ ABSL_GUARDED_BY(tls_mu_);
  uint64_t tls_failures_dropped_ ABSL_GUARDED_BY(tls_mu_) = 0;
};

}  // namespace strata::master

#endif  // STRATA_MASTER_EVENT_SINK_H_
