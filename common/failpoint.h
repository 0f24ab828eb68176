// Named places in the code where a test makes the process die at once, as a
// crash or the OOM killer would: `--failpoint NAME[@N]` on a daemon's
// command line (comma-separated for several) kills it with SIGKILL the N-th
// time (default: the first) execution passes NAME. tests/e2e uses them to
// crash daemons at every step of a checkpoint. `NAME~MS` instead holds
// every pass there for MS milliseconds (a slow disk or peer, so that a test
// can act while the process is in the middle of it).
#ifndef STRATA_COMMON_FAILPOINT_H_
#define STRATA_COMMON_FAILPOINT_H_

#include <atomic>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace strata {

// Thread-safe. Built in main() from the flag and handed to the daemon.
class Failpoints {
 public:
  // "a", "a@3", "a,b@2". InvalidArgument for an empty name or a bad count.
  static absl::StatusOr<std::unique_ptr<Failpoints>> Parse(const std::string& spec);
  Failpoints(const Failpoints&) = delete;
  Failpoints& operator=(const Failpoints&) = delete;

  // Kills this process (SIGKILL) when `name` is armed and this is its N-th
  // pass; sleeps when it is armed as a delay. Does nothing otherwise.
  void Hit(absl::string_view name) const;
  // How long `name` is armed to hold (zero when it is not a delay): for a
  // place that must not block its thread, which then holds the work
  // elsewhere (Hit would sleep on the spot).
  absl::Duration Delay(absl::string_view name) const;

 private:
  Failpoints() = default;
  std::map<std::string, std::unique_ptr<std::atomic<int>>, std::less<>> left_;
  std::map<std::string, int, std::less<>> delay_ms_;
};

// `failpoints` may be null (the usual case).
inline void HitFailpoint(const Failpoints* failpoints, absl::string_view name) {
  if (failpoints != nullptr) failpoints->Hit(name);
}

}  // namespace strata

#endif  // STRATA_COMMON_FAILPOINT_H_
