// How a training set is cut into data tasks: record ranges of
// `task_records`, shuffled per epoch by the job seed. The master leases
// them; a worker training alone (--local) walks the same list, so both see
// the data in the same order.
#ifndef STRATA_COMMON_DATA_TASKS_H_
#define STRATA_COMMON_DATA_TASKS_H_

#include <cstdint>
#include <utility>
#include <vector>

namespace strata {

// [begin, end) ranges covering [0, records) once, in epoch `epoch`'s order.
// REQUIRES: task_records > 0.
std::vector<std::pair<int64_t, int64_t>> EpochTaskRanges(int64_t records, int64_t task_records,
                                                         uint64_t seed, int epoch);

}  // namespace strata

#endif  // STRATA_COMMON_DATA_TASKS_H_
