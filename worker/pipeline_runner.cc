#include "worker/pipeline_runner.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace strata::worker {

PipelineRunner::PipelineRunner(TrainerContext* ctx, std::vector<std::vector<float>>* params,
                               MakeStage make)
    : ctx_(ctx),
      params_(params),
      make_(std::move(make)),
      micro_batches_(ctx->config().model.micro_batches > 0 ? ctx->config().model.micro_batches
                                                           : 4 * ctx->config().model.stages) {}

PipelineRunner::~PipelineRunner() { DropStage(); }

absl::StatusOr<std::optional<PipelineSeat>> PipelineRunner::Seat() {
  ParamClient* params = ctx_->params();
  // (Every step asks: the view is read again only when it has changed.)
  if (seat_.has_value() && params->epoch() == seated_epoch_) return seat_;
  const proto::ClusterView view = params->Members();
  seated_epoch_ = view.epoch();
  const int k = ctx_->config().model.stages;
  const std::map<uint32_t, PipelineSeat> seats = PipelineSeats(view, k);
  auto it = seats.find(ctx_->node_id());
  if (it == seats.end()) {
    if (seat_.has_value()) {
      LOG(INFO) << "pipeline: this worker has no seat in view epoch " << view.epoch()
                << " (its workers do not make a whole group of " << k << ")";
      DropStage();
    }
    return seat_;
  }
  if (seat_.has_value() && seat_->stage == it->second.stage && seat_->group == it->second.group) {
    return seat_;
  }
  const PipelineSeat seat = it->second;
  const JobConfig& config = ctx_->config();
  STRATA_ASSIGN_OR_RETURN(Stage made, make_(seat.stage));
  PipelineStage::Options o;
  o.stage = seat.stage;
  o.stages = k;
  o.node_id = ctx_->node_id();
  // A wait covers the other stages' pulls, pushes and calls to the master.
  o.timeout = absl::Milliseconds(std::max(config.cluster.request_timeout_ms, 10000));
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<PipelineStage> created,
                          PipelineStage::Create(ctx_->data_plane(), o, made.model));
  std::shared_ptr<PipelineStage> stage = std::move(created);
  if (!stage->last()) {
    const uint32_t next = seat.group[seat.stage + 1];
    std::string address;
    for (const auto& m : view.members()) {
      if (m.id() == next) address = m.data_address();
    }
    if (address.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("pipeline stage ", seat.stage, ": node ", next,
                       " (the next stage) has no data address in view epoch ", view.epoch()));
    }
    STRATA_RETURN_IF_ERROR(stage->ConnectNext(address));
  }
  // The listener hands the previous stage's micro-batches to the new
  // stage; the old one answers those it held with an error.
  ctx_->SetPipelineStage(stage);
  if (stage_ != nullptr) stage_->Abort(absl::UnavailableError("this worker changed seats"));
  stage_ = std::move(stage);
  made_ = std::move(made);
  seat_ = seat;
  LOG(INFO) << "pipeline: stage " << seat.stage << " of " << k << " (" << made_.layers
            << ", tables " << made_.first_table << ".." << made_.end_table - 1
            << ") in the group of nodes " << absl::StrJoin(seat.group, ",") << ", view epoch "
            << view.epoch();
  return seat_;
}

absl::Status PipelineRunner::PullStage(uint64_t min_version, uint64_t* version,
                                       absl::Duration* comm) {
  const absl::Time w = absl::Now();
  STRATA_ASSIGN_OR_RETURN(*version, ctx_->params()->PullTables(min_version, made_.first_table,
                                                               made_.end_table, params_));
  *comm += absl::Now() - w;
  return made_.model->BeginStep();
}

absl::Status PipelineRunner::PushStage(uint64_t version, int n, absl::Duration* comm) {
  STRATA_ASSIGN_OR_RETURN(const std::vector<std::vector<float>>* sums, made_.model->Summed());
  const absl::Time w = absl::Now();
  STRATA_ASSIGN_OR_RETURN(const PushResult r,
                          ctx_->params()->PushTables(*sums, made_.first_table, made_.end_table,
                                                     version, static_cast<uint64_t>(n)));
  *comm += absl::Now() - w;
  LOG_IF(WARNING, r.stale_partitions > 0)
      << "pipeline stage " << seat_->stage << ": the push of step " << version << " was stale at "
      << r.stale_partitions << " partitions";
  return absl::OkStatus();
}

absl::StatusOr<double> PipelineRunner::LeaderStep(const float* x, const int32_t* y, int n,
                                                  uint64_t* version, int64_t* correct,
                                                  absl::Duration* comm) {
  // A step that fails (a stage gone, or out of step) is tried again, on a
  // stage made anew, once the view has the group whole again: a dead
  // stage's worker is declared dead and its restart takes the seat. Given
  // up after a while, when no worker comes to take it.
  const ClusterSection& cluster = ctx_->config().cluster;
  const absl::Time give_up =
      absl::Now() +
      absl::Milliseconds(std::max(60000, 3 * cluster.dead_timeout_ms + cluster.request_timeout_ms));
  absl::Status last;
  while (true) {
    absl::StatusOr<std::optional<PipelineSeat>> seat = Seat();
    if (seat.ok() && seat->has_value() && (*seat)->stage == 0) {
      STRATA_RETURN_IF_ERROR(PullStage(ctx_->next_step(), version, comm));
      absl::StatusOr<PipelineStage::StepResult> r =
          stage_->Step(next_op_++, *version, x, y, n, micro_batches_);
      if (r.ok()) {
        STRATA_RETURN_IF_ERROR(PushStage(*version, n, comm));
        *correct = r->correct;
        return r->loss;
      }
      last = r.status();
    } else {
      last = !seat.ok() ? seat.status()
                        : absl::UnavailableError(absl::StrCat(
                              "pipeline: this worker holds a data task but is not the first "
                              "stage of a whole group in the view now (",
                              seat->has_value() ? absl::StrCat("stage ", (*seat)->stage)
                                                : std::string("no seat"),
                              ")"));
    }
    if (ctx_->stopping()) return absl::CancelledError("worker shut down");
    if (absl::Now() >= give_up) return last;
    LOG(WARNING) << "pipeline: step " << ctx_->next_step() << " failed (" << last
                 << "); trying it again once the group is whole";
    DropStage();
    absl::SleepFor(absl::Milliseconds(500));
  }
}

void PipelineRunner::DropStage() {
  if (stage_ == nullptr) return;
  ctx_->SetPipelineStage(nullptr);
  stage_->Abort(absl::UnavailableError("this worker's pipeline stage is made anew"));
  stage_.reset();
  seat_.reset();
  made_ = Stage();
}

absl::Status PipelineRunner::Flush() {
  if (stage_ == nullptr || stage_->last()) return absl::OkStatus();
  return stage_->Flush();
}

absl::Status PipelineRunner::Follow(absl::Duration idle) {
  absl::Time idle_until = absl::Now() + idle;
  while (!ctx_->stopping()) {
    absl::StatusOr<std::optional<PipelineSeat>> seated = Seat();
    if (!seated.ok()) {
      // (The next stage not reachable yet: tried again at the next wait.)
      LOG_EVERY_N(WARNING, 20) << "pipeline: " << seated.status();
      return absl::OkStatus();
    }
    const std::optional<PipelineSeat> seat = *std::move(seated);
    if (!seat.has_value() || seat->stage == 0) return absl::OkStatus();
    const absl::Duration wait =
        std::clamp(idle_until - absl::Now(), absl::ZeroDuration(), absl::Milliseconds(100));
    // (A flush finds this stage's pushes settled: each step pushes before
    // the next one is taken.)
    STRATA_ASSIGN_OR_RETURN(const std::optional<PipelineStage::Next> next, stage_->NextStep(wait));
    if (!next.has_value()) {
      if (absl::Now() >= idle_until) return absl::OkStatus();
      continue;
    }
    absl::Duration comm;
    uint64_t version = 0;
    const absl::Time t0 = absl::Now();
    if (absl::Status pulled = PullStage(next->step, &version, &comm); !pulled.ok()) {
      // (A pull that failed, or the stage's model that could not begin the
      // step: the stage goes, answering the leader's micro-batches with
      // the error at once, and the leader tries the step again.)
      if (ctx_->stopping()) return absl::OkStatus();
      LOG(WARNING) << "pipeline stage " << seat->stage << ": step " << next->step
                   << " could not begin (" << pulled << "); the leader tries it again";
      DropStage();
      idle_until = absl::Now() + idle;
      continue;
    }
    absl::StatusOr<PipelineStage::StepResult> r = stage_->Step(*next);
    if (!r.ok()) {
      // The leader tries the step again (a new attempt), which this stage
      // takes as it is (attempts do not mix), or made anew when its
      // connection to the next stage broke.
      if (ctx_->stopping()) return absl::OkStatus();
      LOG(WARNING) << "pipeline stage " << seat->stage << ": step " << next->step << " failed ("
                   << r.status() << "); waiting for the leader to try it again";
      if (!stage_->healthy()) DropStage();
      idle_until = absl::Now() + idle;
      continue;
    }
    STRATA_RETURN_IF_ERROR(PushStage(next->step, r->samples, &comm));
    VLOG(1) << "pipeline stage " << seat->stage << ": step " << next->step << ", " << r->samples
            << " samples in " << r->micro_batches << " micro-batches, "
            << absl::FormatDuration(absl::Now() - t0) << " (computing "
            << absl::FormatDuration(r->busy) << ", pservers " << absl::FormatDuration(comm) << ")";
    idle_until = absl::Now() + idle;
  }
  return absl::OkStatus();
}

}  // namespace strata::worker
