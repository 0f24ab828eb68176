// `strata scale` and the autoscaler (MasterServer's, in their own file): a
// scale planned by the scaler against the view, the workers it removes
// drained, the provider started for those it adds (master/scaler.h,
// master/autoscaler.h; docs/operations.md, "Scaling").
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "master/master_server.h"

namespace strata::master {

absl::StatusOr<proto::ScaleResponse> MasterServer::Scale(const proto::ScaleRequest& req) {
  return Durably([&](uint64_t* ticket) -> absl::StatusOr<proto::ScaleResponse> {
    absl::MutexLock l(&mu_);
    auto r = ScaleLocked(req, req.reason().empty() ? "request" : req.reason());
    *ticket = PersistLocked();
    return r;
  });
}

absl::StatusOr<proto::ScaleResponse> MasterServer::ScaleLocked(const proto::ScaleRequest& req,
                                                               const std::string& why) {
  STRATA_ASSIGN_OR_RETURN(const Scaler::Plan plan,
                          scaler_.Prepare(req, nodes_.View(), job_.state()));
  proto::ScaleResponse resp;
  if (req.autoscale() != proto::ScaleRequest::AUTOSCALE_UNCHANGED) {
    scaler_.SetAutoscale(req.autoscale());
    job_.Event(absl::StrCat(scaler_.autoscaler().Describe(), " (", why, ")"), "autoscale");
  }
  if (plan.role == proto::PSERVER && !plan.drain.empty()) {
    // (Emptied by the moves first: drained by Migrate.)
    nodes_.MarkLeaving(plan.drain, absl::StrCat("scale in: ", why));
    for (uint32_t id : plan.drain) resp.add_draining(id);
  }
  for (uint32_t id : plan.role == proto::WORKER ? plan.drain : std::vector<uint32_t>{}) {
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
  if (!plan.add.empty() || !plan.drain.empty()) {
    job_.Event(absl::StrCat("scale (", why, "): ", plan.what), "scale");
  }
  proto::JobStatus js;
  scaler_.FillStatus(nodes_.View(), &js);
  resp.set_workers_target(js.workers_target());
  resp.set_pservers_target(js.pservers_target());
  std::string next = plan.what;
  if (!plan.add.empty()) {
    const bool ps = plan.role == proto::PSERVER;
    absl::StrAppend(&next,
                    scaler_.has_provider() ? "; the provider starts them"
                    : ps                   ? "; no provider: start them (strata-pserver --index N)"
                                           : "; no provider: start them (strata-worker --index N)",
                    ps ? ", then partitions move to them" : ", they join at a step boundary");
  }
  if (!plan.drain.empty()) {
    absl::StrAppend(&next, plan.role == proto::WORKER ? "; each leaves after its current data task"
                                                      : "; each exits once its partitions moved");
  }
  resp.set_message(next);
  return resp;
}

void MasterServer::ScaleTickLocked() {
  NodeManager::Migration moves;
  if (!job_.over()) {
    NodeManager::MigrateOptions o;
    o.rebalance = scaler_.scaling_pservers();
    o.max_moves = options_.config.elastic.max_moves;
    o.credit = scaler_.MoveCredit();
    o.hold_cutover = checkpoints_->writing();
    moves = nodes_.Migrate(o);
    view_pushes_.insert(moves.touched.begin(), moves.touched.end());
    scaler_.MovesStarted(moves.started_bytes);
    for (const NodeManager::Departure& d : moves.departed) DepartedLocked(d);
  }
  const proto::ClusterView view = nodes_.View();
  for (const Scaler::Ended& e : scaler_.Check(view, moves.in_progress + moves.waiting)) {
    job_.Event(e.message, e.kind.c_str());
  }
  // (The samples come from the whole status: only when the autoscaler
  // wants them.)
  if (!scaler_.autoscaler().enabled()) return;
  const std::optional<Autoscaler::Decision> d =
      scaler_.Autoscale(view, job_.state(), tasks_.pending(), JobStatusLocked().samples());
  if (!d.has_value()) return;
  if (d->delta == 0) {
    job_.Event(d->reason, "autoscale");
    return;
  }
  proto::ScaleRequest req;
  (d->role == proto::PSERVER ? req.mutable_pservers() : req.mutable_workers())->set_by(d->delta);
  if (absl::StatusOr<proto::ScaleResponse> r = ScaleLocked(req, d->reason); !r.ok()) {
    job_.Event(absl::StrCat(d->reason, "; refused: ", r.status().message()), "autoscale");
    scaler_.autoscaler().Refused();
  }
}

}  // namespace strata::master
