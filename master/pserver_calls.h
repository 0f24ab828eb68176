// What the master asks of its pservers over their admin service
// (proto::PServerAdmin): placement, versions, the update ledger, and the
// failure detector's probe. Each call is made without any of the master's
// locks held (the callers copy what they need out of their components
// first) and bounded by a deadline; a pserver that does not answer is an
// error naming its node, never an abort.
#ifndef STRATA_MASTER_PSERVER_CALLS_H_
#define STRATA_MASTER_PSERVER_CALLS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/checkpoint.pb.h"
#include "proto/strata.grpc.pb.h"

namespace strata::master {

// A pserver the master calls: its node id and its stub (which lives as
// long as the master).
using PServerTarget = std::pair<uint32_t, proto::PServerAdmin::Stub*>;

// Sends each pserver of `targets` its partitions of `view`
// (AssignPartitions), with `restore` (a checkpoint's partition chains,
// under `root`) when the job resumes; `loaded` is called as each pserver
// that restores has loaded its partitions. OK once all accepted;
// UNAVAILABLE (naming the pserver) to try again later; FailedPrecondition
// when a pserver cannot restore the checkpoint (the job cannot go on).
absl::Status SendPlacement(const proto::ClusterView& view,
                           const std::vector<PServerTarget>& targets,
                           const proto::CheckpointManifest* restore, const std::string& root,
                           const std::function<void()>& loaded);

// Sends each of `targets` the view now (AssignPartitions; a pserver
// ignores a view older than its own), each call within `deadline`: those
// a move involves take it a round trip after it changed, not at their next
// heartbeat. Failures are logged (the heartbeat brings it all the same).
// Returns the targets that applied it (a pserver answers once it has).
std::vector<uint32_t> PushView(const proto::ClusterView& view,
                               const std::vector<PServerTarget>& targets, absl::Duration deadline);

// The newest partition version of those pservers now (bsp: the step).
absl::StatusOr<uint64_t> NewestPartitionVersion(const std::vector<PServerTarget>& targets);

// The update ledger: for each partition, the updates applied per sender,
// as its primary counts them (`owner`: partition → its primary's node id;
// a backup's copy is not counted). An error when a pserver does not
// answer within 2 s, or when a partition's bsp step is still open (its
// acknowledged pushes are not counted yet).
using Ledger = std::map<uint32_t, std::map<uint32_t, uint64_t>>;
absl::StatusOr<Ledger> ReadLedger(const std::vector<PServerTarget>& targets,
                                  const std::map<uint32_t, uint32_t>& owner);

// The failure detector's probe: OK when the pserver answers a status
// request within `deadline`.
absl::Status ProbePServer(const PServerTarget& target, absl::Duration deadline);

}  // namespace strata::master

#endif  // STRATA_MASTER_PSERVER_CALLS_H_
