// The one place that converts between grpc::Status and absl::Status.
#ifndef STRATA_COMMON_GRPC_STATUS_H_
#define STRATA_COMMON_GRPC_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace strata {

inline absl::Status FromGrpcStatus(const grpc::Status& s,
                                   const std::string& peer = "") {
  if (s.ok()) return absl::OkStatus();
  std::string msg = s.error_message();
  if (!peer.empty()) msg = peer + ": " + msg;
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), msg);
}

inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()));
}

}  // namespace strata

#endif  // STRATA_COMMON_GRPC_STATUS_H_
