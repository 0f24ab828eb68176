// How a transport is made (CreateTransport in transport/transport.h): the
// backend and its settings, the data-plane membership and sealing, limits
// and timeouts.
#ifndef STRATA_TRANSPORT_TRANSPORT_OPTIONS_H_
#define STRATA_TRANSPORT_TRANSPORT_OPTIONS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/time.h"

namespace strata::transport {

class MembershipKeys;

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
  // tcp (and rdma's TCP fallback): the payloads of push, replication and
  // collective requests up to 16 MiB are read into a buffer each connection keeps and
  // lent to the request handler (Message::payload_ref), valid only until
  // the handler returns; a handler that keeps such a request calls
  // Message::OwnPayload() first. Saves allocating and clearing a buffer per
  // message (the pserver's data plane).
  bool lend_request_payloads = false;
};

}  // namespace strata::transport

#endif  // STRATA_TRANSPORT_TRANSPORT_OPTIONS_H_
