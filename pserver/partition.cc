#include "pserver/partition.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/vector_ops.h"
#include "glog/logging.h"

namespace strata::pserver {

using transport::Message;
using transport::MessageType;

Partition::Partition(uint32_t id, std::string table, std::vector<float> values,
                     std::unique_ptr<Optimizer> optimizer, Consistency consistency)
    : id_(id),
      table_(std::move(table)),
      length_(values.size()),
      sparse_(false),
      dim_(0),
      consistency_(consistency),
      values_(std::move(values)),
      optimizer_(std::move(optimizer)) {
  if (consistency_ == Consistency::kBsp) grad_sum_.assign(length_, 0.f);
}

Partition::Partition(uint32_t id, std::string table, std::unique_ptr<SparseTable> rows,
                     Consistency consistency)
    : id_(id),
      table_(std::move(table)),
      length_(0),
      sparse_(true),
      dim_(rows->dim()),
      consistency_(consistency),
      rows_(std::move(rows)) {}

void Partition::Send(std::vector<Reply>* replies) {
  for (auto& [responder, msg] : *replies) responder->Respond(std::move(msg));
  replies->clear();
}

absl::Status Partition::CheckRequest(const Message& request) const {
  const auto& h = request.header;
  const bool sparse_request = (h.flags & transport::kFlagSparse) != 0;
  const char* kind = sparse_ ? "sparse" : "dense";
  if (sparse_request != sparse_) {
    return absl::InvalidArgumentError(absl::StrCat(
        sparse_request ? "sparse " : "dense ",
        h.type == MessageType::kPullRequest ? "pull" : "push", " request from node ", h.sender_id, " to ", kind, " partition ", id_, " (", table_, ")"));
  }
  const size_t size = request.payload_size();
  if (h.type == MessageType::kPullRequest) {
    if (sparse_ && size % sizeof(uint64_t) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sparse pull from node ", h.sender_id, " to partition ", id_, " (", table_,
          "): ", size, " bytes of keys is not a whole number of 8-byte keys"));
    }
    return absl::OkStatus();
  }
  if (h.count == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "push to partition ", id_, " (", table_, ") from node ", h.sender_id,
        " sums over 0 samples"));
  }
  if (sparse_) {
    const size_t row = sizeof(uint64_t) + sizeof(float) * dim_;
    if (size % row != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sparse push to partition ", id_, " (", table_, ") from node ", h.sender_id, ": ",
          size, " bytes is not a whole number of (key, ", dim_, " floats) rows of ", row,
          " bytes"));
    }
  } else if (size != length_ * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "push to partition ", id_, " (", table_, ") from node ", h.sender_id,
        ": expected ", length_ * sizeof(float), " bytes of gradient over >= 1 "
        "sample, got ", size, " bytes over ", h.count));
  }
  return absl::OkStatus();
}

Message Partition::PullResponseLocked(const Message& req) const {
  Message resp;
  resp.header = req.header;
  resp.header.type = MessageType::kPullResponse;
  resp.header.status = 0;
  resp.header.version = stats_.version;
  if (sparse_) {
    const size_t n = req.payload_size() / sizeof(uint64_t);
    resp.payload.resize(n * dim_ * sizeof(float));
    rows_->Lookup(reinterpret_cast<const uint64_t*>(req.payload_data()), n,
                  reinterpret_cast<float*>(resp.payload.data()));
    return resp;
  }
  // Sent straight from the values, under the partition lock (see Send).
  resp.payload_ref = reinterpret_cast<const char*>(values_.data());
  resp.payload_ref_size = values_.size() * sizeof(float);
  return resp;
}

void Partition::Pull(const Message& request,
                     std::shared_ptr<transport::Responder> responder) {
  if (absl::Status s = CheckRequest(request); !s.ok()) {
    responder->Respond(transport::MakeErrorResponse(request.header, MessageType::kPullResponse, s));
    return;
  }
  absl::MutexLock l(&mu_);
  if (consistency_ == Consistency::kBsp && request.header.version > stats_.version) {
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

void Partition::Push(const Message& request,
                     std::shared_ptr<transport::Responder> responder) {
  const auto& h = request.header;
  std::vector<Reply> replies;
  auto reply = [&](const absl::Status& s) {
    Message resp;
    if (s.ok()) {
      resp.header = h;
      resp.header.type = MessageType::kPushResponse;
      resp.header.status = 0;
    } else {
      resp = transport::MakeErrorResponse(h, MessageType::kPushResponse, s);
    }
    replies.emplace_back(responder, std::move(resp));
  };
  {
    absl::MutexLock l(&mu_);
    const absl::Status fit = CheckRequest(request);
    const char* payload = request.payload_data();
    const size_t sparse_n =
        sparse_ ? request.payload_size() / (sizeof(uint64_t) + sizeof(float) * dim_) : 0;
    const auto* keys = reinterpret_cast<const uint64_t*>(payload);
    const auto* rows = reinterpret_cast<const float*>(payload + sparse_n * sizeof(uint64_t));
    if (!fit.ok()) {
      ++stats_.rejected_pushes;
      reply(fit);
    } else if (auto it = last_seq_.find(h.sender_id);
               it != last_seq_.end() && h.seq <= it->second) {
      ++stats_.duplicate_pushes;
      reply(absl::OkStatus());
    } else if (consistency_ == Consistency::kAsp) {
      last_seq_[h.sender_id] = h.seq;
      ++stats_.pushes_applied;
      const float scale = static_cast<float>(1.0 / static_cast<double>(h.count));
      if (sparse_) {
        rows_->Update(keys, sparse_n, rows, scale);
      } else {
        optimizer_->Apply(values_.data(), reinterpret_cast<const float*>(payload), scale, length_);
      }
      ++stats_.updates_applied;
      ++stats_.version;
      reply(absl::OkStatus());
    } else if (h.version < stats_.version) {
      ++stats_.rejected_pushes;
      last_seq_[h.sender_id] = h.seq;
      reply(absl::FailedPreconditionError(absl::StrCat(
          "push to partition ", id_, " from node ", h.sender_id, " is for step ",
          h.version, " but the partition is at version ", stats_.version,
          ": stale gradient dropped")));
    } else if (h.version > stats_.version) {
      ++stats_.rejected_pushes;
      reply(absl::OutOfRangeError(absl::StrCat(
          "push to partition ", id_, " from node ", h.sender_id, " is for step ",
          h.version, " ahead of version ", stats_.version)));
    } else if (step_workers_.count(h.sender_id) == 0) {
      reply(absl::UnavailableError(absl::StrCat(
          "node ", h.sender_id, " is not in partition ", id_,
          "'s step set yet; retry after the view update")));
    } else {
      last_seq_[h.sender_id] = h.seq;
      if (contributors_.insert(h.sender_id).second) {
        ++stats_.pushes_applied;
        const float* g = reinterpret_cast<const float*>(payload);
        // The step's first gradient is copied, later ones added: the sum
        // needs no clearing between steps.
        if (sparse_) {
          AccumulateSparseLocked(keys, rows, sparse_n);
        } else if (contributors_.size() == 1) {
          std::memcpy(grad_sum_.data(), g, length_ * sizeof(float));
        } else {
          AddInto(grad_sum_.data(), g, length_);
        }
        count_sum_ += static_cast<double>(h.count);
      } else {
        ++stats_.duplicate_pushes;
      }
      // The ack goes out before the step's update is applied: the pusher
      // need not wait for the optimizer, only for the next pull.
      reply(absl::OkStatus());
      Send(&replies);
      MaybeCompleteStepLocked(&replies);
    }
    Send(&replies);
  }
}

void Partition::ApplyStepLocked() {
  const float scale = static_cast<float>(1.0 / count_sum_);
  if (sparse_) {
    rows_->Update(step_keys_.data(), step_keys_.size(), step_grads_.data(), scale);
    step_slot_.clear();
    step_keys_.clear();
    step_grads_.clear();
  } else {
    optimizer_->Apply(values_.data(), grad_sum_.data(), scale, length_);
  }
  ++stats_.updates_applied;
  ++stats_.version;
}

void Partition::MaybeCompleteStepLocked(std::vector<Reply>* replies) {
  if (contributors_.empty()) return;
  for (uint32_t w : step_workers_) {
    if (contributors_.count(w) == 0) return;
  }
  ApplyStepLocked();
  count_sum_ = 0;
  contributors_.clear();
  for (auto it = waiting_pulls_.begin(); it != waiting_pulls_.end();) {
    if (it->first.header.version <= stats_.version) {
      ++stats_.pulls_served;
      replies->emplace_back(std::move(it->second), PullResponseLocked(it->first));
      it = waiting_pulls_.erase(it);
    } else {
      ++it;
    }
  }
}

void Partition::SetStepWorkers(const std::set<uint32_t>& workers) {
  std::vector<Reply> replies;
  absl::MutexLock l(&mu_);
  step_workers_ = workers;
  if (consistency_ == Consistency::kBsp) MaybeCompleteStepLocked(&replies);
  Send(&replies);
}

PartitionStats Partition::stats() const {
  absl::MutexLock l(&mu_);
  return stats_;
}

SparseTableStats Partition::sparse_stats() const {
  absl::MutexLock l(&mu_);
  return sparse_ ? rows_->stats() : SparseTableStats{};
}

std::vector<float> Partition::ValuesForTesting() const {
  absl::MutexLock l(&mu_);
  return values_;
}

}  // namespace strata::pserver
