// Pipeline stages (model.stages; docs/architecture.md, "Pipeline stages"):
// an MLP's layers cut into K consecutive groups, stage s's layers held and
// trained by a worker of its own, so that a model one device cannot hold
// trains on K. A step's batch goes through the stages in M micro-batches:
// stage s sends each micro-batch's output (its activations, and the labels
// along) to stage s + 1 as a kStage request over the data plane
// (transport/transport.h: tcp, rdma or inproc), and the answer is the
// gradient of that output, sent once the stages after it have done the
// micro-batch's backward pass.
//
// The micro-batches are scheduled one-forward-one-backward (1F1B, the
// schedule of PipeDream-flush and Megatron): stage s runs min(K - 1 - s,
// M) forward passes ahead, then alternates one forward and one backward,
// then drains its backward passes; the last stage does each micro-batch's
// forward and backward at once. A stage before the last keeps only each
// micro-batch's input while it is in flight and computes its forward pass
// again in the backward one (GPipe's re-materialisation): a stage's
// activation memory is that of one micro-batch, for one more forward pass.
//
// Each stage's gradient is summed over the step's micro-batches, so a
// step's gradient is the batch's, as unpipelined (float rounding apart),
// and the step's update the same. The stage's tables are then pushed and
// pulled by the worker like any others (ParamClient; PipelineRunner,
// worker/pipeline_runner.h).
//
// What a stage computes is a StageModel's: the MLP's layers (MlpStage,
// which computes a micro-batch's forward pass again in its backward pass),
// or a PyTorch script's modules (python/core.cc, which keeps each
// micro-batch's autograd graph while it is in flight).
//
// The bubble: of a step's 2M + 2(K - 1) forward-and-backward slots per
// stage, 2(K - 1) are idle, a fraction (K - 1) / (M + K - 1).
#ifndef STRATA_WORKER_PIPELINE_H_
#define STRATA_WORKER_PIPELINE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "transport/transport.h"
#include "worker/mlp.h"

namespace strata::worker {

// kStage's flags bit 0: a flush, not a micro-batch (count 0, no payload):
// answered once the receiving stage has pushed every step it took, and has
// passed the flush on to the stage after it and had its answer.
inline constexpr uint32_t kFlagStageFlush = 1;
// The most micro-batches a step may have (a kStage header's partition).
inline constexpr uint64_t kMaxMicroBatches = 1 << 16;

// Where the stages' layers begin: K + 1 layer indices {0, ..., L} for a
// model of L = layers.size() - 1 layers, the cut that makes the largest
// stage's parameters fewest (each stage one layer at least).
// InvalidArgument naming model.stages when K is not in [1, L].
absl::StatusOr<std::vector<int>> StageBounds(const std::vector<int>& layers, int stages);
// The same cut of L layers of the given costs (parameters): K + 1 indices
// {0, ..., L}, the largest stage's cost least, each stage one layer at
// least; of the cuts as good, the one whose stages begin latest.
absl::StatusOr<std::vector<int>> CutStages(const std::vector<uint64_t>& costs, int stages);
// Stage s's widths: layers[bounds[s]] .. layers[bounds[s + 1]]. Its tables
// are the model's [2 bounds[s], 2 bounds[s + 1]).
std::vector<int> StageWidths(const std::vector<int>& layers, const std::vector<int>& bounds,
                             int stage);

// What one stage computes, on the thread that steps it (PipelineStage::
// Step). Rows are flat: a micro-batch of `rows` examples is rows x in_dim()
// floats in, rows x out_dim() out; labels are class indices, in [0,
// out_dim()) at the last stage.
class StageModel {
 public:
  virtual ~StageModel() = default;
  virtual int in_dim() const = 0;
  virtual int out_dim() const = 0;
  // A step begins: the stage's tables hold the step's parameters (pulled
  // into the whole model's tables: PipelineRunner).
  virtual absl::Status BeginStep() { return absl::OkStatus(); }
  // Micro-batch m's forward pass: out[rows x out_dim()] (stages before the
  // last).
  virtual absl::Status Forward(uint32_t m, const float* x, int rows, float* out) = 0;
  // Micro-batch m's backward pass, from out_grad[rows x out_dim()] (the
  // gradient of the summed loss with respect to its output), or at the
  // last stage (out_grad null) from the loss on labels y: its gradient
  // added to the stage's (set, for the step's first micro-batch:
  // !accumulate), and with in_grad the gradient with respect to x written
  // there [rows x in_dim()]. Returns the summed loss and sets *correct (the
  // rows predicted right) at the last stage; 0 before it. (A model may
  // instead zero its gradient in BeginStep and always add: the script's
  // stage does.)
  virtual absl::StatusOr<double> Backward(uint32_t m, const float* x, const int32_t* y, int rows,
                                          const float* out_grad, float* in_grad, bool accumulate,
                                          int64_t* correct) = 0;
  // The step's gradient of the stage's tables, summed over its
  // micro-batches, in tensors indexed as the whole model's tables (those
  // of the stage's range set; PipelineRunner pushes them).
  virtual absl::StatusOr<const std::vector<std::vector<float>>*> Summed() = 0;
};

// The MLP's stage: an Mlp of the stage's layers (StageWidths), borrowed.
// A stage before the last applies the activation to its output, which is
// the next stage's input; its backward pass computes the micro-batch's
// forward pass again (GPipe's re-materialisation), so a stage keeps only
// each micro-batch's input while it is in flight.
class MlpStage : public StageModel {
 public:
  MlpStage(Mlp* model, bool last);
  // For PipelineRunner: owns `model`; pulls land in whole->params(), the
  // stage's tables from `first_table` on, and Summed() gives tensors as
  // whole's.
  MlpStage(std::unique_ptr<Mlp> model, bool last, Mlp* whole, int first_table);
  int in_dim() const override { return in_dim_; }
  int out_dim() const override { return out_dim_; }
  absl::Status BeginStep() override;
  absl::Status Forward(uint32_t m, const float* x, int rows, float* out) override;
  absl::StatusOr<double> Backward(uint32_t m, const float* x, const int32_t* y, int rows,
                                  const float* out_grad, float* in_grad, bool accumulate,
                                  int64_t* correct) override;
  absl::StatusOr<const std::vector<std::vector<float>>*> Summed() override;
  Mlp* model() const { return model_; }

 private:
  std::unique_ptr<Mlp> owned_;
  Mlp* const model_;
  const bool last_;
  const int in_dim_, out_dim_;
  Mlp* const whole_ = nullptr;
  const int first_table_ = 0;
  std::vector<std::vector<float>> summed_;  // as whole's tables (the stage's set)
};

// One stage of a pipeline. Step is called from one thread (the worker's
// training thread); Handle from the transport's threads.
class PipelineStage {
 public:
  struct Options {
    int stage = 0;
    int stages = 1;
    uint32_t node_id = 0;  // the sender id of its requests
    // Each wait for the previous stage's micro-batch or the next stage's
    // gradient.
    absl::Duration timeout = absl::Seconds(60);
  };
  // `model` is what the stage computes, shared with its maker.
  // InvalidArgument for a stage outside [0, stages).
  static absl::StatusOr<std::unique_ptr<PipelineStage>> Create(transport::Transport* transport,
                                                               Options options,
                                                               std::shared_ptr<StageModel> model);
  // The MLP's stage of `model` (StageWidths), borrowed (MlpStage).
  static absl::StatusOr<std::unique_ptr<PipelineStage>> Create(transport::Transport* transport,
                                                               Options options, Mlp* model);
  // Answers the previous stage's requests still held with an error.
  ~PipelineStage();
  PipelineStage(const PipelineStage&) = delete;
  PipelineStage& operator=(const PipelineStage&) = delete;

  // Stages before the last: connects to the next stage's listener.
  absl::Status ConnectNext(const std::string& address);
  // Any thread: a kStage request from the previous stage, held until the
  // step's backward pass of it answers it. A malformed one (sizes that
  // are not this stage's input) is answered at once with InvalidArgument.
  void Handle(transport::Message request, std::shared_ptr<transport::Responder> responder);

  struct StepResult {
    double loss = 0;      // summed over the step's examples
    int64_t correct = 0;  // its examples predicted right
    int samples = 0;
    int micro_batches = 0;
    absl::Duration busy;  // this stage's computing (the rest is the bubble)
  };
  // The first stage: step `step` (the pservers' version its stages pull
  // and push) on x[n x layers[0]] with labels y[n], in `micro_batches`
  // micro-batches (fewer when n is smaller). `op` names this attempt of
  // the step: it ascends from call to call (a failed step tried again
  // is a new attempt), so that what is left of a failed one is never taken
  // for the new one's.
  absl::StatusOr<StepResult> Step(uint64_t op, uint64_t step, const float* x, const int32_t* y,
                                  int n, int micro_batches);
  // The stages after the first: a step attempt as NextStep gives it, its
  // micro-batches as they come from the previous stage.
  struct Next {
    uint64_t op = 0;
    uint64_t step = 0;
  };
  absl::StatusOr<StepResult> Step(const Next& next);
  // Stages after the first: waits up to `wait` for the previous stage's
  // next step attempt, and returns it (nullopt when none came). A flush
  // that comes
  // meanwhile is answered: this stage's pushes are done (it is between
  // steps), so once the stage after it (if any) has answered it too.
  absl::StatusOr<std::optional<Next>> NextStep(absl::Duration wait);
  // Stages before the last: a flush through the stages after this one
  // (they have pushed every step they took once it returns OK).
  absl::Status Flush();
  StageModel* model() const { return model_.get(); }

  // Any thread: fails the step in progress, and every later one, with
  // `why` (the worker is stopping).
  void Abort(absl::Status why);

  // False once the connection to the next stage broke (a new stage is
  // needed, with a new one).
  bool healthy() const { return next_ == nullptr || next_->healthy(); }
  int stage() const { return options_.stage; }
  bool first() const { return options_.stage == 0; }
  bool last() const { return options_.stage + 1 == options_.stages; }

 private:
  using Key = std::pair<uint64_t, uint32_t>;  // step attempt (op), micro-batch
  PipelineStage(transport::Transport* transport, Options options,
                std::shared_ptr<StageModel> model);
  // Where micro-batch m's rows are, and the inputs of this step.
  struct Micro {
    const float* x = nullptr;
    const int32_t* y = nullptr;
    int rows = 0;
  };
  absl::StatusOr<StepResult> Run(uint64_t op, std::vector<Micro> micros);
  // Waits for micro-batch m of attempt `op` from the previous stage.
  absl::StatusOr<Micro> AwaitInput(uint64_t op, uint32_t m, uint32_t* micro_batches);
  // Forward pass of micro-batch m, sent on to the next stage.
  absl::Status Forward(uint64_t op, uint32_t m, uint32_t micro_batches, const Micro& in);
  // Backward pass of micro-batch m (with its forward pass again), the
  // gradient summed, and the previous stage answered.
  absl::Status Backward(uint64_t op, uint32_t m, const Micro& in, StepResult* result);
  // Answers the previous stage's held requests of attempts up to `op`
  // (all: UINT64_MAX) with `why`.
  void FailHeld(uint64_t op, const absl::Status& why);

  transport::Transport* const transport_;
  const Options options_;
  const std::shared_ptr<StageModel> model_;
  const int in_dim_, out_dim_;
  std::shared_ptr<transport::Connection> next_;
  absl::Duration busy_;  // the step's computing so far
  uint64_t step_ = 0;    // the step being run (its attempt is the op)
  struct Held {
    transport::Message request;
    std::shared_ptr<transport::Responder> responder;
  };
  // Passes the flushes held on and answers them.
  void AnswerFlushes(std::vector<Held> flushes);
  struct State {
    absl::Mutex mu;
    absl::CondVar changed;
    std::map<Key, Held> inbox ABSL_GUARDED_BY(mu);  // from the previous stage
    std::vector<Held> flushes ABSL_GUARDED_BY(mu);
    std::map<Key, absl::StatusOr<transport::Message>> answers
        ABSL_GUARDED_BY(mu);                 // from the next stage
    uint64_t floor ABSL_GUARDED_BY(mu) = 0;  // attempts (ops) below it are over
    absl::Status aborted ABSL_GUARDED_BY(mu);
  };
  // (Shared with the callbacks of the sends in flight.)
  const std::shared_ptr<State> st_ = std::make_shared<State>();
};

}  // namespace strata::worker

#endif  // STRATA_WORKER_PIPELINE_H_
