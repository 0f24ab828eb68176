// For tests of what happens when the locked-memory limit is too low for
// ibv_reg_mr: lowers RLIMIT_MEMLOCK and drops CAP_IPC_LOCK from the
// effective set (root ignores the limit otherwise) for the life of the
// object, then puts both back.
#ifndef STRATA_TESTS_TESTING_LOW_MEMLOCK_H_
#define STRATA_TESTS_TESTING_LOW_MEMLOCK_H_

#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

namespace strata::testing {

class LowMemlockLimit {
 public:
  explicit LowMemlockLimit(uint64_t bytes) {
    if (getrlimit(RLIMIT_MEMLOCK, &old_) != 0 || !SetIpcLock(false)) return;
    rlimit low = old_;
    low.rlim_cur = bytes;
    ok_ = setrlimit(RLIMIT_MEMLOCK, &low) == 0;
  }
  ~LowMemlockLimit() {
    setrlimit(RLIMIT_MEMLOCK, &old_);
    SetIpcLock(true);
  }
  LowMemlockLimit(const LowMemlockLimit&) = delete;
  LowMemlockLimit& operator=(const LowMemlockLimit&) = delete;

  // False when the limit could not be lowered (the test cannot run).
  bool ok() const { return ok_; }

 private:
  static bool SetIpcLock(bool on) {
    __user_cap_header_struct h{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct d[2]{};
    if (syscall(SYS_capget, &h, d) != 0) return false;
    const uint32_t bit = 1u << (CAP_IPC_LOCK % 32);
    if (on) {
      d[CAP_IPC_LOCK / 32].effective |= bit;
    } else {
      d[CAP_IPC_LOCK / 32].effective &= ~bit;
    }
    return syscall(SYS_capset, &h, d) == 0;
  }

  rlimit old_{};
  bool ok_ = false;
};

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_LOW_MEMLOCK_H_
