#include "transport/rdma/rdma_hello.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "transport/rdma/rdma_transport.h"

namespace strata::transport::rdma {
namespace {

absl::Status Bad(const std::string& peer, const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat("rdma hello from ", peer, ": field ", field, " ", what));
}

}  // namespace

proto::RdmaHello ReadyHello(const HelloQp& qp) {
  proto::RdmaHello h;
  h.set_version(kRdmaHelloVersion);
  h.set_rdma_ready(true);
  h.set_qpn(qp.qpn);
  h.set_psn(qp.psn);
  h.set_gid(std::string(reinterpret_cast<const char*>(qp.gid.data()), qp.gid.size()));
  h.set_lid(qp.lid);
  h.set_mtu(static_cast<uint32_t>(qp.mtu));
  h.set_recv_slots(qp.recv_slots);
  h.set_slot_bytes(qp.slot_bytes);
  return h;
}

proto::RdmaHello NotReadyHello(const std::string& reason) {
  proto::RdmaHello h;
  h.set_version(kRdmaHelloVersion);
  h.set_rdma_ready(false);
  h.set_not_ready_reason(reason);
  return h;
}

absl::StatusOr<proto::RdmaHello> ParsePeerHello(std::string_view bytes, const std::string& peer) {
  if (bytes.size() > kMaxRdmaHelloBytes) {
    return absl::DataLossError(absl::StrCat("rdma hello from ", peer, ": ", bytes.size(),
                                            " bytes, at most ", kMaxRdmaHelloBytes, " expected"));
  }
  proto::RdmaHello h;
  if (!h.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::DataLossError(
        absl::StrCat("rdma hello from ", peer, ": not an RdmaHello message"));
  }
  if (h.version() != kRdmaHelloVersion) {
    return Bad(peer, "version",
               absl::StrCat("is ", h.version(), ", this side speaks ", kRdmaHelloVersion));
  }
  if (h.has_region()) {
    const proto::RdmaRegion& r = h.region();
    if (h.rdma_ready()) return Bad(peer, "region", "comes with a queue pair's details");
    if (r.handle() == 0) return Bad(peer, "region.handle", "is 0");
    if (r.length() == 0 || r.addr() + r.length() < r.addr()) {
      return Bad(peer, "region.length", absl::StrCat("is ", r.length(), " at address ", r.addr()));
    }
    return h;
  }
  if (!h.rdma_ready()) return h;
  if (h.qpn() == 0 || h.qpn() > 0xffffff) {
    return Bad(peer, "qpn", absl::StrCat("is ", h.qpn(), ", not a 24-bit QP number"));
  }
  if (h.psn() > 0xffffff) {
    return Bad(peer, "psn", absl::StrCat("is ", h.psn(), ", not a 24-bit PSN"));
  }
  if (h.gid().size() != 16) {
    return Bad(peer, "gid", absl::StrCat("has ", h.gid().size(), " bytes, 16 expected"));
  }
  if (h.lid() > 0xffff) {
    return Bad(peer, "lid", absl::StrCat("is ", h.lid(), ", not a 16-bit LID"));
  }
  const uint32_t m = h.mtu();
  if (m != 256 && m != 512 && m != 1024 && m != 2048 && m != 4096) {
    return Bad(peer, "mtu", absl::StrCat("is ", m, ", not one of 256, 512, 1024, 2048, 4096"));
  }
  if (h.recv_slots() == 0 || h.recv_slots() > 65536) {
    return Bad(peer, "recv_slots", absl::StrCat("is ", h.recv_slots(), ", not in [1, 65536]"));
  }
  if (h.slot_bytes() < 4096 || h.slot_bytes() > (64u << 20)) {
    return Bad(peer, "slot_bytes", absl::StrCat("is ", h.slot_bytes(), ", not in [4096, 64 MiB]"));
  }
  return h;
}

proto::RdmaHello RegionHello(uint32_t handle, uint64_t addr, uint64_t length, uint32_t rkey) {
  proto::RdmaHello h;
  h.set_version(kRdmaHelloVersion);
  proto::RdmaRegion* r = h.mutable_region();
  r->set_handle(handle);
  r->set_addr(addr);
  r->set_length(length);
  r->set_rkey(rkey);
  return h;
}

HelloQp HelloQpOf(const proto::RdmaHello& h) {
  HelloQp qp;
  qp.qpn = h.qpn();
  qp.psn = h.psn();
  std::memcpy(qp.gid.data(), h.gid().data(), std::min<size_t>(16, h.gid().size()));
  qp.lid = static_cast<uint16_t>(h.lid());
  qp.mtu = static_cast<int>(h.mtu());
  qp.recv_slots = h.recv_slots();
  qp.slot_bytes = h.slot_bytes();
  return qp;
}

// Here rather than in rdma_transport.cc: both builds (with and without
// libibverbs) compile this file.
const char* ConnectionStateName(ConnectionState state) {
  switch (state) {
    case ConnectionState::kConnecting:
      return "CONNECTING";
    case ConnectionState::kExchanging:
      return "EXCHANGING";
    case ConnectionState::kReady:
      return "READY";
    case ConnectionState::kFallbackTcp:
      return "FALLBACK_TCP";
    case ConnectionState::kFailed:
      return "FAILED";
  }
  return "UNKNOWN";
}

}  // namespace strata::transport::rdma
