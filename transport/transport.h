// The data plane as pserver and worker see it, the interface only: a
// Transport listens and connects, a Connection calls, a Responder answers;
// the messages are in transport/message.h, the backends' options in
// transport/transport_options.h, and what backends share in
// transport/once_responder.h. Backends: tcp, inproc, rdma (in their own
// folders). docs/wire-protocol.md documents the header and the framing.
#ifndef STRATA_TRANSPORT_TRANSPORT_H_
#define STRATA_TRANSPORT_TRANSPORT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transport/message.h"
#include "transport/transport_options.h"

namespace strata::transport {

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
