// The master's audit log (docs/security.md): who did what, when, from where,
// and the result, for every admin action, membership change, recovery,
// checkpoint and refused request. Append-only JSON lines, each chained to
// the one before it by SHA-256 and synced to disk (fdatasync) as it is
// written, so that `strata audit verify` detects any edit, deletion or
// reordering:
//
//   {"seq": 3, "unix_ms": 1764590000123, "time": "2026-12-01T12:00:00.123Z",
//    "who": "ipv4:10.0.0.5:51234", "action": "checkpoint", "target": "",
//    "result": "ok", "detail": "checkpoint 4 (full) at step 812",
//    "prev": "<64 hex>", "hash": "<64 hex>"}
//
// seq counts from 1; prev is the previous line's hash (64 zeros for the
// first); hash = SHA-256(prev || the line's text before `, "hash": `). Cutting
// lines off the end keeps the rest a valid chain: compare the head that
// verify prints with the master's (`strata status`, /metrics).
#ifndef STRATA_STORAGE_AUDIT_LOG_H_
#define STRATA_STORAGE_AUDIT_LOG_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "storage/file_system.h"

namespace strata::storage {

struct AuditRecord {
  std::string who;     // the caller's identity ("operator:alice"), "plaintext", or "master"
  std::string from;    // the caller's peer address ("ipv4:10.0.0.5:51234"), "" for the master
  std::string action;  // "register", "checkpoint", "drain", "node_dead", ...
  std::string target;  // what it acted on: "worker 1 (node 4)", or ""
  std::string result;  // "ok", "refused: ...", "failed: ..."
  std::string detail;  // anything else worth keeping (never a secret)
};

struct AuditHead {
  uint64_t seq = 0;  // records in the chain
  std::string hash;  // the last one's (64 zeros when empty)
};

// Checks a whole log's chain. Errors (DataLoss) name `name`:LINE and what is
// wrong: a line that is not a record, a seq out of order, a prev that is not
// the previous hash, a hash that does not match its line.
absl::StatusOr<AuditHead> VerifyAuditLog(absl::string_view contents, const std::string& name);

// Thread-safe.
class AuditLog {
 public:
  // Opens (creating, mode 0640) the log at `path` on `fs` (borrowed; it
  // outlives the log) and verifies what it holds, to carry the chain on. A
  // log that does not verify is refused (keep it as evidence; move it aside
  // to start a new one).
  static absl::StatusOr<std::unique_ptr<AuditLog>> Open(FileSystem* fs, const std::string& path);
  ~AuditLog();
  AuditLog(const AuditLog&) = delete;
  AuditLog& operator=(const AuditLog&) = delete;

  // Appends one record and syncs it to disk before returning. A failure
  // (Unavailable, naming the log) cuts what was written of the record off
  // again, so the chain stays whole.
  absl::Status Append(const AuditRecord& record, absl::Time now);

  AuditHead head() const;
  const std::string& path() const { return path_; }

 private:
  AuditLog(std::string path, std::unique_ptr<WritableFile> file, uint64_t size, AuditHead head);

  const std::string path_;
  mutable absl::Mutex mu_;
  const std::unique_ptr<WritableFile> file_ ABSL_GUARDED_BY(mu_);
  uint64_t size_ ABSL_GUARDED_BY(mu_);  // bytes of whole records in the file
  AuditHead head_ ABSL_GUARDED_BY(mu_);
};

// The line of `record` after `prev` (seq = prev.seq + 1), newline included,
// and its hash in *hash.
std::string AuditLine(const AuditRecord& record, absl::Time now, const AuditHead& prev,
                      std::string* hash);

}  // namespace strata::storage

#endif  // STRATA_STORAGE_AUDIT_LOG_H_
