#include "transport/ring_allreduce.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/vector_ops.h"

namespace strata::transport {
namespace {

const char* PhaseName(uint32_t phase) { return phase == 0 ? "reduce-scatter" : "all-gather"; }

}  // namespace

absl::StatusOr<std::unique_ptr<RingAllreduce>> RingAllreduce::Create(Transport* transport,
                                                                     Options options) {
  if (options.size == 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring allreduce: rank ", options.rank, " of a ring of ", options.size));
  }
  if (options.chunk_bytes < 4 || options.chunk_bytes % 4 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ring allreduce: chunk_bytes ", options.chunk_bytes, " is not a positive multiple of 4"));
  }
  return std::unique_ptr<RingAllreduce>(new RingAllreduce(transport, options));
}

RingAllreduce::RingAllreduce(Transport* transport, Options options)
    : transport_(transport), options_(options) {}

absl::Status RingAllreduce::ConnectNext(const std::string& next_address) {
  auto conn = transport_->Connect(next_address);
  if (!conn.ok()) {
    return absl::UnavailableError(absl::StrCat("ring allreduce rank ", options_.rank,
                                               ": the next rank at ", next_address, ": ",
                                               conn.status().message()));
  }
  next_ = *std::move(conn);
  return absl::OkStatus();
}

uint64_t RingAllreduce::bytes_sent() const {
  absl::MutexLock l(&st_->mu);
  return st_->bytes_sent;
}

void RingAllreduce::Handle(Message request, std::shared_ptr<Responder> responder) {
  const MessageHeader h = request.header;
  const MessageType answer = ResponseTypeFor(h.type);
  if (h.type != MessageType::kCollective || h.flags > 1 ||
      request.payload_size() != h.count * sizeof(float)) {
    responder->Respond(MakeErrorResponse(
        h, answer,
        absl::InvalidArgumentError(absl::StrCat(
            "ring allreduce rank ", options_.rank, ": a malformed collective message from ",
            responder->peer(), " (", MessageTypeName(h.type), ", phase ", h.flags, ", ",
            request.payload_size(), " bytes for ", h.count, " floats)"))));
    return;
  }
  const Key key{h.version, h.flags, h.partition, h.seq};
  Slot* slot = nullptr;
  {
    absl::MutexLock l(&st_->mu);
    // (Dropped: a chunk of a call that is over, or any once the ring
    // failed; a second copy of a chunk.)
    if (h.version >= st_->done_op && st_->broken.ok()) {
      auto it = st_->posted.find(key);
      if (it != st_->posted.end()) {
        if (!it->second.claimed) {
          it->second.claimed = true;
          slot = &it->second;
          ++st_->applying;
        }
      } else if (st_->inbox.count(key) == 0) {
        request.OwnPayload();
        st_->inbox[key] = std::move(request.payload);
        st_->changed.SignalAll();
      }
    }
  }
  absl::Status applied;
  if (slot != nullptr) {
    // (Outside the lock: the slot is this chunk's alone once claimed, and
    // the call waits for State::applying before it lets go of its buffer.)
    applied = Apply(key, *slot, request.payload_data(), request.payload_size());
    absl::MutexLock l(&st_->mu);
    slot->error = applied;
    slot->done = true;
    --st_->applying;
    st_->changed.SignalAll();
  }
  if (!applied.ok()) {  // the sender learns it too
    responder->Respond(MakeErrorResponse(h, answer, applied));
    return;
  }
  Message ack;
  ack.header = h;
  ack.header.type = answer;
  ack.header.count = 0;
  responder->Respond(std::move(ack));
}

absl::Status RingAllreduce::Apply(const Key& key, const Slot& slot, const char* payload,
                                  size_t bytes) const {
  if (bytes != slot.len * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ring allreduce rank ", options_.rank, ": the previous rank sent ", bytes / sizeof(float),
        " floats for chunk ", std::get<3>(key), " of ", PhaseName(std::get<1>(key)), " step ",
        std::get<2>(key), " of operation ", std::get<0>(key), ", ", slot.len,
        " expected: the ranks are reducing buffers of different sizes"));
  }
  if (slot.add) {
    AddInto(slot.dest, reinterpret_cast<const float*>(payload), slot.len);
  } else {
    std::memcpy(slot.dest, payload, bytes);
  }
  return absl::OkStatus();
}

void RingAllreduce::Send(uint64_t op, uint32_t phase, uint32_t step, uint64_t chunk,
                         const float* data, size_t count) {
  Message m;
  m.header.type = MessageType::kCollective;
  m.header.sender_id = options_.node_id;
  m.header.version = op;
  m.header.flags = phase;
  m.header.partition = step;
  m.header.seq = chunk;
  m.header.count = count;
  // (Borrowed only until Call returns: every backend sends or copies it
  // by then.)
  m.payload_ref = reinterpret_cast<const char*>(data);
  m.payload_ref_size = count * sizeof(float);
  {
    absl::MutexLock l(&st_->mu);
    ++st_->pending;
    st_->bytes_sent += count * sizeof(float);
  }
  // (The callback may run after this is gone: it touches the shared state
  // only.)
  next_->Call(std::move(m), [st = st_, rank = options_.rank,
                             peer = next_->peer()](absl::StatusOr<Message> r) {
    absl::Status s = r.ok() ? ResponseStatus(*r) : r.status();
    absl::MutexLock l(&st->mu);
    if (!s.ok() && st->send_error.ok()) {
      st->send_error = absl::Status(
          s.code(), absl::StrCat("ring allreduce rank ", rank, ": sending to the next rank (", peer,
                                 "): ", s.message()));
    }
    --st->pending;
    st->changed.SignalAll();
  });
}

absl::Status RingAllreduce::SendError() const {
  absl::MutexLock l(&st_->mu);
  return st_->send_error;
}

absl::Status RingAllreduce::Await(const Key& key) {
  const absl::Time deadline = absl::Now() + options_.timeout;
  absl::MutexLock l(&st_->mu);
  const Slot& slot = st_->posted.at(key);
  while (true) {
    if (slot.done) return slot.error;
    if (!st_->send_error.ok()) return st_->send_error;
    if (st_->changed.WaitWithDeadline(&st_->mu, deadline) && absl::Now() >= deadline &&
        !slot.done) {
      return absl::DeadlineExceededError(absl::StrCat(
          "ring allreduce rank ", options_.rank, " of ", options_.size, ": chunk ",
          std::get<3>(key), " of ", PhaseName(std::get<1>(key)), " step ", std::get<2>(key),
          " of operation ", std::get<0>(key), " did not come from the previous rank (",
          (options_.rank + options_.size - 1) % options_.size, ") within ",
          absl::FormatDuration(options_.timeout),
          ": it, or a rank before it, has left the ring or is behind"));
    }
  }
}

void RingAllreduce::Abort(absl::Status why) {
  absl::MutexLock l(&st_->mu);
  if (st_->send_error.ok()) st_->send_error = why;
  if (st_->broken.ok()) st_->broken = std::move(why);
  st_->changed.SignalAll();
}

absl::Status RingAllreduce::Allreduce(float* data, size_t n, uint64_t op) {
  return Allreduce(data, n, op, Hooks{});
}

absl::Status RingAllreduce::Allreduce(float* data, size_t n, uint64_t op, const Hooks& hooks) {
  const uint32_t w = options_.size;
  Cut cut;
  cut.bounds.resize(w + 1);
  for (uint32_t s = 0; s <= w; ++s) cut.bounds[s] = n * s / w;
  return Allreduce(data, n, op, hooks, cut);
}

absl::Status RingAllreduce::CheckCut(size_t n, const Cut& cut) const {
  const uint32_t w = options_.size;
  const std::vector<size_t>& bounds = cut.bounds;
  bool ascending = bounds.size() == w + 1 && bounds.front() == 0 && bounds.back() == n;
  for (size_t s = 0; ascending && s + 1 < bounds.size(); ++s) {
    ascending = bounds[s] <= bounds[s + 1];
  }
  if (ascending) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "ring allreduce rank ", options_.rank, ": ", bounds.size(), " segment bounds for a ring of ",
      w, " over ", n, " floats (expected ", w + 1, " ascending from 0 to ", n, ")"));
}

absl::Status RingAllreduce::EndCall(uint64_t op, bool settle, absl::Status status) {
  // Every send answered (or failed), and this op's leftovers dropped.
  const absl::Time deadline = absl::Now() + options_.timeout;
  absl::MutexLock l(&st_->mu);
  while (settle && st_->pending > 0 && st_->send_error.ok()) {
    if (st_->changed.WaitWithDeadline(&st_->mu, deadline) && absl::Now() >= deadline) {
      if (status.ok()) {
        status = absl::DeadlineExceededError(
            absl::StrCat("ring allreduce rank ", options_.rank, ": ", st_->pending,
                         " chunks unanswered by the next rank (", next_->peer(), ") after ",
                         absl::FormatDuration(options_.timeout)));
      }
      break;
    }
  }
  if (status.ok()) status = st_->send_error;
  // No chunk of this call is written into the caller's buffer after it
  // returns: later ones are dropped, and those being written are waited for.
  st_->done_op = std::max(st_->done_op, op + 1);
  while (st_->applying > 0) st_->changed.Wait(&st_->mu);
  st_->posted.clear();
  st_->inbox.erase(st_->inbox.begin(), st_->inbox.lower_bound(Key{op + 1, 0, 0, 0}));
  if (!status.ok()) st_->broken = status;
  return status;
}

absl::Status RingAllreduce::Allreduce(float* data, size_t n, uint64_t op, const Hooks& hooks,
                                      const Cut& cut) {
  const uint32_t w = options_.size;
  const std::vector<size_t>& bounds = cut.bounds;
  STRATA_RETURN_IF_ERROR(CheckCut(n, cut));
  if (w == 1) {
    if (hooks.owned && n > 0) hooks.owned(0, data, n);
    return absl::OkStatus();
  }
  {
    absl::MutexLock l(&st_->mu);
    if (!st_->broken.ok()) return st_->broken;
  }
  if (next_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("ring allreduce rank ", options_.rank, ": not connected to the next rank"));
  }
  // (Every rank cuts alike: the same bounds.)
  size_t cf = options_.chunk_bytes / sizeof(float);
  if (options_.max_chunks > 0) {
    size_t segment = 0;
    for (uint32_t s = 0; s < w; ++s) segment = std::max(segment, bounds[s + 1] - bounds[s]);
    cf = std::max(cf, (segment + options_.max_chunks - 1) / options_.max_chunks);
  }
  const int64_t r = options_.rank;
  auto mod = [w](int64_t x) { return static_cast<uint32_t>(((x % w) + w) % w); };
  auto begin = [&bounds](uint32_t s) { return bounds[s]; };
  auto chunks = [&](uint32_t s) { return (begin(s + 1) - begin(s) + cf - 1) / cf; };
  auto chunk_at = [&](uint32_t s, uint64_t c) { return data + begin(s) + c * cf; };
  auto chunk_len = [&](uint32_t s, uint64_t c) {
    return std::min<size_t>(cf, begin(s + 1) - begin(s) - c * cf);
  };
  // Where every chunk of this call goes; chunks that came before it are
  // put there now.
  {
    absl::MutexLock l(&st_->mu);
    for (uint32_t phase = 0; phase < 2; ++phase) {
      for (uint32_t k = 0; k + 1 < w; ++k) {
        const uint32_t s = phase == 0 ? mod(r - k - 1) : mod(r - k);
        for (uint64_t c = 0; c < chunks(s); ++c) {
          Slot& slot = st_->posted[Key{op, phase, k, c}];
          slot.dest = chunk_at(s, c);
          slot.len = chunk_len(s, c);
          slot.add = phase == 0;
        }
      }
    }
    for (auto it = st_->inbox.lower_bound(Key{op, 0, 0, 0});
         it != st_->inbox.end() && std::get<0>(it->first) == op;) {
      auto p = st_->posted.find(it->first);
      if (p != st_->posted.end()) {
        p->second.error = Apply(it->first, p->second, it->second.data(), it->second.size());
        p->second.claimed = p->second.done = true;
      }
      it = st_->inbox.erase(it);
    }
  }
  absl::Status status;
  // Reduce-scatter: step k receives segment r - k - 1 (added to this
  // rank's) and passes it on (step k + 1); the last step's sum is this
  // rank's reduced segment, the all-gather's first send.
  for (uint64_t c = 0; c < chunks(mod(r)); ++c) {
    Send(op, 0, 0, c, chunk_at(mod(r), c), chunk_len(mod(r), c));
  }
  for (uint32_t k = 0; k + 1 < w && status.ok(); ++k) {
    const uint32_t s = mod(r - k - 1);
    for (uint64_t c = 0; c < chunks(s) && status.ok(); ++c) {
      status = Await(Key{op, 0, k, c});
      if (!status.ok()) break;
      if (k + 2 < w) {
        Send(op, 0, k + 1, c, chunk_at(s, c), chunk_len(s, c));
      } else {
        Send(op, 1, 0, c, chunk_at(s, c), chunk_len(s, c));
        // (Send is done with the chunk's bytes when it returns.)
        if (hooks.owned) hooks.owned(begin(s) + c * cf, chunk_at(s, c), chunk_len(s, c));
      }
    }
  }
  // All-gather: step k receives the sum of segment r - k (copied in) and
  // passes it on.
  for (uint32_t k = 0; k + 1 < w && status.ok(); ++k) {
    const uint32_t s = mod(r - k);
    for (uint64_t c = 0; c < chunks(s) && status.ok(); ++c) {
      status = Await(Key{op, 1, k, c});
      if (!status.ok()) break;
      if (k == 0 && hooks.first_gathered) {
        hooks.first_gathered(begin(s) + c * cf, chunk_at(s, c), chunk_len(s, c));
      }
      if (k + 2 < w) Send(op, 1, k + 1, c, chunk_at(s, c), chunk_len(s, c));
    }
  }
  return EndCall(op, cut.settle, std::move(status));
}

}  // namespace strata::transport
