#include "worker/pipeline.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace strata::worker {
namespace {

using transport::Message;
using transport::MessageType;

// What follows the gradient in a kStageResponse: the micro-batch's summed
// loss and correct predictions, from the last stage.
constexpr size_t kTrailerBytes = sizeof(double) + sizeof(int64_t);

uint64_t LayerParams(const std::vector<int>& layers, int i) {
  return static_cast<uint64_t>(layers[i]) * layers[i + 1] + layers[i + 1];
}

}  // namespace

absl::StatusOr<std::vector<int>> StageBounds(const std::vector<int>& layers, int stages) {
  const int n = static_cast<int>(layers.size()) - 1;
  if (stages < 1 || stages > n) {
    return absl::InvalidArgumentError(absl::StrCat("model.stages: ", stages,
                                                   " stages for a model of ", n,
                                                   " layers (each stage needs one at least)"));
  }
  std::vector<uint64_t> costs;
  for (int i = 0; i < n; ++i) costs.push_back(LayerParams(layers, i));
  return CutStages(costs, stages);
}

absl::StatusOr<std::vector<int>> CutStages(const std::vector<uint64_t>& costs, int stages) {
  const int n = static_cast<int>(costs.size());
  if (stages < 1 || stages > n) {
    return absl::InvalidArgumentError(absl::StrCat("model.stages: ", stages,
                                                   " stages for a model of ", n,
                                                   " layers (each stage needs one at least)"));
  }
  // best[k][j]: the least largest stage over the first j layers in k
  // stages; cut[k][j] where its last stage begins.
  std::vector<uint64_t> prefix(n + 1, 0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];
  const uint64_t kNone = std::numeric_limits<uint64_t>::max();
  std::vector<std::vector<uint64_t>> best(stages + 1, std::vector<uint64_t>(n + 1, kNone));
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(n + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= stages; ++k) {
    for (int j = k; j <= n; ++j) {
      for (int i = k - 1; i < j; ++i) {
        if (best[k - 1][i] == kNone) continue;
        const uint64_t cost = std::max(best[k - 1][i], prefix[j] - prefix[i]);
        // (<=: of cuts as good, the latest, so that a layer of no
        // parameters (an activation) stays with the layer before it.)
        if (cost <= best[k][j]) {
          best[k][j] = cost;
          cut[k][j] = i;
        }
      }
    }
  }
  std::vector<int> bounds(stages + 1, 0);
  bounds[stages] = n;
  for (int k = stages; k > 0; --k) bounds[k - 1] = cut[k][bounds[k]];
  return bounds;
}

std::vector<int> StageWidths(const std::vector<int>& layers, const std::vector<int>& bounds,
                             int stage) {
  return std::vector<int>(layers.begin() + bounds[stage], layers.begin() + bounds[stage + 1] + 1);
}

MlpStage::MlpStage(Mlp* model, bool last)
    : model_(model),
      last_(last),
      in_dim_(static_cast<int>(model->params()[0].size() / model->params()[1].size())),
      out_dim_(static_cast<int>(model->params().back().size())) {
  model_->SetActivateOutput(!last);
}

MlpStage::MlpStage(std::unique_ptr<Mlp> model, bool last, Mlp* whole, int first_table)
    : owned_(std::move(model)),
      model_(owned_.get()),
      last_(last),
      in_dim_(static_cast<int>(model_->params()[0].size() / model_->params()[1].size())),
      out_dim_(static_cast<int>(model_->params().back().size())),
      whole_(whole),
      first_table_(first_table) {
  model_->SetActivateOutput(!last);
  summed_.resize(whole_->params().size());
  for (size_t t = 0; t < model_->params().size(); ++t) {
    summed_[first_table_ + t].resize(model_->params()[t].size());
  }
}

absl::Status MlpStage::BeginStep() {
  if (whole_ == nullptr) return absl::OkStatus();
  auto& mine = model_->params();
  for (size_t t = 0; t < mine.size(); ++t) {
    const auto& src = whole_->params()[first_table_ + t];
    std::copy(src.begin(), src.end(), mine[t].begin());
  }
  return absl::OkStatus();
}

absl::Status MlpStage::Forward(uint32_t m, const float* x, int rows, float* out) {
  return model_->ForwardOutput(x, rows, out);
}

absl::StatusOr<double> MlpStage::Backward(uint32_t m, const float* x, const int32_t* y, int rows,
                                          const float* out_grad, float* in_grad, bool accumulate,
                                          int64_t* correct) {
  STRATA_ASSIGN_OR_RETURN(const double loss,
                          model_->StageStep(x, y, rows, out_grad, in_grad, accumulate));
  *correct = last_ ? model_->last_correct() : 0;
  return loss;
}

absl::StatusOr<const std::vector<std::vector<float>>*> MlpStage::Summed() {
  if (whole_ == nullptr) {
    return absl::FailedPreconditionError("an MLP stage of no whole model: its grads() are the sum");
  }
  const auto& sums = model_->grads();
  for (size_t t = 0; t < sums.size(); ++t) {
    std::copy(sums[t].begin(), sums[t].end(), summed_[first_table_ + t].begin());
  }
  return &summed_;
}

absl::StatusOr<std::unique_ptr<PipelineStage>> PipelineStage::Create(
    transport::Transport* transport, Options options, std::shared_ptr<StageModel> model) {
  if (options.stages < 1 || options.stage < 0 || options.stage >= options.stages) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline stage ", options.stage, " of ", options.stages));
  }
  if (model == nullptr || model->in_dim() <= 0 || model->out_dim() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline stage ", options.stage, ": a model of no inputs or outputs"));
  }
  return std::unique_ptr<PipelineStage>(new PipelineStage(transport, options, std::move(model)));
}

absl::StatusOr<std::unique_ptr<PipelineStage>> PipelineStage::Create(
    transport::Transport* transport, Options options, Mlp* model) {
  return Create(transport, options,
                std::make_shared<MlpStage>(model, options.stage + 1 == options.stages));
}

PipelineStage::PipelineStage(transport::Transport* transport, Options options,
                             std::shared_ptr<StageModel> model)
    : transport_(transport),
      options_(options),
      model_(std::move(model)),
      in_dim_(model_->in_dim()),
      out_dim_(model_->out_dim()) {}

PipelineStage::~PipelineStage() {
  FailHeld(std::numeric_limits<uint64_t>::max(),
           absl::UnavailableError(absl::StrCat("pipeline stage ", options_.stage, " (node ",
                                               options_.node_id, ") stopped")));
}

absl::Status PipelineStage::ConnectNext(const std::string& address) {
  STRATA_ASSIGN_OR_RETURN(next_, transport_->Connect(address));
  return absl::OkStatus();
}

void PipelineStage::Handle(Message request, std::shared_ptr<transport::Responder> responder) {
  const transport::MessageHeader h = request.header;
  auto refuse = [&](absl::Status why) {
    responder->Respond(transport::MakeErrorResponse(h, MessageType::kStageResponse, why));
  };
  if (h.type == MessageType::kStage && h.flags == kFlagStageFlush && h.count == 0 &&
      request.payload_size() == 0 && !first()) {
    absl::MutexLock l(&st_->mu);
    st_->flushes.push_back(Held{std::move(request), std::move(responder)});
    st_->changed.SignalAll();
    return;
  }
  const size_t row_bytes = static_cast<size_t>(in_dim_) * sizeof(float) + sizeof(int32_t);
  if (h.type != MessageType::kStage || h.flags != 0 || h.partition == 0 ||
      h.partition > kMaxMicroBatches || h.seq >= h.partition || h.count == 0 ||
      h.count > static_cast<uint64_t>(std::numeric_limits<int>::max()) ||
      request.payload_size() != h.count * row_bytes || first()) {
    refuse(absl::InvalidArgumentError(absl::StrFormat(
        "pipeline stage %d (node %u): a malformed micro-batch from %s (node %u): "
        "micro-batch %u of %u, %u rows in %u bytes, where a row is %u activations and a label",
        options_.stage, options_.node_id, responder->peer(), h.sender_id, h.seq, h.partition,
        h.count, request.payload_size(), in_dim_)));
    return;
  }
  if (last()) {
    // The loss reads its labels as indices into the output's classes.
    const char* labels = request.payload_data() + h.count * in_dim_ * sizeof(float);
    for (uint64_t r = 0; r < h.count; ++r) {
      int32_t label;
      std::memcpy(&label, labels + r * sizeof(int32_t), sizeof(label));
      if (label < 0 || label >= out_dim_) {
        refuse(absl::InvalidArgumentError(
            absl::StrCat("pipeline stage ", options_.stage, " (node ", options_.node_id, "): row ",
                         r, " of micro-batch ", h.seq, " of step ", h.version, " from ",
                         responder->peer(), " has label ", label, " outside [0, ", out_dim_, ")")));
        return;
      }
    }
  }
  request.OwnPayload();
  absl::Status refused;
  {
    absl::MutexLock l(&st_->mu);
    const Key key{h.epoch, static_cast<uint32_t>(h.seq)};
    if (!st_->aborted.ok()) {
      refused = st_->aborted;
    } else if (h.epoch < st_->floor) {
      refused = absl::FailedPreconditionError(absl::StrCat("pipeline stage ", options_.stage,
                                                           ": step ", h.version, " (attempt ",
                                                           h.epoch, ") is over here"));
    } else if (st_->inbox.count(key) != 0) {
      refused =
          absl::AlreadyExistsError(absl::StrCat("pipeline stage ", options_.stage, ": micro-batch ",
                                                h.seq, " of step ", h.version, " came twice"));
    } else {
      st_->inbox.emplace(key, Held{std::move(request), std::move(responder)});
      st_->changed.SignalAll();
      return;
    }
  }
  // (Answered outside the lock: a slow peer's write does not hold up the
  // training thread.)
  refuse(refused);
}

void PipelineStage::Abort(absl::Status why) {
  // (The held requests are answered by the step that fails, or by the
  // destructor: a step may be reading their payloads now.)
  absl::MutexLock l(&st_->mu);
  if (st_->aborted.ok()) st_->aborted = why;
  st_->changed.SignalAll();
}

absl::StatusOr<std::optional<PipelineStage::Next>> PipelineStage::NextStep(absl::Duration wait) {
  if (first()) return absl::FailedPreconditionError("the first pipeline stage steps on data");
  const absl::Time deadline = absl::Now() + wait;
  while (true) {
    std::vector<Held> flushes;
    std::optional<Next> step;
    {
      absl::MutexLock l(&st_->mu);
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(st_->mu) {
        if (!st_->aborted.ok() || !st_->flushes.empty()) return true;
        for (const auto& [key, held] : st_->inbox) {
          if (key.second == 0) return true;
        }
        return false;
      };
      while (!ready()) {
        if (st_->changed.WaitWithDeadline(&st_->mu, deadline)) break;
      }
      if (!st_->aborted.ok()) return st_->aborted;
      flushes.swap(st_->flushes);
      // The newest attempt: the first stage sends one at a time, so an
      // older one still here is what is left of a failed attempt.
      for (const auto& [key, held] : st_->inbox) {
        if (key.second == 0) step = Next{key.first, held.request.header.version};
      }
    }
    if (!flushes.empty()) {
      AnswerFlushes(std::move(flushes));
      continue;
    }
    if (step.has_value() && step->op > 0) {
      FailHeld(step->op - 1, absl::AbortedError(absl::StrCat("pipeline stage ", options_.stage,
                                                             ": attempt ", step->op, " of step ",
                                                             step->step, " came after this one")));
    }
    return step;
  }
}

void PipelineStage::AnswerFlushes(std::vector<Held> flushes) {
  absl::Status s;
  if (!last()) s = Flush();
  for (Held& h : flushes) {
    Message reply;
    if (s.ok()) {
      reply.header = h.request.header;
      reply.header.type = MessageType::kStageResponse;
      reply.header.sender_id = options_.node_id;
      reply.header.status = 0;
    } else {
      reply = transport::MakeErrorResponse(h.request.header, MessageType::kStageResponse, s);
    }
    h.responder->Respond(std::move(reply));
  }
}

absl::Status PipelineStage::Flush() {
  if (next_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "pipeline stage ", options_.stage, " is not connected to stage ", options_.stage + 1));
  }
  Message m;
  m.header.type = MessageType::kStage;
  m.header.flags = kFlagStageFlush;
  m.header.sender_id = options_.node_id;
  STRATA_ASSIGN_OR_RETURN(const Message answer, next_->CallSync(std::move(m), options_.timeout));
  absl::Status s = transport::ResponseStatus(answer);
  if (s.ok()) return s;
  return absl::Status(s.code(),
                      absl::StrCat("pipeline stage ", options_.stage, ": the flush of stage ",
                                   options_.stage + 1, " (", next_->peer(), "): ", s.message()));
}

void PipelineStage::FailHeld(uint64_t op, const absl::Status& why) {
  std::vector<Held> failed;
  {
    absl::MutexLock l(&st_->mu);
    if (op == std::numeric_limits<uint64_t>::max()) failed.swap(st_->flushes);
    for (auto it = st_->inbox.begin(); it != st_->inbox.end() && it->first.first <= op;) {
      failed.push_back(std::move(it->second));
      it = st_->inbox.erase(it);
    }
  }
  for (Held& h : failed) {
    h.responder->Respond(
        transport::MakeErrorResponse(h.request.header, MessageType::kStageResponse, why));
  }
}

absl::StatusOr<PipelineStage::StepResult> PipelineStage::Step(uint64_t op, uint64_t step,
                                                              const float* x, const int32_t* y,
                                                              int n, int micro_batches) {
  if (!first()) {
    return absl::FailedPreconditionError(absl::StrCat("pipeline stage ", options_.stage,
                                                      " takes its inputs from stage ",
                                                      options_.stage - 1, ", not from data"));
  }
  if (n <= 0) return absl::InvalidArgumentError("a pipeline step of no examples");
  const int m = std::clamp(micro_batches, 1, std::min<int>(n, kMaxMicroBatches));
  std::vector<Micro> micros;
  int at = 0;
  for (int i = 0; i < m; ++i) {
    const int rows = n / m + (i < n % m ? 1 : 0);
    micros.push_back(Micro{x + static_cast<size_t>(at) * in_dim_, y + at, rows});
    at += rows;
  }
  step_ = step;
  return Run(op, std::move(micros));
}

absl::StatusOr<PipelineStage::StepResult> PipelineStage::Step(const Next& next) {
  if (first()) {
    return absl::FailedPreconditionError("the first pipeline stage steps on data");
  }
  step_ = next.step;
  uint32_t m = 0;
  STRATA_ASSIGN_OR_RETURN(Micro first, AwaitInput(next.op, 0, &m));
  // (The others' inputs are taken as the schedule reaches them.)
  std::vector<Micro> micros(m);
  micros[0] = first;
  return Run(next.op, std::move(micros));
}

absl::StatusOr<PipelineStage::Micro> PipelineStage::AwaitInput(uint64_t op, uint32_t m,
                                                               uint32_t* micro_batches) {
  const Key key{op, m};
  const absl::Time deadline = absl::Now() + options_.timeout;
  absl::MutexLock l(&st_->mu);
  // (A newer attempt's micro-batch: the first stage has given this one up.)
  auto newer = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(st_->mu) {
    return st_->inbox.lower_bound(Key{op + 1, 0}) != st_->inbox.end();
  };
  while (st_->aborted.ok() && st_->inbox.count(key) == 0 && !newer()) {
    if (st_->changed.WaitWithDeadline(&st_->mu, deadline)) break;
  }
  if (!st_->aborted.ok()) return st_->aborted;
  if (st_->inbox.count(key) == 0 && newer()) {
    return absl::AbortedError(absl::StrCat("pipeline stage ", options_.stage, ": step ", step_,
                                           " was tried again by stage 0 before micro-batch ", m,
                                           " of this attempt came"));
  }
  auto it = st_->inbox.find(key);
  if (it == st_->inbox.end()) {
    return absl::DeadlineExceededError(
        absl::StrCat("pipeline stage ", options_.stage, " (node ", options_.node_id,
                     "): micro-batch ", m, " of step ", step_, " did not come from stage ",
                     options_.stage - 1, " within ", absl::FormatDuration(options_.timeout)));
  }
  const Message& r = it->second.request;
  if (micro_batches != nullptr) *micro_batches = static_cast<uint32_t>(r.header.partition);
  Micro in;
  in.rows = static_cast<int>(r.header.count);
  in.x = reinterpret_cast<const float*>(r.payload.data());
  in.y = reinterpret_cast<const int32_t*>(r.payload.data() +
                                          static_cast<size_t>(in.rows) * in_dim_ * sizeof(float));
  return in;
}

absl::StatusOr<PipelineStage::StepResult> PipelineStage::Run(uint64_t op,
                                                             std::vector<Micro> micros) {
  {
    absl::MutexLock l(&st_->mu);
    if (!st_->aborted.ok()) return st_->aborted;
    st_->floor = op;
    // Answers of attempts before this one (one that failed) are dropped.
    st_->answers.erase(st_->answers.begin(), st_->answers.lower_bound(Key{op, 0}));
  }
  if (op > 0) {
    // Held requests of earlier attempts (one that failed before their
    // turn) are answered now.
    FailHeld(op - 1, absl::FailedPreconditionError(absl::StrCat("pipeline stage ", options_.stage,
                                                                " went on to step ", step_)));
  }
  busy_ = absl::ZeroDuration();
  const uint32_t m = static_cast<uint32_t>(micros.size());
  const int k = options_.stages;
  StepResult result;
  result.micro_batches = static_cast<int>(m);
  auto input = [&](uint32_t i) -> absl::StatusOr<Micro> {
    if (first() || i == 0) return micros[i];
    uint32_t count = 0;
    STRATA_ASSIGN_OR_RETURN(micros[i], AwaitInput(op, i, &count));
    if (count != m) {
      return absl::InvalidArgumentError(
          absl::StrCat("pipeline stage ", options_.stage, ": micro-batch ", i, " of step ", step_,
                       " says ", count, " micro-batches, the first said ", m));
    }
    return micros[i];
  };
  absl::Status s = [&]() -> absl::Status {
    if (last()) {
      for (uint32_t i = 0; i < m; ++i) {
        STRATA_ASSIGN_OR_RETURN(const Micro in, input(i));
        STRATA_RETURN_IF_ERROR(Backward(op, i, in, &result));
      }
      return absl::OkStatus();
    }
    const uint32_t warmup = std::min<uint32_t>(k - 1 - options_.stage, m);
    uint32_t f = 0, b = 0;
    for (; f < warmup; ++f) {
      STRATA_ASSIGN_OR_RETURN(const Micro in, input(f));
      STRATA_RETURN_IF_ERROR(Forward(op, f, m, in));
    }
    for (; f < m; ++f, ++b) {
      STRATA_ASSIGN_OR_RETURN(const Micro in, input(f));
      STRATA_RETURN_IF_ERROR(Forward(op, f, m, in));
      STRATA_RETURN_IF_ERROR(Backward(op, b, micros[b], &result));
    }
    for (; b < m; ++b) STRATA_RETURN_IF_ERROR(Backward(op, b, micros[b], &result));
    return absl::OkStatus();
  }();
  if (!s.ok()) {
    // The previous stage learns at once; its held requests of this attempt
    // get this error.
    FailHeld(op, s);
    return s;
  }
  result.busy = busy_;
  return result;
}

absl::Status PipelineStage::Forward(uint64_t op, uint32_t m, uint32_t micro_batches,
                                    const Micro& in) {
  const absl::Time t0 = absl::Now();
  const size_t act_bytes = static_cast<size_t>(in.rows) * out_dim_ * sizeof(float);
  Message msg;
  msg.header.type = MessageType::kStage;
  msg.header.sender_id = options_.node_id;
  msg.header.version = step_;
  msg.header.epoch = op;
  msg.header.seq = m;
  msg.header.partition = micro_batches;
  msg.header.count = static_cast<uint64_t>(in.rows);
  msg.payload.resize(act_bytes + static_cast<size_t>(in.rows) * sizeof(int32_t));
  STRATA_RETURN_IF_ERROR(
      model_->Forward(m, in.x, in.rows, reinterpret_cast<float*>(msg.payload.data())));
  std::memcpy(msg.payload.data() + act_bytes, in.y, static_cast<size_t>(in.rows) * sizeof(int32_t));
  busy_ += absl::Now() - t0;
  if (next_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "pipeline stage ", options_.stage, " is not connected to stage ", options_.stage + 1));
  }
  std::shared_ptr<State> st = st_;
  const Key key{op, m};
  next_->Call(std::move(msg), [st, key](absl::StatusOr<Message> answer) {
    absl::MutexLock l(&st->mu);
    if (key.first < st->floor) return;  // an attempt given up
    st->answers.insert_or_assign(key, std::move(answer));
    st->changed.SignalAll();
  });
  return absl::OkStatus();
}

absl::Status PipelineStage::Backward(uint64_t op, uint32_t m, const Micro& in, StepResult* result) {
  const Key key{op, m};
  Message answer;
  const float* out_grad = nullptr;
  double loss = 0;
  int64_t correct = 0;
  if (!last()) {
    const absl::Time deadline = absl::Now() + options_.timeout;
    absl::StatusOr<Message> got = absl::UnknownError("");
    {
      absl::MutexLock l(&st_->mu);
      while (st_->aborted.ok() && st_->answers.count(key) == 0) {
        if (st_->changed.WaitWithDeadline(&st_->mu, deadline)) break;
      }
      if (!st_->aborted.ok()) return st_->aborted;
      auto it = st_->answers.find(key);
      if (it == st_->answers.end()) {
        return absl::DeadlineExceededError(
            absl::StrCat("pipeline stage ", options_.stage, " (node ", options_.node_id,
                         "): the gradient of micro-batch ", m, " of step ", step_,
                         " did not come from stage ", options_.stage + 1, " (", next_->peer(),
                         ") within ", absl::FormatDuration(options_.timeout)));
      }
      got = std::move(it->second);
      st_->answers.erase(it);
    }
    if (!got.ok()) return got.status();
    STRATA_RETURN_IF_ERROR(transport::ResponseStatus(*got));
    answer = *std::move(got);
    const size_t grad_bytes = static_cast<size_t>(in.rows) * out_dim_ * sizeof(float);
    if (answer.payload.size() != grad_bytes + kTrailerBytes) {
      return absl::DataLossError(absl::StrCat(
          "pipeline stage ", options_.stage, ": the gradient of micro-batch ", m, " of step ",
          step_, " from stage ", options_.stage + 1, " (", next_->peer(), ") has ",
          answer.payload.size(), " bytes, not ", grad_bytes + kTrailerBytes));
    }
    out_grad = reinterpret_cast<const float*>(answer.payload.data());
    std::memcpy(&loss, answer.payload.data() + grad_bytes, sizeof(double));
    std::memcpy(&correct, answer.payload.data() + grad_bytes + sizeof(double), sizeof(int64_t));
  }
  // The previous stage's answer: the gradient of this micro-batch's input.
  Message reply;
  const size_t in_bytes = static_cast<size_t>(in.rows) * in_dim_ * sizeof(float);
  if (!first()) reply.payload.resize(in_bytes + kTrailerBytes);
  const absl::Time t0 = absl::Now();
  int64_t own_correct = 0;
  STRATA_ASSIGN_OR_RETURN(
      const double own_loss,
      model_->Backward(m, in.x, in.y, in.rows, out_grad,
                       first() ? nullptr : reinterpret_cast<float*>(reply.payload.data()),
                       /*accumulate=*/result->samples > 0, &own_correct));
  if (last()) {
    loss = own_loss;
    correct = own_correct;
  }
  busy_ += absl::Now() - t0;
  result->loss += loss;
  result->correct += correct;
  result->samples += in.rows;
  if (first()) return absl::OkStatus();
  std::memcpy(reply.payload.data() + in_bytes, &loss, sizeof(double));
  std::memcpy(reply.payload.data() + in_bytes + sizeof(double), &correct, sizeof(int64_t));
  Held held;
  {
    absl::MutexLock l(&st_->mu);
    auto it = st_->inbox.find(key);
    if (it == st_->inbox.end()) return absl::OkStatus();  // (failed meanwhile)
    held = std::move(it->second);
    st_->inbox.erase(it);
  }
  reply.header = held.request.header;
  reply.header.type = MessageType::kStageResponse;
  reply.header.sender_id = options_.node_id;
  reply.header.status = 0;
  held.responder->Respond(std::move(reply));
  return absl::OkStatus();
}

}  // namespace strata::worker
