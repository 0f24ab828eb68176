// A pserver::ReplicaSink for tests: the replication records a primary
// partition sends are kept, for the test to hand to its backups.
#ifndef STRATA_TESTS_TESTING_QUEUE_SINK_H_
#define STRATA_TESTS_TESTING_QUEUE_SINK_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "pserver/partition.h"
#include "transport/message.h"

namespace strata::testing {

// Keeps every record sent, stamped with the primary's node id `sender`
// (as the pserver stamps it). Thread-safe.
class QueueSink : public pserver::ReplicaSink {
 public:
  explicit QueueSink(uint32_t sender = 1) : sender_(sender) {}
  void Send(pserver::Partition*, uint32_t backup, transport::Message record) override {
    record.header.sender_id = sender_;
    absl::MutexLock l(&mu_);
    records_.emplace_back(backup, std::move(record));
  }
  // The records sent since the last Take, with the backup each is for.
  std::vector<std::pair<uint32_t, transport::Message>> Take() {
    absl::MutexLock l(&mu_);
    std::vector<std::pair<uint32_t, transport::Message>> r;
    r.swap(records_);
    return r;
  }

 private:
  const uint32_t sender_;
  absl::Mutex mu_;
  std::vector<std::pair<uint32_t, transport::Message>> records_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_QUEUE_SINK_H_
