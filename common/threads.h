// Starting helper threads without dying of it. std::thread's constructor
// throws std::system_error when the system will not make another thread
// (EAGAIN at a pid or memory limit); uncaught, that ends the daemon. These
// return false instead, logged, and the caller does the work itself.
#ifndef STRATA_COMMON_THREADS_H_
#define STRATA_COMMON_THREADS_H_

#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "glog/logging.h"

namespace strata {

// Appends a thread running `fn` to *threads; false when none could start.
template <typename Fn>
bool TryAddThread(std::vector<std::thread>* threads, Fn&& fn) {
  try {
    threads->emplace_back(std::forward<Fn>(fn));
    return true;
  } catch (const std::system_error& e) {
    LOG_EVERY_N(WARNING, 100) << "cannot start a helper thread (" << e.what()
                              << "); doing its work on the calling thread";
    return false;
  }
}

// *thread = a thread running `fn`; false when it could not start.
template <typename Fn>
bool TryStartThread(std::thread* thread, Fn&& fn) {
  try {
    *thread = std::thread(std::forward<Fn>(fn));
    return true;
  } catch (const std::system_error& e) {
    LOG_EVERY_N(WARNING, 100) << "cannot start a helper thread (" << e.what()
                              << "); doing its work on the calling thread";
    return false;
  }
}

}  // namespace strata

#endif  // STRATA_COMMON_THREADS_H_
