// The master's data-task calls (MasterServer's, in their own file):
// leasing a task, with the batch its steps take (elastic.batch), and
// completing one.
#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/aggregation.h"
#include "common/error_reason.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "master/master_server.h"

namespace strata::master {
namespace {

proto::LeaseTaskResponse LeaseAnswer(proto::LeaseTaskResponse::Outcome outcome,
                                     bool drained = false) {
  proto::LeaseTaskResponse resp;
  resp.set_outcome(outcome);
  if (drained) resp.set_drained(true);
  return resp;
}

}  // namespace

int MasterServer::TaskBatchLocked(uint32_t node) {
  const int batch = options_.config.job.batch_size;
  const bool fixed_global = options_.config.elastic.batch == "fixed_global";
  const bool by_speed = options_.config.job.batch_split == "by_speed";
  if (!fixed_global && !by_speed) return batch;
  // The global batch: the one the job started with (fixed_global), or
  // job.batch_size for each worker that trains now. (A pipeline's group
  // trains as one worker, its leader: the others take no task.)
  std::vector<uint32_t> workers = nodes_.TrainingWorkers(node);
  if (options_.config.model.stages > 1) {
    const std::map<uint32_t, PipelineSeat> seats =
        PipelineSeats(nodes_.View(), options_.config.model.stages);
    workers.erase(std::remove_if(workers.begin(), workers.end(),
                                 [&](uint32_t w) {
                                   auto it = seats.find(w);
                                   return w != node && (it == seats.end() || it->second.stage != 0);
                                 }),
                  workers.end());
  }
  const int64_t count = static_cast<int64_t>(workers.size());
  const int64_t started = options_.expected_workers / std::max(1, options_.config.model.stages);
  const int64_t global = static_cast<int64_t>(batch) * (fixed_global ? started : count);
  if (!by_speed) {
    // Evenly; the first global % count of them take one record more.
    const int64_t rank = std::find(workers.begin(), workers.end(), node) - workers.begin();
    const int64_t share = global / count + (rank < global % count ? 1 : 0);
    return static_cast<int>(std::max<int64_t>(1, share));
  }
  bool remade = false;
  const std::map<uint32_t, int64_t>& split =
      splitter_.Split(global, workers, clock_->Now(), &remade);
  if (remade) {
    std::string line = absl::StrCat("batch split by speed: global batch ", global, " =");
    for (uint32_t w : workers) {
      const double speed = splitter_.SpeedOf(w);
      const absl::StatusOr<proto::NodeInfo> info = nodes_.LiveWorker(w);
      absl::StrAppend(&line, w == workers.front() ? " " : " + ", split.at(w), " (",
                      info.ok() ? absl::StrCat("worker ", info->index()) : absl::StrCat("node ", w),
                      speed > 0 ? absl::StrFormat(", %.0f samples/s computing", speed)
                                : std::string(", not measured yet"),
                      ")");
    }
    job_.Event(line, "batch_split");
  }
  return static_cast<int>(std::max<int64_t>(1, split.at(node)));
}

bool MasterServer::PipelineLeader(uint32_t node) const {
  const int stages = options_.config.model.stages;
  if (stages <= 1) return true;
  const std::map<uint32_t, PipelineSeat> seats = PipelineSeats(nodes_.View(), stages);
  auto it = seats.find(node);
  return it != seats.end() && it->second.stage == 0;
}

absl::StatusOr<proto::LeaseTaskResponse> MasterServer::LeaseTask(
    const proto::LeaseTaskRequest& req) {
  // The update ledger is read before anyone evaluates, so that the summary
  // written at the end has it (the background tick takes it too, but an
  // evaluation may end before its next turn).
  TakeLedger();
  // Durable before the worker hears of its task.
  return Durably([&](uint64_t* ticket) { return LeaseTaskUnpersisted(req, ticket); });
}

absl::StatusOr<proto::LeaseTaskResponse> MasterServer::LeaseTaskUnpersisted(
    const proto::LeaseTaskRequest& req, uint64_t* ticket) {
  using Response = proto::LeaseTaskResponse;
  absl::MutexLock l(&mu_);
  // Drained, and asking again (its answer was lost): the same answer, so
  // that it leaves rather than fails and is restarted.
  if (nodes_.IsDrainedWorker(req.node_id())) return LeaseAnswer(Response::DONE, true);
  STRATA_ASSIGN_OR_RETURN(const proto::NodeInfo n, nodes_.LiveWorker(req.node_id()));
  if (!nodes_.ready() || job_.state() == proto::JOB_WAITING) return LeaseAnswer(Response::WAIT);
  if (job_.over()) return LeaseAnswer(Response::DONE);
  // Where the task's batches start (bsp), unless the worker is coming back
  // from the finished ones (the steps went on without it).
  std::optional<uint64_t> first_step;
  if (req.has_next_step() && n.state() == proto::ALIVE) first_step = req.next_step();
  // A worker holds one data task at a time and asks for the next once it
  // has completed it. One that asks while it still holds a task never got
  // the answer that leased it (this master went down between recording the
  // lease and answering): it gets that task again, else the task would
  // stay leased to a live worker that does not know it, and the job would
  // never finish.
  // Pipeline stages: a group's first stage holds its data tasks; the
  // stages after it take its steps (worker/pipeline_runner.h).
  const bool leads = PipelineLeader(n.id());
  std::optional<proto::DataTask> task;
  if (leads) task = tasks_.Held(n.id(), clock_->Now(), first_step);
  if (task.has_value()) {
    LOG(WARNING) << "worker " << n.index() << " (node " << n.id() << ") asks for a task "
                 << "but holds data task " << task->id() << ": its lease answer was lost; "
                 << "the same task again";
  } else if (n.draining()) {
    // Drained: its last data task is done; it leaves, the job goes on.
    nodes_.WorkerDrained(n.id());
    UpdateJobStateLocked();
    *ticket = PersistLocked();
    return LeaseAnswer(Response::DONE, true);
  } else if (leads) {
    task = tasks_.Lease(n.id(), clock_->Now(), first_step, TaskBatchLocked(n.id()));
  }
  if (task.has_value()) {
    // (A finished or joining worker is in the step set now.)
    if (n.state() != proto::ALIVE) nodes_.SetWorkerState(n.id(), proto::ALIVE);
    *ticket = PersistLocked();
    Response resp = LeaseAnswer(Response::TASK);
    resp.set_batch_size(tasks_.BatchOf(task->id()));
    *resp.mutable_task() = *std::move(task);
    return resp;
  }
  // No training work left for this worker: it leaves the step set.
  if (n.state() != proto::FINISHED) nodes_.SetWorkerState(n.id(), proto::FINISHED);
  UpdateJobStateLocked();
  // The evaluation waits for the ledger (a moment: LeaseTask reads it),
  // unless the pservers do not answer for it within 10 s.
  if (req.cannot_evaluate()) {
    job_.DeclineEvaluation(n.id());
    std::vector<uint32_t> in_job;
    if (job_.state() == proto::JOB_EVALUATING) {
      const proto::ClusterView view = nodes_.View();
      for (const proto::NodeInfo& m : view.members()) {
        if (m.role() == proto::WORKER && nodes_.InJob(m.id())) in_job.push_back(m.id());
      }
    }
    if (job_.AllDeclined(in_job)) {  // (none: not evaluating)
      // (Each joined after training ended, or its ring failed: no ring
      // forms again to bring them the model.)
      const std::string model = checkpoints_->TrainedModel();
      FinishJobLocked(
          proto::JOB_FAILED,
          absl::StrCat("no worker in the job holds the trained model's dense allreduce tables to "
                       "evaluate it (each joined after training ended, or its ring failed); ",
                       model,
                       absl::StartsWith(model, "checkpoint ")
                           ? " (resume from it to evaluate: launch.sh run --resume latest)"
                           : ": the trained allreduce tables are lost"));
      *ticket = PersistLocked();
      return LeaseAnswer(Response::DONE);
    }
  }
  if (!checkpoints_->final_pending() && !req.cannot_evaluate()) {
    if (auto min_version = job_.ClaimEvaluation(n.id(), nodes_.InJob(job_.evaluator()))) {
      Response resp = LeaseAnswer(Response::EVALUATE);
      resp.set_min_version(*min_version);
      return resp;
    }
  }
  return LeaseAnswer(Response::WAIT);
}

absl::Status MasterServer::CompleteTask(const proto::CompleteTaskRequest& req) {
  // Durable before the worker hears that its task is done.
  return Durably([&](uint64_t* ticket) -> absl::Status {
    absl::MutexLock l(&mu_);
    STRATA_ASSIGN_OR_RETURN(const proto::NodeInfo n, nodes_.LiveWorker(req.node_id()));
    STRATA_RETURN_IF_ERROR(tasks_.Complete(n.id(), req.task_id(), req.last_step(), req.records()));
    job_.TaskCompleted(req.last_step());
    UpdateJobStateLocked();
    *ticket = PersistLocked();
    return absl::OkStatus();
  });
}

}  // namespace strata::master
