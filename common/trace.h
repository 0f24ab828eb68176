// Chrome trace-event JSON (the format chrome://tracing and Perfetto open),
// written as it happens: the "JSON Array Format", one event a line, so a
// trace cut short by a crash still loads. Timestamps are microseconds since
// the Unix epoch: traces of several processes line up when merged.
#ifndef STRATA_COMMON_TRACE_H_
#define STRATA_COMMON_TRACE_H_

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace strata {

// Thread-safe.
class TraceWriter {
 public:
  // Creates (truncates) `path`; `pid` and `process_name` name the process
  // in the viewer.
  static absl::StatusOr<std::unique_ptr<TraceWriter>> Open(const std::string& path, int pid,
                                                           const std::string& process_name);
  ~TraceWriter();  // Close()
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  // Names lane `tid` of this process.
  void ThreadName(int tid, absl::string_view name);
  // A complete event ("ph": "X") from `start` to `end`. `args_json`: the
  // members of its args object, e.g. "\"bytes\": 4096" (may be empty).
  void Span(absl::string_view name, absl::string_view category, int tid, absl::Time start,
            absl::Time end, absl::string_view args_json = "");
  // Events while disabled are dropped (a trace of the first N steps).
  void set_enabled(bool on) { enabled_.store(on, std::memory_order_relaxed); }
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  // Ends the array and closes the file; later events are dropped. The
  // first write error, if any.
  absl::Status Close();
  const std::string& path() const { return path_; }

 private:
  TraceWriter(std::string path, std::FILE* f, int pid);
  void WriteLocked(const std::string& event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const int pid_;
  std::atomic<bool> enabled_{true};
  absl::Mutex mu_;
  std::FILE* f_ ABSL_GUARDED_BY(mu_);
  bool first_ ABSL_GUARDED_BY(mu_) = true;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata

#endif  // STRATA_COMMON_TRACE_H_
