// The rdma backend in a build without libibverbs: "rdma" cannot work,
// "auto" is plain TCP.
#include "absl/status/status.h"
#include "glog/logging.h"
#include "transport/rdma/rdma_transport.h"
#include "transport/tcp/tcp_transport.h"

namespace strata::transport::rdma {

absl::StatusOr<std::unique_ptr<Transport>> NewRdmaTransport(const TransportOptions& options) {
  if (options.kind == "rdma") {
    return absl::FailedPreconditionError(
        "transport rdma: this build of Strata has no RDMA support (libibverbs-dev "
        "was missing when it was configured); use transport: tcp or auto");
  }
  LOG(INFO) << "transport auto: using TCP (built without RDMA support)";
  tcp::TcpOptions t;
  t.max_payload_bytes = options.max_payload_bytes;
  t.membership = options.membership;
  // (Sealed under the membership handshake, as the verbs build's bootstrap.)
  t.encrypt = options.encrypt_data_plane || options.membership != nullptr;
  t.lend_request_payloads = options.lend_request_payloads;
  return tcp::NewTcpTransport(t);
}

ConnectionState StateOf(const Connection& connection) {
  return connection.healthy() ? ConnectionState::kFallbackTcp : ConnectionState::kFailed;
}

RdmaConnectionStats StatsOf(const Connection&) { return RdmaConnectionStats(); }

absl::Status ForceQpErrorForTesting(Connection*) {
  return absl::FailedPreconditionError("built without RDMA support");
}

uint32_t DestinationKeyForTesting(const Connection&, const void*) { return 0; }

}  // namespace strata::transport::rdma
