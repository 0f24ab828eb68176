#include "storage/audit_log.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/json.h"
#include "glog/logging.h"
#include "storage/s3_sign.h"

namespace strata::storage {
namespace {

const std::string& ZeroHash() {
  static const std::string* zero = new std::string(64, '0');
  return *zero;
}

constexpr absl::string_view kHashKey = ", \"hash\": \"";
constexpr absl::string_view kPrevKey = ", \"prev\": \"";

bool IsHex64(absl::string_view s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!absl::ascii_isdigit(c) && !(c >= 'a' && c <= 'f')) return false;
  }
  return true;
}

}  // namespace

std::string AuditLine(const AuditRecord& r, absl::Time now, const AuditHead& prev,
                      std::string* hash) {
  const std::string prev_hash = prev.hash.empty() ? ZeroHash() : prev.hash;
  const std::string body = absl::StrFormat(
      "{\"seq\": %d, \"unix_ms\": %d, \"time\": \"%s\", \"who\": \"%s\", \"from\": \"%s\", "
      "\"action\": \"%s\", "
      "\"target\": \"%s\", \"result\": \"%s\", \"detail\": \"%s\", \"prev\": \"%s\"",
      prev.seq + 1, absl::ToUnixMillis(now),
      absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", now, absl::UTCTimeZone()), JsonEscape(r.who),
      JsonEscape(r.from), JsonEscape(r.action), JsonEscape(r.target), JsonEscape(r.result),
      JsonEscape(r.detail), prev_hash);
  *hash = Sha256Hex(absl::StrCat(prev_hash, body));
  return absl::StrCat(body, kHashKey, *hash, "\"}\n");
}

absl::StatusOr<AuditHead> VerifyAuditLog(absl::string_view contents, const std::string& name) {
  AuditHead head;
  head.hash = ZeroHash();
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(contents, '\n')) {
    ++line_no;
    if (line.empty()) {
      // Only the end of the file (after the last newline) may be empty.
      if (line.data() + line.size() == contents.data() + contents.size()) break;
      return absl::DataLossError(absl::StrCat(name, ":", line_no, ": an empty line"));
    }
    auto bad = [&](absl::string_view what) {
      return absl::DataLossError(absl::StrCat(name, ":", line_no, ": ", what));
    };
    if (line.data() + line.size() == contents.data() + contents.size()) {
      // (A record is written whole with its newline.)
      return bad("the last record has no end of line: cut short or appended to by hand");
    }
    const size_t h = line.rfind(kHashKey);
    if (!absl::StartsWith(line, "{\"seq\": ") || h == absl::string_view::npos ||
        line.size() != h + kHashKey.size() + 64 + 2 || !absl::EndsWith(line, "\"}")) {
      return bad("not an audit record");
    }
    const absl::string_view body = line.substr(0, h);
    const absl::string_view hash = line.substr(h + kHashKey.size(), 64);
    const size_t p = body.rfind(kPrevKey);
    if (p == absl::string_view::npos || body.size() != p + kPrevKey.size() + 64 + 1 ||
        body.back() != '"') {
      return bad("not an audit record (no prev)");
    }
    const absl::string_view prev = body.substr(p + kPrevKey.size(), 64);
    absl::string_view seq_text = body.substr(8);
    seq_text = seq_text.substr(0, seq_text.find(','));
    uint64_t seq = 0;
    if (!absl::SimpleAtoi(seq_text, &seq) || !IsHex64(hash) || !IsHex64(prev)) {
      return bad("not an audit record (seq, prev or hash)");
    }
    if (seq != head.seq + 1) {
      return bad(absl::StrCat("seq ", seq, " where ", head.seq + 1,
                              " was due: a record was removed, added or moved"));
    }
    if (prev != head.hash) {
      return bad(absl::StrCat("prev is not the hash of record ", head.seq,
                              ": a record before it was removed, changed or moved"));
    }
    if (Sha256Hex(absl::StrCat(prev, body)) != hash) {
      return bad("the hash does not match the record: it was changed");
    }
    head.seq = seq;
    head.hash = std::string(hash);
  }
  return head;
}

absl::StatusOr<std::unique_ptr<AuditLog>> AuditLog::Open(FileSystem* fs, const std::string& path) {
  absl::StatusOr<std::string> contents = fs->ReadFile(path);
  if (absl::IsNotFound(contents.status())) contents = std::string();
  if (!contents.ok()) {
    return absl::UnavailableError(
        absl::StrCat("audit log ", path, ": cannot read: ", contents.status().message()));
  }
  absl::StatusOr<AuditHead> head = VerifyAuditLog(*contents, path);
  if (!head.ok()) {
    return absl::DataLossError(absl::StrCat(
        head.status().message(),
        " (the audit log does not verify: keep it as evidence and move it aside to start a "
        "new one)"));
  }
  absl::StatusOr<std::unique_ptr<WritableFile>> file = fs->NewAppendableFile(path);
  if (!file.ok()) {
    return absl::UnavailableError(
        absl::StrCat("audit log ", path, ": cannot open: ", file.status().message()));
  }
  return std::unique_ptr<AuditLog>(
      new AuditLog(path, std::move(*file), contents->size(), std::move(*head)));
}

AuditLog::AuditLog(std::string path, std::unique_ptr<WritableFile> file, uint64_t size,
                   AuditHead head)
    : path_(std::move(path)), file_(std::move(file)), size_(size), head_(std::move(head)) {}

AuditLog::~AuditLog() {
  absl::MutexLock l(&mu_);
  absl::Status s = file_->Close();
  if (!s.ok()) LOG(WARNING) << "audit log " << path_ << ": " << s;
}

absl::Status AuditLog::Append(const AuditRecord& record, absl::Time now) {
  absl::MutexLock l(&mu_);
  std::string hash;
  const std::string line = AuditLine(record, now, head_, &hash);
  absl::Status s = file_->Append(line);
  if (s.ok()) s = file_->Sync();
  if (!s.ok()) {
    // No torn record left for the next one to follow.
    if (absl::Status cut = file_->Truncate(size_); !cut.ok()) {
      s = absl::InternalError(
          absl::StrCat(s.message(), "; and cannot cut the torn record off: ", cut.message()));
    }
    return absl::UnavailableError(
        absl::StrCat("audit log ", path_, ": cannot append: ", s.message()));
  }
  size_ += line.size();
  ++head_.seq;
  head_.hash = std::move(hash);
  return absl::OkStatus();
}

AuditHead AuditLog::head() const {
  absl::MutexLock l(&mu_);
  return head_;
}

}  // namespace strata::storage
