#include "pserver/partition.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/error_reason.h"
#include "common/status_macros.h"
#include "common/vector_ops.h"
#include "glog/logging.h"

namespace strata::pserver {

using transport::Message;
using transport::MessageType;

std::vector<Partition::Chunk> Partition::MakeChunks(uint64_t length, uint64_t chunk_floats) {
  std::vector<Partition::Chunk> chunks;
  for (uint64_t b = 0; b < length || chunks.empty(); b += chunk_floats) {
    Partition::Chunk c;
    c.begin = b;
    c.end = std::min(length, b + chunk_floats);
    chunks.push_back(std::move(c));
  }
  return chunks;
}

Partition::Partition(uint32_t id, std::string table, std::vector<float> values,
                     std::unique_ptr<Optimizer> optimizer, SyncMode sync, uint64_t chunk_floats)
    : id_(id),
      table_(std::move(table)),
      length_(values.size()),
      sparse_(false),
      dim_(0),
      chunk_floats_(chunk_floats == 0 || chunk_floats >= length_ ? std::max<uint64_t>(length_, 1)
                                                                 : chunk_floats),
      num_chunks_(static_cast<uint32_t>((std::max<uint64_t>(length_, 1) + chunk_floats_ - 1) /
                                        chunk_floats_)),
      consistency_(sync.consistency),
      staleness_(sync.staleness),
      values_(std::move(values)),
      optimizer_(std::move(optimizer)),
      chunks_(MakeChunks(length_, chunk_floats_)),
      ledger_(static_cast<uint32_t>(chunks_.size())) {
  if (consistency_ == Consistency::kBsp) grad_sum_.assign(length_, 0.f);
}

Partition::Partition(uint32_t id, std::string table, std::unique_ptr<SparseTable> rows,
                     SyncMode sync)
    : id_(id),
      table_(std::move(table)),
      length_(0),
      sparse_(true),
      dim_(rows->dim()),
      chunk_floats_(1),
      num_chunks_(1),
      consistency_(sync.consistency),
      staleness_(sync.staleness),
      rows_(std::move(rows)),
      chunks_(MakeChunks(0, 1)),
      ledger_(1) {}

Partition::~Partition() {
  std::vector<Reply> replies;
  std::vector<SnapshotDone> snapshots;
  {
    absl::MutexLock l(&mu_);
    const absl::Status moved = WithReason(
        absl::UnavailableError(absl::StrCat("partition ", id_,
                                            " left this pserver before answering; retry at its "
                                            "new owner")),
        proto::REASON_NOT_SERVED);
    auto refuse = [&](std::shared_ptr<transport::Responder> responder,
                      const transport::MessageHeader& h) {
      replies.emplace_back(std::move(responder), Answer(h, h.type, moved));
    };
    for (auto& [request, responder] : waiting_pulls_) {
      refuse(std::move(responder), request.header);
    }
    for (Held& held : held_) {
      for (Reply& r : held.replies) refuse(std::move(r.first), r.second.header);
    }
    for (Reply& r : step_acks_) refuse(std::move(r.first), r.second.header);
    for (Chunk& k : chunks_) {
      for (Reply& r : k.covered) refuse(std::move(r.first), r.second.header);
    }
    for (auto& [request, done] : waiting_snapshots_) snapshots.push_back(std::move(done));
  }
  // (A pull waiting here has its request type; its answer the response's.)
  for (Reply& r : replies) r.second.header.type = transport::ResponseTypeFor(r.second.header.type);
  Send(&replies);
  for (SnapshotDone& done : snapshots) {
    done(absl::UnavailableError(absl::StrCat("partition ", id_, " left this pserver")));
  }
}

Message Partition::Answer(const transport::MessageHeader& request, MessageType type,
                          const absl::Status& s) {
  if (!s.ok()) return transport::MakeErrorResponse(request, type, s);
  Message resp;
  resp.header = request;
  resp.header.type = type;
  resp.header.status = 0;
  return resp;
}

void Partition::Send(std::vector<Reply>* replies) {
  for (auto& [responder, msg] : *replies) responder->Respond(std::move(msg));
  replies->clear();
}

absl::Status Partition::CheckRequest(const Message& request, uint32_t* first, uint32_t* end) const {
  const auto& h = request.header;
  const bool sparse_request = (h.flags & transport::kFlagSparse) != 0;
  const bool push = h.type == MessageType::kPushRequest;
  const char* kind = sparse_ ? "sparse" : "dense";
  if (sparse_request != sparse_) {
    return absl::InvalidArgumentError(absl::StrCat(
        sparse_request ? "sparse " : "dense ", push ? "push" : "pull", " request from node ",
        h.sender_id, " to ", kind, " partition ", id_, " (", table_, ")"));
  }
  *first = 0;
  *end = num_chunks_;
  if ((h.flags & transport::kFlagChunk) != 0) {
    const uint32_t c = transport::ChunkIndex(h.flags);
    if (sparse_ || c >= num_chunks_) {
      return absl::InvalidArgumentError(
          absl::StrCat(push ? "push" : "pull", " of chunk ", c, " from node ", h.sender_id,
                       " to partition ", id_, " (", table_, "), which has ", num_chunks_,
                       " chunk(s) of ", chunk_floats_ * sizeof(float),
                       " bytes (is cluster.chunk_bytes the same for every node?)"));
    }
    *first = c;
    *end = c + 1;
  }
  const size_t size = request.payload_size();
  if (!push) {
    if (sparse_ && size % sizeof(uint64_t) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("sparse pull from node ", h.sender_id, " to partition ", id_, " (", table_,
                       "): ", size, " bytes of keys is not a whole number of 8-byte keys"));
    }
    return absl::OkStatus();
  }
  if (h.count == 0) {
    return absl::InvalidArgumentError(absl::StrCat("push to partition ", id_, " (", table_,
                                                   ") from node ", h.sender_id,
                                                   " sums over 0 samples"));
  }
  if (sparse_) {
    const size_t row = sizeof(uint64_t) + sizeof(float) * dim_;
    if (size % row != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sparse push to partition ", id_, " (", table_, ") from node ", h.sender_id, ": ", size,
          " bytes is not a whole number of (key, ", dim_, " floats) rows of ", row, " bytes"));
    }
    return absl::OkStatus();
  }
  const uint64_t want =
      (std::min(length_, uint64_t{*end} * chunk_floats_) - uint64_t{*first} * chunk_floats_) *
      sizeof(float);
  if (size != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("push to partition ", id_, " (", table_, ")",
                     *end - *first < num_chunks_ ? absl::StrCat(" chunk ", *first) : "",
                     " from node ", h.sender_id, ": expected ", want,
                     " bytes of gradient over >= 1 sample, got ", size, " bytes over ", h.count));
  }
  return absl::OkStatus();
}

uint64_t Partition::PullFloats(const transport::MessageHeader& h) const {
  if ((h.flags & transport::kFlagChunk) == 0) return length_;
  const uint64_t begin = uint64_t{transport::ChunkIndex(h.flags)} * chunk_floats_;
  return begin < length_ ? std::min(chunk_floats_, length_ - begin) : 0;
}

Message Partition::PullResponseLocked(const Message& req) const {
  Message resp;
  resp.header = req.header;
  resp.header.type = MessageType::kPullResponse;
  resp.header.status = 0;
  resp.header.version = stats_.version;
  if (consistency_ == Consistency::kSsp) {
    // The clock the puller goes on at: its own, or the slowest worker's
    // when that is ahead (it joined while the others trained).
    const auto [first, end] = ChunkRangeOf(req.header);
    resp.header.version = std::max(req.header.version, SlowestClockLocked(first, end).value_or(0));
  }
  if (sparse_) {
    const size_t n = req.payload_size() / sizeof(uint64_t);
    resp.payload.resize(n * dim_ * sizeof(float));
    rows_->Lookup(reinterpret_cast<const uint64_t*>(req.payload_data()), n,
                  reinterpret_cast<float*>(resp.payload.data()));
    return resp;
  }
  // Sent straight from the values, under the partition lock (see Send).
  uint64_t begin = 0, end = length_;
  if ((req.header.flags & transport::kFlagChunk) != 0) {
    const Chunk& c = chunks_[transport::ChunkIndex(req.header.flags)];  // (checked)
    begin = c.begin;
    end = c.end;
    resp.header.version = c.version;
  }
  resp.payload_ref = reinterpret_cast<const char*>(values_.data() + begin);
  resp.payload_ref_size = (end - begin) * sizeof(float);
  return resp;
}

void Partition::Pull(const Message& request, std::shared_ptr<transport::Responder> responder) {
  uint32_t first = 0, end = 0;
  if (absl::Status s = CheckRequest(request, &first, &end); !s.ok()) {
    responder->Respond(transport::MakeErrorResponse(request.header, MessageType::kPullResponse, s));
    return;
  }
  absl::MutexLock l(&mu_);
  if (role_ != PartitionRole::kPrimary) {
    responder->Respond(transport::MakeErrorResponse(
        request.header, MessageType::kPullResponse,
        absl::UnavailableError(absl::StrCat("partition ", id_, " is a backup on this pserver"))));
    return;
  }
  if (!PullReadyLocked(request.header, first, end)) {
    Message waiting;
    waiting.header = request.header;
    waiting.payload.assign(request.payload_data(), request.payload_size());
    waiting_pulls_.emplace_back(std::move(waiting), std::move(responder));
    return;
  }
  ++stats_.pulls_served;
  responder->Respond(PullResponseLocked(request));
}

void Partition::AccumulateSparseLocked(const uint64_t* keys, const float* grads, size_t n) {
  for (size_t i = 0; i < n; ++i, grads += dim_) {
    auto [it, added] = step_slot_.try_emplace(keys[i], static_cast<uint32_t>(step_keys_.size()));
    if (added) {
      step_keys_.push_back(keys[i]);
      step_grads_.insert(step_grads_.end(), grads, grads + dim_);
    } else {
      AddInto(step_grads_.data() + static_cast<size_t>(it->second) * dim_, grads, dim_);
    }
  }
}

void Partition::Push(const Message& request, std::shared_ptr<transport::Responder> responder) {
  const auto& h = request.header;
  std::vector<Reply> replies;
  absl::MutexLock l(&mu_);
  uint32_t first = 0, end = 0;
  absl::Status s = CheckRequest(request, &first, &end);
  Hold hold = Hold::kNone;
  if (role_ != PartitionRole::kPrimary) {
    s = absl::UnavailableError(absl::StrCat("partition ", id_, " is a backup on this pserver"));
  } else if (!s.ok()) {
    ++stats_.rejected_pushes;
  } else if ((h.flags & transport::kFlagInitialValues) != 0) {
    s = InitialValuesLocked(h, first, end, request.payload_data(), &hold);
    first = end;  // (no step to complete)
  } else {
    const char* payload = request.payload_data();
    const size_t sparse_n =
        sparse_ ? request.payload_size() / (sizeof(uint64_t) + sizeof(float) * dim_) : 0;
    for (uint32_t c = first; c < end && s.ok(); ++c) {
      const size_t at = sparse_ ? 0 : (chunks_[c].begin - chunks_[first].begin) * sizeof(float);
      s = PushChunkLocked(h, c, payload + at, sparse_n, &hold);
    }
  }
  // The ack goes out before a bsp step's update is applied: the pusher
  // need not wait for the optimizer, only for the next pull. With backups
  // it waits until they hold what it was part of.
  Reply reply(responder, Answer(h, MessageType::kPushResponse, s));
  if (hold == Hold::kCovered) {
    chunks_[covered_chunk_].covered.push_back(std::move(reply));
  } else if (hold == Hold::kStep) {
    step_acks_.push_back(std::move(reply));
  } else if (hold == Hold::kRecord && !held_.empty()) {
    held_.back().replies.push_back(std::move(reply));
  } else {
    replies.push_back(std::move(reply));
  }
  Send(&replies);
  // (Also after a refusal: a whole push may have added some chunks first.)
  if (consistency_ == Consistency::kBsp && role_ == PartitionRole::kPrimary && first < end) {
    for (uint32_t c = first; c < end; ++c) MaybeCompleteChunkStepLocked(c, &replies);
    Send(&replies);
  }
  if (consistency_ == Consistency::kSsp && s.ok() && !waiting_pulls_.empty()) {
    ServeWaitingPullsLocked(&replies);  // (a clock moved)
    Send(&replies);
  }
}

absl::Status Partition::InitialValuesLocked(const transport::MessageHeader& h, uint32_t first,
                                            uint32_t end, const char* data, Hold* hold) {
  if (sparse_) {
    return absl::InvalidArgumentError(
        absl::StrCat("initial values from node ", h.sender_id, " for sparse partition ", id_, " (",
                     table_, "): a sparse table's rows start from sparse.init"));
  }
  for (uint32_t c = first; c < end; ++c) {
    if (chunks_[c].version != 0 || !chunks_[c].contributors.empty() || stats_.pushes_applied != 0) {
      ++stats_.rejected_pushes;
      return absl::FailedPreconditionError(absl::StrCat(
          "initial values from node ", h.sender_id, " for partition ", id_, " (", table_,
          "), which is trained already (version ", chunks_[c].version, "): refused"));
    }
  }
  const uint64_t begin = chunks_[first].begin;
  std::memcpy(values_.data() + begin, data, (chunks_[end - 1].end - begin) * sizeof(float));
  ++changes_;
  if (backup_acked_.empty()) return absl::OkStatus();
  for (uint32_t c = first; c < end; ++c) {
    ReplicaUpdate u;
    u.chunk = c;
    u.grads.assign(values_.begin() + static_cast<std::ptrdiff_t>(chunks_[c].begin),
                   values_.begin() + static_cast<std::ptrdiff_t>(chunks_[c].end));
    std::vector<Reply> none;
    ReplicateLocked(u, 0, &none, transport::kFlagInitialValues);
  }
  if (HeldByAllLocked() != UINT64_MAX) *hold = std::max(*hold, Hold::kRecord);
  return absl::OkStatus();
}

absl::Status Partition::PushChunkLocked(const transport::MessageHeader& h, uint32_t c,
                                        const char* data, size_t sparse_n, Hold* hold) {
  Chunk& k = chunks_[c];
  const bool replicating = !backup_acked_.empty();
  // A record's acks wait only for counted backups, not for a move's
  // target still catching up. A bsp push's ack waits for its step with
  // any backup: the step in progress is not in a new backup's copy, so a
  // push acked before its step completed would be lost were the backup to
  // take over (a move's cut-over) with the step still open.
  const bool holding = HeldByAllLocked() != UINT64_MAX;
  const auto* keys = reinterpret_cast<const uint64_t*>(data);
  const auto* grad =
      reinterpret_cast<const float*>(sparse_ ? data + sparse_n * sizeof(uint64_t) : data);
  const uint64_t n = k.end - k.begin;
  auto raise = [hold](Hold h) { *hold = std::max(*hold, h); };
  const uint32_t member =
      consistency_ == Consistency::kBsp ? MemberLocked(h.sender_id) : h.sender_id;
  bool in_step = k.contributors.count(member) != 0;
  if (in_step && member != h.sender_id && !ledger_.Seen(h.sender_id, h.seq, c) &&
      std::none_of(k.pushes.begin(), k.pushes.end(),
                   [&](const auto& p) { return p.first == h.sender_id; })) {
    // Another worker of the host pushed its sum for this step already.
    ++stats_.rejected_pushes;
    ledger_.Resolve(h.sender_id, h.seq, c, false);
    covered_chunk_ = c;
    raise(Hold::kCovered);
    return WithReason(
        absl::FailedPreconditionError(absl::StrCat(
            "push to partition ", id_, " from node ", h.sender_id, " for step ", h.version,
            ": its host's gradient is in the step already (pushed by "
            "the host's previous aggregating worker): dropped")),
        proto::REASON_STALE_GRADIENT);
  }
  if (ledger_.Seen(h.sender_id, h.seq, c) || in_step) {
    ++stats_.duplicate_pushes;
    // Acknowledged only once what it was part of is replicated.
    if (in_step ? replicating : holding) raise(in_step ? Hold::kStep : Hold::kRecord);
    return absl::OkStatus();
  }
  // (For the refusals below only: not built for every chunk.)
  auto where = [&] {
    return num_chunks_ > 1 ? absl::StrCat("chunk ", c, " of partition ", id_)
                           : absl::StrCat("partition ", id_);
  };
  if (consistency_ != Consistency::kBsp) {
    if (consistency_ == Consistency::kSsp) {
      uint64_t& clock = k.clocks[h.sender_id];
      clock = std::max(clock, h.version + 1);
    }
    const float scale = static_cast<float>(1.0 / static_cast<double>(h.count));
    if (sparse_) {
      rows_->Update(keys, sparse_n, grad, scale);
    } else {
      optimizer_->ApplyRange(k.begin, values_.data() + k.begin, grad, scale, n, k.version + 1);
    }
    ++k.version;
    ++changes_;
    ledger_.Resolve(h.sender_id, h.seq, c, true);
    if (c == 0) ++stats_.pushes_applied;  // (a push counted by its first chunk)
    AdvanceLocked();
    if (replicating) {
      ReplicaUpdate u;
      u.scale = scale;
      u.chunk = c;
      u.version = k.version;
      u.pushes.emplace_back(h.sender_id, h.seq);
      if (sparse_) {
        u.keys.assign(keys, keys + sparse_n);
        u.grads.assign(grad, grad + sparse_n * dim_);
      } else {
        u.grads.assign(grad, grad + n);
      }
      std::vector<Reply> none;
      ReplicateLocked(u, k.version - 1, &none);
      if (holding) raise(Hold::kRecord);
    }
    return absl::OkStatus();
  }
  if (h.version < k.version) {
    ++stats_.rejected_pushes;
    ledger_.Resolve(h.sender_id, h.seq, c, false);
    return WithReason(
        absl::FailedPreconditionError(absl::StrCat(
            "push to ", where(), " from node ", h.sender_id, " is for step ", h.version,
            " but it is at version ", k.version, ": stale gradient dropped")),
        proto::REASON_STALE_GRADIENT);
  }
  if (h.version > k.version) {
    ++stats_.rejected_pushes;
    return absl::OutOfRangeError(absl::StrCat("push to ", where(), " from node ", h.sender_id,
                                              " is for step ", h.version, " ahead of version ",
                                              k.version));
  }
  if (step_workers_.count(member) == 0) {
    return WithReason(
        absl::UnavailableError(absl::StrCat("node ", h.sender_id, " is not in partition ", id_,
                                            "'s step set yet; retry after the view update")),
        proto::REASON_NOT_IN_STEP_SET);
  }
  k.contributors.insert(member);
  k.pushes.emplace_back(h.sender_id, h.seq);
  // The step's first gradient is copied, later ones added: the sum needs
  // no clearing between steps.
  if (sparse_) {
    AccumulateSparseLocked(keys, grad, sparse_n);
  } else if (k.contributors.size() == 1) {
    std::memcpy(grad_sum_.data() + k.begin, grad, n * sizeof(float));
  } else {
    AddInto(grad_sum_.data() + k.begin, grad, n);
  }
  k.count_sum += static_cast<double>(h.count);
  if (c == 0) ++stats_.pushes_applied;
  if (replicating) raise(Hold::kStep);
  return absl::OkStatus();
}

void Partition::MaybeCompleteChunkStepLocked(uint32_t c, std::vector<Reply>* replies) {
  Chunk& k = chunks_[c];
  if (k.contributors.empty()) return;
  for (uint32_t w : step_workers_) {
    if (k.contributors.count(w) == 0) return;
  }
  const bool replicating = !backup_acked_.empty();
  const float scale = static_cast<float>(1.0 / k.count_sum);
  ReplicaUpdate record;
  if (replicating) {
    record.scale = scale;
    record.chunk = c;
    record.version = k.version + 1;
    record.pushes = k.pushes;
    if (sparse_) {
      record.keys = step_keys_;
      record.grads = step_grads_;
    } else {
      record.grads.assign(grad_sum_.begin() + static_cast<std::ptrdiff_t>(k.begin),
                          grad_sum_.begin() + static_cast<std::ptrdiff_t>(k.end));
    }
  }
  if (sparse_) {
    rows_->Update(step_keys_.data(), step_keys_.size(), step_grads_.data(), scale);
    step_slot_.clear();
    step_keys_.clear();
    step_grads_.clear();
  } else {
    optimizer_->ApplyRange(k.begin, values_.data() + k.begin, grad_sum_.data() + k.begin, scale,
                           k.end - k.begin, k.version + 1);
  }
  ++k.version;
  ++changes_;
  for (const auto& [sender, seq] : k.pushes) ledger_.Resolve(sender, seq, c, true);
  k.pushes.clear();
  k.contributors.clear();
  k.count_sum = 0;
  for (Reply& r : k.covered) replies->push_back(std::move(r));
  k.covered.clear();
  const bool step_done = AdvanceLocked();
  if (replicating) {
    // The step's acks wait for its last chunk's record.
    std::vector<Reply> acks;
    if (step_done) acks.swap(step_acks_);
    ReplicateLocked(record, k.version - 1, &acks);
    for (Reply& r : acks) replies->push_back(std::move(r));  // (no backup counted)
  }
  ServeWaitingPullsLocked(replies);
}

bool Partition::AdvanceLocked() {
  uint64_t all = UINT64_MAX;
  for (const Chunk& k : chunks_) all = std::min(all, k.version);
  if (all <= stats_.version) return false;
  stats_.updates_applied += all - stats_.version;
  stats_.version = all;
  if (!waiting_snapshots_.empty()) TakeDueSnapshotsLocked();
  return true;
}

uint64_t Partition::NewestChunkVersionLocked() const {
  uint64_t newest = 0;
  for (const Chunk& k : chunks_) newest = std::max(newest, k.version);
  return newest;
}

uint64_t Partition::ServedChunkVersionLocked(uint32_t c) const {
  // The first record of the chunk not held by every backup yet.
  for (const Held& h : held_) {
    if (h.chunk == c) return h.before;
  }
  return chunks_[c].version;
}

uint64_t Partition::ServedVersionLocked() const {
  if (held_.empty()) return stats_.version;
  uint64_t served = UINT64_MAX;
  for (uint32_t c = 0; c < chunks_.size(); ++c) {
    served = std::min(served, ServedChunkVersionLocked(c));
  }
  return served;
}

uint64_t Partition::ServedForLocked(uint32_t first, uint32_t end) const {
  return end - first == chunks_.size() ? ServedVersionLocked() : ServedChunkVersionLocked(first);
}

std::pair<uint32_t, uint32_t> Partition::ChunkRangeOf(const transport::MessageHeader& h) const {
  if ((h.flags & transport::kFlagChunk) == 0) return {0, num_chunks_};
  const uint32_t c = transport::ChunkIndex(h.flags);
  return {c, c + 1};
}

std::optional<uint64_t> Partition::SlowestClockLocked(uint32_t first, uint32_t end) const {
  std::optional<uint64_t> slowest;
  for (uint32_t c = first; c < end && c < num_chunks_; ++c) {
    for (uint32_t w : step_workers_) {
      auto it = chunks_[c].clocks.find(w);
      if (it != chunks_[c].clocks.end() && (!slowest || it->second < *slowest)) {
        slowest = it->second;
      }
    }
  }
  return slowest;
}

bool Partition::PullReadyLocked(const transport::MessageHeader& h, uint32_t first,
                                uint32_t end) const {
  switch (consistency_) {
    case Consistency::kBsp:
      return h.version <= ServedForLocked(first, end);
    case Consistency::kSsp: {
      const std::optional<uint64_t> slowest = SlowestClockLocked(first, end);
      return !slowest.has_value() || h.version <= *slowest + staleness_;
    }
    case Consistency::kAsp:
      break;
  }
  return true;
}

void Partition::ServeWaitingPullsLocked(std::vector<Reply>* replies) {
  for (auto it = waiting_pulls_.begin(); it != waiting_pulls_.end();) {
    const auto [first, end] = ChunkRangeOf(it->first.header);
    if (PullReadyLocked(it->first.header, first, end)) {
      ++stats_.pulls_served;
      replies->emplace_back(std::move(it->second), PullResponseLocked(it->first));
      it = waiting_pulls_.erase(it);
    } else {
      ++it;
    }
  }
}

void Partition::SetStepWorkers(const std::set<uint32_t>& workers,
                               const std::map<uint32_t, uint32_t>& member_of) {
  std::vector<Reply> replies;
  absl::MutexLock l(&mu_);
  step_workers_ = workers;
  member_of_ = member_of;
  if (consistency_ == Consistency::kBsp) {
    for (uint32_t c = 0; c < chunks_.size(); ++c) MaybeCompleteChunkStepLocked(c, &replies);
  } else if (consistency_ == Consistency::kSsp) {
    ServeWaitingPullsLocked(&replies);  // (one that left held them)
  }
  Send(&replies);
}

std::map<uint32_t, uint64_t> Partition::ssp_clocks() const {
  absl::MutexLock l(&mu_);
  std::map<uint32_t, uint64_t> clocks;
  for (const Chunk& k : chunks_) {
    for (const auto& [w, clock] : k.clocks) clocks.emplace(w, clock);
  }
  for (auto& [w, clock] : clocks) {
    for (const Chunk& k : chunks_) {
      auto it = k.clocks.find(w);
      clock = std::min(clock, it != k.clocks.end() ? it->second : 0);
    }
  }
  return clocks;
}

PartitionStats Partition::stats() const {
  absl::MutexLock l(&mu_);
  PartitionStats s = stats_;
  s.newest_chunk_version = NewestChunkVersionLocked();
  s.chunks = static_cast<uint32_t>(chunks_.size());
  for (const Chunk& k : chunks_) s.open_chunks += k.contributors.empty() ? 0 : 1;
  return s;
}

SparseTableStats Partition::sparse_stats() const {
  absl::MutexLock l(&mu_);
  return sparse_ ? rows_->stats() : SparseTableStats{};
}

std::vector<float> Partition::ValuesForTesting() const {
  absl::MutexLock l(&mu_);
  return values_;
}

std::vector<float> Partition::RowsForTesting(const std::vector<uint64_t>& keys) const {
  absl::MutexLock l(&mu_);
  if (!sparse_) return {};
  std::vector<float> out(keys.size() * dim_);
  rows_->Lookup(keys.data(), keys.size(), out.data());
  return out;
}

uint64_t Partition::RawBytesLocked() const {
  if (sparse_) {
    // Keys and values and state, as a plain dump would hold them.
    return rows_->rows() * (sizeof(uint64_t) + rows_->row_bytes() - 16);
  }
  return length_ * (sizeof(float) + optimizer_->state_bytes_per_param());
}

PartitionSnapshot Partition::SnapshotLocked(const SnapshotRequest& req) {
  const absl::Time start = absl::Now();
  PartitionSnapshot snap;
  const bool incremental = req.base_seq != 0 && req.base_seq == baseline_seq_;
  proto::CheckpointPartitionHeader& h = snap.header;
  FillHeaderLocked(&h);
  h.set_job(req.job);
  h.set_seq(req.seq);
  h.set_full(!incremental || !sparse_);
  snap.raw_bytes = RawBytesLocked();
  if (sparse_) {
    rows_->ExportRows(/*all=*/!incremental, &snap.rows);
    if (incremental) rows_->ExportRemoved(&snap.removed);
    rows_->ExportPending(&snap.pending);
    rows_->MarkClean();
  } else {
    if (incremental && changes_ == baseline_changes_) {
      snap.unchanged = true;
    } else {
      snap.values.assign(reinterpret_cast<const char*>(values_.data()),
                         values_.size() * sizeof(float));
      snap.optimizer_state = optimizer_->SaveState();
    }
  }
  baseline_seq_ = req.seq;
  baseline_changes_ = changes_;
  snap.stall = absl::Now() - start;
  return snap;
}

void Partition::TakeDueSnapshotsLocked() {
  const uint64_t newest = NewestChunkVersionLocked();
  for (auto it = waiting_snapshots_.begin(); it != waiting_snapshots_.end();) {
    if (newest > it->first.version) {  // (a chunk went on before the others got there)
      it->second(
          WithReason(absl::FailedPreconditionError(absl::StrCat(
                         "partition ", id_, " (", table_, ") has a chunk at version ", newest,
                         ", past the checkpoint's cut at version ", it->first.version)),
                     proto::REASON_CUT_PASSED));
      it = waiting_snapshots_.erase(it);
    } else if (it->first.version == stats_.version) {
      it->second(SnapshotLocked(it->first));
      it = waiting_snapshots_.erase(it);
    } else {
      ++it;
    }
  }
}

void Partition::RequestSnapshot(const SnapshotRequest& req, SnapshotDone done) {
  absl::MutexLock l(&mu_);
  if (!req.at_version) {
    done(SnapshotLocked(req));
    return;
  }
  // Past the cut when any chunk is (an update applied chunk by chunk).
  const uint64_t newest = NewestChunkVersionLocked();
  if (req.version < newest) {
    done(WithReason(absl::FailedPreconditionError(
                        absl::StrCat("partition ", id_, " (", table_, ") is at version ", newest,
                                     ", past the checkpoint's cut at version ", req.version)),
                    proto::REASON_CUT_PASSED));
    return;
  }
  if (req.version == stats_.version) {
    done(SnapshotLocked(req));
    return;
  }
  waiting_snapshots_.emplace_back(req, std::move(done));
}

void Partition::CancelSnapshot(uint64_t seq) {
  absl::MutexLock l(&mu_);
  for (auto it = waiting_snapshots_.begin(); it != waiting_snapshots_.end();) {
    if (it->first.seq == seq) {
      it->second(absl::CancelledError(
          absl::StrCat("checkpoint ", seq, " cancelled before partition ", id_, " reached version ",
                       it->first.version, " (at ", stats_.version, ")")));
      it = waiting_snapshots_.erase(it);
    } else {
      ++it;
    }
  }
}

absl::Status Partition::ApplyCheckpointFile(
    const std::map<storage::BlockType, std::string>& streams, const std::string& path) {
  absl::MutexLock l(&mu_);
  return ApplyStreamsLocked(streams, path);
}

absl::Status Partition::ApplyStreamsLocked(const std::map<storage::BlockType, std::string>& streams,
                                           const std::string& path) {
  using storage::BlockType;
  auto stream = [&streams](BlockType t) -> const std::string& {
    static const std::string* const kEmpty = new std::string();
    auto it = streams.find(t);
    return it == streams.end() ? *kEmpty : it->second;
  };
  proto::CheckpointPartitionHeader h;
  STRATA_RETURN_IF_ERROR(storage::ParseHeaderBlock(streams, BlockType::kHeader, path, &h));
  auto mismatch = [&](absl::string_view what, const auto& file, const auto& here) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", what, " ", file,
                                                   " in the checkpoint, ", here,
                                                   " in this job's partition ", id_));
  };
  if (h.id() != id_) return mismatch("partition", h.id(), id_);
  if (h.table() != table_) return mismatch("table", h.table(), table_);
  if (h.sparse() != sparse_) return mismatch("sparse", h.sparse(), sparse_);
  if (sparse_) {
    if (h.dim() != static_cast<uint32_t>(dim_)) return mismatch("dim", h.dim(), dim_);
    if (h.optimizer() != rows_->optimizer_name()) {
      return mismatch("sparse optimizer", h.optimizer(), rows_->optimizer_name());
    }
    if (h.row_bytes() != rows_->row_bytes())
      return mismatch("row bytes", h.row_bytes(), rows_->row_bytes());
    if (h.full() && rows_->rows() > 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": a full image applied over restored rows"));
    }
    absl::Status s = rows_->RemoveKeys(stream(BlockType::kSparseDeletes));
    if (s.ok()) s = rows_->ImportRows(stream(BlockType::kSparseRows));
    if (s.ok()) s = rows_->ImportPending(stream(BlockType::kSparsePending));
    if (!s.ok()) return absl::DataLossError(absl::StrCat(path, ": ", s.message()));
    if (rows_->rows() != h.rows()) {
      return absl::DataLossError(absl::StrCat(
          path, ": ", rows_->rows(), " rows after applying it, its header says ", h.rows()));
    }
    rows_->SetClock({h.table_updates(), h.table_rng(), h.table_sweep()});
  } else {
    if (h.length() != length_) return mismatch("length", h.length(), length_);
    if (h.optimizer() != optimizer_->name()) {
      return mismatch("optimizer", h.optimizer(), optimizer_->name());
    }
    const std::string& values = stream(BlockType::kDenseValues);
    if (values.size() != length_ * sizeof(float)) {
      return absl::DataLossError(
          absl::StrCat(path, ": ", values.size(), " bytes of values for ", length_, " parameters"));
    }
    if (absl::Status s = optimizer_->RestoreState(stream(BlockType::kOptimizerState)); !s.ok()) {
      return absl::DataLossError(absl::StrCat(path, ": ", s.message()));
    }
    std::memcpy(values_.data(), values.data(), values.size());
  }
  stats_.version = h.version();
  // Chunk versions as saved, if it was cut into the same chunks.
  const bool same_chunks = static_cast<size_t>(h.chunk_versions_size()) == chunks_.size();
  for (size_t c = 0; c < chunks_.size(); ++c) {
    chunks_[c].version =
        same_chunks ? std::max(h.chunk_versions(static_cast<int>(c)), h.version()) : h.version();
  }
  ledger_.Load(h);
  ++changes_;
  return absl::OkStatus();
}

void Partition::FinishRestore(uint64_t seq) {
  absl::MutexLock l(&mu_);
  baseline_seq_ = seq;
  baseline_changes_ = changes_;
  if (sparse_) rows_->MarkClean();
}

}  // namespace strata::pserver

namespace strata::pserver {

void Partition::MakeBackup() {
  absl::MutexLock l(&mu_);
  role_ = PartitionRole::kBackup;
  synced_ = false;
  caught_up_ = false;
}

PartitionRole Partition::role() const {
  absl::MutexLock l(&mu_);
  return role_;
}

bool Partition::synced() const {
  absl::MutexLock l(&mu_);
  return role_ == PartitionRole::kBackup && synced_ && caught_up_;
}

bool Partition::holds_copy() const {
  absl::MutexLock l(&mu_);
  return role_ == PartitionRole::kBackup && synced_;
}

std::map<uint32_t, uint64_t> Partition::applied_by_sender() const {
  absl::MutexLock l(&mu_);
  return ledger_.applied_by_sender();
}

void Partition::FastForward(uint64_t version) {
  absl::MutexLock l(&mu_);
  for (Chunk& k : chunks_) k.version = std::max(k.version, version);
  stats_.version = std::max(stats_.version, version);
}

void Partition::Promote() {
  absl::MutexLock l(&mu_);
  if (role_ == PartitionRole::kPrimary) return;
  if (!synced_) {
    LOG(ERROR) << "partition " << id_ << " (" << table_
               << ") promoted without the primary's copy: it starts from its initial values";
  }
  role_ = PartitionRole::kPrimary;
  synced_ = true;
  caught_up_ = true;
  LOG(INFO) << "partition " << id_ << " (" << table_ << ") promoted to primary at version "
            << stats_.version << " (replication record " << record_index_ << ")";
}

void Partition::FillHeaderLocked(proto::CheckpointPartitionHeader* h) const {
  h->set_format_version(storage::kCheckpointFormatVersion);
  h->set_id(id_);
  h->set_table(table_);
  h->set_length(length_);
  h->set_sparse(sparse_);
  h->set_dim(static_cast<uint32_t>(dim_));
  h->set_version(stats_.version);
  if (NewestChunkVersionLocked() != stats_.version) {
    for (const Chunk& k : chunks_) h->add_chunk_versions(k.version);
  }
  ledger_.Save(h);
  if (sparse_) {
    h->set_optimizer(rows_->optimizer_name());
    h->set_row_bytes(static_cast<uint32_t>(rows_->row_bytes()));
    const SparseTable::Clock c = rows_->clock();
    h->set_table_updates(c.updates);
    h->set_table_rng(c.rng);
    h->set_table_sweep(c.sweep);
    h->set_rows(rows_->rows());
  } else {
    h->set_optimizer(optimizer_->name());
  }
}

std::vector<CopyStream> Partition::CopyStreamsLocked(std::string* header, std::string* rows,
                                                     std::string* pending) const {
  using storage::BlockType;
  proto::CheckpointPartitionHeader h;
  FillHeaderLocked(&h);
  h.set_full(true);
  *header = h.SerializeAsString();
  if (sparse_) {
    rows_->ExportRows(/*all=*/true, rows);
    rows_->ExportPending(pending);
    return {{BlockType::kHeader, {*header}},
            {BlockType::kSparseRows, {*rows}},
            {BlockType::kSparsePending, {*pending}}};
  }
  return {{BlockType::kHeader, {*header}},
          {BlockType::kDenseValues,
           {absl::string_view(reinterpret_cast<const char*>(values_.data()),
                              values_.size() * sizeof(float))}},
          {BlockType::kOptimizerState, optimizer_->StateViews()}};
}

void Partition::EncodeCopyLocked(std::string* out) const {
  std::string header, rows, pending;
  EncodeReplicaCopy(CopyStreamsLocked(&header, &rows, &pending), out);
}

size_t Partition::CopyBufferBytes(const std::vector<uint32_t>& backups) const {
  absl::MutexLock l(&mu_);
  if (role_ != PartitionRole::kPrimary || sparse_) return 0;  // (a sparse copy is built anyway)
  bool added = false;
  for (uint32_t b : backups) added = added || backup_acked_.count(b) == 0;
  if (!added) return 0;
  std::string header, rows, pending;
  // (The header may grow a few bytes by the time the copy is made.)
  return ReplicaCopySize(CopyStreamsLocked(&header, &rows, &pending)) + 256;
}

void Partition::SetBackups(const std::vector<uint32_t>& backups, ReplicaSink* sink,
                           uint32_t move_target) {
  // A new backup's copy goes into a buffer allocated, and its pages
  // touched, before the lock: under it (the partition serves nothing
  // meanwhile) its bytes are only copied in, once.
  const absl::Time start = absl::Now();
  std::string copy(CopyBufferBytes(backups), '\0');
  const absl::Time allocated = absl::Now();
  std::vector<Reply> replies;
  absl::MutexLock l(&mu_);
  const absl::Time locked = absl::Now();
  if (role_ != PartitionRole::kPrimary) return;
  sink_ = sink;
  move_target_ = move_target;
  const std::set<uint32_t> want(backups.begin(), backups.end());
  for (auto it = backup_acked_.begin(); it != backup_acked_.end();) {
    it = want.count(it->first) ? std::next(it) : backup_acked_.erase(it);
  }
  for (auto it = catching_up_.begin(); it != catching_up_.end();) {
    it = want.count(it->first) ? std::next(it) : catching_up_.erase(it);
  }
  std::vector<uint32_t> added;
  for (uint32_t b : want) {
    if (backup_acked_.count(b) == 0) added.push_back(b);
  }
  // (Made once, for every new backup; moved into the last.)
  if (!added.empty()) {
    EncodeCopyLocked(&copy);
    VLOG(1) << "partition " << id_ << ": copy of " << copy.size() << " bytes: buffer "
            << absl::FormatDuration(allocated - start) << ", lock "
            << absl::FormatDuration(locked - allocated) << ", copy under the lock "
            << absl::FormatDuration(absl::Now() - locked);
  }
  for (uint32_t b : added) {
    backup_acked_[b] = 0;
    catching_up_[b] = CatchUp{record_index_, std::nullopt};
    transport::Message m;
    m.header.type = MessageType::kReplicate;
    m.header.partition = id_;
    m.header.seq = record_index_;
    m.header.version = stats_.version;
    m.header.flags = transport::kFlagReplicaCopy | (sparse_ ? transport::kFlagSparse : 0);
    m.header.count = b;
    VLOG(1) << "partition " << id_ << ": copy of " << copy.size() << " bytes at version "
            << stats_.version << " to new backup node " << b;
    if (b == added.back()) {
      m.payload = std::move(copy);
    } else {
      m.payload = copy;
    }
    sink_->Send(this, b, std::move(m));
  }
  ReleaseLocked(&replies);
  Send(&replies);
}

void Partition::ReplicateLocked(const ReplicaUpdate& update, uint64_t before,
                                std::vector<Reply>* replies, uint32_t flags) {
  ++record_index_;
  transport::Message m;
  m.header.type = MessageType::kReplicate;
  m.header.partition = id_;
  m.header.seq = record_index_;
  m.header.version = stats_.version;
  m.header.flags = (sparse_ ? transport::kFlagSparse : 0) | flags;
  m.payload = EncodeReplicaUpdate(update);
  size_t left = backup_acked_.size();
  for (const auto& [b, acked] : backup_acked_) {
    transport::Message copy;
    copy.header = m.header;
    copy.header.count = b;
    copy.payload = --left == 0 ? std::move(m.payload) : m.payload;
    sink_->Send(this, b, std::move(copy));
  }
  // (No backup counted yet: nothing waits; the replies stay the caller's.)
  if (HeldByAllLocked() == UINT64_MAX) return;
  held_.push_back(Held{record_index_, update.chunk, before, std::move(*replies)});
  replies->clear();
}

uint64_t Partition::HeldByAllLocked() const {
  uint64_t all = UINT64_MAX;
  for (const auto& [b, acked] : backup_acked_) {
    if (b != move_target_ || catching_up_.count(b) == 0) all = std::min(all, acked);
  }
  return all;
}

void Partition::ReleaseLocked(std::vector<Reply>* replies) {
  const uint64_t all = HeldByAllLocked();
  size_t n = 0;
  while (n < held_.size() && held_[n].index <= all) {
    for (Reply& r : held_[n].replies) replies->push_back(std::move(r));
    ++n;
  }
  // No backup left: the step in progress need not wait for one (its
  // acks would wait forever: a step completed without backups sends no
  // record).
  const bool step_freed = backup_acked_.empty() && !step_acks_.empty();
  if (n == 0 && !step_freed) return;
  held_.erase(held_.begin(), held_.begin() + static_cast<std::ptrdiff_t>(n));
  if (step_freed) {
    for (Reply& r : step_acks_) replies->push_back(std::move(r));
    step_acks_.clear();
  }
  ServeWaitingPullsLocked(replies);
}

void Partition::OnReplicaAck(uint32_t backup, uint64_t index) {
  std::vector<Reply> replies;
  absl::MutexLock l(&mu_);
  auto it = backup_acked_.find(backup);
  if (it == backup_acked_.end()) return;
  auto c = catching_up_.find(backup);
  // (A copy at record 0 is acknowledged at 0: it counts for catching up.)
  if (index <= it->second && (c == catching_up_.end() || index < c->second.copy)) return;
  it->second = std::max(it->second, index);
  if (c != catching_up_.end()) {
    // Its copy taken in: it must hold what was sent until then too.
    if (!c->second.until.has_value() && index >= c->second.copy) c->second.until = record_index_;
    if (c->second.until.has_value() && index >= *c->second.until) {
      catching_up_.erase(c);
      transport::Message m;
      m.header.type = MessageType::kReplicate;
      m.header.partition = id_;
      m.header.seq = index;  // (acknowledged: nothing else of this seq is queued)
      m.header.version = stats_.version;
      m.header.flags = transport::kFlagReplicaCaughtUp | (sparse_ ? transport::kFlagSparse : 0);
      m.header.count = backup;
      VLOG(1) << "partition " << id_ << ": backup node " << backup << " caught up at record "
              << index;
      sink_->Send(this, backup, std::move(m));
    }
  }
  ReleaseLocked(&replies);
  Send(&replies);
}

absl::Status Partition::ApplyUpdateLocked(const ReplicaUpdate& u) {
  if (u.chunk >= chunks_.size()) {
    return absl::DataLossError(absl::StrCat("replication record for chunk ", u.chunk,
                                            " of partition ", id_, ", which has ", chunks_.size()));
  }
  Chunk& k = chunks_[u.chunk];
  if (sparse_) {
    if (u.grads.size() != u.keys.size() * static_cast<size_t>(dim_)) {
      return absl::DataLossError(absl::StrCat("replication record for sparse partition ", id_, ": ",
                                              u.keys.size(), " keys of dim ", dim_, " but ",
                                              u.grads.size(), " floats"));
    }
    rows_->Update(u.keys.data(), u.keys.size(), u.grads.data(), u.scale);
  } else {
    if (u.grads.size() != k.end - k.begin) {
      return absl::DataLossError(absl::StrCat("replication record for chunk ", u.chunk,
                                              " of partition ", id_, ": ", u.grads.size(),
                                              " floats for ", k.end - k.begin, " parameters"));
    }
    optimizer_->ApplyRange(k.begin, values_.data() + k.begin, u.grads.data(), u.scale,
                           k.end - k.begin, std::max<uint64_t>(u.version, 1));
  }
  k.version = std::max(k.version, u.version);
  ++changes_;
  for (const auto& [sender, seq] : u.pushes) ledger_.Resolve(sender, seq, u.chunk, true);
  if (u.chunk == 0) stats_.pushes_applied += u.pushes.size();
  AdvanceLocked();
  return absl::OkStatus();
}

absl::Status Partition::TakeValuesLocked(const ReplicaUpdate& u) {
  if (sparse_ || u.chunk >= chunks_.size() ||
      u.grads.size() != chunks_[u.chunk].end - chunks_[u.chunk].begin) {
    return absl::DataLossError(absl::StrCat("initial values record for chunk ", u.chunk,
                                            " of partition ", id_, " with ", u.grads.size(),
                                            " floats: not a chunk of it"));
  }
  std::copy(u.grads.begin(), u.grads.end(),
            values_.begin() + static_cast<std::ptrdiff_t>(chunks_[u.chunk].begin));
  ++changes_;
  return absl::OkStatus();
}

void Partition::ApplyReplica(const Message& record,
                             std::shared_ptr<transport::Responder> responder) {
  const auto& h = record.header;
  auto answer = [&](const absl::Status& s) {
    responder->Respond(Answer(h, MessageType::kReplicateResponse, s));
  };
  const bool copy = (h.flags & transport::kFlagReplicaCopy) != 0;
  absl::MutexLock l(&mu_);
  if (role_ != PartitionRole::kBackup) {
    return answer(absl::FailedPreconditionError(absl::StrCat("replication record for partition ",
                                                             id_, " from node ", h.sender_id,
                                                             ": this pserver is its primary")));
  }
  if ((h.flags & transport::kFlagReplicaCaughtUp) != 0) {
    // The primary counts this backup from now on: it is in sync.
    if (!synced_) {
      return answer(absl::UnavailableError(absl::StrCat(
          "backup of partition ", id_, " has no copy yet (caught-up marker ", h.seq, ")")));
    }
    caught_up_ = true;
    return answer(absl::OkStatus());
  }
  if (synced_ && h.seq <= record_index_) return answer(absl::OkStatus());  // held already
  if (copy) {
    if (synced_) {
      return answer(absl::FailedPreconditionError(
          absl::StrCat("copy of partition ", id_, " at record ", h.seq,
                       " over a synced backup at record ", record_index_)));
    }
    auto streams =
        DecodeReplicaCopy(absl::string_view(record.payload_data(), record.payload_size()));
    absl::Status s = streams.ok()
                         ? ApplyStreamsLocked(*streams, absl::StrCat("copy of partition ", id_,
                                                                     " from node ", h.sender_id))
                         : streams.status();
    if (!s.ok()) {
      LOG(ERROR) << s;
      return answer(s);
    }
    record_index_ = h.seq;
    synced_ = true;
    VLOG(1) << "partition " << id_ << ": backup holds the primary's copy at version "
            << stats_.version;
    return answer(absl::OkStatus());
  }
  if (!synced_) {
    return answer(absl::UnavailableError(
        absl::StrCat("backup of partition ", id_, " has no copy yet (record ", h.seq, ")")));
  }
  if (h.seq != record_index_ + 1) {
    return answer(absl::DataLossError(absl::StrCat("replication record ", h.seq, " for partition ",
                                                   id_, " after record ", record_index_)));
  }
  auto u = DecodeReplicaUpdate(absl::string_view(record.payload_data(), record.payload_size()));
  absl::Status s = !u.ok()                                          ? u.status()
                   : (h.flags & transport::kFlagInitialValues) == 0 ? ApplyUpdateLocked(*u)
                                                                    : TakeValuesLocked(*u);
  if (!s.ok()) {
    LOG(ERROR) << s;
    return answer(s);
  }
  record_index_ = h.seq;
  if (stats_.version != h.version) {
    LOG(ERROR) << "partition " << id_ << ": backup at version " << stats_.version
               << " after record " << h.seq << ", the primary at " << h.version;
  }
  answer(absl::OkStatus());
}

}  // namespace strata::pserver
