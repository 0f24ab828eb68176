#include "master/event_sink.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/json.h"
#include "common/proto_names.h"
#include "common/security.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace strata::master {

absl::StatusOr<std::unique_ptr<EventSink>> EventSink::Open(Options options) {
  if (options.fs == nullptr) return absl::InvalidArgumentError("event sink: no file system");
  std::unique_ptr<storage::AuditLog> audit;
  if (!options.audit_log.empty()) {
    STRATA_ASSIGN_OR_RETURN(audit, storage::AuditLog::Open(options.fs, options.audit_log));
  }
  return std::unique_ptr<EventSink>(new EventSink(std::move(options), std::move(audit)));
}

EventSink::EventSink(Options options, std::unique_ptr<storage::AuditLog> audit)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : RealClock()),
      audit_(std::move(audit)) {
  writer_ = std::thread([this] { WriterLoop(); });
}

EventSink::~EventSink() {
  StopWatchingTlsHandshakes();
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  writer_.join();  // (it writes what is queued first)
}

void EventSink::Event(const char* kind, const std::string& what, const proto::NodeInfo* node) {
  if (options_.event_log.empty() && audit_ == nullptr) return;
  Item item;
  item.at = clock_->Now();
  if (!options_.event_log.empty()) {
    item.line = absl::StrFormat(
        "{\"unix_ms\": %d, \"time\": \"%s\", \"job\": \"%s\", \"kind\": \"%s\", "
        "\"message\": \"%s\"",
        absl::ToUnixMillis(item.at),
        absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", item.at, absl::UTCTimeZone()),
        JsonEscape(options_.job), kind, JsonEscape(what));
    if (node != nullptr) {
      absl::StrAppendFormat(&item.line, ", \"role\": \"%s\", \"index\": %d, \"node\": %d",
                            NodeRoleName(node->role()), node->index(), node->id());
    }
    item.line += "}\n";
  }
  if (audit_ != nullptr) {
    storage::AuditRecord r;
    r.who = "master";
    r.action = kind;
    if (node != nullptr) {
      r.target =
          absl::StrCat(NodeRoleName(node->role()), " ", node->index(), " (node ", node->id(), ")");
    }
    r.result = "ok";
    r.detail = what;
    item.audit = std::move(r);
  }
  Post(std::move(item));
}

void EventSink::Audit(storage::AuditRecord record) {
  if (audit_ == nullptr) return;
  Item item;
  item.at = clock_->Now();
  item.audit = std::move(record);
  Post(std::move(item));
}

void EventSink::Post(Item item) {
  absl::MutexLock l(&mu_);
  queue_.push_back(std::move(item));
  ++posted_;
}

void EventSink::Flush() {
  absl::MutexLock l(&mu_);
  const uint64_t target = posted_;
  wanted_ = std::max(wanted_, target);
  auto written = [this, target]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return written_ >= target; };
  mu_.Await(absl::Condition(&written));
}

storage::AuditHead EventSink::audit_head() const {
  if (audit_ == nullptr) return storage::AuditHead{0, std::string(64, '0')};
  return audit_->head();  // (a leaf lock)
}

void EventSink::WriterLoop() {
  mu_.Lock();
  auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || wanted_ > written_; };
  while (true) {
    mu_.AwaitWithTimeout(absl::Condition(&wake), options_.write_every);
    if (queue_.empty()) {
      if (stop_) break;
      continue;
    }
    std::vector<Item> batch;
    batch.swap(queue_);
    const uint64_t upto = posted_;
    mu_.Unlock();
    Write(batch);
    mu_.Lock();
    written_ = upto;
  }
  mu_.Unlock();
}

void EventSink::Write(const std::vector<Item>& batch) {
  std::string lines;
  for (const Item& item : batch) {
    lines += item.line;
    if (!item.audit.has_value()) continue;
    absl::Status s = audit_->Append(*item.audit, item.at);
    if (!s.ok()) LOG(ERROR) << s;
  }
  if (lines.empty()) return;
  // Opened for each batch and appended whole: a rotated log is followed,
  // and the lines of a restarted master follow the old ones.
  absl::Status s = [&]() -> absl::Status {
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<storage::WritableFile> f,
                            options_.fs->NewAppendableFile(options_.event_log));
    STRATA_RETURN_IF_ERROR(f->Append(lines));
    return f->Close();
  }();
  if (!s.ok() && !event_log_failed_) {
    event_log_failed_ = true;
    LOG(WARNING) << "event log " << options_.event_log << ": cannot append (" << s.message()
                 << "); events are still in the master's log";
  }
}

void EventSink::AuditAction(storage::AuditRecord record) {
  if (!auditing()) return;
  Audit(std::move(record));
  Flush();
}

void EventSink::WatchTlsHandshakes() {
  if (!auditing() || tls_listener_ >= 0) return;
  tls_listener_ = ListenForTlsFailures([this](const std::string& reason) {
    absl::MutexLock l(&tls_mu_);
    if (tls_failures_.size() < 64) {
      tls_failures_.push_back(reason);
    } else {
      ++tls_failures_dropped_;
    }
  });
}

void EventSink::StopWatchingTlsHandshakes() {
  if (tls_listener_ < 0) return;
  StopListeningForTlsFailures(std::exchange(tls_listener_, -1));
  AuditTlsFailures();  // the last ones
}

void EventSink::AuditTlsFailures() {
  std::vector<std::string> failures;
  uint64_t dropped = 0;
  {
    absl::MutexLock l(&tls_mu_);
    failures.swap(tls_failures_);
    dropped = std::exchange(tls_failures_dropped_, 0);
  }
  if (dropped > 0) {
    LOG(WARNING) << dropped << " more failed TLS handshake(s) not audited one by one";
  }
  // (gRPC does not say from where; one record a second per reason.)
  for (const std::string& reason : failures) {
    AuditRefusal("", "unknown (gRPC does not name the peer of a failed handshake)", "tls handshake",
                 absl::UnauthenticatedError(reason));
  }
}

void EventSink::AuditRefusal(const std::string& who, const std::string& peer,
                             const std::string& action, const absl::Status& s) {
  if (!auditing()) return;
  const std::string result =
      absl::StrCat("refused: ", absl::StatusCodeToString(s.code()), ": ", s.message());
  int skipped = 0;
  {
    absl::MutexLock l(&refusals_mu_);
    // (Unauthenticated callers by host, not by connection: each new
    // connection's refusal must not be synced to disk.)
    const std::string from =
        who.empty() ? std::string(absl::string_view(peer).substr(0, peer.rfind(':'))) : peer;
    Refusal& r = refusals_[absl::StrCat(who, " ", from, " ", action, " ", s.code(), " ",
                                        who.empty() ? s.message() : "")];
    const absl::Time now = absl::Now();
    if (now - r.last < absl::Seconds(1)) {
      ++r.skipped;
      return;
    }
    r.last = now;
    skipped = std::exchange(r.skipped, 0);
    if (refusals_.size() > 4096) refusals_.clear();  // (bounded)
  }
  AuditAction({who.empty() ? "unauthenticated" : who, peer, action, "", result,
               skipped ? absl::StrCat(skipped, " more like it in the second before") : ""});
}

}  // namespace strata::master
