#include "common/failpoint.h"

#include <signal.h>
#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "glog/logging.h"

namespace strata {

absl::StatusOr<std::unique_ptr<Failpoints>> Failpoints::Parse(const std::string& spec) {
  std::unique_ptr<Failpoints> f(new Failpoints());
  for (absl::string_view item : absl::StrSplit(spec, ',', absl::SkipEmpty())) {
    if (absl::StrContains(item, '~')) {
      std::pair<absl::string_view, absl::string_view> d = absl::StrSplit(item, '~');
      int ms = 0;
      if (d.first.empty() || !absl::SimpleAtoi(d.second, &ms) || ms < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("--failpoint: '", item, "' is not NAME~MS (a delay, MS >= 0)"));
      }
      f->delay_ms_[std::string(d.first)] = ms;
      continue;
    }
    std::pair<absl::string_view, absl::string_view> parts = absl::StrSplit(item, '@');
    int count = 1;
    if (parts.first.empty() ||
        (!parts.second.empty() && (!absl::SimpleAtoi(parts.second, &count) || count < 1))) {
      return absl::InvalidArgumentError(
          absl::StrCat("--failpoint: '", item, "' is not NAME or NAME@N (N >= 1)"));
    }
    f->left_[std::string(parts.first)] = std::make_unique<std::atomic<int>>(count);
  }
  return f;
}

absl::Duration Failpoints::Delay(absl::string_view name) const {
  auto d = delay_ms_.find(name);
  return d == delay_ms_.end() ? absl::ZeroDuration() : absl::Milliseconds(d->second);
}

void Failpoints::Hit(absl::string_view name) const {
  if (auto d = delay_ms_.find(name); d != delay_ms_.end()) {
    LOG(WARNING) << "failpoint " << name << ": holding for " << d->second << " ms";
    absl::SleepFor(absl::Milliseconds(d->second));
    return;
  }
  auto it = left_.find(name);
  if (it == left_.end()) return;
  if (it->second->fetch_sub(1) != 1) return;
  LOG(ERROR) << "failpoint " << name << ": killing this process (SIGKILL)";
  google::FlushLogFiles(google::GLOG_INFO);
  kill(getpid(), SIGKILL);
  pause();
}

}  // namespace strata
