// A fixed set of threads, each with its own FIFO queue; work posted with the
// same key always runs on the same thread, in the order posted. The pserver
// uses it to apply different partitions in parallel while keeping each
// partition's requests in arrival order.
#ifndef STRATA_COMMON_SHARDED_EXECUTOR_H_
#define STRATA_COMMON_SHARDED_EXECUTOR_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace strata {

// Thread-safe. Shutdown() runs what is queued, then joins; work posted after
// it runs inline on the poster's thread.
class ShardedExecutor {
 public:
  explicit ShardedExecutor(int threads);
  ~ShardedExecutor();  // Shutdown()
  ShardedExecutor(const ShardedExecutor&) = delete;
  ShardedExecutor& operator=(const ShardedExecutor&) = delete;

  void Post(size_t key, std::function<void()> fn);
  void Shutdown();
  int threads() const { return static_cast<int>(shards_.size()); }

 private:
  struct Shard {
    absl::Mutex mu;
    std::deque<std::function<void()>> queue ABSL_GUARDED_BY(mu);
    bool stop ABSL_GUARDED_BY(mu) = false;
    std::thread thread;
  };
  static void Loop(Shard* shard);

  std::vector<std::unique_ptr<Shard>> shards_;
};

}  // namespace strata

#endif  // STRATA_COMMON_SHARDED_EXECUTOR_H_
