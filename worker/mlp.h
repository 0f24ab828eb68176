// A multi-layer perceptron trained with softmax cross-entropy. Parameters are
// laid out exactly as the tables of common/model_spec.h: for layer i,
// weight {in, out} (row-major, y = x W + b) then bias {out}.
#ifndef STRATA_WORKER_MLP_H_
#define STRATA_WORKER_MLP_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/device.h"

namespace strata::worker {

// Not thread-safe. The Device is borrowed and must outlive the Mlp.
//
// On a GPU (a device without host memory) params() and grads() stay in host
// memory, pinned, and are what pulls fill and pushes send: a block of
// parameters is copied to the GPU as soon as need_params has it, on the copy
// stream while earlier layers compute, and a block of gradients is copied
// back while the layers below it compute; grads_ready is called once its
// copy is done. On the CPU the models compute on those arrays directly.
class Mlp {
 public:
  Mlp(std::vector<int> layers, Activation activation, Device* device);
  ~Mlp();

  // One tensor per table, in ModelTables() order. Callers fill params()
  // (from a pull) before TrainStep/Evaluate.
  std::vector<std::vector<float>>& params() { return params_; }
  const std::vector<std::vector<float>>& grads() const { return grads_; }

  // Forward and backward on x[batch x layers[0]] with labels y[batch].
  // grads() becomes d(sum of per-example losses)/d params. Returns the
  // summed loss, or the device's error (a failed kernel or copy).
  absl::StatusOr<double> TrainStep(const float* x, const int32_t* y, int batch);
  // TrainStep with hooks for overlapping communication, in terms of
  // parameter tables and element prefixes (a weight table is computed in
  // blocks of rows, see SetPartitionStarts):
  //   need_params(t, end)   forward: elements [0, end) of table t are read
  //                         next (wait for them);
  //   after_forward()       the forward pass is done;
  //   grads_ready(t, end)   backward: gradient elements [0, end) of table t
  //                         are final (send them);
  //   params_released(t)    backward: table t's parameters are not read
  //                         again in this step (the next step's may land).
  // For each table, `end` only grows. Any hook's error stops the step.
  struct Hooks {
    std::function<absl::Status(int table, uint64_t end)> need_params;
    std::function<absl::Status()> after_forward;
    std::function<absl::Status(int table, uint64_t end)> grads_ready;
    std::function<absl::Status(int table)> params_released;
  };
  absl::StatusOr<double> TrainStep(const float* x, const int32_t* y, int batch, const Hooks& hooks);
  // Pipeline stages (worker/pipeline.h): an Mlp of one stage's layers.
  // A stage before the last applies the activation to its output as well:
  // that output is the next stage's input.
  void SetActivateOutput(bool on) { activate_output_ = on; }
  // Forward only: out[batch x layers.back()] = the model's output on
  // x[batch x layers[0]] (what a stage sends on). Fails only when the
  // device does.
  absl::Status ForwardOutput(const float* x, int batch, float* out);
  // One micro-batch of a stage: forward, then backward from the loss on
  // labels y (out_grad null: the last stage) or from out_grad[batch x
  // layers.back()], the gradient of the loss with respect to the output.
  // With in_grad, the gradient with respect to x is written there [batch
  // x layers[0]]. grads() become this micro-batch's, or with `accumulate`
  // have it added (the micro-batches of one step). Returns the summed
  // loss (0 when the backward pass starts from out_grad).
  absl::StatusOr<double> StageStep(const float* x, const int32_t* y, int batch,
                                   const float* out_grad, float* in_grad, bool accumulate = false);
  // Examples of the last completed TrainStep whose predicted class (the
  // argmax of the logits) was their label: the training accuracy.
  int64_t last_correct() const { return last_correct_; }

  // Where the partitions of parameter table t begin (element offsets). A
  // weight table's forward and backward are then computed in blocks of rows
  // cut at those partitions (at most kMaxRowBlocks per layer), so a block
  // can start as soon as its parameters arrive and its gradient can be sent
  // while the next block computes. Bias tables are never cut.
  static constexpr int kMaxRowBlocks = 8;
  void SetPartitionStarts(int table, const std::vector<uint64_t>& starts);
  // Row boundaries of layer i's weight blocks: {0, ..., layers[i]}.
  const std::vector<int>& row_blocks(int layer) const { return row_blocks_[layer]; }
  int num_layers() const { return static_cast<int>(layers_.size()) - 1; }

  // Forward only: adds the summed loss to *loss_sum and the number of
  // correct predictions to *correct. Fails only when the device does.
  absl::Status Evaluate(const float* x, const int32_t* y, int batch, double* loss_sum,
                        int64_t* correct);

  // Input prefetch: the batch of a coming TrainStep, copied to the device
  // now, on the copy stream, while the current step computes. (Evaluate
  // drops what is prefetched; a step after it copies its own batch.)
  // Steps take prefetched batches in order; a step's x and y must then hold
  // the same data (the CPU reads them directly). At most two are prefetched
  // ahead. Nothing on the CPU.
  absl::Status Prefetch(const float* x, const int32_t* y, int batch);
  // Forgets the prefetched batches (their steps will not come).
  void DropPrefetched() { prefetched_.clear(); }

  // Activation recomputation (gradient checkpointing): with every >= 2 the
  // forward pass keeps the output of every `every`-th layer (and the
  // logits) and the backward pass recomputes the others, one segment at a
  // time: activation memory of about L/every + every layers instead of L,
  // for up to one more forward pass. 0 or 1: everything kept.
  void SetRecompute(int every);
  // Bytes of activation buffers held for the last batch, and what keeping
  // every layer's output would take.
  struct ActivationMemory {
    uint64_t held = 0;
    uint64_t without_recompute = 0;
  };
  ActivationMemory activation_memory() const;

 private:
  absl::Status Prepare(const float* x, const int32_t* y, int batch);
  // Evaluate and ForwardOutput: the forward pass on params() as they are
  // now; the output (the last layer's, on the device).
  absl::StatusOr<const float*> ForwardOnly(const float* x, const int32_t* y, int batch);
  // TrainStep and StageStep: the loss's gradient is out_grad's when set,
  // and in_grad receives the input's; with `accumulate` the gradients are
  // added to grads() rather than written.
  absl::StatusOr<double> Step(const float* x, const int32_t* y, int batch, const Hooks& hooks,
                              const float* out_grad, float* in_grad, bool accumulate);
  absl::Status Forward(int batch, const Hooks& hooks);
  // One layer's forward pass, out = f(in W + b) (no f on the last layer);
  // with `hooks`, need_params is called per row block and the block is
  // copied to the GPU (without, the parameters are there already).
  absl::Status LayerForward(size_t i, const float* in, int batch, float* out, const Hooks* hooks);
  // Recomputes the outputs of the layers of `layer`'s segment up to `layer`.
  absl::Status Recompute(size_t layer, int batch);
  // Where layer i's output is (a kept layer's own buffer or a segment slot).
  float* Act(size_t i);
  bool Kept(size_t i) const;
  // The parameters and gradients as the device reads and writes them.
  float* DParam(int t) { return host_ ? params_[t].data() : d_params_[t].data(); }
  float* DGrad(int t) { return host_ ? grads_[t].data() : d_grads_[t].data(); }
  // A block of table t's parameters to the device (GPU only).
  void UploadParams(int t, uint64_t begin, uint64_t end);
  // A block of table t's gradient to the host, then grads_ready(t, end)
  // once it is there; Drain calls the hooks of those done (all: wait).
  absl::Status DownloadGrads(int t, uint64_t begin, uint64_t end, const Hooks& hooks);
  absl::Status Drain(bool wait, const Hooks& hooks);
  absl::Status ReleaseParams(int t, const Hooks& hooks);

  const std::vector<int> layers_;
  const Activation activation_;
  Device* const device_;
  const bool host_;  // the device computes on host memory
  std::vector<std::vector<float>> params_;
  std::vector<std::vector<float>> grads_;
  std::vector<DeviceArray<float>> d_params_, d_grads_;  // GPU only
  std::vector<Device::Fence> param_fence_;              // last upload per table
  struct PendingGrad {
    int table;
    uint64_t end;
    Device::Fence fence;
  };
  std::vector<PendingGrad> pending_grads_;
  std::vector<DeviceArray<float>> acts_;   // per layer output (kept layers)
  std::vector<DeviceArray<float>> slots_;  // recomputed layers' outputs
  bool loss_pending_ = false;              // a step's loss is on the device, not taken
  int64_t last_correct_ = 0;
  int recompute_every_ = 0;
  bool activate_output_ = false;  // a pipeline stage before the last
  int valid_segment_ = -1;        // whose outputs the slots hold
  int batch_ = 0;
  std::vector<std::vector<int>> row_blocks_;  // per layer
  DeviceArray<float> delta_, delta_prev_;
  // The batch as the device reads it.
  const float* x_ = nullptr;
  const int32_t* y_ = nullptr;
  // GPU: batches go up through pinned host staging, in two slots used in
  // turn; `prefetched_` holds the slots of batches copied ahead, in order.
  struct InputSlot {
    DeviceArray<float> x;
    DeviceArray<int32_t> y;
    std::vector<float> stage_x;
    std::vector<int32_t> stage_y;
    int batch = 0;
    Device::Fence fx = 0, fy = 0;  // its uploads
  };
  absl::Status Stage(InputSlot* slot, const float* x, const int32_t* y, int batch);
  InputSlot inputs_[2];
  int next_slot_ = 0;
  std::vector<int> prefetched_;
};

}  // namespace strata::worker

#endif  // STRATA_WORKER_MLP_H_
