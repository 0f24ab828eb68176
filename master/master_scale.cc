// `strata scale` (MasterServer's, in its own file): a scale planned by the
// scaler against the view, the workers it removes drained, the provider
// started for those it adds (master/scaler.h; docs/operations.md).
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "master/master_server.h"

namespace strata::master {

absl::StatusOr<proto::ScaleResponse> MasterServer::Scale(const proto::ScaleRequest& req) {
  return Durably([&](uint64_t* ticket) -> absl::StatusOr<proto::ScaleResponse> {
    absl::MutexLock l(&mu_);
    STRATA_ASSIGN_OR_RETURN(const Scaler::Plan plan,
                            scaler_.Prepare(req, nodes_.View(), job_.state()));
    proto::ScaleResponse resp;
    const std::string why = req.reason().empty() ? "request" : req.reason();
    for (uint32_t id : plan.drain) {
      proto::DrainRequest d;
      d.set_node_id(id);
      d.set_reason(absl::StrCat("scale in: ", why));
      // (Prepare picked live workers that are not the last: not refused.)
      STRATA_ASSIGN_OR_RETURN(NodeManager::Drained drained,
                              nodes_.Drain(d, job_.state(), job_.evaluator()));
      if (drained.departure.has_value()) DepartedLocked(*drained.departure);
      resp.add_draining(id);
    }
    scaler_.Begin(plan);
    for (int32_t i : plan.add) resp.add_adding(i);
    const bool something = !plan.add.empty() || !plan.drain.empty();
    if (something) {
      job_.Event(absl::StrCat("scale (", why, "): ", plan.what), "scale");
      *ticket = PersistLocked();
    }
    proto::JobStatus js;
    scaler_.FillStatus(nodes_.View(), &js);
    resp.set_workers_target(js.workers_target());
    resp.set_pservers_target(js.pservers_target());
    std::string next = plan.what;
    if (!plan.add.empty()) {
      absl::StrAppend(&next, scaler_.has_provider()
                                 ? "; the provider starts them, they join at a step boundary"
                                 : "; no provider: start them (strata-worker --index N), they "
                                   "join at a step boundary");
    }
    if (!plan.drain.empty()) absl::StrAppend(&next, "; each leaves after its current data task");
    resp.set_message(next);
    return resp;
  });
}

}  // namespace strata::master
