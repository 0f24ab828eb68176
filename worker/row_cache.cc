#include "worker/row_cache.h"

#include <cstring>
#include <utility>

namespace strata::worker {

RowCache::RowCache(int64_t capacity, int staleness_steps, std::vector<int> dims)
    : capacity_(capacity > 0 ? static_cast<size_t>(capacity) : 0),
      staleness_(staleness_steps > 0 ? static_cast<uint64_t>(staleness_steps) : 0),
      dims_(std::move(dims)),
      slot_rows_(dims_.size()) {}

size_t RowCache::Lookup(const std::vector<uint64_t>& keys, uint64_t now,
                        const std::vector<float*>& rows, std::vector<uint8_t>* hit) {
  hit->assign(keys.size(), 0);
  size_t n = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto it = index_.find(keys[i]);
    if (it == index_.end() || slot_step_[it->second] + staleness_ < now) continue;
    const uint32_t s = it->second;
    for (size_t t = 0; t < dims_.size(); ++t) {
      std::memcpy(rows[t] + i * dims_[t], slot_rows_[t].data() + static_cast<size_t>(s) * dims_[t],
                  sizeof(float) * dims_[t]);
    }
    (*hit)[i] = 1;
    ++n;
  }
  hits_ += n;
  misses_ += keys.size() - n;
  return n;
}

void RowCache::DropStale(uint64_t now) {
  for (auto it = index_.begin(); it != index_.end();) {
    const uint32_t s = it->second;
    if (slot_step_[s] + staleness_ < now) {
      free_.push_back(s);
      index_.erase(it++);
    } else {
      ++it;
    }
  }
}

void RowCache::Insert(const uint64_t* keys, size_t n, const std::vector<const float*>& rows,
                      uint64_t now) {
  if (capacity_ == 0) return;
  for (size_t i = 0; i < n; ++i) {
    uint32_t s;
    auto it = index_.find(keys[i]);
    if (it != index_.end()) {
      s = it->second;
    } else {
      if (index_.size() >= capacity_) {
        // At most one sweep a step: a cache full of fresh rows stays as is.
        if (last_sweep_ == now) return;
        last_sweep_ = now;
        DropStale(now);
        if (index_.size() >= capacity_) return;
      }
      if (!free_.empty()) {
        s = free_.back();
        free_.pop_back();
      } else {
        s = static_cast<uint32_t>(slot_step_.size());
        slot_step_.push_back(0);
        for (size_t t = 0; t < dims_.size(); ++t)
          slot_rows_[t].resize(slot_rows_[t].size() + dims_[t]);
      }
      index_.emplace(keys[i], s);
    }
    slot_step_[s] = now;
    for (size_t t = 0; t < dims_.size(); ++t) {
      std::memcpy(slot_rows_[t].data() + static_cast<size_t>(s) * dims_[t], rows[t] + i * dims_[t],
                  sizeof(float) * dims_[t]);
    }
  }
}

}  // namespace strata::worker
