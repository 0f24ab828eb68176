#include "common/sharded_executor.h"

#include <algorithm>

namespace strata {

ShardedExecutor::ShardedExecutor(int threads) {
  for (int i = 0; i < std::max(1, threads); ++i) {
    shards_.push_back(std::make_unique<Shard>());
  }
  for (auto& s : shards_) {
    Shard* shard = s.get();
    shard->thread = std::thread([shard] { Loop(shard); });
  }
}

ShardedExecutor::~ShardedExecutor() { Shutdown(); }

void ShardedExecutor::Post(size_t key, std::function<void()> fn) {
  Shard* shard = shards_[key % shards_.size()].get();
  {
    absl::MutexLock l(&shard->mu);
    if (!shard->stop) {
      shard->queue.push_back(std::move(fn));
      return;
    }
  }
  fn();
}

void ShardedExecutor::Loop(Shard* shard) {
  while (true) {
    std::function<void()> fn;
    {
      absl::MutexLock l(&shard->mu);
      auto ready = [shard]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard->mu) {
        return !shard->queue.empty() || shard->stop;
      };
      shard->mu.Await(absl::Condition(&ready));
      if (shard->queue.empty()) return;  // stopped and drained
      fn = std::move(shard->queue.front());
      shard->queue.pop_front();
    }
    fn();
  }
}

void ShardedExecutor::Shutdown() {
  for (auto& s : shards_) {
    absl::MutexLock l(&s->mu);
    s->stop = true;
  }
  for (auto& s : shards_) {
    if (s->thread.joinable()) s->thread.join();
  }
}

}  // namespace strata
