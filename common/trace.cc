#include "common/trace.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/json.h"

namespace strata {

namespace {
std::string JsonQuote(absl::string_view s) { return absl::StrCat("\"", JsonEscape(s), "\""); }
}  // namespace

absl::StatusOr<std::unique_ptr<TraceWriter>> TraceWriter::Open(const std::string& path, int pid,
                                                               const std::string& process_name) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    return absl::PermissionDeniedError(
        absl::StrCat("trace file ", path, ": cannot create it (", std::strerror(errno), ")"));
  }
  std::unique_ptr<TraceWriter> w(new TraceWriter(path, f, pid));
  {
    absl::MutexLock l(&w->mu_);
    w->WriteLocked(absl::StrFormat(
        "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": %s}}", pid,
        JsonQuote(process_name)));
  }
  return w;
}

TraceWriter::TraceWriter(std::string path, std::FILE* f, int pid)
    : path_(std::move(path)), pid_(pid), f_(f) {}

TraceWriter::~TraceWriter() { Close().IgnoreError(); }

void TraceWriter::WriteLocked(const std::string& event) {
  if (f_ == nullptr) return;
  const std::string line = absl::StrCat(first_ ? "[\n" : ",\n", event);
  first_ = false;
  if (std::fwrite(line.data(), 1, line.size(), f_) != line.size() && error_.ok()) {
    error_ = absl::DataLossError(
        absl::StrCat("trace file ", path_, ": write failed (", std::strerror(errno), ")"));
  }
}

void TraceWriter::ThreadName(int tid, absl::string_view name) {
  absl::MutexLock l(&mu_);
  WriteLocked(absl::StrFormat(
      "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, \"args\": {\"name\": "
      "%s}}",
      pid_, tid, JsonQuote(name)));
}

void TraceWriter::Span(absl::string_view name, absl::string_view category, int tid,
                       absl::Time start, absl::Time end, absl::string_view args_json) {
  if (!enabled()) return;
  const int64_t ts = absl::ToUnixMicros(start);
  const int64_t dur = std::max<int64_t>(0, absl::ToInt64Microseconds(end - start));
  std::string event = absl::StrFormat(
      "{\"name\": %s, \"cat\": %s, \"ph\": \"X\", \"ts\": %d, \"dur\": %d, \"pid\": %d, "
      "\"tid\": %d",
      JsonQuote(name), JsonQuote(category), ts, dur, pid_, tid);
  if (!args_json.empty()) absl::StrAppend(&event, ", \"args\": {", args_json, "}");
  event += "}";
  absl::MutexLock l(&mu_);
  WriteLocked(event);
}

absl::Status TraceWriter::Close() {
  absl::MutexLock l(&mu_);
  if (f_ == nullptr) return error_;
  const char* tail = first_ ? "[]\n" : "\n]\n";
  if (std::fputs(tail, f_) < 0 && error_.ok()) {
    error_ = absl::DataLossError(absl::StrCat("trace file ", path_, ": write failed"));
  }
  if (std::fclose(f_) != 0 && error_.ok()) {
    error_ = absl::DataLossError(
        absl::StrCat("trace file ", path_, ": close failed (", std::strerror(errno), ")"));
  }
  f_ = nullptr;
  return error_;
}

}  // namespace strata
