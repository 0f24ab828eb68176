// The rdma backend of transport.h (kinds "rdma" and "auto"): RC queue pairs
// on libibverbs, set up over a TCP bootstrap connection to the peer's data
// port, falling back to that TCP connection when rdma is not possible.
// docs/rdma.md describes the design and docs/wire-protocol.md the frames.
//
// Connection states: CONNECTING (TCP connect) -> EXCHANGING (RdmaHello
// each way: QPN, PSN, GID, LID, MTU, receive slots) -> READY (messages go
// over the queue pair), or FALLBACK_TCP (this host or the peer has no
// usable device, or, for "auto", the set-up failed: the bootstrap
// connection carries the frames exactly as the tcp backend does), or
// FAILED ("rdma" only: Connect returns the error; a READY connection whose
// queue pair breaks is FAILED too, its pending calls Unavailable naming the
// peer and the verbs error).
//
// Data path of a READY connection:
//   - Every message is one or more SENDs of at most a receive slot, into
//     slots the receiver pre-posted from one registered region per
//     connection; credits (one per slot) ride on every frame, or in a
//     credit frame when the receiver has nothing else to send, so a SEND
//     never meets an empty receive queue.
//   - A pull response whose destination the caller registered
//     (Transport::RegisterMemory, then CallInto) is written straight into it
//     by RDMA WRITE; a header frame follows on the same queue pair (RC
//     ordering: it is seen only after the data is in place).
//   - One completion thread per transport polls every connection's
//     completion queue, busy for RdmaTransportSettings::busy_poll after the
//     last completion, then asleep on a completion channel. Request handlers
//     and response callbacks run on it (as on the tcp backend's epoll
//     thread: quick, never blocking on this transport).
// Every verbs failure is a Status naming the call and the peer; nothing
// aborts. Resources of a connection are allocated all together or not at
// all, and released when it fails or closes.
#ifndef STRATA_TRANSPORT_RDMA_RDMA_TRANSPORT_H_
#define STRATA_TRANSPORT_RDMA_RDMA_TRANSPORT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "transport/transport.h"

namespace strata::transport::rdma {

enum class ConnectionState { kConnecting, kExchanging, kReady, kFallbackTcp, kFailed };
const char* ConnectionStateName(ConnectionState state);

// For CreateTransport with kind "rdma" or "auto" (see TransportOptions).
// "rdma" fails here, with the preflight's findings and their fixes, when
// this host has no usable device, or when Strata was built without
// libibverbs; "auto" then gives a transport whose connections all use TCP.
absl::StatusOr<std::unique_ptr<Transport>> NewRdmaTransport(const TransportOptions& options);

// Introspection, for tests and logs. `connection` must come from an rdma
// transport's Connect (else: kFailed / zero counters).
ConnectionState StateOf(const Connection& connection);
struct RdmaConnectionStats {
  uint64_t sends = 0;              // SEND frames posted by this side
  uint64_t responses_written = 0;  // responses that arrived by RDMA WRITE
  uint64_t credit_frames = 0;      // credit-only frames sent
  uint64_t zero_copy_sends = 0;    // SENDs gathered from the caller's registered memory
  // The caller's regions registered for this peer (in its protection
  // domain), and how many were registered again for a new key epoch.
  uint64_t peer_regions = 0;
  uint64_t region_rotations = 0;
  // Destination regions announced to the server on the TCP bootstrap
  // (their keys never travel on the queue pair).
  uint64_t regions_announced = 0;
};
RdmaConnectionStats StatsOf(const Connection& connection);
// Moves the connection's queue pair to the error state, as a failing NIC
// or peer would.
absl::Status ForceQpErrorForTesting(Connection* connection);
// The remote key this connection hands its peer for RDMA WRITEs into the
// registered destination holding `addr` (0: none registered for it yet).
uint32_t DestinationKeyForTesting(const Connection& connection, const void* addr);

}  // namespace strata::transport::rdma

#endif  // STRATA_TRANSPORT_RDMA_RDMA_TRANSPORT_H_
