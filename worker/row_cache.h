// The worker's cache of pulled sparse rows (config sparse.cache): a row
// pulled at step s is used again, without a pull, up to step
// s + staleness_steps, so the hot keys of a power-law workload are pulled
// once every few steps instead of every step. Gradients of cached rows are
// still pushed every step: the staleness is bounded, nothing is lost.
#ifndef STRATA_WORKER_ROW_CACHE_H_
#define STRATA_WORKER_ROW_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace strata::worker {

// Not thread-safe: the training thread owns it.
class RowCache {
 public:
  // Caches up to `capacity` keys, each with one row per table of the given
  // widths (the wide part's weight and the embedding: {1, dim}).
  RowCache(int64_t capacity, int staleness_steps, std::vector<int> dims);
  RowCache(const RowCache&) = delete;
  RowCache& operator=(const RowCache&) = delete;

  // For each keys[i] cached at a step >= now - staleness: copies its rows
  // into rows[t] + i * dims[t] and sets (*hit)[i] = 1 (else 0). Returns the
  // number of hits.
  size_t Lookup(const std::vector<uint64_t>& keys, uint64_t now, const std::vector<float*>& rows,
                std::vector<uint8_t>* hit);
  // Stores the rows of keys[0..n) (rows[t] + i * dims[t]) pulled at step
  // `now`. When full, first drops what went stale; keys that still do not
  // fit are not cached.
  void Insert(const uint64_t* keys, size_t n, const std::vector<const float*>& rows, uint64_t now);

  size_t size() const { return index_.size(); }
  uint64_t hits() const { return hits_; }
  uint64_t misses() const { return misses_; }

 private:
  void DropStale(uint64_t now);

  const size_t capacity_;
  const uint64_t staleness_;
  const std::vector<int> dims_;
  absl::flat_hash_map<uint64_t, uint32_t> index_;  // key -> slot
  std::vector<uint64_t> slot_step_;
  std::vector<std::vector<float>> slot_rows_;  // per table, slot-major
  std::vector<uint32_t> free_;
  uint64_t last_sweep_ = UINT64_MAX;
  uint64_t hits_ = 0, misses_ = 0;
};

}  // namespace strata::worker

#endif  // STRATA_WORKER_ROW_CACHE_H_
