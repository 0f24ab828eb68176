#include "common/failpoint.h"

#include <signal.h>
#include <unistd.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "glog/logging.h"

namespace strata {

absl::StatusOr<std::unique_ptr<Failpoints>> Failpoints::Parse(const std::string& spec) {
  std::unique_ptr<Failpoints> f(new Failpoints());
  for (absl::string_view item : absl::StrSplit(spec, ',', absl::SkipEmpty())) {
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

void Failpoints::Hit(absl::string_view name) const {
  auto it = left_.find(name);
  if (it == left_.end()) return;
  if (it->second->fetch_sub(1) != 1) return;
  LOG(ERROR) << "failpoint " << name << ": killing this process (SIGKILL)";
  google::FlushLogFiles(google::GLOG_INFO);
  kill(getpid(), SIGKILL);
  pause();
}

}  // namespace strata
