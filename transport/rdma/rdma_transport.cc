// The rdma backend (rdma_transport.h has the design). This file holds the
// connection handed to users (rdma or its TCP fallback) and the transport
// (bootstrap over TCP, the hello, the completion thread); a connection's
// data path is the Channel of rdma_channel.h, its frames and their checks
// on receipt are in rdma_frames.h, the caller's registered regions in
// rdma_regions.h.
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
#include "transport/rdma/rdma_channel.h"
#include "transport/rdma/rdma_device.h"
#include "transport/rdma/rdma_frames.h"
#include "transport/rdma/rdma_hello.h"
#include "transport/rdma/rdma_regions.h"
#include "transport/rdma/verbs.h"
#include "transport/tcp/tcp_transport.h"

namespace strata::transport::rdma {

namespace {

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
    t.lend_request_payloads = options_.lend_request_payloads;
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
