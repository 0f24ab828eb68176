// The RdmaHello exchanged when an rdma data connection is set up
// (proto/strata.proto, docs/rdma.md): building it from a queue pair's
// details, and checking a peer's before any of it reaches verbs. A hello
// from the wire is untrusted input: every field is checked and a bad one
// is an error naming the peer and the field.
#ifndef STRATA_TRANSPORT_RDMA_RDMA_HELLO_H_
#define STRATA_TRANSPORT_RDMA_RDMA_HELLO_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "proto/strata.pb.h"

namespace strata::transport::rdma {

inline constexpr uint32_t kRdmaHelloVersion = 1;
// A hello is small; anything larger is not one.
inline constexpr size_t kMaxRdmaHelloBytes = 4096;

// The connection details of one side (the fields of RdmaHello that join
// queue pairs), in host form.
struct HelloQp {
  uint32_t qpn = 0;
  uint32_t psn = 0;
  std::array<uint8_t, 16> gid{};
  uint16_t lid = 0;
  int mtu = 1024;
  uint32_t recv_slots = 0;
  uint32_t slot_bytes = 0;
};

// A hello offering rdma with these details.
proto::RdmaHello ReadyHello(const HelloQp& qp);
// A hello declining rdma (this side has no usable device: `reason`).
proto::RdmaHello NotReadyHello(const std::string& reason);

// A destination region announced on a joined connection (RdmaHello.region).
proto::RdmaHello RegionHello(uint32_t handle, uint64_t addr, uint64_t length, uint32_t rkey);

// Parses and checks a peer's hello. DataLoss naming `peer` for bytes that
// are not a hello; InvalidArgument naming `peer` and the field for a field
// out of range (version, qpn, psn, gid, lid, mtu, recv_slots, slot_bytes).
// A not-ready hello needs only a valid version; a region announcement a
// handle and a length that does not wrap (region.handle, region.length).
absl::StatusOr<proto::RdmaHello> ParsePeerHello(std::string_view bytes, const std::string& peer);

// The queue-pair details of a checked, ready hello.
HelloQp HelloQpOf(const proto::RdmaHello& hello);

}  // namespace strata::transport::rdma

#endif  // STRATA_TRANSPORT_RDMA_RDMA_HELLO_H_
