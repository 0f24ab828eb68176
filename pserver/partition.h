// One parameter partition on a pserver: values, optimizer state, BSP
// aggregation, waiting pulls and push de-duplication.
#ifndef STRATA_PSERVER_PARTITION_H_
#define STRATA_PSERVER_PARTITION_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/config.h"
#include "common/optimizer.h"
#include "transport/transport.h"

namespace strata::pserver {

struct PartitionStats {
  uint64_t version = 0;
  uint64_t pushes_applied = 0;    // gradients accepted (each counted once)
  uint64_t updates_applied = 0;   // optimizer steps
  uint64_t duplicate_pushes = 0;  // (worker, seq) seen before: acked, not applied
  uint64_t rejected_pushes = 0;   // stale step, bad size, ...
  uint64_t pulls_served = 0;
};

// Thread-safe: any transport thread may call Pull/Push concurrently.
// Responses are sent while the partition lock is held: pull responses go
// out straight from the values (no copy), which must not change meanwhile.
class Partition {
 public:
  // `values` are the initial parameters (moved in); `optimizer` owned.
  Partition(uint32_t id, std::string table, std::vector<float> values,
            std::unique_ptr<Optimizer> optimizer, Consistency consistency);
  Partition(const Partition&) = delete;
  Partition& operator=(const Partition&) = delete;

  // kPullRequest: answers with the values once version >= header.version
  // (BSP); ASP answers at once.
  void Pull(const transport::Message& request,
            std::shared_ptr<transport::Responder> responder);
  // kPushRequest: payload is the gradient summed over header.count samples
  // for step header.version. Applied at most once per (sender, seq). BSP:
  // accumulated until every worker of the step set has pushed, then averaged
  // over all samples and applied once; ASP: averaged and applied at once.
  void Push(const transport::Message& request,
            std::shared_ptr<transport::Responder> responder);

  // The workers a BSP step waits for (live, training workers of the current
  // view). Completes the pending step if everyone left in it has pushed.
  void SetStepWorkers(const std::set<uint32_t>& workers);

  uint32_t id() const { return id_; }
  const std::string& table() const { return table_; }
  uint64_t length() const { return length_; }
  PartitionStats stats() const;
  // A copy of the current values.
  std::vector<float> ValuesForTesting() const;

 private:
  using Reply = std::pair<std::shared_ptr<transport::Responder>, transport::Message>;
  void MaybeCompleteStepLocked(std::vector<Reply>* replies)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyLocked(const float* grad_sum, double count)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  transport::Message PullResponseLocked(const transport::MessageHeader& req) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Called with mu_ held (pull responses borrow values_).
  static void Send(std::vector<Reply>* replies);

  const uint32_t id_;
  const std::string table_;
  const uint64_t length_;
  const Consistency consistency_;

  mutable absl::Mutex mu_;
  std::vector<float> values_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Optimizer> optimizer_ ABSL_GUARDED_BY(mu_);
  std::vector<float> grad_sum_ ABSL_GUARDED_BY(mu_);  // BSP step accumulator
  double count_sum_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<uint32_t> contributors_ ABSL_GUARDED_BY(mu_);
  std::set<uint32_t> step_workers_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, uint64_t> last_seq_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<transport::MessageHeader, std::shared_ptr<transport::Responder>>>
      waiting_pulls_ ABSL_GUARDED_BY(mu_);
  PartitionStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata::pserver

#endif  // STRATA_PSERVER_PARTITION_H_
