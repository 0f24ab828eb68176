#include "worker/dense_sync.h"

#include <algorithm>
#include <cstring>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace strata::worker {
namespace {

// Counters go round the ring as floats: 24 bits a float is exact, and a
// member writes only its own slot, so a sum adds nothing to them.
constexpr int kPieces = 2;
void PutU64(uint64_t v, float* out) {
  out[0] = static_cast<float>(v >> 24);
  out[1] = static_cast<float>(v & 0xFFFFFF);
}
uint64_t GetU64(const float* in) {
  return (static_cast<uint64_t>(in[0]) << 24) | static_cast<uint64_t>(in[1]);
}

// A member's slot in Form's first exchange.
enum FormField : int {
  kHasState = 0,                          // 1: it holds optimizer shards
  kStateEpoch = 1,                        // the ring they are split by
  kHasCompleted = kStateEpoch + kPieces,  // 1: it completed a step
  kCompleted = kHasCompleted + 1,         // the last one
  kInStep = kCompleted + kPieces,         // 1: a step failed here
  kInStepValue = kInStep + 1,             // that step
  kUpdates = kInStepValue + kPieces,      // optimizer updates applied
  kRestored = kUpdates + kPieces,         // 1: it holds a checkpoint's state (Restore)
  kAnswered = kRestored + 1,              // the newest checkpoint ask it answered
  kFormSlot = kAnswered + kPieces,
};
// A member's slot in a step's first exchange.
enum StepField : int {
  kSamples = 0,
  kEpochSeen = kPieces,
  kAskId = 2 * kPieces,  // the newest checkpoint asked of the ring it knows
  kAskSeq = 3 * kPieces,
  kAskCut = 4 * kPieces,
  kStepSlot = 5 * kPieces,
};

}  // namespace

absl::StatusOr<std::unique_ptr<DenseSync>> DenseSync::Create(transport::Transport* transport,
                                                             Options options,
                                                             std::vector<size_t> table_sizes) {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> probe,
                          Optimizer::Create(options.optimizer, 1));
  if (options.chunk_bytes < 4 || options.chunk_bytes % 4 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dense allreduce: chunk_bytes ", options.chunk_bytes, " is not a positive multiple of 4"));
  }
  auto sync = std::unique_ptr<DenseSync>(new DenseSync(transport, options, std::move(table_sizes)));
  sync->state_vectors_ = probe->state_bytes_per_param() / sizeof(float);
  sync->state_has_count_ = probe->StateViews().size() > sync->state_vectors_;
  return sync;
}

DenseSync::DenseSync(transport::Transport* transport, Options options,
                     std::vector<size_t> table_sizes)
    : transport_(transport), options_(std::move(options)), table_sizes_(std::move(table_sizes)) {
  for (size_t n : table_sizes_) {
    offsets_.push_back(total_);
    total_ += n;
  }
  CutBuckets();
}

DenseSync::~DenseSync() {
  AbandonStep(absl::CancelledError("dense allreduce: shut down"));
  {
    absl::MutexLock l(&step_mu_);
    quit_ = true;
  }
  if (step_thread_.joinable()) step_thread_.join();
}

void DenseSync::Abort(const absl::Status& why) {
  std::shared_ptr<transport::RingAllreduce> ring;
  {
    absl::MutexLock l(&mu_);
    over_ = true;
    ring = ring_;
  }
  if (ring != nullptr) ring->Abort(why);
}

uint32_t DenseSync::GoneLocked() const {
  if (ring_ == nullptr || newest_view_ <= ring_epoch_) return 0;
  for (uint32_t id : ring_nodes_) {
    if (std::find(newest_view_members_.begin(), newest_view_members_.end(), id) ==
        newest_view_members_.end()) {
      return id;
    }
  }
  return 0;
}

absl::Status DenseSync::LeftError(uint32_t gone, uint64_t ring_epoch, uint64_t view) const {
  return absl::UnavailableError(absl::StrCat("dense allreduce member ", options_.node_id, ": node ",
                                             gone, " of the ring of epoch ", ring_epoch,
                                             " is not in the job in view ", view));
}

void DenseSync::AbortIfLeft(uint64_t epoch, const std::vector<uint32_t>& members) {
  std::shared_ptr<transport::RingAllreduce> ring;
  uint32_t gone = 0;
  uint64_t current = 0;
  {
    absl::MutexLock l(&mu_);
    if (epoch <= newest_view_) return;
    newest_view_ = epoch;
    newest_view_members_ = members;
    gone = GoneLocked();
    if (gone == 0) return;
    ring = ring_;
    current = ring_epoch_;
  }
  ring->Abort(LeftError(gone, current, epoch));
}

void DenseSync::Handle(transport::Message request,
                       std::shared_ptr<transport::Responder> responder) {
  const uint64_t epoch = request.header.version >> 32;
  std::shared_ptr<transport::RingAllreduce> ring;
  uint64_t current = 0;
  {
    absl::MutexLock l(&mu_);
    current = ring_epoch_;
    if (ring_ != nullptr && epoch == ring_epoch_) {
      ring = ring_;
    } else if (epoch > ring_epoch_ && early_bytes_ + request.payload_size() <= (size_t{1} << 30)) {
      // (A member a step ahead formed the next ring first.) The ring this
      // member is in cannot finish a call now (that member has left it):
      // its wait ends at once rather than at the timeout.
      if (ring_ != nullptr) {
        ring_->Abort(absl::UnavailableError(
            absl::StrCat("dense allreduce member ", options_.node_id, ": ", responder->peer(),
                         " has gone on to the ring of epoch ", epoch,
                         "; this member's is of epoch ", ring_epoch_)));
      }
      request.OwnPayload();
      early_bytes_ += request.payload.size();
      early_[epoch].emplace_back(std::move(request), std::move(responder));
      return;
    }
  }
  if (ring == nullptr) {
    const transport::MessageHeader h = request.header;
    responder->Respond(transport::MakeErrorResponse(
        h, transport::ResponseTypeFor(h.type),
        absl::FailedPreconditionError(absl::StrCat(
            "dense allreduce member ", options_.node_id, ": a message for the ring of epoch ",
            epoch, " from ", responder->peer(), "; this member's ring is of epoch ", current,
            epoch > current ? " (too many waiting for a ring not formed yet)"
                            : " (that ring is over)"))));
    return;
  }
  ring->Handle(std::move(request), std::move(responder));
}

absl::StatusOr<std::unique_ptr<Optimizer>> DenseSync::MakeOptimizer(
    size_t n, const std::string* state) const {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> opt, Optimizer::Create(options_.optimizer, n));
  if (state != nullptr) STRATA_RETURN_IF_ERROR(opt->RestoreState(*state));
  return opt;
}

void DenseSync::CopyOut(const std::vector<float>& flat, const std::vector<float*>& params) const {
  size_t at = 0;
  for (size_t t = 0; t < table_sizes_.size(); ++t) {
    std::memcpy(params[t], flat.data() + at, table_sizes_[t] * sizeof(float));
    at += table_sizes_[t];
  }
}

void DenseSync::CopyIn(const std::vector<float*>& params, std::vector<float>* flat) const {
  flat->resize(total_);
  size_t at = 0;
  for (size_t t = 0; t < table_sizes_.size(); ++t) {
    std::memcpy(flat->data() + at, params[t], table_sizes_[t] * sizeof(float));
    at += table_sizes_[t];
  }
}

size_t DenseSync::state_floats() const {
  if (members_.empty()) return 0;
  size_t n = 0;
  auto [b, e] = shard();
  n += (e - b) * state_vectors_;
  if (replica_ != nullptr) {
    auto [rb, re] = Segment(rank_);
    n += (re - rb) * state_vectors_;
  }
  return n;
}

std::vector<std::pair<size_t, size_t>> DenseSync::PutOldShards(
    const std::function<bool(uint32_t)>& holder, float* all) const {
  const size_t k = state_vectors_;
  const uint32_t ow = static_cast<uint32_t>(state_members_.size());
  auto in_ring = [&](uint32_t old_rank) { return holder(state_members_[old_rank % ow].node_id); };
  uint32_t old_rank = 0;
  for (uint32_t i = 0; i < ow; ++i) {
    if (state_members_[i].node_id == options_.node_id) old_rank = i;
  }
  std::vector<std::pair<size_t, size_t>> lost;
  // Segment j of the old ring: its owner was rank j - 1, its replica rank j.
  for (uint32_t j = 0; j < ow; ++j) {
    const uint32_t owner = (j + ow - 1) % ow;
    auto [b, e] = SegmentOf(j, ow);
    const Optimizer* from = nullptr;
    if (in_ring(owner)) {
      if (owner == old_rank) from = primary_.get();
    } else if (ow > 1 && in_ring(j)) {
      if (j == old_rank) from = replica_.get();
    } else {
      if (e > b) lost.emplace_back(b, e);
      continue;
    }
    if (from == nullptr || k == 0) continue;
    const std::vector<absl::string_view> views = from->StateViews();
    const size_t first = views.size() - k;  // (a count before the vectors)
    for (size_t v = 0; v < k; ++v) {
      std::memcpy(all + v * total_ + b, views[first + v].data(), (e - b) * sizeof(float));
    }
  }
  return lost;
}

std::optional<uint64_t> DenseSync::PutCheckpointState(
    const std::vector<std::pair<size_t, size_t>>& lost, float* all) const {
  if (!options_.checkpoint_state) return std::nullopt;
  absl::StatusOr<CheckpointState> ck = options_.checkpoint_state();
  if (ck.ok() && ck->state.size() != state_vectors_ * total_) {
    ck = absl::DataLossError(absl::StrCat("checkpoint ", ck->seq, " has ", ck->state.size(),
                                          " optimizer-state floats, the ring's tables ",
                                          state_vectors_ * total_));
  }
  if (!ck.ok()) {
    LOG(WARNING) << "dense allreduce member " << options_.node_id
                 << ": no checkpoint to take the lost optimizer state from: " << ck.status();
    return std::nullopt;
  }
  for (size_t v = 0; v < state_vectors_; ++v) {
    for (const auto& [b, e] : lost) {
      std::memcpy(all + v * total_ + b, ck->state.data() + v * total_ + b, (e - b) * sizeof(float));
    }
  }
  LOG(INFO) << "dense allreduce member " << options_.node_id
            << ": the optimizer state of segments whose owner and replica left together comes "
               "from checkpoint "
            << ck->seq << " (step " << ck->step << ")";
  return ck->seq;
}

absl::StatusOr<std::shared_ptr<transport::RingAllreduce>> DenseSync::StartRing(
    uint64_t epoch, const std::vector<Member>& members, uint32_t rank) {
  transport::RingAllreduce::Options ro;
  ro.rank = rank;
  ro.size = static_cast<uint32_t>(members.size());
  ro.node_id = options_.node_id;
  ro.chunk_bytes = options_.chunk_bytes;
  ro.timeout = options_.timeout;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<transport::RingAllreduce> made,
                          transport::RingAllreduce::Create(transport_, ro));
  std::shared_ptr<transport::RingAllreduce> ring(std::move(made));
  std::vector<std::pair<transport::Message, std::shared_ptr<transport::Responder>>> early, skipped;
  {
    absl::MutexLock l(&mu_);
    // (An Abort since Form began: this ring is not installed.)
    if (over_.load()) return absl::CancelledError("dense allreduce: the job is over");
    ring_ = ring;
    ring_epoch_ = epoch;
    ring_nodes_.clear();
    for (const Member& m : members) ring_nodes_.push_back(m.node_id);
    // (A newer view, seen meanwhile, that leaves a member out: this ring
    // cannot form.)
    if (const uint32_t gone = GoneLocked(); gone != 0) {
      ring->Abort(LeftError(gone, epoch, newest_view_));
    }
    for (auto it = early_.begin(); it != early_.end() && it->first <= epoch;) {
      for (auto& m : it->second) {
        early_bytes_ -= m.first.payload.size();
        (it->first == epoch ? early : skipped).push_back(std::move(m));
      }
      it = early_.erase(it);
    }
  }
  formed_ = false;  // (until this Form is through)
  for (auto& [m, r] : early) ring->Handle(std::move(m), std::move(r));
  for (auto& [m, r] : skipped) {  // (a ring this member never formed)
    r->Respond(transport::MakeErrorResponse(
        m.header, transport::ResponseTypeFor(m.header.type),
        absl::FailedPreconditionError(absl::StrCat("dense allreduce member ", options_.node_id,
                                                   ": the ring of epoch ", m.header.version >> 32,
                                                   " was skipped for that of epoch ", epoch))));
  }
  epoch_ = epoch;
  calls_ = 0;
  rank_ = rank;
  members_ = members;
  return ring;
}

namespace {

// What Form's first exchange says (`ctl`: the slots of `w` members).
struct Agreement {
  // The last step any member completed; a member that was in it when the
  // ring broke has its optimizer shards past it too (every shard was
  // applied before any member could complete it).
  std::optional<uint64_t> last;
  // The newest split of the optimizer state among members that are where
  // the job is (0: none), and, by member, whether it holds its shards.
  uint64_t newest = 0;
  std::vector<bool> holds;
  uint64_t updates = 0;  // the optimizer updates the ring has applied
  // No member holds the state of a ring: a member that restored a
  // checkpoint brings its state (every such member read the same one).
  std::optional<uint32_t> restorer;
  // The parameters of the first member that completed the last step (or
  // of the first member, before any step).
  uint32_t source = 0;
  uint64_t answered = 0;  // the newest checkpoint ask every member answered
};

Agreement Agree(const std::vector<float>& ctl, uint32_t w) {
  auto slot = [&](uint32_t m) { return ctl.data() + static_cast<size_t>(m) * kFormSlot; };
  Agreement a;
  for (uint32_t m = 0; m < w; ++m) {
    if (slot(m)[kHasCompleted] > 0) {
      a.last = std::max(a.last.value_or(0), GetU64(slot(m) + kCompleted));
    }
  }
  auto current = [&](uint32_t m) {  // where the job is: at the last step
    const float* s = slot(m);
    if (a.last.has_value() && s[kInStep] > 0 && GetU64(s + kInStepValue) == *a.last) return true;
    const std::optional<uint64_t> done =
        s[kHasCompleted] > 0 ? std::optional<uint64_t>(GetU64(s + kCompleted)) : std::nullopt;
    return done == a.last;
  };
  for (uint32_t m = 0; m < w; ++m) {
    if (slot(m)[kHasState] > 0 && current(m)) {
      a.newest = std::max(a.newest, GetU64(slot(m) + kStateEpoch));
    }
  }
  for (uint32_t m = 0; m < w; ++m) {
    a.holds.push_back(slot(m)[kHasState] > 0 && GetU64(slot(m) + kStateEpoch) == a.newest &&
                      current(m));
    if (a.holds.back()) a.updates = std::max(a.updates, GetU64(slot(m) + kUpdates));
  }
  if (a.newest == 0) {
    for (uint32_t m = 0; m < w && !a.restorer.has_value(); ++m) {
      if (slot(m)[kRestored] > 0 && current(m)) a.restorer = m;
    }
    if (a.restorer.has_value()) a.updates = GetU64(slot(*a.restorer) + kUpdates);
  }
  if (a.last.has_value()) {
    for (uint32_t m = w; m-- > 0;) {
      if (slot(m)[kHasCompleted] > 0 && GetU64(slot(m) + kCompleted) == *a.last) a.source = m;
    }
  }
  a.answered = GetU64(slot(0) + kAnswered);
  for (uint32_t m = 1; m < w; ++m) a.answered = std::min(a.answered, GetU64(slot(m) + kAnswered));
  return a;
}

}  // namespace

absl::StatusOr<DenseSync::Formed> DenseSync::Form(uint64_t epoch,
                                                  const std::vector<Member>& members,
                                                  const std::vector<float*>& params) {
  if (params.size() != table_sizes_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("dense allreduce: ", params.size(),
                                                   " parameter buffers for ", table_sizes_.size(),
                                                   " tables"));
  }
  // (A step in flight cannot go on across rings: it failed.)
  AbandonStep(absl::AbortedError("dense allreduce: a ring is formed while a step is in flight"));
  if (over_.load()) return absl::CancelledError("dense allreduce: the job is over");
  if (epoch <= epoch_ || epoch >= (uint64_t{1} << 32)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dense allreduce member ", options_.node_id, ": a ring of epoch ", epoch,
                     " after one of epoch ", epoch_, " (epochs rise, below 2^32)"));
  }
  uint32_t rank = 0;
  bool found = false;
  for (uint32_t i = 0; i < members.size(); ++i) {
    if (members[i].node_id == options_.node_id) {
      rank = i;
      found = true;
    }
  }
  if (!found) {
    return absl::InvalidArgumentError(absl::StrCat("dense allreduce: node ", options_.node_id,
                                                   " is not among the ", members.size(),
                                                   " members of the ring of epoch ", epoch));
  }
  const uint32_t w = static_cast<uint32_t>(members.size());
  STRATA_ASSIGN_OR_RETURN(std::shared_ptr<transport::RingAllreduce> ring,
                          StartRing(epoch, members, rank));
  if (w > 1) STRATA_RETURN_IF_ERROR(ring->ConnectNext(members[(rank + 1) % w].address));
  if (state_epoch_ == 0) CopyIn(params, &params_);  // (a member new to the job)

  // 1. Who holds what.
  std::vector<float> ctl(static_cast<size_t>(w) * kFormSlot, 0.f);
  PutFormSlot(ctl.data() + static_cast<size_t>(rank) * kFormSlot);
  STRATA_RETURN_IF_ERROR(ring->Allreduce(ctl.data(), ctl.size(), Op(calls_++)));
  const Agreement agreed = Agree(ctl, w);
  const std::optional<uint64_t> last = agreed.last;
  auto holder = [&](uint32_t node) {
    for (uint32_t m = 0; m < w; ++m) {
      if (members[m].node_id == node) return agreed.holds[m];
    }
    return false;
  };
  // A step cut short everywhere is undone here.
  if (in_step_.has_value() && (!last.has_value() || *in_step_ > *last)) {
    if (primary_ != nullptr) STRATA_RETURN_IF_ERROR(primary_->RestoreState(primary_before_));
    if (replica_ != nullptr) STRATA_RETURN_IF_ERROR(replica_->RestoreState(replica_before_));
  }
  // 2. The parameters and the optimizer state, summed from where each
  // part is: [K state vectors over the flat space][the parameters][the
  // seq of the checkpoint lost state came from, + 1, as 2 floats].
  const size_t k = state_vectors_;
  std::vector<float> all((k + 1) * total_ + kPieces, 0.f);
  std::vector<std::pair<size_t, size_t>> lost_ranges;
  if (agreed.newest > 0 && agreed.newest == state_epoch_ && agreed.holds[rank]) {
    lost_ranges = PutOldShards(holder, all.data());
  }
  size_t lost = 0;
  for (const auto& [b, e] : lost_ranges) lost += (e - b) * k;
  // (The first member that holds state puts the lost segments'; every
  // holder finds the same ones.)
  const uint32_t filler = static_cast<uint32_t>(
      std::find(agreed.holds.begin(), agreed.holds.end(), true) - agreed.holds.begin());
  if (lost > 0 && rank == filler) {
    if (std::optional<uint64_t> seq = PutCheckpointState(lost_ranges, all.data())) {
      PutU64(*seq + 1, all.data() + (k + 1) * total_);
    }
  }
  if (agreed.restorer == rank && k > 0) {
    std::memcpy(all.data(), restored_state_.data(), k * total_ * sizeof(float));
  }
  if (rank == agreed.source)
    std::memcpy(all.data() + k * total_, params_.data(), total_ * sizeof(float));
  STRATA_RETURN_IF_ERROR(ring->Allreduce(all.data(), all.size(), Op(calls_++)));

  // 3. This ring's shards.
  std::optional<uint64_t> state_checkpoint;
  if (const uint64_t seq = GetU64(all.data() + (k + 1) * total_); seq > 0) {
    state_checkpoint = seq - 1;
  }
  std::memcpy(params_.data(), all.data() + k * total_, total_ * sizeof(float));
  CopyOut(params_, params);
  STRATA_RETURN_IF_ERROR(TakeShards(all, rank, w, agreed.updates));
  const bool own_params = completed_.has_value() && completed_ == last;
  answered_ = agreed.answered;
  updates_ = agreed.updates;
  state_epoch_ = epoch;
  state_members_ = members;
  completed_ = last;
  in_step_.reset();
  cut_short_samples_.reset();
  formed_ = true;
  if (restored_) {
    restored_ = false;
    std::vector<float>().swap(restored_state_);
  }
  if (agreed.restorer.has_value()) {
    LOG(INFO) << "dense allreduce ring of epoch " << epoch
              << ": the optimizer state is the checkpoint's (" << agreed.updates
              << " updates), the parameters those of step " << last.value_or(0);
  }
  if (lost > 0) {
    LOG(WARNING) << "dense allreduce ring of epoch " << epoch << ": " << lost
                 << " floats of optimizer state were on members that are all gone (a shard's "
                    "owner and its replica); "
                 << (state_checkpoint.has_value()
                         ? absl::StrCat("they are checkpoint ", *state_checkpoint, "'s")
                         : std::string("they start again from zero"));
  }
  VLOG(1) << "dense allreduce ring of epoch " << epoch << ": rank " << rank << " of " << w
          << ", next step " << (last.has_value() ? *last + 1 : 0);
  return Formed{last.has_value() ? *last + 1 : 0, lost, state_checkpoint, own_params};
}

void DenseSync::PutFormSlot(float* mine) const {
  mine[kHasState] = state_epoch_ > 0 ? 1.f : 0.f;
  PutU64(state_epoch_, mine + kStateEpoch);
  mine[kHasCompleted] = completed_.has_value() ? 1.f : 0.f;
  PutU64(completed_.value_or(0), mine + kCompleted);
  mine[kInStep] = in_step_.has_value() ? 1.f : 0.f;
  PutU64(in_step_.value_or(0), mine + kInStepValue);
  PutU64(updates(), mine + kUpdates);
  mine[kRestored] = restored_ ? 1.f : 0.f;
  PutU64(answered_, mine + kAnswered);
}

absl::Status DenseSync::TakeShards(const std::vector<float>& all, uint32_t rank, uint32_t w,
                                   uint64_t updates) {
  const size_t k = state_vectors_;
  auto state_of = [&](uint32_t segment) {
    auto [b, e] = SegmentOf(segment, w);
    std::string s;
    // (Adam keeps its update count before the vectors.)
    if (state_has_count_) {
      s.append(reinterpret_cast<const char*>(&updates), sizeof(uint64_t));
    }
    for (size_t v = 0; v < k; ++v) {
      s.append(reinterpret_cast<const char*>(all.data() + v * total_ + b), (e - b) * sizeof(float));
    }
    return s;
  };
  {
    auto [b, e] = SegmentOf((rank + 1) % w, w);
    const std::string s = state_of((rank + 1) % w);
    STRATA_ASSIGN_OR_RETURN(primary_, MakeOptimizer(e - b, &s));
  }
  replica_.reset();
  if (w > 1) {
    auto [b, e] = SegmentOf(rank, w);
    const std::string s = state_of(rank);
    STRATA_ASSIGN_OR_RETURN(replica_, MakeOptimizer(e - b, &s));
  }
  return absl::OkStatus();
}

absl::Status DenseSync::CanStep(uint64_t step,
                                std::shared_ptr<transport::RingAllreduce>* ring) const {
  {
    absl::MutexLock l(&mu_);
    *ring = ring_;
  }
  if (in_flight_ != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("dense allreduce member ", options_.node_id,
                                                      ": step ", step, " while step ",
                                                      in_flight_->step, " is in flight"));
  }
  if (*ring == nullptr || !formed_ || in_step_.has_value()) {
    std::string why = " before a ring was formed";
    if (in_step_.has_value()) {
      why = absl::StrCat(" after step ", *in_step_, " failed");
    } else if (*ring != nullptr) {
      why = absl::StrCat(" after forming the ring of epoch ", epoch_, " failed");
    }
    return absl::FailedPreconditionError(absl::StrCat("dense allreduce member ", options_.node_id,
                                                      ": step ", step, why, ": form a ring first"));
  }
  return absl::OkStatus();
}

absl::StatusOr<DenseSync::StepResult> DenseSync::Step(uint64_t step,
                                                      const std::vector<const float*>& grads,
                                                      uint64_t samples, uint64_t epoch_seen,
                                                      const std::vector<float*>& params,
                                                      CheckpointAsk ask) {
  std::shared_ptr<transport::RingAllreduce> ring;
  STRATA_RETURN_IF_ERROR(CanStep(step, &ring));
  if (grads.size() != table_sizes_.size() || params.size() != table_sizes_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("dense allreduce: ", grads.size(), " gradients and ", params.size(),
                     " parameter buffers for ", table_sizes_.size(), " tables"));
  }
  Begin(step, samples, epoch_seen, ask, std::move(ring), /*threaded=*/false);
  return FinishStep(grads, params);
}

absl::Status DenseSync::StartStep(uint64_t step, uint64_t samples, uint64_t epoch_seen,
                                  CheckpointAsk ask) {
  std::shared_ptr<transport::RingAllreduce> ring;
  STRATA_RETURN_IF_ERROR(CanStep(step, &ring));
  Begin(step, samples, epoch_seen, ask, std::move(ring), /*threaded=*/true);
  return absl::OkStatus();
}

void DenseSync::Begin(uint64_t step, uint64_t samples, uint64_t epoch_seen, CheckpointAsk ask,
                      std::shared_ptr<transport::RingAllreduce> ring, bool threaded) {
  auto f = std::make_unique<InFlight>();
  f->step = step;
  f->samples = samples;
  f->epoch_seen = epoch_seen;
  f->ask = ask;
  f->ring = std::move(ring);
  f->threaded = threaded;
  f->ready.assign(table_sizes_.size(), 0);
  // (Before the first send: a step cut short is undone from here.)
  primary_before_ = primary_->SaveState();
  if (replica_ != nullptr) replica_before_ = replica_->SaveState();
  buf_.resize(total_);
  in_flight_ = std::move(f);
  if (threaded) {
    if (!step_thread_.joinable()) step_thread_ = std::thread([this] { StepThread(); });
    absl::MutexLock l(&step_mu_);
    handed_ = in_flight_.get();
  }
}

void DenseSync::StepThread() {
  while (true) {
    InFlight* f = nullptr;
    {
      absl::MutexLock l(&step_mu_);
      auto handed = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_) {
        return handed_ != nullptr || quit_;
      };
      step_mu_.Await(absl::Condition(&handed));
      if (handed_ == nullptr) return;  // (quit_)
      f = handed_;
      handed_ = nullptr;
    }
    RunStep(f);
    absl::MutexLock l(&step_mu_);
    f->done = true;
  }
}

void DenseSync::GradsReady(size_t table, const float* grad, size_t end) {
  InFlight* f = in_flight_.get();
  if (f == nullptr || table >= table_sizes_.size()) return;
  end = std::min(end, table_sizes_[table]);
  // (Only this thread writes `ready`; the step thread reads it under
  // step_mu_, and the bytes before it once it is set.)
  const size_t have = f->ready[table];
  if (end <= have) return;
  std::memcpy(buf_.data() + offsets_[table] + have, grad + have, (end - have) * sizeof(float));
  absl::MutexLock l(&step_mu_);
  f->ready[table] = end;
}

bool DenseSync::BucketReady(const InFlight& f, size_t b) const {
  if (f.all_ready) return true;
  // The last bucket waits for FinishStep: until then no member can
  // complete the step, so that one abandoned (AbandonStep) is one that
  // nobody completed, its batch untrained everywhere.
  if (b + 1 == buckets_.size()) return false;
  const auto [begin, end] = buckets_[b];
  for (size_t t = 0; t < table_sizes_.size(); ++t) {
    const size_t tb = offsets_[t], te = offsets_[t] + table_sizes_[t];
    if (te <= begin || tb >= end) continue;
    if (f.ready[t] < std::min(end, te) - tb) return false;
  }
  return true;
}

void DenseSync::RunStep(InFlight* f) {
  const uint32_t w = size();
  // 1. The step's samples and the newest view, from every member.
  std::vector<float> ctl(static_cast<size_t>(w) * kStepSlot, 0.f);
  float* mine = ctl.data() + static_cast<size_t>(rank_) * kStepSlot;
  PutU64(f->samples, mine + kSamples);
  PutU64(f->epoch_seen, mine + kEpochSeen);
  PutU64(f->ask.id, mine + kAskId);
  PutU64(f->ask.seq, mine + kAskSeq);
  PutU64(f->ask.cut, mine + kAskCut);
  if (absl::Status s = f->ring->Allreduce(ctl.data(), ctl.size(), Op(calls_++)); !s.ok()) {
    f->result = s;
    return;
  }
  StepResult result;
  for (uint32_t m = 0; m < w; ++m) {
    const float* slot = ctl.data() + static_cast<size_t>(m) * kStepSlot;
    result.samples += GetU64(slot + kSamples);
    result.max_epoch = std::max(result.max_epoch, GetU64(slot + kEpochSeen));
    if (const uint64_t id = GetU64(slot + kAskId); id > result.ask.id) {
      result.ask = {id, GetU64(slot + kAskSeq), GetU64(slot + kAskCut)};
    }
  }
  f->result = result;
  f->ctl_samples = result.samples;
  if (result.samples == 0) return;  // (nobody trained: the parameters stay)

  // 2. Bucket by bucket, as the gradients come: reduce-scatter the sums;
  // each shard's owner (and its replica) applies the optimizer to its
  // part of the bucket; the all-gather carries parameters.
  const float scale = 1.f / static_cast<float>(result.samples);
  const uint64_t update = updates_ + 1;
  auto apply = [&](Optimizer* opt, size_t shard_begin, size_t offset, float* chunk, size_t len) {
    if (scratch_.size() < len) scratch_.resize(len);
    std::memcpy(scratch_.data(), params_.data() + offset, len * sizeof(float));
    opt->ApplyRange(offset - shard_begin, scratch_.data(), chunk, scale, len, update);
    std::memcpy(chunk, scratch_.data(), len * sizeof(float));
  };
  const size_t own_begin = shard().first;
  const size_t replica_begin = Segment(rank_).first;
  transport::RingAllreduce::Cut cut;
  cut.bounds.resize(w + 1);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    {
      absl::MutexLock l(&step_mu_);
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_) {
        return f->abandoned || BucketReady(*f, b);
      };
      step_mu_.Await(absl::Condition(&ready));
      if (f->abandoned) {
        f->result = absl::CancelledError(absl::StrCat("dense allreduce member ", options_.node_id,
                                                      ": step ", f->step, " abandoned"));
        return;
      }
    }
    const auto [begin, end] = buckets_[b];
    // (Each member's share of the bucket: where its shard falls in it.)
    for (uint32_t s = 0; s <= w; ++s) {
      cut.bounds[s] = std::clamp(s == w ? total_ : Segment(s).first, begin, end) - begin;
    }
    // (The step's last bucket waits for every bucket's acknowledgements.)
    cut.settle = b + 1 == buckets_.size();
    transport::RingAllreduce::Hooks hooks;
    hooks.owned = [&, begin = begin](size_t offset, float* chunk, size_t len) {
      apply(primary_.get(), own_begin, begin + offset, chunk, len);
    };
    hooks.first_gathered = [&, begin = begin](size_t offset, float* chunk, size_t len) {
      apply(replica_.get(), replica_begin, begin + offset, chunk, len);
    };
    if (absl::Status s =
            f->ring->Allreduce(buf_.data() + begin, end - begin, Op(calls_++), hooks, cut);
        !s.ok()) {
      f->result = s;
      return;
    }
  }
}

absl::StatusOr<DenseSync::StepResult> DenseSync::FinishStep(const std::vector<const float*>& grads,
                                                            const std::vector<float*>& params) {
  if (in_flight_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("dense allreduce member ", options_.node_id, ": no step in flight to finish"));
  }
  InFlight* f = in_flight_.get();
  if (grads.size() != table_sizes_.size() || params.size() != table_sizes_.size()) {
    const absl::Status bad = absl::InvalidArgumentError(
        absl::StrCat("dense allreduce: ", grads.size(), " gradients and ", params.size(),
                     " parameter buffers for ", table_sizes_.size(), " tables"));
    AbandonStep(bad);
    return bad;
  }
  // The gradients the backward pass did not hand over yet.
  for (size_t t = 0; t < table_sizes_.size(); ++t) {
    const size_t have = f->ready[t];
    std::memcpy(buf_.data() + offsets_[t] + have, grads[t] + have,
                (table_sizes_[t] - have) * sizeof(float));
  }
  {
    absl::MutexLock l(&step_mu_);
    f->all_ready = true;
  }
  if (f->threaded) {
    absl::MutexLock l(&step_mu_);
    step_mu_.Await(absl::Condition(&f->done));
  } else {
    RunStep(f);
  }
  const std::unique_ptr<InFlight> done = std::move(in_flight_);
  const uint64_t step = done->step;
  if (!done->result.ok()) {
    in_step_ = step;
    cut_short_samples_ = done->ctl_samples;
    return done->result.status();
  }
  if (done->result->samples == 0) {  // (nobody trained: the parameters stay)
    completed_ = step;
    return done->result;
  }
  if (options_.fail_after_step_for_testing == step) {
    in_step_ = step;
    cut_short_samples_ = done->ctl_samples;
    return absl::UnavailableError(absl::StrCat("dense allreduce member ", options_.node_id,
                                               ": step ", step, " failed (test)"));
  }
  params_.swap(buf_);
  CopyOut(params_, params);
  ++updates_;
  completed_ = step;
  return done->result;
}

void DenseSync::AbandonStep(const absl::Status& why) {
  if (in_flight_ == nullptr) return;
  InFlight* f = in_flight_.get();
  {
    absl::MutexLock l(&step_mu_);
    f->abandoned = true;
  }
  // (Ends a ring call in progress; the others' wait for this member ends
  // at their timeout, or when the next view's ring forms.)
  f->ring->Abort(why);
  if (f->threaded) {
    absl::MutexLock l(&step_mu_);
    step_mu_.Await(absl::Condition(&f->done));
  }
  in_step_ = f->step;
  cut_short_samples_ = f->ctl_samples;
  in_flight_.reset();
}

std::vector<uint64_t> DenseSync::BucketStarts(size_t table) const {
  std::vector<uint64_t> starts;
  if (table >= table_sizes_.size()) return starts;
  const size_t tb = offsets_[table], te = tb + table_sizes_[table];
  for (const auto& [begin, end] : buckets_) {
    if (begin > tb && begin < te) starts.push_back(begin - tb);
  }
  std::sort(starts.begin(), starts.end());
  return starts;
}

void DenseSync::CutBuckets() {
  buckets_.clear();
  if (total_ == 0) return;
  if (options_.bucket_bytes == 0) {
    buckets_.emplace_back(0, total_);
    return;
  }
  const size_t cap = std::max<size_t>(1, options_.bucket_bytes / sizeof(float));
  for (size_t t = table_sizes_.size(); t-- > 0;) {
    const size_t size = table_sizes_[t];
    if (size == 0) continue;
    const size_t row =
        t < options_.row_floats.size() && options_.row_floats[t] > 0 ? options_.row_floats[t] : 1;
    const size_t rows = (size + row - 1) / row;
    const size_t pieces = std::min(rows, (size + cap - 1) / cap);
    for (size_t k = 0; k < pieces; ++k) {
      const size_t b = offsets_[t] + std::min(size, rows * k / pieces * row);
      const size_t e = offsets_[t] + std::min(size, rows * (k + 1) / pieces * row);
      if (b == e) continue;
      if (!buckets_.empty()) {
        std::pair<size_t, size_t>& last = buckets_.back();
        if (last.first == e && last.second - b <= cap) {  // (the table before)
          last.first = b;
          continue;
        }
        if (last.second == b && e - last.first <= cap) {  // (the next piece)
          last.second = e;
          continue;
        }
      }
      buckets_.emplace_back(b, e);
    }
  }
}

absl::StatusOr<DenseSync::Snapshot> DenseSync::TakeSnapshot() const {
  if (!formed_ || in_step_.has_value() || primary_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("dense allreduce member ", options_.node_id, ": no snapshot ",
                     in_step_.has_value() ? "after a failed step" : "before a ring is formed"));
  }
  Snapshot s;
  s.rank = rank_;
  s.ring_size = size();
  s.ring_epoch = epoch_;
  std::tie(s.begin, s.end) = shard();
  s.total = total_;
  s.step = completed_.value_or(0);
  s.updates = updates_;
  s.state_vectors = static_cast<uint32_t>(state_vectors_);
  s.state_count = state_has_count_;
  s.values.assign(params_.begin() + static_cast<ptrdiff_t>(s.begin),
                  params_.begin() + static_cast<ptrdiff_t>(s.end));
  if (state_vectors_ > 0) s.state = primary_->SaveState();
  return s;
}

absl::Status DenseSync::Restore(uint64_t step, uint64_t updates, std::vector<float> values,
                                std::vector<float> state, const std::vector<float*>& params) {
  if (state_epoch_ != 0 || formed_) {
    return absl::FailedPreconditionError(
        absl::StrCat("dense allreduce member ", options_.node_id,
                     ": a checkpoint's state restored after a ring was formed"));
  }
  if (values.size() != total_ || state.size() != state_vectors_ * total_ ||
      params.size() != table_sizes_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("dense allreduce: a checkpoint of ", values.size(), " parameters and ",
                     state.size(), " optimizer-state floats for tables of ", total_,
                     " parameters and ", state_vectors_ * total_, " state floats"));
  }
  params_ = std::move(values);
  CopyOut(params_, params);
  restored_state_ = std::move(state);
  restored_ = true;
  updates_ = updates;
  completed_ = step;
  return absl::OkStatus();
}

}  // namespace strata::worker
