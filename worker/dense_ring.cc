#include "worker/dense_ring.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/aggregation.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace strata::worker {

DenseRing::DenseRing(DenseSync* sync, uint32_t node_id, std::vector<std::vector<float>>* tables,
                     std::vector<size_t> ring_tables, Hooks hooks, absl::Duration reform_timeout,
                     bool by_host)
    : sync_(sync),
      node_id_(node_id),
      ring_tables_(std::move(ring_tables)),
      hooks_(std::move(hooks)),
      reform_timeout_(reform_timeout),
      by_host_(by_host) {
  for (size_t t : ring_tables_) {
    if (sync_index_.size() <= t) sync_index_.resize(t + 1, -1);
    sync_index_[t] = static_cast<int>(params_.size());
    params_.push_back((*tables)[t].data());
    zeros_.emplace_back((*tables)[t].size(), 0.f);
  }
}

bool DenseRing::BeginStep(uint64_t samples) {
  if (!sync_->overlaps() || !in_ring_ || broken_ || sync_->over() || sync_->stepping()) {
    return false;
  }
  absl::Status started = sync_->StartStep(next_step_, samples, hooks_.epoch_seen(), Ask());
  if (!started.ok()) {
    VLOG(1) << "dense allreduce: step " << next_step_ << ": " << started;
    return false;
  }
  if (steps_overlapped_.fetch_add(1) == 0) {
    LOG(INFO) << "dense allreduce: steps overlap the backward pass (" << sync_->buckets()
              << " buckets a step)";
  }
  return true;
}

void DenseRing::GradsReady(size_t model_table, const float* grad, uint64_t end) {
  if (model_table < sync_index_.size() && sync_index_[model_table] >= 0) {
    sync_->GradsReady(static_cast<size_t>(sync_index_[model_table]), grad, end);
  }
}

void DenseRing::AbandonStep(const absl::Status& why) {
  if (!sync_->stepping()) return;
  LOG(WARNING) << "dense allreduce: step " << next_step_ << " abandoned: " << why;
  sync_->AbandonStep(why);
  broken_ = true;
  ++steps_failed_;
}

std::vector<uint64_t> DenseRing::BucketStarts(size_t model_table) const {
  if (model_table >= sync_index_.size() || sync_index_[model_table] < 0) return {};
  return sync_->BucketStarts(static_cast<size_t>(sync_index_[model_table]));
}

std::vector<DenseSync::Member> DenseRing::MembersOf(const proto::ClusterView& view, bool by_host) {
  std::set<uint32_t> leaders;
  if (by_host) {
    for (const auto& [host, id] : RingLeadersByHost(view)) leaders.insert(id);
  }
  std::vector<DenseSync::Member> members;
  for (const proto::NodeInfo& n : view.members()) {
    if (n.role() != proto::WORKER) continue;
    if (n.state() != proto::ALIVE && n.state() != proto::FINISHED) continue;
    if (by_host && leaders.count(n.id()) == 0) continue;
    members.push_back({n.id(), n.data_address()});
  }
  std::sort(
      members.begin(), members.end(),
      [](const DenseSync::Member& a, const DenseSync::Member& b) { return a.node_id < b.node_id; });
  return members;
}

bool DenseRing::FormOf(const proto::ClusterView& view) {
  const std::vector<DenseSync::Member> members = MembersOf(view, by_host_);
  std::vector<uint32_t> ids;
  for (const DenseSync::Member& m : members) ids.push_back(m.node_id);
  absl::StatusOr<DenseSync::Formed> formed = sync_->Form(view.epoch(), members, params_);
  checked_epoch_ = std::max(checked_epoch_, view.epoch());
  ended_ = false;  // (a Form cut short may have moved the state)
  if (!formed.ok() && sync_->over()) {
    broken_ = true;
    return false;
  }
  if (!formed.ok()) {
    LOG(WARNING) << "dense allreduce: forming the ring of view " << view.epoch() << " (nodes "
                 << absl::StrJoin(ids, ", ") << ") failed: " << formed.status();
    broken_ = true;
    return false;
  }
  members_ = std::move(ids);
  in_ring_ = true;
  broken_ = false;
  gave_up_ = false;
  next_step_ = formed->next_step;
  own_params_ = formed->own_params;
  ++rings_formed_;
  LOG(INFO) << "dense allreduce: ring of view " << view.epoch() << ": nodes "
            << absl::StrJoin(members_, ", ") << ", this one rank " << sync_->rank()
            << "; next step " << next_step_
            << (formed->lost_state == 0 ? ""
                : formed->state_checkpoint.has_value()
                    ? absl::StrCat("; ", formed->lost_state,
                                   " optimizer-state floats lost with their owner and replica, "
                                   "taken from checkpoint ",
                                   *formed->state_checkpoint)
                    : absl::StrCat("; ", formed->lost_state,
                                   " optimizer-state floats lost with their owner and replica, "
                                   "started again from zero (no checkpoint)"));
  return true;
}

absl::Status DenseRing::Join() {
  if (sync_->over()) {  // (no ring forms again)
    if (in_ring_ && (!broken_ || ended_)) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "dense allreduce: node ", node_id_,
        " holds no ring's parameters (it was in no ring when training ended, or its ring "
        "failed) and no ring forms now that training is over: it cannot evaluate the trained "
        "model"));
  }
  if (in_ring_ && !broken_) return absl::OkStatus();
  if (broken_) return Reform();
  absl::StatusOr<proto::ClusterView> view = hooks_.fetch_view();
  if (!view.ok()) return view.status();
  const std::vector<DenseSync::Member> members = MembersOf(*view, by_host_);
  if (std::none_of(members.begin(), members.end(),
                   [&](const DenseSync::Member& m) { return m.node_id == node_id_; })) {
    return absl::OkStatus();  // (not in the view's ring)
  }
  if (view->epoch() > sync_->epoch() && FormOf(*view)) return absl::OkStatus();
  return Reform();
}

absl::Status DenseRing::Reform() {
  gave_up_ = false;
  const absl::Time deadline = absl::Now() + reform_timeout_;
  while (!hooks_.stopping()) {
    if (sync_->over()) return absl::CancelledError("dense allreduce: the job is over");
    absl::StatusOr<proto::ClusterView> view = hooks_.fetch_view();
    if (view.ok() && view->epoch() > sync_->epoch()) {
      const std::vector<DenseSync::Member> members = MembersOf(*view, by_host_);
      if (std::none_of(members.begin(), members.end(),
                       [&](const DenseSync::Member& m) { return m.node_id == node_id_; })) {
        // Out of the view's ring (declared dead, drained): the ring goes
        // on without this worker.
        LOG(WARNING) << "dense allreduce: view " << view->epoch()
                     << " has no ring with this worker (node " << node_id_ << ") in it";
        in_ring_ = false;
        broken_ = false;
        checked_epoch_ = std::max(checked_epoch_, view->epoch());
        return absl::OkStatus();
      }
      if (FormOf(*view)) return absl::OkStatus();
    }
    if (absl::Now() >= deadline) {
      gave_up_ = true;
      return absl::UnavailableError(absl::StrCat(
          "dense allreduce: node ", node_id_, " formed no ring within ",
          absl::FormatDuration(reform_timeout_), " of the ring of view ", sync_->epoch(),
          " failing", view.ok() ? "" : absl::StrCat(" (the view: ", view.status().message(), ")")));
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  return absl::CancelledError("worker shut down");
}

absl::Status DenseRing::FollowView(uint64_t epoch) {
  if (epoch <= checked_epoch_) return absl::OkStatus();
  absl::StatusOr<proto::ClusterView> view = hooks_.fetch_view();
  if (!view.ok()) return view.status();
  checked_epoch_ = std::max(checked_epoch_, epoch);
  const std::vector<DenseSync::Member> members = MembersOf(*view, by_host_);
  std::vector<uint32_t> ids;
  for (const DenseSync::Member& m : members) ids.push_back(m.node_id);
  if (ids == members_ || view->epoch() <= sync_->epoch()) return absl::OkStatus();
  if (std::find(ids.begin(), ids.end(), node_id_) == ids.end()) {
    LOG(INFO) << "dense allreduce: view " << view->epoch()
              << " leaves this worker out of the ring (node " << node_id_ << ")";
    in_ring_ = false;
    members_.clear();
    return absl::OkStatus();
  }
  if (FormOf(*view)) return absl::OkStatus();
  return Reform();
}

absl::StatusOr<DenseSync::StepResult> DenseRing::StepOnce(const std::vector<const float*>& grads,
                                                          uint64_t samples) {
  absl::StatusOr<DenseSync::StepResult> r;
  if (sync_->stepping()) {  // (begun by BeginStep, its ask taken then)
    r = sync_->FinishStep(grads, params_);
  } else {
    r = sync_->Step(next_step_, grads, samples, hooks_.epoch_seen(), params_, Ask());
  }
  if (!r.ok()) {
    broken_ = true;
    // (Ended by the Abort with no parameter moved: a step whose members
    // all had no samples, or one whose first exchange did not go through.
    // One with samples may have been completed by others: this member's
    // parameters would be a step behind theirs.)
    ended_ = absl::IsCancelled(r.status()) && sync_->over() &&
             sync_->cut_short_samples().value_or(0) == 0;
    if (absl::IsCancelled(r.status())) {  // (DenseSync::Abort: the job is over)
      LOG(INFO) << "dense allreduce: step " << next_step_ << " ended: " << r.status().message();
      return r.status();
    }
    ++steps_failed_;
    LOG(WARNING) << "dense allreduce: step " << next_step_ << " failed: " << r.status();
    return r.status();
  }
  ++next_step_;
  CheckpointAfterStep(r->ask);
  return r;
}

void DenseRing::CheckpointAfterStep(const DenseSync::CheckpointAsk& ask) {
  // (Every member decides the same: the ask and the updates are the
  // ring's, not this member's.)
  // (A ring formed anew answers again what any of its members had not
  // answered: Form agrees on the least answered.)
  if (ask.id <= sync_->answered() || !hooks_.checkpoint_cut) return;
  const uint64_t updates = sync_->updates();
  if (updates < ask.cut) return;  // not there yet
  sync_->set_answered(ask.id);
  if (updates > ask.cut) {
    hooks_.checkpoint_cut(ask, nullptr, absl::OkStatus());
    return;
  }
  absl::StatusOr<DenseSync::Snapshot> snap = sync_->TakeSnapshot();
  if (!snap.ok()) {
    LOG(WARNING) << "dense allreduce: checkpoint " << ask.seq << ": " << snap.status();
    hooks_.checkpoint_cut(ask, nullptr, snap.status());
    return;
  }
  hooks_.checkpoint_cut(ask, &*snap, absl::OkStatus());
}

absl::StatusOr<DenseRing::Done> DenseRing::TrainStep(
    const std::vector<std::vector<float>>& model_grads, uint64_t samples) {
  std::vector<const float*> grads;
  for (size_t t : ring_tables_) {
    if (t >= model_grads.size() || model_grads[t].size() != zeros_[grads.size()].size()) {
      const absl::Status bad = absl::InvalidArgumentError(
          absl::StrCat("dense allreduce: the gradient of table ", t, " has ",
                       t < model_grads.size() ? model_grads[t].size() : 0, " floats, its table ",
                       zeros_[grads.size()].size()));
      AbandonStep(bad);  // (a step begun)
      return bad;
    }
    grads.push_back(model_grads[t].data());
  }
  // Not in a ring yet (its first step, or back from the finished): it
  // joins now, after this step's compute and whatever went to the
  // pservers before it (a CTR step's sparse pushes, which members at the
  // pservers' next-step barrier wait for). Its gradient was computed on
  // its own values: when the ring has trained already, it brings none to
  // this step (the ring's values are its now), unless its values were
  // the ring's (a checkpoint's that the ring took).
  if (sync_->stepping() && samples != sync_->begun_samples()) {
    AbandonStep(absl::InternalError(absl::StrCat("dense allreduce: step ", next_step_,
                                                 " begun with ", sync_->begun_samples(),
                                                 " samples, ended with ", samples)));
  }
  if (sync_->over()) {
    // (A step begun goes unfinished; the parameters stay those of the
    // last step completed, as when no step was begun.)
    sync_->AbandonStep(absl::CancelledError("dense allreduce: the job is over"));
    return absl::CancelledError("dense allreduce: the job is over");
  }
  if (!in_ring_ && !broken_) {
    STRATA_RETURN_IF_ERROR(Join());
    if (in_ring_ && next_step_ > 0 && !own_params_) {
      grads.clear();
      for (const std::vector<float>& z : zeros_) grads.push_back(z.data());
      samples = 0;
    }
  }
  while (true) {
    if (hooks_.stopping()) {
      AbandonStep(absl::CancelledError("worker shut down"));  // (a step begun)
      return absl::CancelledError("worker shut down");
    }
    if (broken_) STRATA_RETURN_IF_ERROR(Reform());
    if (!in_ring_) {
      return absl::FailedPreconditionError(
          absl::StrCat("dense allreduce: node ", node_id_,
                       " trains a step but is in no ring (the view of epoch ", checked_epoch_,
                       " has it neither ALIVE nor FINISHED)"));
    }
    const uint64_t step = next_step_;
    absl::StatusOr<DenseSync::StepResult> r = StepOnce(grads, samples);
    if (r.ok()) {
      STRATA_RETURN_IF_ERROR(FollowView(r->max_epoch));
      return Done{step, r->samples};
    }
    STRATA_RETURN_IF_ERROR(Reform());
    if (in_ring_ && next_step_ > step) {
      // Another member completed it: its parameters are ours now (Form).
      return Done{step, 0};
    }
  }
}

absl::Status DenseRing::IdleFor(absl::Duration duration) {
  AbandonStep(absl::FailedPreconditionError("dense allreduce: an idle step while one is begun"));
  if (sync_->over()) {  // (the caller asks the master what to do)
    absl::SleepFor(duration);
    return absl::OkStatus();
  }
  const absl::Time until = absl::Now() + duration;
  // (A worker with no task yet is in the view's ring all the same: the
  // others' first ring waits for it.)
  absl::Status joined = broken_ ? Reform() : !in_ring_ ? Join() : absl::OkStatus();
  if (!joined.ok()) {
    if (!sync_->over()) return joined;
    // Training ended meanwhile (Abort): the caller asks the master.
    absl::SleepFor(std::max(absl::ZeroDuration(), until - absl::Now()));
    return absl::OkStatus();
  }
  std::vector<const float*> grads;
  for (const std::vector<float>& z : zeros_) grads.push_back(z.data());
  // (At least one step: IdleFor(0) is one.)
  for (bool first = true; in_ring_ && !hooks_.stopping() && (first || absl::Now() < until);
       first = false) {
    absl::StatusOr<DenseSync::StepResult> r = StepOnce(grads, 0);
    if (!r.ok()) return absl::OkStatus();  // (the next call re-forms)
    STRATA_RETURN_IF_ERROR(FollowView(r->max_epoch));
    // Nobody trained: the members wait a little rather than spin.
    if (r->samples == 0) absl::SleepFor(absl::Milliseconds(5));
  }
  if (!in_ring_) absl::SleepFor(std::max(absl::ZeroDuration(), until - absl::Now()));
  return absl::OkStatus();
}

}  // namespace strata::worker
