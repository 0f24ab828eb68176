// The TCP backend of transport.h. Frames are a 72-byte little-endian header
// followed by the payload; docs/wire-protocol.md is the specification.
//
// Design: one epoll thread per TcpTransport accepts connections and reads
// every socket of that transport (server-side accepted sockets and
// client-side Connections). Complete request frames are handed to the
// RequestHandler on that thread; complete response frames run the matching
// ResponseCallback on that thread. Writes happen on the calling thread under
// a per-socket write mutex (so responses may be sent from any thread).
// Consequently handlers and response callbacks must be quick and must never
// block waiting for another message of the same transport (e.g. CallSync to
// a peer from inside a callback, or a server calling itself). Sending from a
// callback is allowed, but a large send there stalls every socket of the
// transport while the peer's receive buffer is full (and two peers doing so
// towards each other wait out write_stall_timeout): hand large sends to
// another thread.
//
// Setup and lifecycle live in tcp_transport.cc, the hot path (framing,
// reads, writes, request/response matching) in tcp_datapath.cc.
#ifndef STRATA_TRANSPORT_TCP_TCP_TRANSPORT_H_
#define STRATA_TRANSPORT_TCP_TCP_TRANSPORT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "transport/data_plane_auth.h"
#include "transport/transport.h"

namespace strata::transport::tcp {

class Endpoint;

// ---------------------------------------------------------------------------
// Framing (docs/wire-protocol.md).

inline constexpr uint32_t kFrameMagic = 0x31525453;  // "STR1" on the wire
inline constexpr uint16_t kProtocolVersion = 1;
inline constexpr size_t kFrameHeaderBytes = 72;

// Writes the wire form of `header` with `payload_bytes` into `out`.
void EncodeFrameHeader(const MessageHeader& header, uint64_t payload_bytes,
                       char out[kFrameHeaderBytes]);

// Parses a wire header. DataLoss describing the problem when the magic or
// protocol version is wrong, the type is not a valid MessageType, or
// payload_bytes exceeds `max_payload_bytes`.
absl::Status DecodeFrameHeader(const char in[kFrameHeaderBytes], uint64_t max_payload_bytes,
                               MessageHeader* header, uint64_t* payload_bytes);

// ---------------------------------------------------------------------------
// Factory.

struct TcpOptions {
  // Largest payload accepted from the wire (TransportOptions).
  uint64_t max_payload_bytes = 1ull << 31;
  // Bound on Connect (name resolution excluded), the data-plane handshake
  // and its tries again after key-epoch refusals included.
  absl::Duration connect_timeout = absl::Seconds(5);
  // A write making no progress for this long breaks the connection.
  absl::Duration write_stall_timeout = absl::Seconds(60);

  // Hooks for the rdma backend, which bootstraps its connections over TCP
  // (docs/rdma.md). Both run on the epoll thread.
  // Receives kRdmaHello requests. Unset: they are answered
  // FailedPrecondition ("transport tcp: no rdma here") and never reach the
  // request handler.
  RequestHandler rdma_hello_handler;
  // Called once when a connection (either side) closes, with its endpoint.
  std::function<void(Endpoint* endpoint, const absl::Status& reason)> on_close;
  // Data-plane membership (transport/data_plane_auth.h): the handshake
  // opens every connection; null = none.
  std::shared_ptr<MembershipKeys> membership;
  // Seal every frame after the handshake (TransportOptions).
  bool encrypt = false;
  // An accepted connection that has not passed the handshake this long
  // after it opened is closed (with `membership` only).
  absl::Duration handshake_timeout = absl::Seconds(5);
  // TransportOptions::lend_request_payloads.
  bool lend_request_payloads = false;
  // Connections accepted from one peer host: at most this many in all, and
  // at most `max_pending_handshakes_per_host` of them still in the
  // handshake. One more is closed at once, unread (a rate-limited warning
  // names the host).
  int max_connections_per_host = 1024;
  int max_pending_handshakes_per_host = 16;
};

absl::StatusOr<std::unique_ptr<Transport>> NewTcpTransport(const TcpOptions& options);

// Splits "host:port" or "[v6addr]:port". InvalidArgument naming `address`.
absl::Status SplitHostPort(const std::string& address, std::string* host, int* port);

// ---------------------------------------------------------------------------
// Implementation classes (shared by tcp_transport.cc and tcp_datapath.cc).

class TcpTransport;

// One connected, non-blocking TCP socket of a TcpTransport, either side.
// Reading (OnReadable) happens only on the owning transport's epoll thread;
// WriteFrame is thread-safe. The socket is closed exactly once, by Close(),
// which runs on the epoll thread or after that thread has stopped.
// Owned by the transport's endpoint table (shared_ptr); responders and
// connection handles may keep it alive after it closed.
class Endpoint : public std::enable_shared_from_this<Endpoint> {
 public:
  // Takes ownership of `fd` (connected, non-blocking).
  Endpoint(int fd, std::string peer, const TcpOptions& options);
  virtual ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  // "host:port" of the other side.
  const std::string& peer() const { return peer_; }
  // The socket; only meaningful while the endpoint is in its transport's
  // table (the table is emptied before sockets are closed).
  int fd() const { return fd_; }
  bool closed() const { return closed_.load(std::memory_order_acquire); }
  // The peer's host (peer() without the port).
  std::string peer_host() const;
  absl::Time opened_at() const { return opened_at_; }
  // Epoll thread: an accepted connection still waiting for its data-plane
  // handshake.
  virtual bool HandshakePending() const { return false; }
  // Epoll thread: the node an accepted connection proved it is (the
  // membership handshake); nullopt without one.
  virtual std::optional<uint32_t> AuthenticatedNode() const { return std::nullopt; }

  // Writes one frame (header then payload) atomically with respect to other
  // writers, blocking until it is in the kernel. Unavailable naming the peer
  // when the socket is closed or the write fails; a failed write also shuts
  // the socket down so the epoll thread closes the connection.
  // Thread-safe.
  absl::Status WriteFrame(const MessageHeader& header, const char* payload, size_t payload_size);

  // Epoll thread only: reads what the socket has (bounded per call, epoll is
  // level-triggered), handing complete frames to OnFrame. `scratch` is the
  // epoll thread's read buffer. Returns the reason to close the connection:
  // Unavailable on EOF or a socket error, DataLoss on a malformed frame.
  absl::Status OnReadable(char* scratch, size_t scratch_size);

  // Closes the socket and calls OnClosed(reason); later calls do nothing.
  // REQUIRES: on the epoll thread, after it stopped, or never registered.
  void Close(const absl::Status& reason);

  // Any thread: shuts the socket down so that the epoll thread sees EOF and
  // closes the connection. No-op once closed.
  void RequestClose();

  // From now on, seal every frame sent with `send_key` and open every
  // frame received with `recv_key` (data_plane_auth.h, FrameCipher).
  // REQUIRES: no frame in flight either way (right after the handshake).
  void StartEncryption(std::string send_key, std::string recv_key);

 protected:
  // Epoll thread: one complete frame arrived. A non-OK status closes the
  // connection with that reason.
  virtual absl::Status OnFrame(Message message) = 0;
  // Called once from Close().
  virtual void OnClosed(const absl::Status& reason) = 0;
  // Epoll thread: a frame's header arrived; a non-OK status closes the
  // connection before any of its payload is read (or buffered).
  virtual absl::Status CheckHeader(const MessageHeader& header, uint64_t payload_bytes) {
    return absl::OkStatus();
  }
  // Epoll thread: where the payload of a frame with this (valid) header
  // should be written, or nullptr for a fresh buffer in Message::payload.
  virtual char* PayloadDestination(const MessageHeader& header, uint64_t payload_bytes) {
    return nullptr;
  }

 private:
  absl::Status WriteAllLocked(struct iovec* iov, int iovcnt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  // Feeds `n` received bytes to the frame parser.
  absl::Status Consume(const char* data, size_t n);
  // Doubles the payload buffer (up to the frame's size) when it is full.
  void GrowPayloadRoom();
  // The frame in incoming_ is complete: reset and hand it to OnFrame.
  absl::Status DeliverIncoming();

  const int fd_;
  const std::string peer_;
  const absl::Time opened_at_ = absl::Now();
  const uint64_t max_payload_bytes_;
  const std::function<void(Endpoint*, const absl::Status&)> on_close_;
  const absl::Duration write_stall_timeout_;
  std::atomic<bool> closed_{false};
  // We shut the socket down ourselves (RequestClose or a failed write), so
  // EOF is not the peer's doing.
  std::atomic<bool> local_shutdown_{false};

  absl::Mutex write_mu_;
  bool fd_open_ ABSL_GUARDED_BY(write_mu_) = true;
  std::unique_ptr<FrameCipher> send_cipher_ ABSL_GUARDED_BY(write_mu_);
  std::string seal_buf_ ABSL_GUARDED_BY(write_mu_);  // sealed payloads go out from here
  // The receiving side's: set once, before encrypted_recv_; then used on
  // the epoll thread only.
  std::unique_ptr<FrameCipher> recv_cipher_;
  std::atomic<bool> encrypted_recv_{false};
  char sealed_header_[kFrameHeaderBytes];  // the current frame's, to open it
  bool incoming_sealed_ = false;           // the current frame is sealed

  // Frame parser state; touched only by the epoll thread.
  char header_buf_[kFrameHeaderBytes];
  size_t header_got_ = 0;
  bool in_payload_ = false;
  Message incoming_;
  char* payload_buf_ = nullptr;  // where the current payload goes
  uint64_t payload_size_ = 0;    // the frame's payload bytes
  uint64_t payload_room_ = 0;    // bytes of payload_buf_ allocated so far
  uint64_t payload_got_ = 0;
  // The last frame's payload was large (read straight into its buffer):
  // the next header is read with a small read, so that little of the
  // payload behind it is copied through the scratch buffer.
  bool large_frames_ = false;
  // Lent request payloads (TcpOptions::lend_request_payloads): the buffer,
  // and whether the frame being read goes there.
  const bool lend_requests_;
  std::unique_ptr<char[]> lent_buf_;
  uint64_t lent_capacity_ = 0;
  bool lent_ = false;
};

// Server side of an accepted socket: each request frame goes to the handler
// with a TcpResponder. Thread-safety as Endpoint.
class ServerEndpoint : public Endpoint {
 public:
  ServerEndpoint(int fd, std::string peer, const TcpOptions& options,
                 std::shared_ptr<const RequestHandler> handler);
  bool HandshakePending() const override {
    return membership_ != nullptr && !authenticated_.load(std::memory_order_acquire);
  }
  // (Any thread: claimed_node_ is written before authenticated_, once.)
  std::optional<uint32_t> AuthenticatedNode() const override {
    if (membership_ == nullptr || !authenticated_.load(std::memory_order_acquire)) {
      return std::nullopt;
    }
    return claimed_node_;
  }

 protected:
  absl::Status OnFrame(Message request) override;
  void OnClosed(const absl::Status& reason) override;

 private:
  // Epoll thread: the handshake's requests until it succeeded; anything
  // else closes the connection unserved.
  absl::Status OnHandshakeFrame(Message request);
  // Before the handshake succeeded only its own small frames are read; then
  // every frame must come from the node that passed it.
  absl::Status CheckHeader(const MessageHeader& header, uint64_t payload_bytes) override;

  const std::shared_ptr<const RequestHandler> handler_;
  const RequestHandler rdma_hello_handler_;
  const std::shared_ptr<MembershipKeys> membership_;
  const bool encrypt_;
  // Handshake state (epoll thread only).
  std::atomic<bool> authenticated_{false};
  std::string server_nonce_, client_nonce_;
  uint32_t claimed_node_ = 0;
  uint64_t claimed_epoch_ = 0;
};

// Client side: matches responses to pending calls by request_id.
// Thread-safe.
class ClientEndpoint : public Endpoint {
 public:
  ClientEndpoint(int fd, std::string peer, const TcpOptions& options);

  // Connection::Call / CallInto (dest == nullptr: no destination).
  void Call(Message request, ResponseCallback done, char* dest = nullptr, size_t dest_size = 0);
  bool healthy() const;

 protected:
  absl::Status OnFrame(Message response) override;
  void OnClosed(const absl::Status& reason) override;
  char* PayloadDestination(const MessageHeader& header, uint64_t payload_bytes) override;

 private:
  struct Pending {
    ResponseCallback done;
    char* dest;  // borrowed from the caller (CallInto), or nullptr
    size_t dest_size;
  };
  mutable absl::Mutex mu_;
  uint64_t next_request_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::unordered_map<uint64_t, Pending> pending_ ABSL_GUARDED_BY(mu_);
  // Set once the connection broke (closed, or a write failed).
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status broken_reason_ ABSL_GUARDED_BY(mu_);
};

// The Connection handed to users. Releasing the last reference closes the
// socket (pending calls then fail Unavailable). Thread-safe.
class TcpConnection : public Connection {
 public:
  explicit TcpConnection(std::shared_ptr<ClientEndpoint> endpoint)
      : endpoint_(std::move(endpoint)) {}
  ~TcpConnection() override { endpoint_->RequestClose(); }
  TcpConnection(const TcpConnection&) = delete;
  TcpConnection& operator=(const TcpConnection&) = delete;

  void Call(Message request, ResponseCallback done) override {
    endpoint_->Call(std::move(request), std::move(done));
  }
  void CallInto(Message request, char* dest, size_t dest_size, ResponseCallback done) override {
    endpoint_->Call(std::move(request), std::move(done), dest, dest_size);
  }
  std::string peer() const override { return endpoint_->peer(); }
  bool healthy() const override { return endpoint_->healthy(); }
  std::string kind() const override { return "tcp"; }
  // The socket's endpoint (the rdma backend matches TcpOptions::on_close).
  const Endpoint* endpoint() const { return endpoint_.get(); }

 private:
  const std::shared_ptr<ClientEndpoint> endpoint_;
};

// The endpoint a responder of this backend answers on; nullptr for another
// backend's responder or once the connection is gone.
std::shared_ptr<Endpoint> EndpointOf(const Responder& responder);

// See the file comment. Thread-safe, except that Shutdown (and so the
// destructor) must not run on the epoll thread, i.e. inside a handler or a
// response callback of this transport.
class TcpTransport : public Transport {
 public:
  static absl::StatusOr<std::unique_ptr<TcpTransport>> Create(const TcpOptions& options);
  ~TcpTransport() override;
  TcpTransport(const TcpTransport&) = delete;
  TcpTransport& operator=(const TcpTransport&) = delete;

  absl::Status Listen(const std::string& host, int port, RequestHandler handler) override;
  std::string listen_address() const override;
  absl::StatusOr<std::shared_ptr<Connection>> Connect(const std::string& address) override;
  int DisconnectNode(uint32_t node) override;
  // Stops the epoll thread, closes every socket and fails pending calls
  // with Unavailable. Idempotent.
  void Shutdown() override;

 private:
  TcpTransport(const TcpOptions& options, int epoll_fd, int wake_fd);

  // One try of Connect, all of it before `deadline`.
  absl::StatusOr<std::shared_ptr<Connection>> ConnectOnce(const std::string& address,
                                                          absl::Time deadline);
  void EventLoop();
  void AcceptAll();
  // Epoll thread: whether one more connection from `host` is within
  // TcpOptions' per-host limits; the reason it is not otherwise.
  absl::Status CheckPeerLimits(const std::string& host);
  // Epoll thread: closes accepted connections whose handshake is overdue.
  void CloseOverdueHandshakes(std::vector<std::shared_ptr<Endpoint>>* graveyard);
  // Adds `endpoint` to the table and to epoll. Unavailable after Shutdown.
  absl::Status Register(std::shared_ptr<Endpoint> endpoint);
  // Epoll thread: removes `endpoint` from epoll and the table (keeping it
  // alive in `graveyard` until the current batch of events is done) and
  // closes it.
  void CloseEndpoint(Endpoint* endpoint, const absl::Status& reason,
                     std::vector<std::shared_ptr<Endpoint>>* graveyard);

  const TcpOptions options_;
  const int epoll_fd_;
  const int wake_fd_;               // eventfd that wakes the epoll thread for Shutdown
  std::thread loop_thread_;         // joined by Shutdown, under shutdown_mu_
  std::thread::id loop_thread_id_;  // written once in the constructor
  std::atomic<bool> stop_{false};

  absl::Mutex shutdown_mu_;  // serializes Shutdown
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int listen_fd_ ABSL_GUARDED_BY(mu_) = -1;
  std::string listen_address_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const RequestHandler> handler_ ABSL_GUARDED_BY(mu_);
  // Every registered endpoint; an endpoint leaves the table before its
  // socket is closed, so sockets in the table are open.
  std::unordered_map<Endpoint*, std::shared_ptr<Endpoint>> endpoints_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata::transport::tcp

#endif  // STRATA_TRANSPORT_TCP_TCP_TRANSPORT_H_
