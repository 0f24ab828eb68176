#include "master/pserver_calls.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace strata::master {
namespace {

absl::Status Status(const PServerTarget& target, absl::Duration deadline,
                    proto::PServerStatusResponse* resp) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  return FromGrpcStatus(target.second->GetStatus(&ctx, proto::PServerStatusRequest(), resp),
                        absl::StrCat("pserver node ", target.first));
}

}  // namespace

absl::Status SendPlacement(const proto::ClusterView& view,
                           const std::vector<PServerTarget>& targets,
                           const proto::CheckpointManifest* restore, const std::string& root,
                           const std::function<void()>& loaded) {
  for (const auto& [id, stub] : targets) {
    proto::AssignPartitionsRequest req;
    *req.mutable_view() = view;
    req.set_node_id(id);
    if (restore != nullptr) {
      *req.mutable_restore() = *restore;
      req.set_checkpoint_root(root);
    }
    proto::AssignPartitionsResponse resp;
    grpc::ClientContext ctx;
    // Loading a checkpoint takes as long as reading it.
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(restore ? 600 : 10)));
    grpc::Status s = stub->AssignPartitions(&ctx, req, &resp);
    if (!s.ok() && restore != nullptr && s.error_code() != grpc::StatusCode::UNAVAILABLE &&
        s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
      return absl::FailedPreconditionError(absl::StrCat("pserver node ", id,
                                                        " cannot restore checkpoint ",
                                                        restore->seq(), ": ", s.error_message()));
    }
    if (!s.ok()) {
      return absl::UnavailableError(
          absl::StrCat("AssignPartitions to pserver node ", id, " failed: ", s.error_message()));
    }
    if (restore != nullptr) loaded();
  }
  return absl::OkStatus();
}

std::vector<uint32_t> PushView(const proto::ClusterView& view,
                               const std::vector<PServerTarget>& targets, absl::Duration deadline) {
  // All at once: a source making a copy for its next move does not hold
  // up the target of the last one.
  std::vector<std::thread> calls;
  std::vector<char> applied(targets.size(), 0);  // (a slot per call)
  for (size_t i = 0; i < targets.size(); ++i) {
    calls.emplace_back([&view, deadline, target = targets[i], done = &applied[i]] {
      const auto& [id, stub] = target;
      proto::AssignPartitionsRequest req;
      *req.mutable_view() = view;
      req.set_node_id(id);
      proto::AssignPartitionsResponse resp;
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
      const grpc::Status s = stub->AssignPartitions(&ctx, req, &resp);
      if (!s.ok()) {
        LOG(WARNING) << "view epoch " << view.epoch() << " to pserver node " << id << ": "
                     << s.error_message() << " (its heartbeat brings it)";
      }
      *done = s.ok();
    });
  }
  for (std::thread& t : calls) t.join();
  std::vector<uint32_t> out;
  for (size_t i = 0; i < targets.size(); ++i) {
    if (applied[i]) out.push_back(targets[i].first);
  }
  return out;
}

absl::StatusOr<uint64_t> NewestPartitionVersion(const std::vector<PServerTarget>& targets) {
  uint64_t newest = 0;
  for (const PServerTarget& t : targets) {
    proto::PServerStatusResponse st;
    STRATA_RETURN_IF_ERROR(Status(t, absl::Seconds(10), &st));
    for (const auto& p : st.partitions()) newest = std::max(newest, p.version());
  }
  return newest;
}

absl::StatusOr<Ledger> ReadLedger(const std::vector<PServerTarget>& targets,
                                  const std::map<uint32_t, uint32_t>& owner) {
  Ledger applied;
  for (const PServerTarget& t : targets) {
    proto::PServerStatusResponse resp;
    STRATA_RETURN_IF_ERROR(Status(t, absl::Seconds(2), &resp));
    for (const auto& ps : resp.partitions()) {
      auto it = owner.find(ps.id());
      if (it == owner.end() || it->second != t.first) continue;  // a backup's copy
      // A bsp step still open holds acknowledged pushes its counts do not
      // show yet (the pserver has not learnt that a worker left the step
      // set): read again later.
      if (ps.open_chunks() > 0) {
        return absl::UnavailableError(absl::StrCat("partition ", ps.id(), " on node ", t.first,
                                                   " has a step in progress (", ps.open_chunks(),
                                                   " chunk(s)): its pushes are not applied yet"));
      }
      for (const auto& [sender, n] : ps.applied_by_sender()) applied[ps.id()][sender] = n;
    }
  }
  return applied;
}

absl::Status ProbePServer(const PServerTarget& target, absl::Duration deadline) {
  proto::PServerStatusResponse resp;
  return Status(target, deadline, &resp);
}

}  // namespace strata::master
