#include "common/sharded_executor.h"

#include <atomic>
#include <map>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(ShardedExecutorTest, SameKeyRunsInPostedOrderOnOneThread) {
  ShardedExecutor ex(3);
  absl::Mutex mu;
  std::map<size_t, std::vector<int>> seen;
  std::map<size_t, std::thread::id> thread_of;
  bool same_thread = true;
  for (int i = 0; i < 3000; ++i) {
    const size_t key = i % 7;
    ex.Post(key, [&, key, i] {
      absl::MutexLock l(&mu);
      seen[key].push_back(i);
      auto [it, fresh] = thread_of.emplace(key, std::this_thread::get_id());
      if (!fresh && it->second != std::this_thread::get_id()) same_thread = false;
    });
  }
  ex.Shutdown();  // drains
  EXPECT_TRUE(same_thread);
  for (const auto& [key, v] : seen) {
    ASSERT_EQ(v.size(), 3000u / 7 + (key < 3000 % 7 ? 1 : 0));
    for (size_t j = 1; j < v.size(); ++j) EXPECT_LT(v[j - 1], v[j]) << "key " << key;
  }
}

TEST(ShardedExecutorTest, DifferentKeysRunInParallel) {
  ShardedExecutor ex(2);
  std::atomic<int> running{0}, peak{0};
  for (int k = 0; k < 2; ++k) {
    ex.Post(k, [&] {
      const int now = ++running;
      int p = peak.load();
      while (now > p && !peak.compare_exchange_weak(p, now)) {
      }
      const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
      while (std::chrono::steady_clock::now() < end && peak.load() < 2) {
      }
      --running;
    });
  }
  ex.Shutdown();
  EXPECT_EQ(peak.load(), 2);
}

TEST(ShardedExecutorTest, PostAfterShutdownRunsInline) {
  ShardedExecutor ex(1);
  ex.Shutdown();
  bool ran = false;
  ex.Post(0, [&] { ran = true; });
  EXPECT_TRUE(ran);
}

}  // namespace
}  // namespace strata
