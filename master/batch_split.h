// job.batch_split by_speed (docs/consistency.md, "Heterogeneous
// workers"): the global batch of a step split over the training workers in
// proportion to their measured compute speed, so that in bsp a CPU worker
// beside GPU workers (or a slowed one) computes its share in the time the
// others compute theirs, and nobody waits. The speeds are re-measured from
// the workers' progress reports as the job goes; a split is remade when the
// workers change or a speed drifts from the one it was made with.
//
// Not thread-safe: the master calls it under its lock.
#ifndef STRATA_MASTER_BATCH_SPLIT_H_
#define STRATA_MASTER_BATCH_SPLIT_H_

#include <cstdint>
#include <map>
#include <vector>

#include "absl/time/time.h"

namespace strata::master {

class BatchSplitter {
 public:
  struct Options {
    // A speed drifting by more than this fraction from the one the split
    // was made with remakes it.
    double drift = 0.15;
    // Seconds of compute a speed sample spans at least.
    double window_seconds = 0.5;
    // A drift remakes the split at most this often (a change of the
    // workers at once): each new split reaches the workers one lease at a
    // time, and until all have it a step's batch is off the global one.
    absl::Duration min_interval = absl::Seconds(10);
  };
  BatchSplitter() : BatchSplitter(Options{}) {}
  explicit BatchSplitter(Options options) : options_(options) {}

  // A worker's progress report: samples trained and seconds spent
  // computing (its training time less its waits on pushes and pulls), both
  // counted from its start.
  void Observe(uint32_t node, uint64_t samples, double compute_seconds);
  // Forgets a worker that left.
  void Forget(uint32_t node);

  // The split of `global` records over `workers` (distinct node ids, in a
  // stable order): shares in proportion to the workers' speeds (the mean
  // speed for one not measured yet), each at least 1 when global allows,
  // summing to global. Remade when the workers or global changed, or a
  // speed drifted and the split is min_interval old at `now`; *remade
  // says whether it was.
  const std::map<uint32_t, int64_t>& Split(int64_t global, const std::vector<uint32_t>& workers,
                                           absl::Time now, bool* remade);
  // A worker's measured speed (samples per second of compute), 0 when not
  // measured yet.
  double SpeedOf(uint32_t node) const;

 private:
  struct Speed {
    uint64_t samples = 0;  // at the last sample's start
    double compute = 0;
    double rate = 0;  // smoothed; 0 until the first window
  };
  bool SpeedDrifted(const std::vector<uint32_t>& workers) const;

  const Options options_;
  std::map<uint32_t, Speed> speeds_;
  // The split now, and what it was made from.
  std::map<uint32_t, int64_t> split_;
  std::vector<uint32_t> split_workers_;
  int64_t split_global_ = -1;
  absl::Time made_at_ = absl::InfinitePast();
  std::map<uint32_t, double> split_rates_;
};

}  // namespace strata::master

#endif  // STRATA_MASTER_BATCH_SPLIT_H_
