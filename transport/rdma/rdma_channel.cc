#include "transport/rdma/rdma_channel.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "transport/data_plane_auth.h"
#include "transport/once_responder.h"

namespace strata::transport::rdma {

Channel::~Channel() {
  absl::MutexLock l(&mu_);
  ReleaseLocked();
}

absl::Status Channel::Allocate() {
  absl::MutexLock l(&mu_);
  absl::Status s = AllocateLocked();
  if (!s.ok()) ReleaseLocked();
  return s;
}

absl::StatusOr<HelloQp> Channel::LocalHello() const {
  absl::MutexLock l(&mu_);
  if (qp_ == nullptr) return FailureLocked();
  HelloQp h;
  const QpInfo info = qp_->local_info();
  h.qpn = info.qpn;
  h.psn = info.psn;
  h.gid = info.gid;
  h.lid = info.lid;
  h.mtu = info.mtu;
  h.recv_slots = recv_slots_;
  h.slot_bytes = slot_bytes_;
  return h;
}

absl::Status Channel::Join(const HelloQp& remote) {
  absl::MutexLock l(&mu_);
  QpInfo info;
  info.qpn = remote.qpn;
  info.psn = remote.psn;
  info.gid = remote.gid;
  info.lid = remote.lid;
  info.mtu = remote.mtu;
  if (absl::Status s = qp_->Connect(info); !s.ok()) {
    ReleaseLocked();
    return s;
  }
  peer_credits_ = remote.recv_slots;
  peer_recv_slots_ = remote.recv_slots;
  frame_room_ = std::min(slot_bytes_, remote.slot_bytes);
  state_ = ConnectionState::kReady;
  VLOG(1) << "rdma: connection with " << peer_ << " READY (local "
          << DescribeQpInfo(qp_->local_info()) << ", remote " << DescribeQpInfo(info) << ")";
  return absl::OkStatus();
}

absl::Status Channel::Probe(absl::Duration timeout) {
  std::vector<std::function<void()>> work;
  absl::Status result;
  {
    absl::MutexLock l(&mu_);
    EnqueueControl(kProbe);
    auto answered = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return probe_acked_ || state_ != ConnectionState::kReady;
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&answered), timeout)) {
      result = absl::DeadlineExceededError(absl::StrCat("rdma connection with ", peer_,
                                                        ": no answer to the path check within ",
                                                        absl::FormatDuration(timeout),
                                                        " (check the GID, the route and the MTU: "
                                                        "`strata doctor`)"));
    } else if (!probe_acked_) {
      result = FailureLocked();
    }
    work.swap(deferred_);
  }
  if (!work.empty()) listener_->Run(std::move(work));
  return result;
}

std::shared_ptr<PeerRegion> Channel::RegionFor(const char* base, size_t bytes, bool remote_write,
                                               uint64_t epoch) {
  std::shared_ptr<ProtectionDomain> pd;
  {
    absl::MutexLock l(&mu_);
    if (state_ != ConnectionState::kReady || pd_ == nullptr) return nullptr;
    pd = pd_;
  }
  absl::MutexLock l(&regions_mu_);
  const std::pair<uintptr_t, bool> key{reinterpret_cast<uintptr_t>(base), remote_write};
  auto found = regions_.find(key);
  if (found != regions_.end() && found->second->epoch >= epoch &&
      found->second->mr->size() >= bytes) {
    return found->second;
  }
  absl::StatusOr<std::unique_ptr<MemoryRegion>> mr = MemoryRegion::Register(
      ctx_->device.get(), const_cast<char*>(base), bytes,
      remote_write ? IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE : 0, pd->pd());
  if (!mr.ok()) {
    if (!region_failure_logged_) {
      region_failure_logged_ = true;
      LOG(WARNING) << "rdma connection with " << peer_ << ": " << mr.status().message()
                   << "; its calls copy through the slots instead";
    }
    return nullptr;
  }
  if (found != regions_.end()) {
    VLOG(1) << "rdma connection with " << peer_ << ": region at " << static_cast<const void*>(base)
            << " registered again for key epoch " << epoch << " (rkey " << found->second->mr->rkey()
            << " retired)";
    ++stats_region_rotations_;
  }
  auto fresh = std::make_shared<PeerRegion>();
  fresh->ctx = ctx_;
  fresh->pd = std::move(pd);
  fresh->mr = std::move(mr).value();
  fresh->epoch = epoch;
  if (remote_write) fresh->handle = ++next_region_handle_;
  regions_[key] = fresh;
  return fresh;
}

void Channel::SetBootstrap(std::weak_ptr<Connection> bootstrap) {
  absl::MutexLock l(&mu_);
  bootstrap_ = std::move(bootstrap);
}

bool Channel::Announce(PeerRegion* r) {
  absl::MutexLock al(&r->announce_mu);
  if (r->announced != 0) return r->announced > 0;
  std::shared_ptr<Connection> bootstrap;
  {
    absl::MutexLock l(&mu_);
    if (state_ != ConnectionState::kReady) return false;
    if (listener_->OnCompletionThread()) return false;
    bootstrap = bootstrap_.lock();
  }
  if (bootstrap == nullptr) return false;
  Message m;
  m.header.type = MessageType::kRdmaHello;
  m.payload = RegionHello(r->handle, reinterpret_cast<uint64_t>(r->mr->data()), r->mr->size(),
                          r->mr->rkey())
                  .SerializeAsString();
  absl::StatusOr<Message> reply = bootstrap->CallSync(std::move(m), announce_timeout_);
  absl::Status s = reply.ok() ? ResponseStatus(*reply) : reply.status();
  r->announced = s.ok() ? 1 : -1;
  if (s.ok()) {
    absl::MutexLock l(&mu_);
    ++stats_.regions_announced;
  }
  if (!s.ok()) {
    LOG_EVERY_N(WARNING, 20) << "rdma connection with " << peer_
                             << ": cannot announce a destination region (" << s.message()
                             << "); its answers come by SEND";
  }
  return s.ok();
}

absl::Status Channel::AddRemoteRegion(const proto::RdmaRegion& r) {
  absl::MutexLock l(&mu_);
  if (role_ != kServer || state_ != ConnectionState::kReady) {
    return absl::FailedPreconditionError(
        absl::StrCat("rdma region from ", peer_, ": the connection is not serving"));
  }
  if (remote_regions_.size() >= kMaxRemoteRegions && remote_regions_.count(r.handle()) == 0) {
    remote_regions_.erase(remote_regions_.begin());  // the oldest
  }
  remote_regions_[r.handle()] = RemoteRegion{r.addr(), r.length(), r.rkey()};
  return absl::OkStatus();
}

void Channel::BindNode(uint32_t node) {
  absl::MutexLock l(&mu_);
  bound_node_ = node;
}

void Channel::SetCloser(std::function<void()> closer) {
  absl::MutexLock l(&mu_);
  closer_ = std::move(closer);
}

ConnectionState Channel::state() const {
  absl::MutexLock l(&mu_);
  return state_;
}

absl::Status Channel::failure() const {
  absl::MutexLock l(&mu_);
  return failure_;
}

RdmaConnectionStats Channel::stats() const {
  RdmaConnectionStats out;
  {
    absl::MutexLock l(&mu_);
    out = stats_;
  }
  absl::MutexLock l(&regions_mu_);
  out.peer_regions = regions_.size();
  out.region_rotations = stats_region_rotations_;
  return out;
}

uint32_t Channel::DestinationKey(const void* addr) const {
  const auto a = reinterpret_cast<uintptr_t>(addr);
  absl::MutexLock l(&regions_mu_);
  for (const auto& [key, r] : regions_) {
    if (key.second && a >= key.first && a < key.first + r->mr->size()) return r->mr->rkey();
  }
  return 0;
}

void Channel::Call(Message request, ResponseCallback done, char* dest, size_t dest_size,
                   const WriteTarget& remote, std::shared_ptr<PeerRegion> dest_region,
                   std::shared_ptr<PeerRegion> source_region) {
  const uint32_t source_lkey = source_region != nullptr ? source_region->mr->lkey() : 0;
  std::vector<std::function<void()>> work;
  absl::Status broken;
  std::shared_ptr<ZeroCopy> zero_copy;
  bool wait = false;
  {
    absl::MutexLock l(&mu_);
    if (state_ != ConnectionState::kReady) {
      broken = FailureLocked();
    } else {
      if (source_lkey != 0 && request.payload_ref != nullptr) {
        wait = !request.payload_ref_until_response;
        // (The listener is alive while the channel is READY.)
        if (!wait || !listener_->OnCompletionThread()) {
          zero_copy = std::make_shared<ZeroCopy>();
          zero_copy->region = source_region;
          zero_copy->lkey = source_lkey;
        }
      }
      const uint64_t id = ++next_request_id_;
      request.header.request_id = id;
      Pending& p = pending_[id];
      p.done = std::move(done);
      p.dest = dest;
      p.dest_size = dest_size;
      if (dest_region != nullptr) p.regions.push_back(std::move(dest_region));
      if (source_region != nullptr) p.regions.push_back(std::move(source_region));
      Outgoing out;
      out.frame.kind = kMessage;
      if (remote.valid) {
        out.frame.flags = kFlagHasDest;
        out.frame.dest_addr = remote.addr;
        out.frame.dest_len = remote.len;
        out.frame.dest_region = remote.region;
      }
      out.zero_copy = zero_copy;
      Enqueue(std::move(request), std::move(out));
      if (zero_copy != nullptr && wait) {
        // Until every SEND reading the caller's memory completed (or the
        // connection failed, its queue pair gone).
        auto sent = [this, &zero_copy]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return state_ != ConnectionState::kReady ||
                 (zero_copy->posted_all && zero_copy->in_flight == 0);
        };
        // A peer that stops taking data (stopped, not dead) would hold
        // the caller forever: as a stalled TCP write does, no progress
        // for that long breaks the connection (its queue pair goes, so
        // nothing reads the caller's memory any more).
        // Progress of the whole connection: this message may wait
        // behind others that are moving.
        uint64_t progress = sends_completed_;
        while (!mu_.AwaitWithTimeout(absl::Condition(&sent), kSendStallTimeout)) {
          if (sends_completed_ == progress) {
            FailLocked(absl::UnavailableError(
                absl::StrCat("rdma connection with ", peer_, ": no progress sending for ",
                             absl::FormatDuration(kSendStallTimeout))));
            break;
          }
          progress = sends_completed_;
        }
      }
      work.swap(deferred_);
    }
  }
  // As on tcp, a call on a broken connection fails at once.
  if (!broken.ok()) return done(broken);
  if (!work.empty()) listener_->Run(std::move(work));
}

void Channel::Respond(const MessageHeader& request, Message response, const WriteTarget& target) {
  std::vector<std::function<void()>> work;
  {
    absl::MutexLock l(&mu_);
    if (state_ != ConnectionState::kReady) {
      VLOG(1) << "rdma: dropping the response to request " << request.request_id << " from "
              << peer_ << ": " << FailureLocked();
      return;
    }
    Outgoing out;
    out.frame.kind = kMessage;
    const size_t size = response.payload_size();
    if (target.valid && response.header.status == 0 && size > 0 && size == target.len) {
      out.frame.kind = kWritten;
      out.write = target;
    }
    Enqueue(std::move(response), std::move(out));
    work.swap(deferred_);
  }
  if (!work.empty()) listener_->Run(std::move(work));
}

void Channel::Fail(const absl::Status& reason, bool warn) {
  std::vector<std::function<void()>> work;
  {
    absl::MutexLock l(&mu_);
    FailLocked(reason, warn);
    work.swap(deferred_);
  }
  // Nothing to run once failed: a connection handle may outlive its
  // transport (and so the listener).
  if (!work.empty()) listener_->Run(std::move(work));
}

absl::Status Channel::ForceError() {
  absl::MutexLock l(&mu_);
  if (qp_ == nullptr) return FailureLocked();
  return qp_->ForceError();
}

absl::Status Channel::Arm() {
  absl::MutexLock l(&mu_);
  if (cq_ == nullptr) return absl::OkStatus();
  return cq_->Arm();
}

int Channel::PollOnce() {
  std::vector<std::function<void()>> work;
  int n = 0;
  {
    absl::MutexLock l(&mu_);
    if (cq_ == nullptr) return 0;
    ibv_wc wc[32];
    absl::StatusOr<int> got = cq_->Poll(wc, 32);
    if (!got.ok()) {
      FailLocked(absl::UnavailableError(
          absl::StrCat("rdma connection with ", peer_, ": ", got.status().message())));
    } else {
      n = *got;
      for (int i = 0; i < n && cq_ != nullptr; ++i) OnCompletion(wc[i]);
      if (state_ == ConnectionState::kReady) Pump();
    }
    work.swap(deferred_);
  }
  for (auto& w : work) w();
  return n;
}

absl::Status Channel::AllocateLocked() {
  VerbsDevice* dev = ctx_->device.get();
  absl::StatusOr<std::unique_ptr<ProtectionDomain>> pd = ProtectionDomain::Allocate(dev);
  if (!pd.ok()) return Named(pd.status());
  pd_ = std::move(pd).value();
  const uint32_t posted = recv_slots_ + kSpareRecvSlots;
  const int depth = static_cast<int>(posted + send_slots_ + 8);
  absl::StatusOr<std::unique_ptr<CompletionQueue>> cq =
      CompletionQueue::Create(dev, depth, ctx_->events.get());
  if (!cq.ok()) return Named(cq.status());
  cq_ = std::move(cq).value();
  absl::StatusOr<std::unique_ptr<RcQueuePair>> qp =
      RcQueuePair::Create(dev, cq_.get(), cq_.get(), static_cast<int>(send_slots_ + 1),
                          static_cast<int>(posted), peer_, pd_->pd());
  if (!qp.ok()) return qp.status();
  qp_ = std::move(qp).value();
  for (auto [mem, mr, count, access] :
       {std::tuple{&recv_mem_, &recv_mr_, posted, int{IBV_ACCESS_LOCAL_WRITE}},
        std::tuple{&send_mem_, &send_mr_, send_slots_, 0}}) {
    const size_t bytes = static_cast<size_t>(count) * slot_bytes_;
    // aligned_alloc wants a multiple of the alignment.
    mem->reset(static_cast<char*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096)));
    if (*mem == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "rdma connection with ", peer_, ": cannot allocate ", bytes, " bytes of slots"));
    }
    absl::StatusOr<std::unique_ptr<MemoryRegion>> r =
        MemoryRegion::Register(dev, mem->get(), bytes, access, pd_->pd());
    if (!r.ok()) return Named(r.status());
    *mr = std::move(r).value();
  }
  if (absl::Status s = qp_->Init(); !s.ok()) return s;
  for (uint32_t i = 0; i < posted; ++i) {
    if (absl::Status s = PostRecvSlot(i); !s.ok()) return s;
  }
  free_send_.clear();
  for (uint32_t i = 0; i < send_slots_; ++i) free_send_.push_back(send_slots_ - 1 - i);
  slot_zero_copy_.assign(send_slots_, nullptr);
  if (absl::Status s = cq_->Arm(); !s.ok()) return Named(s);
  state_ = ConnectionState::kExchanging;
  return absl::OkStatus();
}

absl::Status Channel::Named(const absl::Status& s) const {
  return absl::Status(s.code(), absl::StrCat("rdma connection with ", peer_, ": ", s.message()));
}

void Channel::ReleaseLocked() {
  qp_.reset();
  slot_zero_copy_.assign(slot_zero_copy_.size(), nullptr);
  cq_.reset();
  recv_mr_.reset();
  send_mr_.reset();
  recv_mem_.reset();
  send_mem_.reset();
  // (The caller's regions of this domain go with the last call that
  // uses them; the domain after them.)
  {
    absl::MutexLock r(&regions_mu_);
    regions_.clear();
  }
  pd_.reset();
}

absl::Status Channel::FailureLocked() const {
  if (!failure_.ok()) return failure_;
  return absl::UnavailableError(absl::StrCat("rdma connection with ", peer_, " is not ready (",
                                             ConnectionStateName(state_), ")"));
}

void Channel::FailLocked(const absl::Status& reason, bool warn) {
  if (state_ == ConnectionState::kFailed) return;
  const bool was_ready = state_ == ConnectionState::kReady;
  state_ = ConnectionState::kFailed;
  // Every later call sees a broken connection: Unavailable, whatever
  // broke it (a bad frame is DataLoss at the point it was found).
  failure_ = reason.ok()
                 ? absl::UnavailableError(absl::StrCat("rdma connection with ", peer_, " closed"))
                 : absl::UnavailableError(reason.message());
  if (was_ready && warn) {
    LOG(WARNING) << "rdma: connection with " << peer_ << " FAILED: " << failure_;
    deferred_.push_back([listener = listener_] { listener->CountFailure(); });
  } else {
    VLOG(1) << "rdma: connection with " << peer_ << " closed: " << failure_;
  }
  ReleaseLocked();
  queue_.clear();
  reader_.Reset();
  for (auto& [id, p] : pending_) {
    deferred_.push_back([done = std::move(p.done), why = failure_] { done(why); });
  }
  pending_.clear();
  deferred_.push_back([listener = listener_] { listener->ChannelsChanged(); });
  if (closer_) {
    deferred_.push_back(std::move(closer_));
    closer_ = nullptr;
  }
}

char* Channel::RecvSlot(uint32_t i) const { return recv_mem_.get() + size_t{i} * slot_bytes_; }

char* Channel::SendSlot(uint32_t i) const { return send_mem_.get() + size_t{i} * slot_bytes_; }

absl::Status Channel::PostRecvSlot(uint32_t i) {
  return qp_->PostRecv(kWrRecv | i, RecvSlot(i), slot_bytes_, recv_mr_->lkey());
}

void Channel::EnqueueControl(uint16_t kind) {
  Outgoing o;
  o.frame.kind = kind;
  queue_.push_back(std::move(o));
  Pump();
}

void Channel::Enqueue(Message message, Outgoing out) {
  queue_.push_back(std::move(out));
  // Pointers into `owned` are taken in place: moving a short string moves
  // its bytes.
  Outgoing& o = queue_.back();
  if (message.payload_ref != nullptr) {
    o.data = message.payload_ref;
    o.size = message.payload_ref_size;
    o.borrowed = true;
  } else {
    o.owned = std::move(message.payload);
    o.data = o.owned.data();
    o.size = o.owned.size();
  }
  o.frame.total_bytes = o.size;
  tcp::EncodeFrameHeader(message.header, o.size, o.header);
  Pump();
  if (state_ == ConnectionState::kReady && !queue_.empty() && queue_.back().borrowed &&
      queue_.back().zero_copy == nullptr) {
    Outgoing& tail = queue_.back();
    tail.owned.assign(tail.data, tail.size);
    tail.data = tail.owned.data();
    tail.borrowed = false;
  }
}

void Channel::Pump() {
  PumpQueue();
  if (state_ == ConnectionState::kReady && to_return_ >= std::max<uint32_t>(1, recv_slots_ / 2) &&
      !free_send_.empty()) {
    Frame f;
    f.kind = kCredit;
    if (PostFrame(f, nullptr, nullptr, 0)) ++stats_.credit_frames;
  }
}

void Channel::PumpQueue() {
  while (!queue_.empty() && state_ == ConnectionState::kReady) {
    Outgoing& o = queue_.front();
    if (o.frame.kind == kProbe || o.frame.kind == kProbeAck) {
      if (peer_credits_ == 0 || free_send_.empty()) return;
      if (!PostFrame(o.frame, nullptr, nullptr, 0)) return;
      queue_.pop_front();
      continue;
    }
    if (o.frame.kind == kWritten) {
      while (o.sent < o.size) {
        if (free_send_.empty()) return;
        const uint32_t slot = TakeSendSlot();
        const uint32_t n = static_cast<uint32_t>(std::min<size_t>(slot_bytes_, o.size - o.sent));
        std::memcpy(SendSlot(slot), o.data + o.sent, n);
        absl::Status s = qp_->PostWrite(kWrSend | slot, SendSlot(slot), n, send_mr_->lkey(),
                                        o.write.addr + o.sent, o.write.rkey, /*signaled=*/true);
        if (!s.ok()) return FailLocked(s);
        o.sent += n;
      }
      if (peer_credits_ == 0 || free_send_.empty()) return;
      Frame f = o.frame;
      f.chunk_bytes = 0;
      if (!PostFrame(f, o.header, nullptr, 0)) return;
      queue_.pop_front();
      continue;
    }
    while (!o.started || o.sent < o.size) {
      if (peer_credits_ == 0 || free_send_.empty()) return;
      Frame f = o.frame;
      const size_t head = kFrameBytes + (o.started ? 0 : kMsgHeaderBytes);
      f.kind = o.started ? kMore : kMessage;
      f.chunk_bytes = static_cast<uint32_t>(std::min<size_t>(frame_room_ - head, o.size - o.sent));
      if (!PostFrame(f, o.started ? nullptr : o.header, o.data + o.sent, f.chunk_bytes,
                     o.zero_copy)) {
        return;
      }
      o.started = true;
      o.sent += f.chunk_bytes;
    }
    if (o.zero_copy != nullptr) o.zero_copy->posted_all = true;
    queue_.pop_front();
  }
}

uint32_t Channel::TakeSendSlot() {
  const uint32_t slot = free_send_.back();
  free_send_.pop_back();
  return slot;
}

bool Channel::PostFrame(Frame f, const char* msg_header, const char* chunk, uint32_t n,
                        const std::shared_ptr<ZeroCopy>& zero_copy) {
  const uint32_t slot = TakeSendSlot();
  char* p = SendSlot(slot);
  f.credits = to_return_;
  EncodeFrame(f, p);
  size_t len = kFrameBytes;
  if (msg_header != nullptr) {
    std::memcpy(p + len, msg_header, kMsgHeaderBytes);
    len += kMsgHeaderBytes;
  }
  absl::Status s;
  if (zero_copy != nullptr && n > 0) {
    s = qp_->PostSendGather(kWrSend | slot, p, static_cast<uint32_t>(len), send_mr_->lkey(), chunk,
                            n, zero_copy->lkey, /*signaled=*/true);
    if (s.ok()) {
      ++zero_copy->in_flight;
      slot_zero_copy_[slot] = zero_copy;
      ++stats_.zero_copy_sends;
    }
  } else {
    if (n > 0) std::memcpy(p + len, chunk, n);
    len += n;
    s = qp_->PostSend(kWrSend | slot, p, static_cast<uint32_t>(len), send_mr_->lkey(),
                      /*signaled=*/true);
  }
  if (!s.ok()) {
    FailLocked(s);
    return false;
  }
  to_return_ = 0;
  if (f.kind != kCredit) --peer_credits_;
  ++stats_.sends;
  return true;
}

void Channel::OnCompletion(const ibv_wc& wc) {
  if (state_ == ConnectionState::kFailed) return;
  if (wc.status != IBV_WC_SUCCESS) return FailLocked(CompletionStatus(wc, peer_));
  const uint32_t slot = static_cast<uint32_t>(wc.wr_id & kWrSlotMask);
  if ((wc.wr_id & ~kWrSlotMask) == kWrSend) {
    free_send_.push_back(slot);
    if (std::shared_ptr<ZeroCopy>& z = slot_zero_copy_[slot]; z != nullptr) {
      --z->in_flight;  // a waiting Call sees this (mu_'s condition)
      z = nullptr;
    }
    ++sends_completed_;
    return;
  }
  bool took_credit = false;
  absl::Status s = OnReceive(RecvSlot(slot), wc.byte_len, &took_credit);
  if (!s.ok()) return FailLocked(s);
  if (absl::Status r = PostRecvSlot(slot); !r.ok()) return FailLocked(r);
  // Credit frames came in a spare slot, not on a credit.
  if (took_credit) ++to_return_;
}

absl::Status Channel::OnReceive(const char* p, uint32_t len, bool* took_credit) {
  FrameReader::Context c;
  c.server = role_ == kServer;
  c.peer = peer_;
  c.max_payload_bytes = max_payload_bytes_;
  c.credits_out = peer_recv_slots_ - peer_credits_;
  c.bound_node = bound_node_;
  c.remote_regions = &remote_regions_;
  c.destination = [this](uint64_t request_id) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    // (Called by OnFrame, under mu_.)
    auto it = pending_.find(request_id);
    return it == pending_.end() ? std::pair<char*, uint64_t>(nullptr, 0)
                                : std::pair<char*, uint64_t>(it->second.dest, it->second.dest_size);
  };
  FrameReader::Result r;
  STRATA_RETURN_IF_ERROR(reader_.OnFrame(c, p, len, &r));
  *took_credit = r.took_credit;
  peer_credits_ += r.credits;
  if (r.send_probe_ack) EnqueueControl(kProbeAck);
  if (r.probe_acked) probe_acked_ = true;
  if (r.written) ++stats_.responses_written;
  if (r.delivered.has_value()) Deliver(std::move(*r.delivered));
  return absl::OkStatus();
}

namespace {

// The server's responder for one request that came over rdma.
class RdmaResponder final : public OnceResponder {
 public:
  RdmaResponder(std::weak_ptr<Channel> channel, const MessageHeader& request, std::string peer,
                const WriteTarget& target)
      : OnceResponder(request, std::move(peer), "rdma"),
        channel_(std::move(channel)),
        target_(target) {}
  ~RdmaResponder() override { AnswerIfDropped(); }

 private:
  void Deliver(Message response) override {
    if (auto channel = channel_.lock()) {
      channel->Respond(request(), std::move(response), target_);
    }
  }

  const std::weak_ptr<Channel> channel_;
  const WriteTarget target_;
};

}  // namespace

void Channel::Deliver(IncomingMessage in) {
  in.message.payload_in_destination = in.message.payload_in_destination || in.dest != nullptr;
  if (role_ == kServer) {
    auto responder = std::make_shared<RdmaResponder>(weak_from_this(), in.message.header, peer_,
                                                     in.reply_target);
    const MessageType t = in.message.header.type;
    if (t == MessageType::kRdmaHello || t == MessageType::kRdmaHelloReply) {
      deferred_.push_back([responder, h = in.message.header] {
        responder->Respond(
            MakeErrorResponse(h, MessageType::kRdmaHelloReply,
                              absl::FailedPreconditionError("this connection is joined already")));
      });
      return;
    }
    deferred_.push_back([handler = handler_, m = std::move(in.message),
                         responder = std::move(responder)]() mutable {
      (*handler)(std::move(m), std::move(responder));
    });
    return;
  }
  auto it = pending_.find(in.message.header.request_id);
  if (it == pending_.end()) {
    VLOG(1) << "rdma: response " << in.message.header.request_id << " from " << peer_
            << " matches no pending call";
    return;
  }
  deferred_.push_back([done = std::move(it->second.done), m = std::move(in.message)]() mutable {
    done(std::move(m));
  });
  pending_.erase(it);
}

}  // namespace strata::transport::rdma
