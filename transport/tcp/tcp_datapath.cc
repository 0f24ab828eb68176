// TCP backend hot path: frame encoding/decoding, reading frames from
// non-blocking sockets on the epoll thread, writing frames with one
// gather-write per frame, and request/response matching.
#include <errno.h>
#include <glog/logging.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "openssl/crypto.h"
#include "transport/once_responder.h"
#include "transport/tcp/tcp_transport.h"

namespace strata::transport::tcp {
namespace {

// Payload remainders at least this large are read straight into the
// message instead of through the scratch buffer.
constexpr uint64_t kDirectReadMinBytes = 64 << 10;
// A header read after a large frame: the header and a little of a payload.
constexpr size_t kHeaderReadBytes = 4 << 10;
// The largest request payload lent from a connection's buffer
// (TcpOptions::lend_request_payloads); larger ones get their own.
constexpr uint64_t kMaxLentBytes = 16 << 20;
// Bytes read from one socket per epoll wakeup, so that one busy peer cannot
// starve the others (epoll is level-triggered: the rest comes next round).
constexpr size_t kReadBudgetBytes = 4 << 20;
// First allocation for a payload without a destination; doubled as bytes
// arrive, so memory follows what the peer actually sent.
constexpr uint64_t kInitialPayloadRoom = 1 << 20;

void PutU16(char* p, uint16_t v) {
  p[0] = static_cast<char>(v);
  p[1] = static_cast<char>(v >> 8);
}
void PutU32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
void PutU64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
uint16_t GetU16(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return static_cast<uint16_t>(u[0] | (u[1] << 8));
}
uint32_t GetU32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | u[i];
  return v;
}
uint64_t GetU64(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | u[i];
  return v;
}

// Answers one request received on a ServerEndpoint. Holds the endpoint
// weakly: once the connection is gone the response is dropped silently.
// Thread-safe.
class TcpResponder final : public OnceResponder {
 public:
  TcpResponder(std::weak_ptr<Endpoint> endpoint, const MessageHeader& request, std::string peer)
      : OnceResponder(request, std::move(peer), "tcp"), endpoint_(std::move(endpoint)) {}
  ~TcpResponder() override { AnswerIfDropped(); }

  std::shared_ptr<Endpoint> endpoint() const { return endpoint_.lock(); }

 private:
  void Deliver(Message response) override {
    std::shared_ptr<Endpoint> endpoint = endpoint_.lock();
    if (endpoint == nullptr) {
      VLOG(1) << "tcp: dropping response to " << peer() << ": connection closed";
      return;
    }
    const absl::Status s =
        endpoint->WriteFrame(response.header, response.payload_data(), response.payload_size());
    if (!s.ok()) VLOG(1) << "tcp: dropping response: " << s;
  }

  const std::weak_ptr<Endpoint> endpoint_;
};

}  // namespace

std::shared_ptr<Endpoint> EndpointOf(const Responder& responder) {
  const auto* r = dynamic_cast<const TcpResponder*>(&responder);
  return r != nullptr ? r->endpoint() : nullptr;
}

// ---------------------------------------------------------------------------
// Framing.

void EncodeFrameHeader(const MessageHeader& h, uint64_t payload_bytes,
                       char out[kFrameHeaderBytes]) {
  PutU32(out + 0, kFrameMagic);
  PutU16(out + 4, kProtocolVersion);
  PutU16(out + 6, static_cast<uint16_t>(h.type));
  PutU16(out + 8, h.status);
  PutU16(out + 10, 0);  // reserved
  PutU32(out + 12, h.sender_id);
  PutU64(out + 16, h.epoch);
  PutU64(out + 24, h.request_id);
  PutU64(out + 32, h.seq);
  PutU32(out + 40, h.partition);
  PutU32(out + 44, h.flags);
  PutU64(out + 48, h.version);
  PutU64(out + 56, h.count);
  PutU64(out + 64, payload_bytes);
}

absl::Status DecodeFrameHeader(const char in[kFrameHeaderBytes], uint64_t max_payload_bytes,
                               MessageHeader* h, uint64_t* payload_bytes) {
  const uint32_t magic = GetU32(in + 0);
  if (magic != kFrameMagic) {
    return absl::DataLossError(
        absl::StrFormat("bad magic 0x%08x (want 0x%08x)", magic, kFrameMagic));
  }
  const uint16_t version = GetU16(in + 4);
  if (version != kProtocolVersion) {
    return absl::DataLossError(
        absl::StrCat("unsupported protocol version ", version, " (want ", kProtocolVersion, ")"));
  }
  const auto type = static_cast<MessageType>(GetU16(in + 6));
  if (!IsValidMessageType(type)) {
    return absl::DataLossError(absl::StrCat("unknown message type ", static_cast<uint16_t>(type)));
  }
  const uint64_t bytes = GetU64(in + 64);
  if (bytes > max_payload_bytes) {
    return absl::DataLossError(
        absl::StrCat("payload_bytes ", bytes, " exceeds max_payload_bytes ", max_payload_bytes));
  }
  h->type = type;
  h->status = GetU16(in + 8);
  // in + 10: reserved, ignored.
  h->sender_id = GetU32(in + 12);
  h->epoch = GetU64(in + 16);
  h->request_id = GetU64(in + 24);
  h->seq = GetU64(in + 32);
  h->partition = GetU32(in + 40);
  h->flags = GetU32(in + 44);
  h->version = GetU64(in + 48);
  h->count = GetU64(in + 56);
  *payload_bytes = bytes;
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Writing.

void Endpoint::StartEncryption(std::string send_key, std::string recv_key) {
  {
    absl::MutexLock l(&write_mu_);
    send_cipher_ = std::make_unique<FrameCipher>(std::move(send_key));
  }
  recv_cipher_ = std::make_unique<FrameCipher>(std::move(recv_key));
  encrypted_recv_.store(true, std::memory_order_release);
}

absl::Status Endpoint::WriteFrame(const MessageHeader& header, const char* payload,
                                  size_t payload_size) {
  char head[kFrameHeaderBytes];
  iovec iov[2];
  iov[0].iov_base = head;
  iov[0].iov_len = kFrameHeaderBytes;

  absl::MutexLock l(&write_mu_);
  if (!fd_open_) {
    return absl::UnavailableError(absl::StrCat("connection with ", peer_, " is closed"));
  }
  if (send_cipher_ != nullptr) {
    // The payload sealed, the header (with the sealed length) authenticated,
    // in a buffer kept for the next frame (no allocation per frame).
    EncodeFrameHeader(header, payload_size + kFrameTagBytes, head);
    if (seal_buf_.size() < payload_size + kFrameTagBytes) {
      seal_buf_.resize(payload_size + kFrameTagBytes);
    }
    send_cipher_->Seal(absl::string_view(head, kFrameHeaderBytes), payload, payload_size,
                       seal_buf_.data());
    payload = seal_buf_.data();
    payload_size += kFrameTagBytes;
  } else {
    EncodeFrameHeader(header, payload_size, head);
  }
  iov[1].iov_base = const_cast<char*>(payload);
  iov[1].iov_len = payload_size;
  absl::Status s = WriteAllLocked(iov, payload_size == 0 ? 1 : 2);
  // (A buffer grown for a large frame is not kept.)
  if (seal_buf_.size() > (8u << 20)) std::string().swap(seal_buf_);
  if (!s.ok()) {
    // Part of a frame may be out: the stream is unusable. Let the epoll
    // thread close the connection (and fail pending calls).
    local_shutdown_.store(true, std::memory_order_release);
    ::shutdown(fd_, SHUT_RDWR);
  }
  return s;
}

absl::Status Endpoint::WriteAllLocked(iovec* iov, int iovcnt) {
  // sendmsg is writev plus flags: MSG_NOSIGNAL turns a peer reset into EPIPE
  // instead of SIGPIPE.
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = iovcnt;
  while (msg.msg_iovlen > 0) {
    const ssize_t n = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);
    if (n >= 0) {
      size_t left = static_cast<size_t>(n);
      while (msg.msg_iovlen > 0 && left >= msg.msg_iov[0].iov_len) {
        left -= msg.msg_iov[0].iov_len;
        ++msg.msg_iov;
        --msg.msg_iovlen;
      }
      if (msg.msg_iovlen > 0) {
        msg.msg_iov[0].iov_base = static_cast<char*>(msg.msg_iov[0].iov_base) + left;
        msg.msg_iov[0].iov_len -= left;
      }
      continue;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return absl::UnavailableError(absl::StrCat("write to ", peer_, ": ", std::strerror(errno)));
    }
    // Socket buffer full: wait until the peer drains some, but not forever.
    pollfd p{fd_, POLLOUT, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(write_stall_timeout_)));
    if (rc == 0) {
      return absl::UnavailableError(absl::StrCat("write to ", peer_, " stalled for ",
                                                 absl::FormatDuration(write_stall_timeout_)));
    }
    if (rc < 0 && errno != EINTR) {
      return absl::UnavailableError(
          absl::StrCat("poll for write to ", peer_, ": ", std::strerror(errno)));
    }
    // Writable, or POLLERR/POLLHUP: the next sendmsg reports which.
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Reading (epoll thread).

absl::Status Endpoint::OnReadable(char* scratch, size_t scratch_size) {
  size_t budget = kReadBudgetBytes;
  while (budget > 0) {
    const uint64_t remaining = in_payload_ ? payload_size_ - payload_got_ : 0;
    char* dst = scratch;
    size_t want =
        large_frames_ && !in_payload_ ? std::min(scratch_size, kHeaderReadBytes) : scratch_size;
    const bool direct = remaining >= kDirectReadMinBytes;
    if (direct) {
      GrowPayloadRoom();
      dst = payload_buf_ + payload_got_;
      want = static_cast<size_t>(
          std::min<uint64_t>({remaining, budget, payload_room_ - payload_got_}));
    }
    const ssize_t n = ::read(fd_, dst, want);
    if (n == 0) {
      if (local_shutdown_.load(std::memory_order_acquire)) {
        return absl::UnavailableError(absl::StrCat(
            "connection with ", peer_, " closed locally (connection released or a write failed)"));
      }
      return absl::UnavailableError(
          absl::StrCat("connection with ", peer_, " closed by the peer",
                       (in_payload_ || header_got_ > 0) ? " in the middle of a frame" : ""));
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return absl::OkStatus();
      return absl::UnavailableError(
          absl::StrCat("connection with ", peer_, " failed: ", std::strerror(errno)));
    }
    budget -= std::min(budget, static_cast<size_t>(n));
    if (direct) {
      payload_got_ += static_cast<uint64_t>(n);
      if (payload_got_ == payload_size_) {
        absl::Status s = DeliverIncoming();
        if (!s.ok()) return s;
      }
    } else {
      absl::Status s = Consume(scratch, static_cast<size_t>(n));
      if (!s.ok()) return s;
    }
    // A short read that ended on a frame boundary: back to epoll (level-
    // triggered, so it reports whatever arrives next) without a read that
    // returns EAGAIN, one system call less per small message. Inside a
    // frame, more is on its way: keep reading.
    if (static_cast<size_t>(n) < want && !in_payload_ && header_got_ == 0) break;
  }
  return absl::OkStatus();
}

absl::Status Endpoint::Consume(const char* data, size_t n) {
  while (n > 0) {
    if (!in_payload_) {
      const size_t take = std::min(n, kFrameHeaderBytes - header_got_);
      std::memcpy(header_buf_ + header_got_, data, take);
      header_got_ += take;
      data += take;
      n -= take;
      if (header_got_ < kFrameHeaderBytes) break;
      header_got_ = 0;
      uint64_t payload_bytes = 0;
      // (Sealed or not is decided here, once per frame.)
      const bool sealed = encrypted_recv_.load(std::memory_order_acquire);
      absl::Status s =
          DecodeFrameHeader(header_buf_, max_payload_bytes_ + (sealed ? kFrameTagBytes : 0),
                            &incoming_.header, &payload_bytes);
      if (s.ok()) s = CheckHeader(incoming_.header, payload_bytes);
      if (!s.ok()) {
        LOG(WARNING) << "tcp: bad frame from " << peer_ << ": " << s.message()
                     << "; closing the connection";
        return absl::DataLossError(absl::StrCat("bad frame from ", peer_, ": ", s.message()));
      }
      // A sealed frame is opened in a buffer of its own (its tag follows
      // the payload); its header is kept to authenticate it.
      incoming_sealed_ = sealed;
      if (sealed) {
        if (payload_bytes < kFrameTagBytes) {
          return absl::DataLossError(absl::StrCat(
              "bad frame from ", peer_, ": a sealed payload of ", payload_bytes, " bytes"));
        }
        std::memcpy(sealed_header_, header_buf_, kFrameHeaderBytes);
      }
      // A destination registered by the caller (a pull landing in the
      // worker's tensor) takes the payload directly; else a buffer of the
      // frame's size, allocated only now that the header checked out.
      char* dest = sealed ? nullptr : PayloadDestination(incoming_.header, payload_bytes);
      incoming_.payload_in_destination = dest != nullptr;
      const MessageType type = incoming_.header.type;
      lent_ = dest == nullptr && !sealed && lend_requests_ && payload_bytes <= kMaxLentBytes &&
              (type == MessageType::kPushRequest || type == MessageType::kReplicate ||
               type == MessageType::kCollective);
      if (lent_) {
        if (lent_capacity_ < payload_bytes) {
          lent_buf_.reset(new char[payload_bytes]);  // (not cleared: written before read)
          lent_capacity_ = payload_bytes;
        }
        dest = lent_buf_.get();
      }
      payload_size_ = payload_bytes;
      large_frames_ = payload_bytes >= kDirectReadMinBytes;
      if (dest == nullptr) {
        // The buffer grows as bytes arrive, so a frame that claims a huge
        // payload and never sends it costs nothing.
        payload_room_ = payload_bytes <= kInitialPayloadRoom + kInitialPayloadRoom / 4
                            ? payload_bytes
                            : kInitialPayloadRoom;
        incoming_.payload.resize(payload_room_);
        dest = incoming_.payload.data();
      } else {
        payload_room_ = payload_bytes;
      }
      payload_buf_ = dest;
      payload_got_ = 0;
      in_payload_ = true;
      if (payload_bytes == 0) {
        s = DeliverIncoming();
        if (!s.ok()) return s;
      }
      continue;
    }
    GrowPayloadRoom();
    const size_t take = static_cast<size_t>(std::min<uint64_t>(n, payload_room_ - payload_got_));
    std::memcpy(payload_buf_ + payload_got_, data, take);
    payload_got_ += take;
    data += take;
    n -= take;
    if (payload_got_ == payload_size_) {
      absl::Status s = DeliverIncoming();
      if (!s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

void Endpoint::GrowPayloadRoom() {
  if (payload_got_ < payload_room_ || payload_room_ == payload_size_) return;
  // Doubling, but straight to the whole frame when that is little more (a
  // sealed frame's tag must not cost one more copy of the payload).
  payload_room_ =
      payload_size_ <= payload_room_ * 2 + payload_room_ / 4 ? payload_size_ : payload_room_ * 2;
  incoming_.payload.resize(payload_room_);
  payload_buf_ = incoming_.payload.data();
}

absl::Status Endpoint::DeliverIncoming() {
  Message message = std::move(incoming_);
  incoming_ = Message();
  if (lent_) {
    lent_ = false;
    message.payload_ref = lent_buf_.get();
    message.payload_ref_size = payload_size_;
  }
  if (incoming_sealed_) {
    incoming_sealed_ = false;
    message.payload.resize(payload_size_);
    // Opened straight into the caller's destination when it has one (a
    // pull landing in the worker's tensor), else in place.
    const uint64_t plain_bytes = payload_size_ - kFrameTagBytes;
    char* dest = PayloadDestination(message.header, plain_bytes);
    if (!recv_cipher_->Open(absl::string_view(sealed_header_, kFrameHeaderBytes),
                            message.payload.data(), message.payload.size(),
                            dest != nullptr ? dest : message.payload.data())) {
      LOG(WARNING) << "tcp: a frame from " << peer_
                   << " does not authenticate; closing the connection";
      return absl::DataLossError(absl::StrCat("a frame from ", peer_,
                                              " does not authenticate (changed, replayed "
                                              "or out of order)"));
    }
    if (dest != nullptr) {
      message.payload.clear();
      message.payload_in_destination = true;
    } else {
      message.payload.resize(plain_bytes);
    }
  }
  in_payload_ = false;
  payload_got_ = 0;
  payload_buf_ = nullptr;
  payload_size_ = 0;
  payload_room_ = 0;
  return OnFrame(std::move(message));
}

// ---------------------------------------------------------------------------
// Server side.

ServerEndpoint::ServerEndpoint(int fd, std::string peer, const TcpOptions& options,
                               std::shared_ptr<const RequestHandler> handler)
    : Endpoint(fd, std::move(peer), options),
      handler_(std::move(handler)),
      rdma_hello_handler_(options.rdma_hello_handler),
      membership_(options.membership),
      encrypt_(options.encrypt) {}

absl::Status ServerEndpoint::OnHandshakeFrame(Message request) {
  const MessageHeader h = request.header;
  // (A responder only for the handshake's own requests: anything else is
  // not answered at all.)
  auto responder = [&] {
    return std::make_shared<TcpResponder>(std::weak_ptr<Endpoint>(shared_from_this()), h, peer());
  };
  if (h.type == MessageType::kAuthHello && server_nonce_.empty()) {
    const bool wants_encryption = (h.flags & kFlagEncrypt) != 0;
    if (wants_encryption != encrypt_) {
      const absl::Status refused = absl::FailedPreconditionError(
          absl::StrCat("data-plane encryption is ", encrypt_ ? "on" : "off", " here and ",
                       wants_encryption ? "on" : "off", " at ", peer(),
                       ": the nodes run different configs (security.encrypt_data_plane)"));
      LOG_EVERY_N(WARNING, 10) << "tcp: " << refused.message();
      responder()->Respond(MakeErrorResponse(h, MessageType::kAuthHelloReply, refused));
      return refused;
    }
    if (request.payload.size() != kAuthNonceBytes) {
      return absl::DataLossError(absl::StrCat("data-plane handshake from ", peer(),
                                              ": a client nonce of ", request.payload.size(),
                                              " bytes"));
    }
    client_nonce_ = std::move(request.payload);
    claimed_node_ = h.sender_id;
    claimed_epoch_ = h.epoch;
    server_nonce_ = RandomBytes(kAuthNonceBytes);
    Message reply;
    reply.header.type = MessageType::kAuthHelloReply;
    reply.payload = server_nonce_;
    responder()->Respond(std::move(reply));
    return absl::OkStatus();
  }
  if (h.type == MessageType::kAuthProof && !server_nonce_.empty()) {
    absl::StatusOr<std::string> key = membership_->KeyOf(claimed_node_, claimed_epoch_);
    absl::Status refused;
    if (!key.ok()) {
      refused = key.status();
    } else {
      const std::string want = HandshakeMac(*key, /*server=*/false, claimed_node_, claimed_epoch_,
                                            server_nonce_, client_nonce_);
      if (request.payload.size() != want.size() ||
          CRYPTO_memcmp(request.payload.data(), want.data(), want.size()) != 0) {
        refused = absl::PermissionDeniedError(
            absl::StrCat("data-plane handshake of node ", claimed_node_, " from ", peer(),
                         ": the proof does not verify (not a member, or a replayed handshake)"));
      }
    }
    if (!refused.ok()) {
      LOG_EVERY_N(WARNING, 10) << "tcp: refused a connection: " << refused.message();
      Message reply = MakeErrorResponse(h, MessageType::kAuthProofReply, refused);
      // (Whose keys are behind, for the client: ClientHandshake.)
      reply.header.epoch = membership_->epoch();
      responder()->Respond(std::move(reply));
      return refused;  // closes the connection
    }
    authenticated_.store(true, std::memory_order_release);
    VLOG(1) << "tcp: node " << claimed_node_ << " at " << peer() << " is a member";
    Message reply;
    reply.header.type = MessageType::kAuthProofReply;
    reply.payload = HandshakeMac(*key, /*server=*/true, claimed_node_, claimed_epoch_,
                                 server_nonce_, client_nonce_);
    responder()->Respond(std::move(reply));
    if (encrypt_) {
      StartEncryption(SessionKey(*key, /*client_to_server=*/false, server_nonce_, client_nonce_),
                      SessionKey(*key, /*client_to_server=*/true, server_nonce_, client_nonce_));
    }
    return absl::OkStatus();
  }
  // Anything else first: dropped unserved, with the connection.
  const absl::Status dropped = absl::PermissionDeniedError(
      absl::StrCat(MessageTypeName(h.type), " from ", peer(),
                   " before the data-plane handshake: connection closed unserved"));
  LOG_EVERY_N(WARNING, 10) << "tcp: " << dropped.message();
  return dropped;
}

absl::Status ServerEndpoint::CheckHeader(const MessageHeader& h, uint64_t payload_bytes) {
  if (membership_ == nullptr) return absl::OkStatus();
  if (!authenticated_) {
    const bool handshake = h.type == MessageType::kAuthHello || h.type == MessageType::kAuthProof;
    if (!handshake || payload_bytes > kAuthNonceBytes + kAuthMacBytes) {
      const absl::Status dropped = absl::PermissionDeniedError(
          absl::StrCat(MessageTypeName(h.type), " from ", peer(), " (", payload_bytes,
                       " bytes) before the data-plane handshake: connection closed unserved"));
      LOG_EVERY_N(WARNING, 10) << "tcp: " << dropped.message();
      return dropped;
    }
    return absl::OkStatus();
  }
  // (The rdma set-up is the transport's own, not a node's request.)
  if (h.sender_id != claimed_node_ && h.type != MessageType::kRdmaHello) {
    const absl::Status forged = absl::PermissionDeniedError(
        absl::StrCat(MessageTypeName(h.type), " from ", peer(), " says it is node ", h.sender_id,
                     " but the connection belongs to node ", claimed_node_, ": connection closed"));
    LOG_EVERY_N(WARNING, 10) << "tcp: " << forged.message();
    return forged;
  }
  return absl::OkStatus();
}

absl::Status ServerEndpoint::OnFrame(Message request) {
  if (membership_ != nullptr && !authenticated_) return OnHandshakeFrame(std::move(request));
  auto responder = std::make_shared<TcpResponder>(std::weak_ptr<Endpoint>(shared_from_this()),
                                                  request.header, peer());
  switch (request.header.type) {
    case MessageType::kAuthHello:
    case MessageType::kAuthProof:
      if (membership_ == nullptr) {
        // A client that wants a handshake, at a server without one.
        responder->Respond(MakeErrorResponse(
            request.header, ResponseTypeFor(request.header.type),
            absl::FailedPreconditionError(
                "this server runs no data-plane handshake (security.mode plaintext?)")));
        return absl::OkStatus();
      }
      return absl::DataLossError(absl::StrCat("a second data-plane handshake from ", peer()));
    default:
      break;
  }
  if (request.header.type == MessageType::kRdmaHello) {
    if (rdma_hello_handler_) {
      rdma_hello_handler_(std::move(request), std::move(responder));
    } else {
      responder->Respond(MakeErrorResponse(
          request.header, MessageType::kRdmaHelloReply,
          absl::FailedPreconditionError("this peer serves transport tcp: no rdma here")));
    }
    return absl::OkStatus();
  }
  (*handler_)(std::move(request), std::move(responder));
  return absl::OkStatus();
}

void ServerEndpoint::OnClosed(const absl::Status& reason) {
  VLOG(1) << "tcp: server connection closed: " << reason;
}

// ---------------------------------------------------------------------------
// Client side.

ClientEndpoint::ClientEndpoint(int fd, std::string peer, const TcpOptions& options)
    : Endpoint(fd, std::move(peer), options) {}

void ClientEndpoint::Call(Message request, ResponseCallback done, char* dest, size_t dest_size) {
  uint64_t id = 0;
  if (!StartCall(request.header.type, peer(), &done, [&] {
        absl::MutexLock l(&mu_);
        if (broken_) return broken_reason_;
        id = ++next_request_id_;
        pending_.emplace(id, Pending{std::move(done), dest, dest_size});
        return absl::OkStatus();
      })) {
    return;
  }
  request.header.request_id = id;
  const absl::Status s = WriteFrame(request.header, request.payload_data(), request.payload_size());
  if (s.ok()) return;
  ResponseCallback callback;
  {
    absl::MutexLock l(&mu_);
    if (!broken_) {
      broken_ = true;
      broken_reason_ = s;
    }
    auto it = pending_.find(id);
    if (it != pending_.end()) {
      callback = std::move(it->second.done);
      pending_.erase(it);
    }
  }
  // Else the epoll thread already failed it (or a response raced in).
  if (callback) callback(s);
}

bool ClientEndpoint::healthy() const {
  absl::MutexLock l(&mu_);
  return !broken_ && !closed();
}

char* ClientEndpoint::PayloadDestination(const MessageHeader& header, uint64_t payload_bytes) {
  if (header.status != 0) return nullptr;  // error text goes to payload
  absl::MutexLock l(&mu_);
  auto it = pending_.find(header.request_id);
  if (it == pending_.end() || it->second.dest == nullptr || it->second.dest_size != payload_bytes) {
    return nullptr;
  }
  return it->second.dest;
}

absl::Status ClientEndpoint::OnFrame(Message response) {
  ResponseCallback callback;
  {
    absl::MutexLock l(&mu_);
    auto it = pending_.find(response.header.request_id);
    if (it != pending_.end()) {
      callback = std::move(it->second.done);
      pending_.erase(it);
    }
  }
  if (!callback) {
    // E.g. the call's write failed and it was already answered.
    VLOG(1) << "tcp: dropping response from " << peer() << " to unknown request "
            << response.header.request_id;
    return absl::OkStatus();
  }
  callback(std::move(response));
  return absl::OkStatus();
}

void ClientEndpoint::OnClosed(const absl::Status& reason) {
  std::unordered_map<uint64_t, Pending> pending;
  {
    absl::MutexLock l(&mu_);
    if (!broken_) {
      broken_ = true;
      broken_reason_ = reason;
    }
    pending.swap(pending_);
  }
  if (!pending.empty()) {
    VLOG(1) << "tcp: failing " << pending.size() << " pending calls: " << reason;
  }
  for (auto& entry : pending) entry.second.done(reason);
}

}  // namespace strata::transport::tcp
