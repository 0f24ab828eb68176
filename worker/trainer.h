// The worker's model family as an interface: one Trainer per family (the
// MLP on image data, mlp_trainer.h; Wide & Deep on CTR data,
// ctr_trainer.h), chosen once by model.type when the Worker is created.
// The Worker core (registration, heartbeats, leases, progress reports)
// knows nothing of the model; a trainer knows nothing of the master.
//
// A trainer owns its model (the parameter and gradient tensors, which the
// worker registers with the transport once), its training data and
// whatever else the family needs between steps (the CTR row cache). It
// reaches the rest of the worker only through the TrainerContext it is
// handed: the ParamClient, the config, the step bookkeeping and the trace.
//
// Thread safety: a trainer is called from the worker's training thread
// only (Worker::Run), except where a method says otherwise. A trainer may
// lend a task to another thread while the training thread waits for it
// inside TrainTask (ScriptTrainer: the Python script's thread runs the
// steps); that thread then uses the TrainerContext in its place, and
// TrainTask returns only once it has stopped.
#ifndef STRATA_WORKER_TRAINER_H_
#define STRATA_WORKER_TRAINER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/config.h"
#include "common/metrics.h"
#include "common/optimizer.h"
#include "proto/strata.pb.h"
#include "storage/file_system.h"
#include "worker/dense_ring.h"
#include "worker/host_aggregator.h"
#include "worker/param_client.h"
#include "worker/pipeline.h"

namespace strata::worker {

// The exchanges a pipelined step leaves in flight (docs/performance.md):
// the pull of the next step's parameters, sent ahead during the backward
// pass, and the last step's push, settled during the next step or before
// its task is reported done. The pull carries over to the next data task;
// when the master has no task for us (wait, evaluate, done) the worker
// settles it first, so a later task starts from a fresh pull of the current
// version rather than from parameters that went stale meanwhile. Owned by
// the worker (it settles them between tasks); training thread only.
struct StepExchanges {
  std::unique_ptr<ParamClient::Exchange> pull;
  std::unique_ptr<ParamClient::Exchange> push;
  PushResult push_result;
  uint64_t pulled_version = 0;
};

// What a trainer needs of the worker core. Implemented by the Worker (and
// by fakes in tests); borrowed by the trainer for the worker's lifetime.
// Training thread only.
class TrainerContext {
 public:
  virtual ~TrainerContext() = default;

  virtual const JobConfig& config() const = 0;
  // The file system the data is read through (WorkerOptions.fs).
  virtual storage::FileSystem* fs() const = 0;
  // The pservers' client: null until the worker has registered, and in a
  // local_only run.
  virtual ParamClient* params() = 0;
  // True once the worker is shutting down: a task stops at its next step.
  virtual bool stopping() const = 0;

  // The records of `task` in [begin, end) in training order (shuffled by
  // the job seed when the worker shuffles within tasks), less its first
  // skip_records.
  virtual std::vector<int64_t> TaskRecordOrder(const proto::DataTask& task, int64_t begin,
                                               int64_t end) const = 0;
  // The epoch being trained, for progress reports.
  virtual void SetEpoch(int epoch) = 0;
  // The records of each step of the data task being trained: the master's
  // for it (elastic.batch fixed_global splits the job's global batch over
  // the workers there are), else job.batch_size.
  virtual int batch_size() const = 0;
  // The version (bsp: the step) the next step starts from.
  virtual uint64_t next_step() const = 0;
  // Counts a finished training step at `version` of `n` samples, `correct`
  // of them predicted right (stats, the progress window), reports progress
  // every job.progress_every_steps, and makes version + 1 the next step.
  virtual void RecordStep(int n, uint64_t version, double loss, int64_t correct,
                          absl::Duration busy, absl::Duration comm, bool stale) = 0;

  // The exchanges a pipelined step leaves in flight, and the settling of
  // the push among them (acks, retries; a stale push is counted).
  virtual StepExchanges& exchanges() = 0;
  virtual absl::Status SettlePush() = 0;

  // Node-local aggregation (cluster.aggregation: node): the host's
  // shared-memory aggregation, through which a step's gradient is posted
  // and the next parameters come; null when the job does not aggregate.
  virtual HostAggregator* host_aggregator() { return nullptr; }
  // model.dense_sync allreduce: the ring the dense tables' steps go
  // through (dense_ring.h); null when they go to the pservers.
  virtual DenseRing* dense_ring() { return nullptr; }
  // Pipeline stages (model.stages > 1): this worker's node id and data
  // plane, and the stage its listener hands the previous stage's kStage
  // requests to (null: none; those that came before one was set are
  // handed to it then).
  virtual uint32_t node_id() const { return 0; }
  virtual transport::Transport* data_plane() { return nullptr; }
  virtual void SetPipelineStage(std::shared_ptr<PipelineStage> stage) {}
  // True when the steps are traced (WorkerOptions.trace_path).
  virtual bool tracing() const = 0;
  // A trace span from `from` to now on the steps lane, when tracing;
  // returns now.
  virtual absl::Time TraceSpan(const char* name, const char* category, absl::Time from,
                               const std::string& args) = 0;
};

// The test-set figures of a model, as reported to the master.
struct EvalMetrics {
  double accuracy = 0;
  double loss = 0;            // mean test loss (the log-loss of a CTR model)
  std::optional<double> auc;  // CTR models
  int64_t examples = 0;
};

// One model family's training. See the file comment.
class Trainer {
 public:
  virtual ~Trainer() = default;

  // model.type of the family: "mlp", "wide_deep".
  virtual std::string_view family() const = 0;
  // For the start-up log: what training data is held (or where it is read).
  virtual std::string DescribeData() const = 0;
  // Training records loaded at start-up (0 when they are read per task).
  virtual int64_t loaded_examples() const = 0;

  // The model's tensors, one per table (a sparse table's are empty). Their
  // storage stays put for the trainer's lifetime: the worker registers it
  // with the transport.
  virtual std::vector<std::vector<float>>& params() = 0;
  virtual const std::vector<std::vector<float>>& grads() const = 0;

  // Node-local aggregation (cluster.aggregation: node): false when the
  // family's steps do not go through the host's segment; else true, with
  // the sparse tables whose rows its workers merge per key in *sparse.
  virtual bool AggregatesOnHost(SparseLayout* sparse) const { return false; }

  // Pipeline stages: true when this trainer is one stage of a pipeline
  // (model.stages > 1). Follow then trains the steps that come from the
  // stage before this worker's, when it is not the first, until none has
  // come for `idle` (the worker calls it while the master has no task for
  // it).
  virtual bool pipelined() const { return false; }
  virtual absl::Status Follow(absl::Duration idle) { return absl::OkStatus(); }

  // Registers the family's own /metrics gauges, if any. The gauges are
  // read on the HTTP thread.
  virtual void AddMetrics(MetricsRegistry* metrics) {}

  // Trains every batch of `task`. With `local` (local_only) the gradients
  // are applied in place by those optimizers, one per table; else each
  // step pulls from and pushes to the pservers. Returns the records of the
  // task (what the master is told when it completes). InvalidArgument for
  // a task outside the training data; Cancelled when the worker stops.
  virtual absl::StatusOr<int64_t> TrainTask(const proto::DataTask& task,
                                            std::vector<std::unique_ptr<Optimizer>>* local) = 0;

  // The model on the test set. With `min_version` the parameters are
  // pulled at version >= it first; without (local_only) they are evaluated
  // as they are.
  virtual absl::StatusOr<EvalMetrics> Evaluate(std::optional<uint64_t> min_version) = 0;
};

}  // namespace strata::worker

#endif  // STRATA_WORKER_TRAINER_H_
