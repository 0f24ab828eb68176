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
      consistency_(consistency),
      values_(std::move(values)),
      optimizer_(std::move(optimizer)) {
  if (consistency_ == Consistency::kBsp) grad_sum_.assign(length_, 0.f);
}

void Partition::Send(std::vector<Reply>* replies) {
  for (auto& [responder, msg] : *replies) responder->Respond(std::move(msg));
  replies->clear();
}

Message Partition::PullResponseLocked(const transport::MessageHeader& req) const {
  Message resp;
  resp.header = req;
  resp.header.type = MessageType::kPullResponse;
  resp.header.status = 0;
  resp.header.version = stats_.version;
  // Sent straight from the values, under the partition lock (see Send).
  resp.payload_ref = reinterpret_cast<const char*>(values_.data());
  resp.payload_ref_size = values_.size() * sizeof(float);
  return resp;
}

void Partition::Pull(const Message& request,
                     std::shared_ptr<transport::Responder> responder) {
  absl::MutexLock l(&mu_);
  if (consistency_ == Consistency::kBsp && request.header.version > stats_.version) {
    waiting_pulls_.emplace_back(request.header, std::move(responder));
    return;
  }
  ++stats_.pulls_served;
  responder->Respond(PullResponseLocked(request.header));
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
    if (request.payload.size() != length_ * sizeof(float) || h.count == 0) {
      ++stats_.rejected_pushes;
      reply(absl::InvalidArgumentError(absl::StrCat(
          "push to partition ", id_, " (", table_, ") from node ", h.sender_id,
          ": expected ", length_ * sizeof(float), " bytes of gradient over >= 1 "
          "sample, got ", request.payload.size(), " bytes over ", h.count)));
    } else if (auto it = last_seq_.find(h.sender_id);
               it != last_seq_.end() && h.seq <= it->second) {
      ++stats_.duplicate_pushes;
      reply(absl::OkStatus());
    } else if (consistency_ == Consistency::kAsp) {
      last_seq_[h.sender_id] = h.seq;
      ++stats_.pushes_applied;
      ApplyLocked(reinterpret_cast<const float*>(request.payload.data()),
                  static_cast<double>(h.count));
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
        const float* g = reinterpret_cast<const float*>(request.payload.data());
        // The step's first gradient is copied, later ones added: the sum
        // needs no clearing between steps.
        if (contributors_.size() == 1) {
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

void Partition::ApplyLocked(const float* grad_sum, double count) {
  optimizer_->Apply(values_.data(), grad_sum, static_cast<float>(1.0 / count), length_);
  ++stats_.updates_applied;
  ++stats_.version;
}

void Partition::MaybeCompleteStepLocked(std::vector<Reply>* replies) {
  if (contributors_.empty()) return;
  for (uint32_t w : step_workers_) {
    if (contributors_.count(w) == 0) return;
  }
  ApplyLocked(grad_sum_.data(), count_sum_);
  count_sum_ = 0;
  contributors_.clear();
  for (auto it = waiting_pulls_.begin(); it != waiting_pulls_.end();) {
    if (it->first.version <= stats_.version) {
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

std::vector<float> Partition::ValuesForTesting() const {
  absl::MutexLock l(&mu_);
  return values_;
}

}  // namespace strata::pserver
