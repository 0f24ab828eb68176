// A model family whose steps run in a training script rather than in C++:
// the Python package (python/strata, docs/python.md) makes a PyTorch script
// a Strata worker through it. The worker core is unchanged: its training
// thread (Worker::Run) registers, leases tasks, reports progress and
// evaluates as for the built-in families, and calls TrainTask, which hands
// the task's records to the script and waits while the script's thread
// trains it in its place: each Step pushes the gradient the script
// computed and pulls the next step's parameters, straight from and into
// the tensors the script computes with (params() and grads(), which the
// script's tensors alias), with no thread hand-off per step. Lookup pulls
// the sparse rows the script asks for, AddRowGrads collects their
// gradients for the step's push.
//
// The script's side (NextTask, Step, Lookup, AddRowGrads, TaskDone,
// Finish) may be called from one other thread at a time. The training
// thread does not return from TrainTask or Evaluate while a Step or Lookup
// is running, so nothing of the script's uses the worker after it moved
// on. Close() ends the script's side (Worker::Run returned).
#ifndef STRATA_WORKER_SCRIPT_TRAINER_H_
#define STRATA_WORKER_SCRIPT_TRAINER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/model_spec.h"
#include "worker/param_client.h"
#include "worker/pipeline_runner.h"
#include "worker/trainer.h"

namespace strata::worker {

class ScriptTrainer : public Trainer {
 public:
  // The tables of the config's model (model.tables for model.type script),
  // or none until the script declares them (Declare). `ctx` is borrowed
  // and outlives the trainer.
  static absl::StatusOr<std::unique_ptr<ScriptTrainer>> Create(TrainerContext* ctx);
  // The model's tables: params() and grads() get their tensors (zeros).
  // Once: a second call with other tables is FailedPrecondition (the same
  // tables again are OK). Before any other call of the script's side, and
  // before the training thread uses the tables (values_in() tells it).
  absl::Status Declare(std::vector<TableSpec> tables) ABSL_LOCKS_EXCLUDED(mu_);
  const absl::Notification& declared() const { return declared_; }
  // The tables hold their initial values (declared by the config, or the
  // script's shared by Worker::ShareInitialValues): the training thread
  // may pull into params() from now on, the script no longer writes them.
  void ValuesIn() {
    if (!values_in_.HasBeenNotified()) values_in_.Notify();
  }
  const absl::Notification& values_in() const { return values_in_; }
  ~ScriptTrainer() override;
  // Drops the exchanges that still use params() and grads() (their
  // connections cut): before the ParamClient and the transport go.
  void DropExchanges();
  ScriptTrainer(const ScriptTrainer&) = delete;
  ScriptTrainer& operator=(const ScriptTrainer&) = delete;

  // Trainer, on the training thread.
  std::string_view family() const override { return "script"; }
  std::string DescribeData() const override { return "the training script's own"; }
  int64_t loaded_examples() const override { return 0; }
  std::vector<std::vector<float>>& params() override { return params_; }
  const std::vector<std::vector<float>>& grads() const override { return grads_; }
  absl::StatusOr<int64_t> TrainTask(const proto::DataTask& task,
                                    std::vector<std::unique_ptr<Optimizer>>* local) override;
  absl::StatusOr<EvalMetrics> Evaluate(std::optional<uint64_t> min_version) override;

  // The script's side.
  const std::vector<TableSpec>& tables() const { return tables_; }
  // The records of the next data task in training order, the parameters
  // already pulled for its first step; nullopt once there is no task to
  // train: the job wants the final model evaluated (Finish gives the
  // figures) or this worker is done (Close).
  // Waits at most `wait` (then DeadlineExceeded: ask again), so that the
  // caller can attend to signals meanwhile.
  absl::StatusOr<std::optional<std::vector<int64_t>>> NextTask(
      absl::Duration wait = absl::InfiniteDuration());
  // One step over `n` records whose gradient of the mean loss is in
  // grads(): pushed as the sum over the records (grads() times n, the
  // pservers' convention; a begun step's are summed already), then the
  // next step's parameters pulled into params(), and grads() zeroed for
  // the next step. `loss` (mean) and `correct` go to the progress reports.
  // With `ahead`, Step returns once the push is settled, the next step's
  // pulls still landing in params(): WaitTables(tables) waits for some
  // tables' values (the script's forward, layer by layer), SettleAhead for
  // all of them; every other call of the script's side settles them first
  // (LeaveTask and AbandonStep drop them).
  // model.dense_sync allreduce: the dense gradients go through the
  // workers' ring (TrainerContext::dense_ring), which writes the next
  // parameters into params() in place; the sparse rows go to the pservers
  // as above; `ahead` is ignored. BeginStep begins the ring's step (its
  // first exchange goes at once) and PushTable hands the ring a table's
  // gradient, its buckets going round while the backward pass goes on
  // (DenseRing::BeginStep); a begun step not finished fails the task all
  // the same (its batch is not trained) and breaks the ring's step.
  absl::Status Step(int n, double loss, int64_t correct, bool ahead = false);
  absl::Status WaitTables(const std::vector<uint32_t>& tables);
  absl::Status SettleAhead();
  // A step whose dense pushes go out table by table while the script's
  // backward pass runs: BeginStep(n) before it, PushTable(t) once table
  // t's gradient (of the mean loss, times n: summed over the records) is
  // in grads()[t], then Step(n, ...) sends the rest and settles it, or
  // AbandonStep() drops it (the script gave up: its calls are cut, and
  // the task fails, since some of its pushes may have been applied). A
  // task ended with a step begun and not finished fails the same way.
  absl::Status BeginStep(int n);
  absl::Status PushTable(uint32_t table);
  void AbandonStep();
  // The rows of sparse table `table` for the n distinct `keys` into
  // rows[0 .. n * dim): in a task, the rows of the step the script
  // computes (bsp: every worker's previous step applied); outside one, the
  // latest. InvalidArgument naming the table when it is not a sparse one.
  absl::Status Lookup(uint32_t table, const uint64_t* keys, size_t n, float* rows);
  // Adds the gradient rows grads[i * dim ..] of keys[i] (i < n; the mean
  // loss's, as autograd gives them) to the step's gradient of sparse table
  // `table`, which the next Step pushes (times its n).
  absl::Status AddRowGrads(uint32_t table, const uint64_t* keys, size_t n, const float* grads);
  // The script left the task from NextTask before its end (an exception):
  // the task fails (TrainTask returns Aborted), is not completed, and goes
  // back to the master's queue once this worker has left.
  void LeaveTask();
  // The task from NextTask is trained (its remaining records skipped).
  absl::Status TaskDone();
  // The records of each step of the task from NextTask (the master's
  // batch for it: TrainerContext::batch_size).
  int batch_size() const { return ctx_->batch_size(); }
  // Whether the job waits for this worker's test figures of the final
  // model (NextTask ended for that), until Finish gives them.
  bool evaluating() ABSL_LOCKS_EXCLUDED(mu_);
  // The test figures of the final model: "test_accuracy", "test_loss",
  // "test_auc", "test_examples" (each optional). Delivered to the evaluation that waits for
  // them, if any.
  void Finish(const std::map<std::string, double>& metrics);
  // The training thread has stopped with `status`: the script's waits end.
  void Close(const absl::Status& status);

  // Pipeline stages (model.stages > 1; pipeline_runner.h): the script's
  // stage of the model (python/strata/torch.py, Job.pipeline), computing
  // stage `stage`'s micro-batches; its tables [first_table, end_table),
  // which alias params() and grads() (Summed gives grads()). Once; before
  // the worker's seat is taken (until then its follower steps wait).
  // InvalidArgument naming model.stages for a stage or tables that do not
  // fit; FailedPrecondition in a job of one stage or with sparse tables.
  absl::Status SetStage(int stage, int first_table, int end_table,
                        std::shared_ptr<StageModel> model, std::string layers)
      ABSL_LOCKS_EXCLUDED(stage_mu_);
  // The leader's step (stage 0), in a data task: x[n x in_dim] with labels
  // y[n] through the stages in micro-batches, each stage's gradient pushed
  // for the step. Sets the summed loss and the examples predicted right;
  // recorded as Step records its steps. An error fails the task.
  absl::Status PipelineStep(const float* x, const int32_t* y, int n, double* loss,
                            int64_t* correct);
  int micro_batches() const { return runner_ != nullptr ? runner_->micro_batches() : 1; }
  // Trainer, on the training thread: a stage after the first takes its
  // leader's steps, computed by the script's stage (on this thread).
  bool pipelined() const override { return runner_ != nullptr; }
  absl::Status Follow(absl::Duration idle) override;

 private:
  explicit ScriptTrainer(TrainerContext* ctx);

  enum class Phase { kIdle, kTask, kTaskDone, kClosed };
  // Waits until no Step or Lookup runs.
  void AwaitCallsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops a begun step (its exchanges cut, grads() zeroed) and fails the
  // task with `why`: some of its pushes may have been applied.
  void FailBegunStep(const std::string& why);
  // A step may start now: counts it in in_calls_.
  absl::Status EnterStepLocked(int n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A step entered by EnterStepLocked is over with `s` (Step's and
  // PipelineStep's): traced and recorded when OK (`comm`: its time in
  // exchanges), else the task's error; the next step's compute starts.
  absl::Status LeaveStep(absl::Status s, int n, uint64_t step, double loss, int64_t correct,
                         absl::Time since, absl::Duration comm, bool stale)
      ABSL_LOCKS_EXCLUDED(mu_);

  // A begun step (BeginStep): the script's thread's only.
  struct Begun {
    int n;
    uint64_t version;
    std::unique_ptr<ParamClient::PushPull> exchange;
  };
  std::unique_ptr<Begun> begun_;
  // Pulls left landing by Step(ahead): the script's thread's only.
  std::unique_ptr<ParamClient::PushPull> ahead_;
  // A failed pull of ahead_: the task fails with it.
  void AheadFailed(const absl::Status& s) ABSL_LOCKS_EXCLUDED(mu_);

  // A step's gradient of one sparse table: one summed row per distinct key.
  struct RowGrads {
    absl::flat_hash_map<uint64_t, uint32_t> index;  // key -> its place in keys
    std::vector<uint64_t> keys;
    std::vector<float> grads;  // keys.size() * dim
    bool looked_up = false;    // pulled from in this step (bsp: at its version)
  };
  // The step the next push is for: the worker's, or the ssp floor.
  uint64_t NextStep() ABSL_LOCKS_EXCLUDED(mu_);
  // The sparse tables' pushes for step `version` over n records (bsp, ssp: to
  // every virtual partition, after a pull at the step's version from any
  // table the script did not look up); issued, then settled by the caller
  // (Step).
  absl::Status IssueSparsePushes(uint64_t version, int n, bool stepped,
                                 std::vector<std::unique_ptr<ParamClient::Exchange>>* exchanges,
                                 std::vector<ParamClient::SparseKeys>* grouped,
                                 std::vector<PushResult>* results);
  int SparseDim(uint32_t table) const;

  TrainerContext* const ctx_;
  // model.stages > 1 (pipelined()): the stages' runner, and the script's
  // stage it makes a seat's model of.
  std::unique_ptr<PipelineRunner> runner_;
  absl::Mutex stage_mu_;
  std::optional<PipelineRunner::Stage> script_stage_ ABSL_GUARDED_BY(stage_mu_);
  int script_stage_index_ ABSL_GUARDED_BY(stage_mu_) = -1;
  // Set once by Declare, before declared_ is notified; read-only after.
  std::vector<TableSpec> tables_;
  bool has_sparse_ = false;  // a sparse table among them
  absl::Notification declared_;
  absl::Notification values_in_;
  std::vector<std::vector<float>> params_;
  std::vector<std::vector<float>> grads_;
  std::map<uint32_t, RowGrads> row_grads_ ABSL_GUARDED_BY(mu_);  // sparse tables
  // The version a lookup pulls at (bsp, in a task: the step's), whether a
  // task is being trained.
  uint64_t lookup_version_ ABSL_GUARDED_BY(mu_) = 0;
  // ssp: the slowest worker's clock when this task began (its pull's
  // answer); a joining worker's steps start there.
  uint64_t ssp_floor_ ABSL_GUARDED_BY(mu_) = 0;
  bool lookup_barrier_ ABSL_GUARDED_BY(mu_) = false;

  absl::Mutex mu_;
  Phase phase_ ABSL_GUARDED_BY(mu_) = Phase::kIdle;
  // A task handed over and not yet taken by NextTask.
  std::optional<std::vector<int64_t>> offered_ ABSL_GUARDED_BY(mu_);
  bool evaluate_wanted_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<std::map<std::string, double>> metrics_ ABSL_GUARDED_BY(mu_);
  // Steps and lookups running on the script's thread.
  int in_calls_ ABSL_GUARDED_BY(mu_) = 0;
  // When the step being computed started (the previous one ended), and
  // the first error of a step of the task (which then fails with it).
  absl::Time step_since_ ABSL_GUARDED_BY(mu_);
  absl::Status step_error_ ABSL_GUARDED_BY(mu_);
  absl::Status closed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata::worker

#endif  // STRATA_WORKER_SCRIPT_TRAINER_H_
