// The rdma backend (rdma_transport.h has the design). Layout of this file
// (the frames and their checks on receipt are in rdma_frames.h, the
// caller's registered regions in rdma_regions.h): the per-connection
// Channel (credits, fragmentation, the write path, completions), the
// connection handed to users, and the transport (bootstrap over TCP, the
// hello, the completion thread).
#include "transport/rdma/rdma_transport.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "transport/data_plane_auth.h"
#include "transport/once_responder.h"
#include "transport/rdma/rdma_device.h"
#include "transport/rdma/rdma_frames.h"
#include "transport/rdma/rdma_hello.h"
#include "transport/rdma/rdma_regions.h"
#include "transport/rdma/verbs.h"
#include "transport/tcp/tcp_transport.h"

namespace strata::transport::rdma {

namespace {

// Receive slots beyond the advertised credits, for credit-only frames
// (which take no credit). Receiver-not-ready retries cover the rest.
constexpr uint32_t kSpareRecvSlots = 4;

// As the tcp backend's write_stall_timeout.
constexpr absl::Duration kSendStallTimeout = absl::Seconds(60);

constexpr uint64_t kWrRecv = 1ull << 56;
constexpr uint64_t kWrSend = 2ull << 56;
constexpr uint64_t kWrSlotMask = (1ull << 32) - 1;

class Channel;

// The transport as its channels see it.
struct ChannelListener {
  virtual ~ChannelListener() = default;
  // A channel is new (its CQ must be polled) or has failed.
  virtual void ChannelsChanged() = 0;
  // A READY channel broke on a verbs error or a bad frame.
  virtual void CountFailure() = 0;
  // True on the completion thread (which must never wait for completions).
  virtual bool OnCompletionThread() const = 0;
  // Runs `work` (response callbacks of a failed channel, ...) on the
  // completion thread, as transport.h promises; inline when that thread is
  // the caller or has stopped.
  virtual void Run(std::vector<std::function<void()>> work) = 0;
};

// ---------------------------------------------------------------------------
// One RC connection, either side. Thread-safe: callers on any thread, the
// completion thread in PollOnce. Callbacks (response callbacks, the request
// handler) never run under mu_.

class Channel : public std::enable_shared_from_this<Channel> {
 public:
  enum Role { kClient, kServer };

  Channel(std::shared_ptr<DeviceContext> ctx, Role role, std::string peer,
          const RdmaTransportSettings& settings, uint64_t max_payload_bytes,
          std::shared_ptr<const RequestHandler> handler, ChannelListener* listener)
      : ctx_(std::move(ctx)),
        role_(role),
        peer_(std::move(peer)),
        recv_slots_(settings.recv_slots),
        send_slots_(settings.send_slots),
        slot_bytes_(settings.slot_bytes),
        max_payload_bytes_(max_payload_bytes),
        handler_(std::move(handler)),
        listener_(listener),
        announce_timeout_(settings.connect_timeout) {}

  ~Channel() {
    absl::MutexLock l(&mu_);
    ReleaseLocked();
  }

  const std::string& peer() const { return peer_; }

  // Creates the CQ, the QP and the two slot regions, moves the QP to INIT
  // and posts every receive slot. All or nothing: on error nothing stays
  // allocated.
  absl::Status Allocate() {
    absl::MutexLock l(&mu_);
    absl::Status s = AllocateLocked();
    if (!s.ok()) ReleaseLocked();
    return s;
  }

  absl::StatusOr<HelloQp> LocalHello() const {
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

  // Joins the QP to the peer's and starts the data path.
  absl::Status Join(const HelloQp& remote) {
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

  // Client: proves the joined queue pairs carry traffic both ways (a wrong
  // GID or route shows up here, not at the first real call): one probe
  // frame out, its answer back, within `timeout`.
  absl::Status Probe(absl::Duration timeout) {
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

  // The caller's region [base, base + bytes) registered in this
  // connection's protection domain, with the narrowest access (remote
  // write for a destination, none for a send source): at its first use
  // here, and anew once the membership key epoch has moved past `epoch`'s
  // registration (the old keys stop working when the last call holding
  // them is done). Null when the connection is not ready or the
  // registration fails (the call then goes by copies; logged once).
  std::shared_ptr<PeerRegion> RegionFor(const char* base, size_t bytes, bool remote_write,
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
      VLOG(1) << "rdma connection with " << peer_ << ": region at "
              << static_cast<const void*>(base) << " registered again for key epoch " << epoch
              << " (rkey " << found->second->mr->rkey() << " retired)";
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

  // Client: the TCP bootstrap connection (sealed under membership), which
  // carries the announcements of destination regions.
  void SetBootstrap(std::weak_ptr<Connection> bootstrap) {
    absl::MutexLock l(&mu_);
    bootstrap_ = std::move(bootstrap);
  }

  // Client: whether the server has destination `r`'s key, announcing it
  // first (RdmaHello.region on the bootstrap: the key never travels on the
  // queue pair). Once per region; waits for the answer, except on the
  // completion thread (false there: that call's answer comes by SEND).
  bool Announce(PeerRegion* r) {
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

  // Server: a destination the client announced on the bootstrap.
  absl::Status AddRemoteRegion(const proto::RdmaRegion& r) {
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

  // Server: requests on this connection must come from node `node` (the
  // one its bootstrap's membership handshake proved); another sender
  // closes it, as on TCP.
  void BindNode(uint32_t node) {
    absl::MutexLock l(&mu_);
    bound_node_ = node;
  }

  // Closes the TCP bootstrap connection; run once when this fails, so that
  // the peer tears its side down too.
  void SetCloser(std::function<void()> closer) {
    absl::MutexLock l(&mu_);
    closer_ = std::move(closer);
  }

  ConnectionState state() const {
    absl::MutexLock l(&mu_);
    return state_;
  }
  bool failed() const { return state() == ConnectionState::kFailed; }
  absl::Status failure() const {
    absl::MutexLock l(&mu_);
    return failure_;
  }
  RdmaConnectionStats stats() const {
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
  uint32_t DestinationKey(const void* addr) const {
    const auto a = reinterpret_cast<uintptr_t>(addr);
    absl::MutexLock l(&regions_mu_);
    for (const auto& [key, r] : regions_) {
      if (key.second && a >= key.first && a < key.first + r->mr->size()) return r->mr->rkey();
    }
    return 0;
  }

  // Client: sends a request; `done` runs once with the response or an
  // error. `dest`: CallInto's destination (copied into when a fitting
  // response comes by SEND); `remote`: the same destination when
  // registered, for the server to RDMA WRITE into.
  //
  // `source_lkey` (non-zero): the request's borrowed payload lies in memory
  // registered with that key. Then its SENDs gather straight from it (no
  // copy into the send slots). With payload_ref_until_response the caller
  // keeps the bytes until `done` runs, and Call returns at once; otherwise
  // Call returns once those SENDs completed (the borrow ends when Call
  // returns), except on the completion thread, which must not wait: there
  // the payload is copied. (Nor should such a Call wait on another
  // transport's thread: do not make one from another transport's callback.)
  void Call(Message request, ResponseCallback done, char* dest, size_t dest_size,
            const WriteTarget& remote, std::shared_ptr<PeerRegion> dest_region = nullptr,
            std::shared_ptr<PeerRegion> source_region = nullptr) {
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

  // Server: sends the response to `request` (finished by OnceResponder),
  // by RDMA WRITE into `target` when it holds a successful payload of the
  // target's size.
  void Respond(const MessageHeader& request, Message response, const WriteTarget& target) {
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

  // Fails the connection: pending calls get `reason`, resources are freed.
  void Fail(const absl::Status& reason, bool warn = false) {
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

  absl::Status ForceError() {
    absl::MutexLock l(&mu_);
    if (qp_ == nullptr) return FailureLocked();
    return qp_->ForceError();
  }

  absl::Status Arm() {
    absl::MutexLock l(&mu_);
    if (cq_ == nullptr) return absl::OkStatus();
    return cq_->Arm();
  }

  // Completion thread: handles what the CQ has; returns how many
  // completions there were.
  int PollOnce() {
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

 private:
  struct Pending {
    ResponseCallback done;
    char* dest;
    size_t dest_size;
    // The regions whose keys the request carries or its SENDs read:
    // registered until the call is done.
    std::vector<std::shared_ptr<PeerRegion>> regions;
  };
  // A message sent straight from the caller's registered memory.
  struct ZeroCopy {
    std::shared_ptr<PeerRegion> region;  // holds `lkey` while SENDs read it
    uint32_t lkey = 0;
    bool posted_all = false;  // every frame posted
    int in_flight = 0;        // posted SENDs not completed yet
  };
  // A message on its way out.
  struct Outgoing {
    char header[kMsgHeaderBytes];
    Frame frame;        // kMessage or kWritten, with dest_* for requests
    std::string owned;  // the payload, when owned
    const char* data = nullptr;
    size_t size = 0;
    bool borrowed = false;                // data points at the caller's memory
    size_t sent = 0;                      // payload bytes posted
    bool started = false;                 // the first frame was posted
    WriteTarget write;                    // kWritten: where the payload goes
    std::shared_ptr<ZeroCopy> zero_copy;  // SENDs gather from `data` itself
  };

  absl::Status AllocateLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
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

  absl::Status Named(const absl::Status& s) const {
    return absl::Status(s.code(), absl::StrCat("rdma connection with ", peer_, ": ", s.message()));
  }

  // Frees every verbs resource, QP first (so nothing DMAs into freed slots).
  void ReleaseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
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

  absl::Status FailureLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!failure_.ok()) return failure_;
    return absl::UnavailableError(absl::StrCat("rdma connection with ", peer_, " is not ready (",
                                               ConnectionStateName(state_), ")"));
  }

  // `warn`: a verbs error or a bad frame (logged as a warning), rather
  // than a close (released, shut down, the peer went away).
  void FailLocked(const absl::Status& reason, bool warn = true) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
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

  char* RecvSlot(uint32_t i) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return recv_mem_.get() + size_t{i} * slot_bytes_;
  }
  char* SendSlot(uint32_t i) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return send_mem_.get() + size_t{i} * slot_bytes_;
  }

  absl::Status PostRecvSlot(uint32_t i) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return qp_->PostRecv(kWrRecv | i, RecvSlot(i), slot_bytes_, recv_mr_->lkey());
  }

  // Queues a frame of the path check.
  void EnqueueControl(uint16_t kind) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Outgoing o;
    o.frame.kind = kind;
    queue_.push_back(std::move(o));
    Pump();
  }

  // Queues `message` (taking its payload or borrowing the caller's) and
  // sends what credits and slots allow; what is left stays queued with its
  // payload copied, so the caller's memory is free when this returns;
  // except a zero-copy message, which keeps reading the caller's memory
  // (its Call waits, or its caller keeps the bytes until the answer).
  void Enqueue(Message message, Outgoing out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
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

  // Posts queued frames while credits and send slots last; returns credits
  // in a credit frame when they pile up with nothing to carry them (also
  // when the queue waits for credits: the peer may be waiting for ours).
  void Pump() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    PumpQueue();
    if (state_ == ConnectionState::kReady && to_return_ >= std::max<uint32_t>(1, recv_slots_ / 2) &&
        !free_send_.empty()) {
      Frame f;
      f.kind = kCredit;
      if (PostFrame(f, nullptr, nullptr, 0)) ++stats_.credit_frames;
    }
  }

  void PumpQueue() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
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
        f.chunk_bytes =
            static_cast<uint32_t>(std::min<size_t>(frame_room_ - head, o.size - o.sent));
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

  uint32_t TakeSendSlot() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint32_t slot = free_send_.back();
    free_send_.pop_back();
    return slot;
  }

  // One SEND: frame header (+ message header) (+ chunk) from a send slot.
  // Data frames take a credit; every frame returns ours.
  // `zero_copy`: the chunk is gathered from the caller's registered memory
  // instead of copied into the slot.
  bool PostFrame(Frame f, const char* msg_header, const char* chunk, uint32_t n,
                 const std::shared_ptr<ZeroCopy>& zero_copy = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
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
      s = qp_->PostSendGather(kWrSend | slot, p, static_cast<uint32_t>(len), send_mr_->lkey(),
                              chunk, n, zero_copy->lkey, /*signaled=*/true);
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

  void OnCompletion(const ibv_wc& wc) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
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

  // One received frame (a slot's bytes); the slot is reposted after.
  absl::Status OnReceive(const char* p, uint32_t len, bool* took_credit)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
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
      return it == pending_.end()
                 ? std::pair<char*, uint64_t>(nullptr, 0)
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

  void Deliver(IncomingMessage in) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<DeviceContext> ctx_;
  const Role role_;
  const std::string peer_;
  const uint32_t recv_slots_;
  const uint32_t send_slots_;
  const uint32_t slot_bytes_;
  const uint64_t max_payload_bytes_;
  const std::shared_ptr<const RequestHandler> handler_;  // server side
  ChannelListener* const listener_;
  const absl::Duration announce_timeout_;  // Announce's wait for the answer

  // The caller's regions registered for this peer (RegionFor), by start
  // and use. Taken without mu_ held (registering is a system call).
  mutable absl::Mutex regions_mu_;
  std::map<std::pair<uintptr_t, bool>, std::shared_ptr<PeerRegion>> regions_
      ABSL_GUARDED_BY(regions_mu_);
  bool region_failure_logged_ ABSL_GUARDED_BY(regions_mu_) = false;
  uint64_t stats_region_rotations_ ABSL_GUARDED_BY(regions_mu_) = 0;
  uint32_t next_region_handle_ ABSL_GUARDED_BY(regions_mu_) = 0;

  mutable absl::Mutex mu_;
  ConnectionState state_ ABSL_GUARDED_BY(mu_) = ConnectionState::kExchanging;
  std::optional<uint32_t> bound_node_ ABSL_GUARDED_BY(mu_);  // server: BindNode
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<CompletionQueue> cq_ ABSL_GUARDED_BY(mu_);
  // This connection's own protection domain: its queue pair, its slots
  // and the caller's regions registered for this peer (RegionFor).
  std::shared_ptr<ProtectionDomain> pd_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<RcQueuePair> qp_ ABSL_GUARDED_BY(mu_);
  SlotMemory recv_mem_ ABSL_GUARDED_BY(mu_);
  SlotMemory send_mem_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<MemoryRegion> recv_mr_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<MemoryRegion> send_mr_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> free_send_ ABSL_GUARDED_BY(mu_);
  // Per send slot: the zero-copy message its SEND reads from, if any.
  std::vector<std::shared_ptr<ZeroCopy>> slot_zero_copy_ ABSL_GUARDED_BY(mu_);
  uint64_t sends_completed_ ABSL_GUARDED_BY(mu_) = 0;  // progress, for stalls
  uint32_t peer_credits_ ABSL_GUARDED_BY(mu_) = 0;     // SENDs we may post
  uint32_t peer_recv_slots_ ABSL_GUARDED_BY(mu_) = 0;  // the peer's advertised slots
  uint32_t to_return_ ABSL_GUARDED_BY(mu_) = 0;        // slots reposted, not yet reported
  uint32_t frame_room_ ABSL_GUARDED_BY(mu_) = 0;       // bytes per SEND
  std::deque<Outgoing> queue_ ABSL_GUARDED_BY(mu_);
  FrameReader reader_ ABSL_GUARDED_BY(mu_);  // the frames received
  uint64_t next_request_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::unordered_map<uint64_t, Pending> pending_ ABSL_GUARDED_BY(mu_);
  std::function<void()> closer_ ABSL_GUARDED_BY(mu_);
  std::weak_ptr<Connection> bootstrap_ ABSL_GUARDED_BY(mu_);              // client
  std::map<uint32_t, RemoteRegion> remote_regions_ ABSL_GUARDED_BY(mu_);  // server
  bool probe_acked_ ABSL_GUARDED_BY(mu_) = false;
  RdmaConnectionStats stats_ ABSL_GUARDED_BY(mu_);
  // Callbacks to run once mu_ is released.
  std::vector<std::function<void()>> deferred_ ABSL_GUARDED_BY(mu_);
};

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

// ---------------------------------------------------------------------------
// The connection handed to users: rdma (a channel) or the TCP fallback.

class RdmaConnection : public Connection {
 public:
  RdmaConnection(std::shared_ptr<Channel> channel, std::shared_ptr<Registry> registry,
                 std::shared_ptr<MembershipKeys> membership)
      : channel_(std::move(channel)),
        registry_(std::move(registry)),
        membership_(std::move(membership)) {}
  RdmaConnection(std::shared_ptr<Connection> fallback, std::string why)
      : fallback_(std::move(fallback)), fallback_why_(std::move(why)) {}
  ~RdmaConnection() override {
    if (channel_ != nullptr) {
      channel_->Fail(absl::UnavailableError(
          absl::StrCat("connection to ", channel_->peer(), " was released")));
    }
  }

  void Call(Message request, ResponseCallback done) override {
    CallInto(std::move(request), nullptr, 0, std::move(done));
  }
  void CallInto(Message request, char* dest, size_t dest_size, ResponseCallback done) override {
    if (fallback_ != nullptr) {
      if (dest == nullptr) return fallback_->Call(std::move(request), std::move(done));
      return fallback_->CallInto(std::move(request), dest, dest_size, std::move(done));
    }
    const MessageType t = request.header.type;
    if (!IsValidMessageType(t) || t == MessageType::kRdmaHello ||
        t == MessageType::kRdmaHelloReply) {
      done(absl::InvalidArgumentError(absl::StrCat(
          "call to ", peer(), ": cannot send message type ", static_cast<uint16_t>(t))));
      return;
    }
    // The caller's registered memory, registered for this peer and the
    // current key epoch (docs/security.md, "RDMA").
    const uint64_t epoch = membership_ != nullptr ? membership_->epoch() : 0;
    WriteTarget target;
    std::shared_ptr<PeerRegion> dest_region, source_region;
    const char* base = nullptr;
    size_t bytes = 0;
    if (dest != nullptr && dest_size > 0 &&
        registry_->Find(dest, dest_size, /*remote_write=*/true, &base, &bytes)) {
      dest_region = channel_->RegionFor(base, bytes, /*remote_write=*/true, epoch);
      if (dest_region != nullptr && channel_->Announce(dest_region.get())) {
        target.valid = true;
        target.addr = reinterpret_cast<uint64_t>(dest);
        target.len = dest_size;
        target.region = dest_region->handle;
      }
    }
    if (request.payload_ref != nullptr && request.payload_ref_size > 0 &&
        registry_->Find(request.payload_ref, request.payload_ref_size, /*remote_write=*/false,
                        &base, &bytes)) {
      source_region = channel_->RegionFor(base, bytes, /*remote_write=*/false, epoch);
    }
    channel_->Call(std::move(request), std::move(done), dest, dest_size, target,
                   std::move(dest_region), std::move(source_region));
  }
  std::string peer() const override {
    return channel_ != nullptr ? channel_->peer() : fallback_->peer();
  }
  bool healthy() const override {
    return channel_ != nullptr ? !channel_->failed() : fallback_->healthy();
  }
  std::string kind() const override {
    if (channel_ != nullptr) return "rdma";
    return absl::StrCat("tcp (rdma fallback: ", fallback_why_, ")");
  }

  ConnectionState state() const {
    return channel_ != nullptr ? channel_->state() : ConnectionState::kFallbackTcp;
  }
  RdmaConnectionStats stats() const {
    return channel_ != nullptr ? channel_->stats() : RdmaConnectionStats();
  }
  uint32_t DestinationKey(const void* addr) const {
    return channel_ != nullptr ? channel_->DestinationKey(addr) : 0;
  }
  absl::Status ForceError() {
    if (channel_ == nullptr) {
      return absl::FailedPreconditionError("a TCP fallback connection has no queue pair");
    }
    return channel_->ForceError();
  }

 private:
  const std::shared_ptr<Channel> channel_;
  const std::shared_ptr<Registry> registry_;
  const std::shared_ptr<MembershipKeys> membership_;  // null: no key epochs
  const std::shared_ptr<Connection> fallback_;
  const std::string fallback_why_;
};

// ---------------------------------------------------------------------------
// The transport.

class RdmaTransport : public Transport, public ChannelListener {
 public:
  // `ctx` null: no usable device (`no_device` says why); every connection
  // falls back to TCP.
  RdmaTransport(const TransportOptions& options, std::shared_ptr<DeviceContext> ctx,
                std::string no_device)
      : options_(options),
        required_(options.kind == "rdma"),
        ctx_(std::move(ctx)),
        no_device_(std::move(no_device)) {
    if (ctx_ != nullptr) registry_ = std::make_shared<Registry>();
  }

  absl::Status Start() {
    tcp::TcpOptions t;
    t.max_payload_bytes = options_.max_payload_bytes;
    t.connect_timeout = options_.rdma.connect_timeout;
    t.membership = options_.membership;  // (the handshake runs on the bootstrap)
    // With the membership handshake the bootstrap is always sealed: the
    // queue pair's details (and, on a fallback, the data) are exchanged
    // under keys the master handed out over mTLS (docs/security.md).
    t.encrypt = options_.encrypt_data_plane || options_.membership != nullptr;
    t.handshake_timeout = options_.handshake_timeout;
    t.rdma_hello_handler = [this](Message m, std::shared_ptr<Responder> r) {
      OnHello(std::move(m), std::move(r));
    };
    t.on_close = [this](tcp::Endpoint* endpoint, const absl::Status& reason) {
      OnBootstrapClosed(endpoint, reason);
    };
    STRATA_ASSIGN_OR_RETURN(tcp_, tcp::TcpTransport::Create(t));
    if (ctx_ == nullptr) return absl::OkStatus();
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) {
      return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));
    }
    {
      absl::MutexLock l(&work_mu_);
      poller_running_ = true;
    }
    poller_ = std::thread([this] { PollLoop(); });
    poller_id_ = poller_.get_id();
    return absl::OkStatus();
  }

  ~RdmaTransport() override {
    Shutdown();
    if (wake_fd_ >= 0) ::close(wake_fd_);
  }

  absl::Status Listen(const std::string& host, int port, RequestHandler handler) override {
    auto shared = std::make_shared<const RequestHandler>(handler);
    bool set = false;
    {
      absl::MutexLock l(&mu_);
      if (handler_ == nullptr) {
        handler_ = shared;
        set = true;
      }
    }
    absl::Status s = tcp_->Listen(host, port, std::move(handler));
    if (!s.ok() && set) {
      absl::MutexLock l(&mu_);
      handler_ = nullptr;
    }
    return s;
  }
  std::string listen_address() const override { return tcp_->listen_address(); }
  // (Closing a bootstrap connection tears its queue pair down too.)
  int DisconnectNode(uint32_t node) override { return tcp_->DisconnectNode(node); }

  absl::StatusOr<std::shared_ptr<Connection>> Connect(const std::string& address) override {
    // CONNECTING
    STRATA_ASSIGN_OR_RETURN(std::shared_ptr<Connection> bootstrap, tcp_->Connect(address));
    if (ctx_ == nullptr) {
      return Fallback(std::move(bootstrap), address, no_device_, /*is_error=*/false);
    }
    // EXCHANGING
    auto channel = std::make_shared<Channel>(ctx_, Channel::kClient, address, options_.rdma,
                                             options_.max_payload_bytes, nullptr, this);
    if (absl::Status s = channel->Allocate(); !s.ok()) {
      return Fallback(std::move(bootstrap), address, std::string(s.message()), true);
    }
    STRATA_ASSIGN_OR_RETURN(HelloQp local, channel->LocalHello());
    Message hello;
    hello.header.type = MessageType::kRdmaHello;
    hello.payload = ReadyHello(local).SerializeAsString();
    absl::StatusOr<Message> reply =
        bootstrap->CallSync(std::move(hello), options_.rdma.connect_timeout);
    if (!reply.ok()) {
      return absl::UnavailableError(
          absl::StrCat("rdma connection set-up with ", address, ": ", reply.status().message()));
    }
    if (absl::Status s = ResponseStatus(*reply); !s.ok()) {
      return Fallback(std::move(bootstrap), address,
                      absl::StrCat("the peer declined: ", s.message()), false);
    }
    absl::StatusOr<proto::RdmaHello> peer_hello = ParsePeerHello(reply->payload, address);
    if (!peer_hello.ok()) {
      return Fallback(nullptr, address, std::string(peer_hello.status().message()), true);
    }
    if (!peer_hello->rdma_ready()) {
      return Fallback(std::move(bootstrap), address,
                      absl::StrCat("the peer has no rdma: ", peer_hello->not_ready_reason()),
                      false);
    }
    if (absl::Status s = channel->Join(HelloQpOf(*peer_hello)); !s.ok()) {
      return Fallback(nullptr, address, std::string(s.message()), true);
    }
    const auto* endpoint = static_cast<const tcp::TcpConnection*>(bootstrap.get())->endpoint();
    bool stopping = false;
    {
      absl::MutexLock l(&mu_);
      stopping = stopping_;
      if (!stopping) {
        channels_by_endpoint_[endpoint] = channel;
        channels_.push_back(channel);
      }
    }
    if (stopping) {
      return absl::UnavailableError(
          absl::StrCat("transport shut down while connecting to ", address));
    }
    // In the map first: a close from now on finds the channel.
    const bool healthy = bootstrap->healthy();
    // Releasing the bootstrap connection closes it (and the peer's side).
    channel->SetBootstrap(bootstrap);
    channel->SetCloser([b = std::move(bootstrap)]() mutable { b.reset(); });
    ChannelsChanged();
    if (!healthy) {
      channel->Fail(absl::UnavailableError(
          absl::StrCat("connection to ", address, " closed during the rdma set-up")));
    }
    // The path check: READY only once a frame went each way.
    if (absl::Status s = channel->Probe(options_.rdma.connect_timeout); !s.ok()) {
      channel->Fail(s);  // logged by Fallback; never a working connection
      return Fallback(nullptr, address, std::string(s.message()), true);
    }
    VLOG(1) << "rdma: connected to " << address;
    return std::shared_ptr<Connection>(
        std::make_shared<RdmaConnection>(std::move(channel), registry_, options_.membership));
  }

  absl::Status RegisterMemory(void* addr, size_t size, MemoryUse use) override {
    if (registry_ == nullptr || size == 0) return absl::OkStatus();
    const bool remote_write = use == MemoryUse::kReceiveDestination;
    // Registered per connection at its first use there (Channel::RegionFor);
    // here once with the device and released, so that a region beyond the
    // locked-memory limit is refused now, naming the fix.
    absl::StatusOr<std::unique_ptr<MemoryRegion>> probe =
        MemoryRegion::Register(ctx_->device.get(), addr, size,
                               remote_write ? IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE : 0);
    if (!probe.ok()) return probe.status();
    probe->reset();
    return registry_->Register(addr, size, remote_write);
  }

  void Shutdown() override {
    std::vector<std::shared_ptr<Channel>> channels;
    {
      absl::MutexLock l(&mu_);
      if (stopping_) return;
      stopping_ = true;
      channels = channels_;
    }
    if (poller_.joinable()) {
      CHECK(std::this_thread::get_id() != poller_id_)
          << "rdma: Shutdown (or the transport's destruction) from inside a handler or "
             "a response callback of the same transport";
      stop_.store(true);
      Wake();
      poller_.join();
    }
    // Work handed to the completion thread as it stopped runs here.
    std::vector<std::function<void()>> left;
    {
      absl::MutexLock l(&work_mu_);
      poller_running_ = false;
      left.swap(work_);
    }
    for (auto& w : left) w();
    for (auto& ch : channels) {
      ch->Fail(absl::UnavailableError(
          absl::StrCat("rdma connection with ", ch->peer(), ": transport shut down")));
    }
    if (tcp_ != nullptr) tcp_->Shutdown();
    absl::MutexLock l(&mu_);
    channels_.clear();
    channels_by_endpoint_.clear();
  }

  void ChannelsChanged() override {
    changed_.store(true, std::memory_order_release);
    Wake();
  }

  void CountFailure() override { failures_.fetch_add(1, std::memory_order_relaxed); }
  bool OnCompletionThread() const override { return std::this_thread::get_id() == poller_id_; }

  TransportStats stats() const override {
    TransportStats st;
    st.tcp_fallbacks = fallbacks_.load(std::memory_order_relaxed);
    st.rdma_failures = failures_.load(std::memory_order_relaxed);
    absl::MutexLock l(&mu_);
    for (const auto& ch : channels_) st.rdma_connections += ch->failed() ? 0 : 1;
    return st;
  }

  void Run(std::vector<std::function<void()>> work) override {
    if (work.empty()) return;
    if (std::this_thread::get_id() != poller_id_) {
      absl::MutexLock l(&work_mu_);
      if (poller_running_) {
        for (auto& w : work) work_.push_back(std::move(w));
        Wake();
        return;
      }
    }
    for (auto& w : work) w();
  }

 private:
  // The connection to `address` goes over TCP (or, for transport rdma,
  // fails). `bootstrap`: the TCP connection to carry it; null when the peer
  // may hold rdma resources for the bootstrap connection (it accepted our
  // hello): that one is closed, so the peer frees them, and a fresh one is
  // opened.
  absl::StatusOr<std::shared_ptr<Connection>> Fallback(std::shared_ptr<Connection> bootstrap,
                                                       const std::string& address,
                                                       const std::string& why, bool is_error) {
    if (required_) {
      return absl::FailedPreconditionError(
          absl::StrCat("rdma connection to ", address, " FAILED: ", why,
                       " (transport: rdma requires rdma on both sides; transport: auto "
                       "falls back to TCP)"));
    }
    if (is_error) {
      LOG(WARNING) << "rdma: connection to " << address << " falls back to TCP: " << why;
    } else {
      VLOG(1) << "rdma: connection to " << address << " uses TCP: " << why;
    }
    if (bootstrap == nullptr) {
      STRATA_ASSIGN_OR_RETURN(bootstrap, tcp_->Connect(address));
    }
    fallbacks_.fetch_add(1, std::memory_order_relaxed);
    return std::shared_ptr<Connection>(std::make_shared<RdmaConnection>(std::move(bootstrap), why));
  }

  // Server side of the set-up (the TCP epoll thread).
  // A destination region announced on a joined bootstrap connection
  // (Channel::Announce): its channel may write answers into it.
  void OnRegion(const proto::RdmaRegion& region, const MessageHeader& request,
                const std::shared_ptr<Responder>& responder) {
    std::shared_ptr<tcp::Endpoint> endpoint = tcp::EndpointOf(*responder);
    if (endpoint == nullptr) return;  // the connection closed meanwhile
    std::shared_ptr<Channel> channel;
    {
      absl::MutexLock l(&mu_);
      auto it = channels_by_endpoint_.find(endpoint.get());
      if (it != channels_by_endpoint_.end()) channel = it->second.lock();
    }
    absl::Status s =
        channel != nullptr
            ? channel->AddRemoteRegion(region)
            : absl::FailedPreconditionError(absl::StrCat("rdma region from ", responder->peer(),
                                                         ": this connection has no queue pair"));
    if (!s.ok()) {
      responder->Respond(MakeErrorResponse(request, MessageType::kRdmaHelloReply, s));
      return;
    }
    Message reply;
    reply.header.type = MessageType::kRdmaHelloReply;
    responder->Respond(std::move(reply));
  }

  void OnHello(Message request, std::shared_ptr<Responder> responder) {
    const std::string peer = responder->peer();
    absl::StatusOr<proto::RdmaHello> hello = ParsePeerHello(request.payload, peer);
    if (hello.ok() && hello->has_region()) {
      OnRegion(hello->region(), request.header, responder);
      return;
    }
    if (!hello.ok() || !hello->rdma_ready()) {
      responder->Respond(MakeErrorResponse(request.header, MessageType::kRdmaHelloReply,
                                           hello.ok()
                                               ? absl::InvalidArgumentError(absl::StrCat(
                                                     "rdma hello from ", peer, " offers no rdma"))
                                               : hello.status()));
      return;
    }
    std::shared_ptr<tcp::Endpoint> endpoint = tcp::EndpointOf(*responder);
    if (endpoint == nullptr) return;  // the connection closed meanwhile
    Message reply;
    reply.header.type = MessageType::kRdmaHelloReply;
    std::shared_ptr<const RequestHandler> handler;
    bool joined_already = false;
    {
      absl::MutexLock l(&mu_);
      handler = handler_;
      auto it = channels_by_endpoint_.find(endpoint.get());
      joined_already = it != channels_by_endpoint_.end() && it->second.lock() != nullptr;
    }
    if (joined_already) {
      // One queue pair per bootstrap connection: a second hello would pin
      // another set of slots for nothing.
      responder->Respond(
          MakeErrorResponse(request.header, MessageType::kRdmaHelloReply,
                            absl::FailedPreconditionError(absl::StrCat(
                                "rdma hello from ", peer, ": this connection is joined already"))));
      return;
    }
    if (ctx_ == nullptr || handler == nullptr) {
      reply.payload =
          NotReadyHello(ctx_ == nullptr ? no_device_ : "not listening").SerializeAsString();
      responder->Respond(std::move(reply));
      return;
    }
    auto channel = std::make_shared<Channel>(ctx_, Channel::kServer, peer, options_.rdma,
                                             options_.max_payload_bytes, handler, this);
    // (The bootstrap passed the membership handshake: the queue pair
    // speaks for that node only.)
    if (std::optional<uint32_t> node = endpoint->AuthenticatedNode()) channel->BindNode(*node);
    absl::Status s = channel->Allocate();
    if (s.ok()) s = channel->Join(HelloQpOf(*hello));
    absl::StatusOr<HelloQp> local = s.ok() ? channel->LocalHello() : s;
    if (!local.ok()) {
      LOG(WARNING) << "rdma: cannot accept rdma from " << peer << ": " << local.status();
      reply.payload = NotReadyHello(std::string(local.status().message())).SerializeAsString();
      responder->Respond(std::move(reply));
      return;
    }
    channel->SetCloser([weak = std::weak_ptr<tcp::Endpoint>(endpoint)] {
      if (auto e = weak.lock()) e->RequestClose();
    });
    {
      absl::MutexLock l(&mu_);
      if (stopping_) return;  // the responder answers Internal
      channels_by_endpoint_[endpoint.get()] = channel;
      channels_.push_back(channel);
    }
    ChannelsChanged();
    reply.payload = ReadyHello(*local).SerializeAsString();
    responder->Respond(std::move(reply));
  }

  // The TCP epoll thread: a bootstrap connection closed, so its channel
  // (either side) goes too.
  void OnBootstrapClosed(tcp::Endpoint* endpoint, const absl::Status& reason) {
    std::shared_ptr<Channel> channel;
    {
      absl::MutexLock l(&mu_);
      if (auto it = channels_by_endpoint_.find(endpoint); it != channels_by_endpoint_.end()) {
        channel = it->second.lock();
        channels_by_endpoint_.erase(it);
      }
    }
    if (channel != nullptr) {
      channel->Fail(absl::UnavailableError(absl::StrCat("rdma connection with ", channel->peer(),
                                                        ": its TCP bootstrap connection closed (",
                                                        reason.message(), ")")));
    }
  }

  void Wake() {
    if (wake_fd_ < 0) return;
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof(one));
  }

  // The completion thread.
  void PollLoop() {
    std::vector<std::shared_ptr<Channel>> live;
    absl::Time last_busy = absl::Now();
    while (!stop_.load(std::memory_order_acquire)) {
      std::vector<std::function<void()>> work;
      {
        absl::MutexLock l(&work_mu_);
        work.swap(work_);
      }
      for (auto& w : work) w();
      if (changed_.exchange(false, std::memory_order_acq_rel)) {
        absl::MutexLock l(&mu_);
        channels_.erase(
            std::remove_if(channels_.begin(), channels_.end(),
                           [](const std::shared_ptr<Channel>& c) { return c->failed(); }),
            channels_.end());
        live = channels_;
      }
      int n = 0;
      for (auto& ch : live) n += ch->PollOnce();
      if (n > 0) {
        last_busy = absl::Now();
        continue;
      }
      if (absl::Now() - last_busy < options_.rdma.busy_poll) continue;
      // Going to sleep: arm every CQ, then look once more (a completion
      // that came before the arming raises no event).
      for (auto& ch : live) {
        if (absl::Status s = ch->Arm(); !s.ok()) {
          ch->Fail(absl::UnavailableError(
                       absl::StrCat("rdma connection with ", ch->peer(), ": ", s.message())),
                   /*warn=*/true);
        }
      }
      for (auto& ch : live) n += ch->PollOnce();
      if (n > 0) {
        last_busy = absl::Now();
        continue;
      }
      pollfd fds[2] = {{ctx_->events->fd(), POLLIN, 0}, {wake_fd_, POLLIN, 0}};
      ::poll(fds, 2, 100);
      ctx_->events->DrainEvents();
      uint64_t v;
      [[maybe_unused]] ssize_t r = ::read(wake_fd_, &v, sizeof(v));
      last_busy = absl::Now();
    }
  }

  const TransportOptions options_;
  const bool required_;
  const std::shared_ptr<DeviceContext> ctx_;
  const std::string no_device_;
  std::shared_ptr<Registry> registry_;
  std::unique_ptr<tcp::TcpTransport> tcp_;
  int wake_fd_ = -1;
  std::thread poller_;
  std::thread::id poller_id_;  // written once in Start
  std::atomic<bool> stop_{false};
  absl::Mutex work_mu_;
  bool poller_running_ ABSL_GUARDED_BY(work_mu_) = false;
  std::vector<std::function<void()>> work_ ABSL_GUARDED_BY(work_mu_);
  std::atomic<bool> changed_{true};
  std::atomic<uint64_t> fallbacks_{0};
  std::atomic<uint64_t> failures_{0};

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<const RequestHandler> handler_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Channel>> channels_ ABSL_GUARDED_BY(mu_);
  // Each rdma channel by its TCP bootstrap connection (either side).
  std::unordered_map<const tcp::Endpoint*, std::weak_ptr<Channel>> channels_by_endpoint_
      ABSL_GUARDED_BY(mu_);
};

// What one connection registers: its slots.
uint64_t ConnectionRegisterBytes(const RdmaTransportSettings& s) {
  return uint64_t{s.recv_slots + kSpareRecvSlots + s.send_slots} * s.slot_bytes;
}

absl::Status CheckSettings(const RdmaTransportSettings& s) {
  if (s.recv_slots < 2 || s.recv_slots > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("rdma recv_slots is ", s.recv_slots, ", not in [2, 4096]"));
  }
  if (s.send_slots < 2 || s.send_slots > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("rdma send_slots is ", s.send_slots, ", not in [2, 4096]"));
  }
  if (s.slot_bytes < 4096 || s.slot_bytes > (16u << 20) || s.slot_bytes % 64 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("rdma slot_bytes is ", s.slot_bytes,
                                                   ", not a multiple of 64 in [4096, 16 MiB]"));
  }
  return absl::OkStatus();
}

// Opens the device the settings select, or says why not (the preflight's
// failed findings, each with its fix).
absl::StatusOr<std::shared_ptr<DeviceContext>> OpenDevice(const RdmaTransportSettings& s) {
  RdmaSettings want;
  want.device = s.device;
  want.port = s.port;
  want.gid_index = s.gid_index;
  absl::StatusOr<std::vector<DeviceInfo>> devices = ListRdmaDevices();
  if (!devices.ok()) return devices.status();
  const PreflightReport report =
      RdmaPreflight(*devices, want, MemlockLimitBytes(), ConnectionRegisterBytes(s));
  if (!report.ok()) {
    std::string why;
    for (const PreflightFinding& f : report.findings) {
      if (f.ok) continue;
      absl::StrAppend(&why, why.empty() ? "" : "; ", f.check, ": ", f.detail,
                      f.fix.empty() ? "" : " (fix: ", f.fix, f.fix.empty() ? "" : ")");
    }
    return absl::FailedPreconditionError(
        absl::StrCat("no usable RDMA device: ", why, " (see `strata doctor`)"));
  }
  STRATA_ASSIGN_OR_RETURN(RdmaSelection sel, SelectRdmaDevice(*devices, want));
  auto ctx = std::make_shared<DeviceContext>();
  STRATA_ASSIGN_OR_RETURN(ctx->device, VerbsDevice::Open(sel));
  STRATA_ASSIGN_OR_RETURN(ctx->events, CompletionChannel::Create(ctx->device.get()));
  return ctx;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> NewRdmaTransport(const TransportOptions& options) {
  if (absl::Status s = CheckSettings(options.rdma); !s.ok()) return s;
  absl::StatusOr<std::shared_ptr<DeviceContext>> ctx = OpenDevice(options.rdma);
  std::string no_device;
  if (!ctx.ok()) {
    if (options.kind == "rdma") {
      return absl::Status(ctx.status().code(),
                          absl::StrCat("transport rdma: ", ctx.status().message()));
    }
    no_device = std::string(ctx.status().message());
    LOG(INFO) << "transport auto: using TCP (" << no_device << ")";
  }
  auto t = std::make_unique<RdmaTransport>(options, ctx.ok() ? std::move(ctx).value() : nullptr,
                                           no_device);
  if (absl::Status s = t->Start(); !s.ok()) return s;
  return std::unique_ptr<Transport>(std::move(t));
}

ConnectionState StateOf(const Connection& connection) {
  const auto* c = dynamic_cast<const RdmaConnection*>(&connection);
  return c != nullptr ? c->state() : ConnectionState::kFailed;
}

RdmaConnectionStats StatsOf(const Connection& connection) {
  const auto* c = dynamic_cast<const RdmaConnection*>(&connection);
  return c != nullptr ? c->stats() : RdmaConnectionStats();
}

absl::Status ForceQpErrorForTesting(Connection* connection) {
  auto* c = dynamic_cast<RdmaConnection*>(connection);
  if (c == nullptr) return absl::InvalidArgumentError("not an rdma connection");
  return c->ForceError();
}

uint32_t DestinationKeyForTesting(const Connection& connection, const void* addr) {
  const auto* c = dynamic_cast<const RdmaConnection*>(&connection);
  return c != nullptr ? c->DestinationKey(addr) : 0;
}

}  // namespace strata::transport::rdma
