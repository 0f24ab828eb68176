// TCP backend setup and lifecycle: listening socket, Connect, the epoll
// thread and the endpoint table. The per-frame work is in tcp_datapath.cc.
#include "transport/tcp/tcp_transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <glog/logging.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "openssl/crypto.h"

namespace strata::transport::tcp {
namespace {

// One request of the handshake on `e`, waiting at most until `deadline`
// (then the connection is closed and the call fails).
absl::StatusOr<Message> HandshakeCall(ClientEndpoint* e, Message request, absl::Time deadline) {
  const uint64_t request_epoch = request.header.epoch;
  struct State {
    absl::Notification done;
    absl::StatusOr<Message> result;
  };
  auto state = std::make_shared<State>();
  e->Call(std::move(request), [state](absl::StatusOr<Message> r) {
    state->result = std::move(r);
    state->done.Notify();
  });
  if (!state->done.WaitForNotificationWithDeadline(deadline)) {
    e->RequestClose();
    state->done.WaitForNotification();  // (the close fails the call)
    return absl::DeadlineExceededError("no answer in time");
  }
  if (!state->result.ok()) return state->result.status();
  absl::Status s = ResponseStatus(*state->result);
  // Refused for its key epoch: the reply carries the server's.
  if (absl::IsUnavailable(s) && state->result->header.epoch != request_epoch) {
    return KeyEpochRefusal(s.code(), absl::StrCat(s.message(), " [server's key epoch ",
                                                  state->result->header.epoch, "]"));
  }
  if (!s.ok()) return s;
  return std::move(state->result);
}

// The client's side of the data-plane handshake (data_plane_auth.h).
absl::Status ClientHandshake(ClientEndpoint* e, const MembershipKeys& keys, bool encrypt,
                             absl::Time deadline) {
  absl::StatusOr<MembershipKeys::Own> own = keys.OwnKey();
  if (!own.ok()) return absl::UnavailableError(own.status().message());
  Message hello;
  hello.header.type = MessageType::kAuthHello;
  hello.header.sender_id = own->node_id;
  hello.header.epoch = own->epoch;
  if (encrypt) hello.header.flags = kFlagEncrypt;
  const std::string client_nonce = RandomBytes(kAuthNonceBytes);
  hello.payload = client_nonce;
  absl::StatusOr<Message> reply = HandshakeCall(e, std::move(hello), deadline);
  if (!reply.ok()) return reply.status();
  if (reply->payload.size() != kAuthNonceBytes) {
    return absl::DataLossError(absl::StrCat("a server nonce of ", reply->payload.size(), " bytes"));
  }
  const std::string server_nonce = reply->payload;
  Message proof;
  proof.header.type = MessageType::kAuthProof;
  proof.header.sender_id = own->node_id;
  proof.header.epoch = own->epoch;
  proof.payload = HandshakeMac(own->key, /*server=*/false, own->node_id, own->epoch, server_nonce,
                               client_nonce);
  reply = HandshakeCall(e, std::move(proof), deadline);
  if (!reply.ok()) return reply.status();
  const std::string want =
      HandshakeMac(own->key, /*server=*/true, own->node_id, own->epoch, server_nonce, client_nonce);
  if (reply->payload.size() != want.size() ||
      CRYPTO_memcmp(reply->payload.data(), want.data(), want.size()) != 0) {
    return absl::PermissionDeniedError(
        "the server's proof does not verify: it does not hold this cluster's keys");
  }
  if (encrypt) {
    e->StartEncryption(
        SessionKey(own->key, /*client_to_server=*/true, server_nonce, client_nonce),
        SessionKey(own->key, /*client_to_server=*/false, server_nonce, client_nonce));
  }
  return absl::OkStatus();
}

// Size of the epoll thread's read buffer.
constexpr size_t kScratchBytes = 256 << 10;
constexpr int kMaxEvents = 64;

std::string ErrnoText(int err) { return std::strerror(err); }

void SetNoDelay(int fd) {
  int one = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
    LOG(WARNING) << "tcp: setsockopt(TCP_NODELAY): " << ErrnoText(errno);
  }
}

// "a.b.c.d:port" or "[v6]:port".
std::string FormatSockaddr(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf));
    return absl::StrCat(buf, ":", ntohs(in->sin_port));
  }
  if (ss.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof(buf));
    return absl::StrCat("[", buf, "]:", ntohs(in6->sin6_port));
  }
  return "unknown-address";
}

// Frees a getaddrinfo result on scope exit.
struct AddrInfoDeleter {
  void operator()(addrinfo* ai) const { ::freeaddrinfo(ai); }
};
using AddrInfoPtr = std::unique_ptr<addrinfo, AddrInfoDeleter>;

absl::StatusOr<AddrInfoPtr> Resolve(const std::string& host, int port, bool passive,
                                    const std::string& what) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  const std::string service = std::to_string(port);
  addrinfo* result = nullptr;
  const int rc =
      ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &result);
  if (rc != 0) {
    return absl::UnavailableError(
        absl::StrCat(what, ": cannot resolve \"", host,
                     "\": ", rc == EAI_SYSTEM ? ErrnoText(errno) : ::gai_strerror(rc)));
  }
  return AddrInfoPtr(result);
}

// Connects a non-blocking socket to `ai` before `deadline`. Returns the fd,
// or -1 with `*error` set.
int ConnectOne(const addrinfo* ai, absl::Time deadline, std::string* error) {
  const int fd =
      ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
  if (fd < 0) {
    *error = absl::StrCat("socket: ", ErrnoText(errno));
    return -1;
  }
  int rc;
  do {
    rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0 && errno != EINPROGRESS) {
    *error = ErrnoText(errno);
    ::close(fd);
    return -1;
  }
  if (rc != 0) {
    for (;;) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) {
        *error = "connect timed out";
        ::close(fd);
        return -1;
      }
      pollfd p{fd, POLLOUT, 0};
      const int n = ::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        *error = absl::StrCat("poll: ", ErrnoText(errno));
        ::close(fd);
        return -1;
      }
      if (n > 0) break;
    }
    int err = 0;
    socklen_t len = sizeof(err);
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err != 0) {
      *error = ErrnoText(err);
      ::close(fd);
      return -1;
    }
  }
  return fd;
}

}  // namespace

absl::Status SplitHostPort(const std::string& address, std::string* host, int* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(absl::StrCat("address \"", address, "\" is not host:port"));
  }
  std::string h = address.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') {
    h = h.substr(1, h.size() - 2);
  }
  int p = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &p) || p < 0 || p > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("address \"", address, "\" has a bad port"));
  }
  *host = std::move(h);
  *port = p;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Transport>> NewTcpTransport(const TcpOptions& options) {
  auto transport = TcpTransport::Create(options);
  if (!transport.ok()) return transport.status();
  return std::unique_ptr<Transport>(std::move(transport).value());
}

// ---------------------------------------------------------------------------
// Endpoint lifecycle (reads and writes are in tcp_datapath.cc).

std::string Endpoint::peer_host() const {
  // "host:port" or "[v6]:port".
  std::string host = peer_.substr(0, peer_.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host;
}

Endpoint::Endpoint(int fd, std::string peer, const TcpOptions& options)
    : fd_(fd),
      peer_(std::move(peer)),
      max_payload_bytes_(options.max_payload_bytes),
      on_close_(options.on_close),
      write_stall_timeout_(options.write_stall_timeout),
      lend_requests_(options.lend_request_payloads) {}

Endpoint::~Endpoint() {
  // Normally Close() ran; this only covers an endpoint that never got that far.
  absl::MutexLock l(&write_mu_);
  if (fd_open_) {
    ::close(fd_);
    fd_open_ = false;
  }
}

void Endpoint::Close(const absl::Status& reason) {
  if (closed_.exchange(true, std::memory_order_acq_rel)) return;
  // Wake any writer blocked in poll() before waiting for the write mutex.
  // fd_ is still open: only this function closes it, once.
  ::shutdown(fd_, SHUT_RDWR);
  {
    absl::MutexLock l(&write_mu_);
    if (fd_open_) {
      ::close(fd_);
      fd_open_ = false;
    }
  }
  OnClosed(reason);
  if (on_close_) on_close_(this, reason);
}

void Endpoint::RequestClose() {
  absl::MutexLock l(&write_mu_);
  if (fd_open_) {
    local_shutdown_.store(true, std::memory_order_release);
    ::shutdown(fd_, SHUT_RDWR);
  }
}

// ---------------------------------------------------------------------------
// TcpTransport.

absl::StatusOr<std::unique_ptr<TcpTransport>> TcpTransport::Create(const TcpOptions& options) {
  const int epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd < 0) {
    return absl::InternalError(absl::StrCat("tcp transport: epoll_create1: ", ErrnoText(errno)));
  }
  const int wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd < 0) {
    const int err = errno;
    ::close(epoll_fd);
    return absl::InternalError(absl::StrCat("tcp transport: eventfd: ", ErrnoText(err)));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = nullptr;  // nullptr tags the wake eventfd
  if (::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, wake_fd, &ev) != 0) {
    const int err = errno;
    ::close(wake_fd);
    ::close(epoll_fd);
    return absl::InternalError(absl::StrCat("tcp transport: epoll_ctl(eventfd): ", ErrnoText(err)));
  }
  return std::unique_ptr<TcpTransport>(new TcpTransport(options, epoll_fd, wake_fd));
}

TcpTransport::TcpTransport(const TcpOptions& options, int epoll_fd, int wake_fd)
    : options_(options), epoll_fd_(epoll_fd), wake_fd_(wake_fd) {
  loop_thread_ = std::thread([this] { EventLoop(); });
  loop_thread_id_ = loop_thread_.get_id();
}

TcpTransport::~TcpTransport() { Shutdown(); }

absl::Status TcpTransport::Listen(const std::string& host, int port, RequestHandler handler) {
  const std::string address = absl::StrCat(host, ":", port);
  const std::string what = absl::StrCat("listen on ", address);
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": bad port"));
  }
  {
    absl::MutexLock l(&mu_);
    if (stopping_) {
      return absl::FailedPreconditionError(absl::StrCat(what, ": transport is shut down"));
    }
    if (listen_fd_ >= 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": already listening on ", listen_address_));
    }
  }
  auto resolved = Resolve(host, port, /*passive=*/true, what);
  if (!resolved.ok()) return resolved.status();

  int fd = -1;
  std::string error = "no address";
  for (const addrinfo* ai = resolved->get(); ai != nullptr; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      error = absl::StrCat("socket: ", ErrnoText(errno));
      continue;
    }
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      error = absl::StrCat("bind: ", ErrnoText(errno));
    } else if (::listen(fd, SOMAXCONN) != 0) {
      error = absl::StrCat("listen: ", ErrnoText(errno));
    } else {
      break;
    }
    ::close(fd);
    fd = -1;
  }
  if (fd < 0) return absl::UnavailableError(absl::StrCat(what, ": ", error));

  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat(what, ": getsockname: ", ErrnoText(err)));
  }

  absl::MutexLock l(&mu_);
  if (stopping_ || listen_fd_ >= 0) {  // lost a race with Shutdown or Listen
    ::close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": transport is shut down or already listening"));
  }
  handler_ = std::make_shared<const RequestHandler>(std::move(handler));
  listen_fd_ = fd;
  listen_address_ = FormatSockaddr(bound);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = this;  // `this` tags the listening socket
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    const int err = errno;
    ::close(fd);
    listen_fd_ = -1;
    return absl::InternalError(absl::StrCat(what, ": epoll_ctl: ", ErrnoText(err)));
  }
  VLOG(1) << "tcp: listening on " << listen_address_;
  return absl::OkStatus();
}

std::string TcpTransport::listen_address() const {
  absl::MutexLock l(&mu_);
  return listen_address_;
}

absl::StatusOr<std::shared_ptr<Connection>> TcpTransport::Connect(const std::string& address) {
  const absl::Time deadline = absl::Now() + options_.connect_timeout;
  for (;;) {
    absl::StatusOr<std::shared_ptr<Connection>> conn = ConnectOnce(address, deadline);
    // Refused for its key epoch (one side has not had the master's new
    // keys yet; they come with the next heartbeat, and a member's own key
    // is read afresh): tried again until the deadline, never taken for a
    // dead peer.
    if (conn.ok() || !IsKeyEpochRefusal(conn.status()) || stop_.load(std::memory_order_acquire) ||
        absl::Now() + absl::Milliseconds(100) >= deadline) {
      return conn;
    }
    VLOG(1) << "tcp: " << conn.status().message() << "; trying again";
    absl::SleepFor(absl::Milliseconds(100));
  }
}

absl::StatusOr<std::shared_ptr<Connection>> TcpTransport::ConnectOnce(const std::string& address,
                                                                      absl::Time deadline) {
  std::string host;
  int port = 0;
  absl::Status s = SplitHostPort(address, &host, &port);
  if (!s.ok()) return s;
  if (stop_.load(std::memory_order_acquire)) {
    return absl::UnavailableError(absl::StrCat("connect to ", address, ": transport is shut down"));
  }
  const std::string what = absl::StrCat("connect to ", address);
  auto resolved = Resolve(host, port, /*passive=*/false, what);
  if (!resolved.ok()) return resolved.status();

  int fd = -1;
  std::string error = "no address";
  for (const addrinfo* ai = resolved->get(); ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = ConnectOne(ai, deadline, &error);
  }
  if (fd < 0) return absl::UnavailableError(absl::StrCat(what, ": ", error));
  SetNoDelay(fd);

  auto endpoint = std::make_shared<ClientEndpoint>(fd, address, options_);
  s = Register(endpoint);
  if (!s.ok()) {
    endpoint->Close(s);
    return s;
  }
  if (options_.membership != nullptr) {
    if (std::this_thread::get_id() == loop_thread_id_) {
      endpoint->RequestClose();
      return absl::FailedPreconditionError(
          absl::StrCat(what,
                       ": Connect with the data-plane handshake waits for an answer; it cannot run "
                       "on this transport's own thread (a handler or callback)"));
    }
    s = ClientHandshake(endpoint.get(), *options_.membership, options_.encrypt, deadline);
    if (!s.ok()) {
      endpoint->RequestClose();
      return Annotate(s, absl::StrCat("data-plane handshake with ", address, ": "));
    }
  }
  VLOG(1) << "tcp: connected to " << address;
  return std::shared_ptr<Connection>(std::make_shared<TcpConnection>(std::move(endpoint)));
}

int TcpTransport::DisconnectNode(uint32_t node) {
  std::vector<std::shared_ptr<Endpoint>> gone;
  {
    absl::MutexLock l(&mu_);
    for (const auto& [key, e] : endpoints_) {
      if (e->AuthenticatedNode() == node) gone.push_back(e);
    }
  }
  for (const auto& e : gone) e->RequestClose();
  if (!gone.empty()) {
    LOG(INFO) << "tcp: closed " << gone.size() << " connection(s) of node " << node
              << ", which left the cluster";
  }
  return static_cast<int>(gone.size());
}

absl::Status TcpTransport::Register(std::shared_ptr<Endpoint> endpoint) {
  absl::MutexLock l(&mu_);
  if (stopping_) {
    return absl::UnavailableError(
        absl::StrCat("connection with ", endpoint->peer(), ": transport is shut down"));
  }
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.ptr = endpoint.get();
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, endpoint->fd(), &ev) != 0) {
    return absl::InternalError(
        absl::StrCat("connection with ", endpoint->peer(), ": epoll_ctl: ", ErrnoText(errno)));
  }
  Endpoint* key = endpoint.get();
  endpoints_.emplace(key, std::move(endpoint));
  return absl::OkStatus();
}

void TcpTransport::CloseEndpoint(Endpoint* endpoint, const absl::Status& reason,
                                 std::vector<std::shared_ptr<Endpoint>>* graveyard) {
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, endpoint->fd(), nullptr);
  {
    absl::MutexLock l(&mu_);
    auto it = endpoints_.find(endpoint);
    if (it != endpoints_.end()) {
      graveyard->push_back(std::move(it->second));
      endpoints_.erase(it);
    }
  }
  endpoint->Close(reason);
}

void TcpTransport::AcceptAll() {
  int listen_fd;
  std::shared_ptr<const RequestHandler> handler;
  {
    absl::MutexLock l(&mu_);
    listen_fd = listen_fd_;
    handler = handler_;
  }
  if (listen_fd < 0) return;
  for (;;) {
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    const int fd =
        ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      LOG_EVERY_N(WARNING, 100) << "tcp: accept on " << listen_address() << ": "
                                << ErrnoText(errno);
      return;
    }
    SetNoDelay(fd);
    auto endpoint = std::make_shared<ServerEndpoint>(fd, FormatSockaddr(ss), options_, handler);
    VLOG(1) << "tcp: accepted connection from " << endpoint->peer();
    if (absl::Status limit = CheckPeerLimits(endpoint->peer_host()); !limit.ok()) {
      LOG_EVERY_N(WARNING, 100) << "tcp: " << listen_address() << ": " << limit.message();
      endpoint->Close(limit);
      continue;
    }
    absl::Status s = Register(endpoint);
    if (!s.ok()) {
      endpoint->Close(s);
      return;
    }
  }
}

absl::Status TcpTransport::CheckPeerLimits(const std::string& host) {
  int all = 0, pending = 0;
  {
    absl::MutexLock l(&mu_);
    for (const auto& [key, endpoint] : endpoints_) {
      if (endpoint->peer_host() != host || dynamic_cast<ServerEndpoint*>(key) == nullptr) continue;
      ++all;
      if (endpoint->HandshakePending()) ++pending;
    }
  }
  if (all >= options_.max_connections_per_host) {
    return absl::ResourceExhaustedError(
        absl::StrCat("a connection from ", host, " refused: it holds ", all, " already (at most ",
                     options_.max_connections_per_host, " a host)"));
  }
  if (options_.membership != nullptr && pending >= options_.max_pending_handshakes_per_host) {
    return absl::ResourceExhaustedError(
        absl::StrCat("a connection from ", host, " refused: ", pending,
                     " of its connections are still in the data-plane handshake (at most ",
                     options_.max_pending_handshakes_per_host, ")"));
  }
  return absl::OkStatus();
}

void TcpTransport::CloseOverdueHandshakes(std::vector<std::shared_ptr<Endpoint>>* graveyard) {
  const absl::Time cutoff = absl::Now() - options_.handshake_timeout;
  std::vector<Endpoint*> overdue;
  {
    absl::MutexLock l(&mu_);
    for (const auto& [key, endpoint] : endpoints_) {
      if (endpoint->HandshakePending() && endpoint->opened_at() < cutoff) overdue.push_back(key);
    }
  }
  for (Endpoint* e : overdue) {
    const absl::Status reason = absl::DeadlineExceededError(
        absl::StrCat("connection from ", e->peer(), " closed: no data-plane handshake within ",
                     absl::FormatDuration(options_.handshake_timeout)));
    LOG_EVERY_N(WARNING, 10) << "tcp: " << reason.message();
    CloseEndpoint(e, reason, graveyard);
  }
}

void TcpTransport::EventLoop() {
  std::unique_ptr<char[]> scratch(new char[kScratchBytes]);
  epoll_event events[kMaxEvents];
  // Endpoints closed during a batch stay alive until the batch is done, as
  // later events of the same batch may still point at them.
  std::vector<std::shared_ptr<Endpoint>> graveyard;
  // With the handshake, unfinished ones are swept about once a second.
  const int wait_ms = options_.membership != nullptr ? 1000 : -1;
  absl::Time next_sweep = absl::Now() + absl::Seconds(1);
  while (!stop_.load(std::memory_order_acquire)) {
    if (wait_ms >= 0 && absl::Now() >= next_sweep) {
      CloseOverdueHandshakes(&graveyard);
      graveyard.clear();
      next_sweep = absl::Now() + absl::Seconds(1);
    }
    const int n = ::epoll_wait(epoll_fd_, events, kMaxEvents, wait_ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      LOG(ERROR) << "tcp: epoll_wait: " << ErrnoText(errno) << "; transport stops serving";
      return;
    }
    for (int i = 0; i < n; ++i) {
      if (stop_.load(std::memory_order_acquire)) break;
      void* tag = events[i].data.ptr;
      if (tag == nullptr) {  // wake eventfd
        uint64_t value;
        while (::read(wake_fd_, &value, sizeof(value)) > 0) {
        }
        continue;
      }
      if (tag == this) {
        AcceptAll();
        continue;
      }
      auto* endpoint = static_cast<Endpoint*>(tag);
      if (endpoint->closed()) continue;
      const absl::Status s = endpoint->OnReadable(scratch.get(), kScratchBytes);
      if (!s.ok()) CloseEndpoint(endpoint, s, &graveyard);
    }
    graveyard.clear();
  }
}

void TcpTransport::Shutdown() {
  CHECK(std::this_thread::get_id() != loop_thread_id_)
      << "TcpTransport::Shutdown called from its own epoll thread (a handler "
         "or response callback)";
  absl::MutexLock shutdown_lock(&shutdown_mu_);
  if (shut_down_) return;
  shut_down_ = true;

  stop_.store(true, std::memory_order_release);
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
    // Unblock an epoll-thread write (a handler responding to a stalled peer)
    // so the join below is prompt. Sockets in the table are open.
    for (auto& entry : endpoints_) ::shutdown(entry.first->fd(), SHUT_RDWR);
  }
  const uint64_t one = 1;
  if (::write(wake_fd_, &one, sizeof(one)) < 0) {
    LOG(ERROR) << "tcp: eventfd write: " << ErrnoText(errno);
  }
  if (loop_thread_.joinable()) loop_thread_.join();

  int listen_fd;
  std::unordered_map<Endpoint*, std::shared_ptr<Endpoint>> endpoints;
  {
    absl::MutexLock l(&mu_);
    listen_fd = listen_fd_;
    listen_fd_ = -1;
    endpoints.swap(endpoints_);
  }
  if (listen_fd >= 0) ::close(listen_fd);
  for (auto& entry : endpoints) {
    entry.second->Close(absl::UnavailableError(
        absl::StrCat("connection with ", entry.second->peer(), " closed: transport shut down")));
  }
  endpoints.clear();
  ::close(epoll_fd_);
  ::close(wake_fd_);
}

}  // namespace strata::transport::tcp
