// The data plane as pserver and worker see it: request/response messages of
// a fixed header plus an opaque payload, over a pluggable backend
// (tcp, inproc, rdma). docs/wire-protocol.md documents the
// header and the TCP framing.
#ifndef STRATA_TRANSPORT_TRANSPORT_H_
#define STRATA_TRANSPORT_TRANSPORT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace strata::transport {

class MembershipKeys;

enum class MessageType : uint16_t {
  kInvalid = 0,
  kPullRequest = 1,   // worker -> pserver: send me partition P (version >= V)
  kPullResponse = 2,  // payload: fp32 values of the partition
  kPushRequest = 3,   // worker -> pserver: gradient for partition P, step V
  kPushResponse = 4,  // ack (status OK) or refusal
  kPing = 5,          // liveness / round-trip probe; echoed as kPong
  kPong = 6,
  // The rdma backend's connection set-up over its TCP bootstrap connection
  // (payload: a serialized proto::RdmaHello; docs/rdma.md). Handled by the
  // transport, never given to a RequestHandler.
  kRdmaHello = 7,
  kRdmaHelloReply = 8,
  // pserver (primary) -> pserver (backup): one replication record of a
  // partition (docs/reliability.md); header.seq is the record's index in the
  // partition's stream, header.count the receiving node's id.
  kReplicate = 9,
  kReplicateResponse = 10,
  // The data-plane membership handshake, first on a TCP connection when the
  // cluster runs mTLS (transport/data_plane_auth.h). Handled by the
  // transport, never given to a RequestHandler.
  kAuthHello = 11,
  kAuthHelloReply = 12,
  kAuthProof = 13,
  kAuthProofReply = 14,
};
const char* MessageTypeName(MessageType t);
// True for the message types above other than kInvalid: the only types a
// backend puts on the wire.
bool IsValidMessageType(MessageType t);
// The response type answering `request_type` (kPullRequest -> kPullResponse,
// kPushRequest -> kPushResponse, kPing -> kPong, kRdmaHello ->
// kRdmaHelloReply); other types map to themselves.
MessageType ResponseTypeFor(MessageType request_type);

// Fixed-size message header. On the TCP wire it is 72 bytes, little-endian;
// see docs/wire-protocol.md. Fields a message type does not use are zero.
struct MessageHeader {
  MessageType type = MessageType::kInvalid;
  // Responses: an absl::StatusCode (0 = OK). On error the payload is the
  // UTF-8 error message. Requests: 0.
  uint16_t status = 0;
  uint32_t sender_id = 0;   // node id assigned by the master at registration
  uint64_t epoch = 0;       // sender's cluster-view epoch
  uint64_t request_id = 0;  // set by Connection::Call; echoed in the response
  uint64_t seq = 0;         // per-sender push sequence (push idempotence)
  uint32_t partition = 0;   // partition id
  uint32_t flags = 0;       // kFlagSparse, else 0
  uint64_t version = 0;     // pull: min version wanted / version sent;
                            // push: the step (version) the gradient is for
  uint64_t count = 0;       // push: samples the gradient sums over;
                            // error responses: the proto::ErrorReason
};

// MessageHeader::flags bit 0: a request for a sparse table's partition
// (docs/sparse.md). Pull: the payload is n little-endian uint64 keys and the
// response n rows of `dim` fp32 values in the same order. Push: n keys, then
// n rows of gradient (n * dim fp32).
inline constexpr uint32_t kFlagSparse = 1;
// MessageHeader::flags bit 1, kReplicate only: the record is a full copy of
// the partition (a new backup's catch-up), not an update.
inline constexpr uint32_t kFlagReplicaCopy = 2;
// MessageHeader::flags bit 2, kAuthHello only: the client seals its frames
// after the handshake (TransportOptions::encrypt_data_plane).
inline constexpr uint32_t kFlagEncrypt = 4;

struct Message {
  MessageHeader header;
  std::string payload;  // opaque bytes; fp32 arrays for pull/push

  // Sending without a copy: when payload_ref is set, these bytes are sent
  // instead of `payload`. They are borrowed from the caller and must stay
  // valid and unchanged until Call / Respond returns (tcp writes them before
  // returning; inproc copies them; rdma copies them, or, when they lie in
  // memory registered as kSendSource, sends them in place and returns once
  // sent).
  const char* payload_ref = nullptr;
  size_t payload_ref_size = 0;
  // Call only: the caller keeps payload_ref valid and unchanged until the
  // call's callback has run, not only until Call returns. Then rdma sends
  // registered bytes in place without waiting in Call. A caller that gives
  // up on such a call must release the connection (which stops every send
  // on it) before changing the bytes. The transport puts no time limit on
  // such a call: the caller's own timeout does.
  bool payload_ref_until_response = false;

  // Receiving without a copy: true when the payload was written straight
  // into the destination given to Connection::CallInto (`payload` is empty).
  bool payload_in_destination = false;

  const char* payload_data() const { return payload_ref ? payload_ref : payload.data(); }
  size_t payload_size() const { return payload_ref ? payload_ref_size : payload.size(); }
  // Copies a borrowed payload into `payload` (for backends that send later).
  void OwnPayload() {
    if (payload_ref != nullptr) {
      payload.assign(payload_ref, payload_ref_size);
      payload_ref = nullptr;
      payload_ref_size = 0;
    }
  }
};

// Builds an error response to `request` with `status` (not OK); the
// status's reason (common/error_reason.h) goes into header.count.
Message MakeErrorResponse(const MessageHeader& request, MessageType type,
                          const absl::Status& status);
// The status carried by a response (OK or header.status + payload message,
// with the reason of header.count).
absl::Status ResponseStatus(const Message& response);

// Server side: a handler gets each request with a Responder. The handler may
// respond at once or keep the Responder and respond later from any thread
// (a BSP pull waits for the step's update). Respond must be called exactly
// once; a Responder dropped without responding answers kInternal.
class Responder {
 public:
  virtual ~Responder() = default;
  virtual void Respond(Message response) = 0;
  // The peer, for logs and errors ("127.0.0.1:51234" or "inproc:...").
  virtual std::string peer() const = 0;
};
using RequestHandler = std::function<void(Message request, std::shared_ptr<Responder> responder)>;

// The part of a Responder every backend shares: Respond answers once (a
// second call is logged and ignored); the response gets the request's
// request_id and, when left kInvalid, the type answering the request; a
// type that is no message type becomes an Internal error response; a
// responder dropped without responding answers Internal. Backends
// implement Deliver, and call AnswerIfDropped from their destructor (the
// base's destructor cannot reach Deliver). Thread-safe.
class OnceResponder : public Responder {
 public:
  // `backend`: "tcp", "rdma", ... for logs.
  OnceResponder(const MessageHeader& request, std::string peer, const char* backend)
      : request_(request), peer_(std::move(peer)), backend_(backend) {}
  // A backend that forgot AnswerIfDropped in its destructor shows here.
  ~OnceResponder() override;

  void Respond(Message response) final;
  std::string peer() const final { return peer_; }

 protected:
  // Sends the finished response, or drops it when the connection is gone.
  virtual void Deliver(Message response) = 0;
  void AnswerIfDropped();
  const MessageHeader& request() const { return request_; }

 private:
  const MessageHeader request_;
  const std::string peer_;
  const char* const backend_;
  std::atomic<bool> responded_{false};
};

using ResponseCallback = std::function<void(absl::StatusOr<Message>)>;

// Client side: one connection to one listening peer. Thread-safe: many
// threads may Call concurrently; responses are matched by request_id.
class Connection {
 public:
  virtual ~Connection() = default;

  // Sends `request` (request_id is overwritten) and calls `done` exactly once,
  // from a transport thread, with the response or with an error: Unavailable
  // when the connection broke (naming the peer), DataLoss on a malformed
  // frame. Response payload errors are not turned into Status here: use
  // ResponseStatus().
  virtual void Call(Message request, ResponseCallback done) = 0;

  // Call, asking for a successful response's payload of exactly `dest_size`
  // bytes to be written straight into `dest` (then the response has
  // payload_in_destination set and an empty payload); other responses
  // arrive as with Call. `dest` must stay valid until `done` runs; if the
  // caller gives up before that, `dest` may still be written to, so it must
  // not be freed. The default implementation copies.
  virtual void CallInto(Message request, char* dest, size_t dest_size, ResponseCallback done);

  // Call and wait up to `timeout` (DeadlineExceeded naming the peer).
  absl::StatusOr<Message> CallSync(Message request, absl::Duration timeout);

  virtual std::string peer() const = 0;
  // False once the connection broke; a new Connect is needed.
  virtual bool healthy() const = 0;
  // What carries this connection's messages, for logs and tests: "tcp",
  // "inproc", "rdma", or for an rdma connection that fell back,
  // "tcp (rdma fallback: <why>)".
  virtual std::string kind() const { return "?"; }
};

// Shared in-process "network" for the inproc backend: addresses map to
// listening transports within one process. Thread-safe. Owned by the test
// (or in-process cluster) and must outlive every transport that uses it.
class InProcNetwork;
std::shared_ptr<InProcNetwork> NewInProcNetwork();

// The rdma backend's settings (cluster.rdma in the config; docs/rdma.md).
struct RdmaTransportSettings {
  // Device, port and GID index; empty / 0 / -1 choose automatically.
  std::string device;
  int port = 0;
  int gid_index = -1;
  // Receive slots per connection and their size: messages up to a slot go
  // in one SEND, larger ones in several (or by RDMA WRITE into a registered
  // destination). Each connection registers (recv_slots + 4 + send_slots) *
  // slot_bytes.
  uint32_t recv_slots = 32;
  uint32_t send_slots = 32;
  uint32_t slot_bytes = 64 << 10;
  // The completion thread busy-polls this long after the last completion,
  // then sleeps on the completion channel until the next one (0: sleep at
  // once; event-driven).
  absl::Duration busy_poll = absl::Microseconds(50);
  // Bound on the connection set-up (TCP connect plus the hello exchange).
  absl::Duration connect_timeout = absl::Seconds(10);
};

struct TransportOptions {
  // "tcp" | "inproc" | "rdma" | "auto". rdma: RDMA required (creating the
  // transport fails with the preflight's findings when this host has no
  // usable device; a connection to a peer without rdma fails). auto: rdma
  // where this host has a usable device, each connection falling back to
  // TCP when the peer, or the set-up, cannot do rdma (docs/rdma.md).
  std::string kind = "tcp";
  std::shared_ptr<InProcNetwork> inproc_network;  // required for inproc
  RdmaTransportSettings rdma;
  // Largest payload accepted from the wire; larger frames are DataLoss and
  // close the connection.
  uint64_t max_payload_bytes = 1ull << 31;
  // Data-plane membership (transport/data_plane_auth.h): when set, tcp (and
  // rdma's TCP bootstrap) connections begin with the handshake, and a
  // server serves only clients that passed it. Null: no handshake (plain
  // text clusters, tests).
  std::shared_ptr<MembershipKeys> membership;
  // With membership: seal every TCP frame after the handshake (AES-256-GCM,
  // transport/data_plane_auth.h). Both ends must agree. rdma moves its data
  // over verbs unsealed; only its TCP bootstrap is.
  bool encrypt_data_plane = false;
  // With membership: an accepted connection not through the handshake
  // this long after it opened is closed.
  absl::Duration handshake_timeout = absl::Seconds(5);
  // tcp: bound on Connect, the handshake and its tries again after a
  // key-epoch refusal included (rdma: rdma.connect_timeout).
  absl::Duration tcp_connect_timeout = absl::Seconds(5);
};

// What a transport is doing, for /metrics.
struct TransportStats {
  uint64_t rdma_connections = 0;  // connections over rdma now (either side)
  uint64_t tcp_fallbacks = 0;     // connections an rdma transport made over TCP
  uint64_t rdma_failures = 0;     // rdma connections broken by a verbs error or bad frame
};

// One backend instance: may listen (server) and connect (client).
// Thread-safe. Shutdown() closes everything; pending calls fail Unavailable.
class Transport {
 public:
  virtual ~Transport() = default;

  // Starts serving on host:port (0 = any free port). One Listen per
  // transport. Errors name the address.
  virtual absl::Status Listen(const std::string& host, int port, RequestHandler handler) = 0;
  // "host:port" actually bound; valid after a successful Listen.
  virtual std::string listen_address() const = 0;

  // Connects to a listening peer at "host:port". Unavailable naming the
  // address on failure.
  virtual absl::StatusOr<std::shared_ptr<Connection>> Connect(const std::string& address) = 0;

  // Closes every accepted connection whose membership handshake proved
  // node `node` (a node that left: its open connections go at once, not
  // only its key); returns how many. 0 without the handshake.
  virtual int DisconnectNode(uint32_t node) {
    (void)node;
    return 0;
  }

  // How registered memory is used.
  enum class MemoryUse {
    kReceiveDestination,  // CallInto destinations (a worker's parameters):
                          // rdma writes pull responses straight into them
    kSendSource,          // borrowed payloads (a worker's gradients): rdma
                          // sends them in place (read only)
  };
  // Memory registered once with the NIC by backends that can use it; a
  // no-op elsewhere. The memory must stay allocated until Shutdown. Errors
  // (rdma: the locked-memory limit) name the fix; a caller may go on
  // without registration, slower.
  virtual absl::Status RegisterMemory(void* addr, size_t size, MemoryUse use) {
    return absl::OkStatus();
  }

  virtual TransportStats stats() const { return TransportStats(); }

  virtual void Shutdown() = 0;
};

absl::StatusOr<std::unique_ptr<Transport>> CreateTransport(const TransportOptions& options);

}  // namespace strata::transport

#endif  // STRATA_TRANSPORT_TRANSPORT_H_
