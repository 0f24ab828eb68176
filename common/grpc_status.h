// The one place that converts between grpc::Status and absl::Status. An
// error's reason (common/error_reason.h) crosses in the status details as a
// serialized proto::ErrorInfo.
#ifndef STRATA_COMMON_GRPC_STATUS_H_
#define STRATA_COMMON_GRPC_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "common/error_reason.h"
#include "grpcpp/support/status.h"
#include "proto/strata.pb.h"

namespace strata {

// `peer`, when given, is put before the message ("master 10.0.0.1:7000: ...").
inline absl::Status FromGrpcStatus(const grpc::Status& s, const std::string& peer = "") {
  if (s.ok()) return absl::OkStatus();
  std::string msg = s.error_message();
  if (!peer.empty()) msg = peer + ": " + msg;
  absl::Status out(static_cast<absl::StatusCode>(s.error_code()), msg);
  proto::ErrorInfo info;
  if (!s.error_details().empty() && info.ParseFromString(s.error_details())) {
    out = WithWireReason(std::move(out), static_cast<uint64_t>(info.reason()));
  }
  return out;
}

inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  const proto::ErrorReason reason = ReasonOf(s);
  if (reason == proto::REASON_UNSPECIFIED) {
    return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
  }
  proto::ErrorInfo info;
  info.set_reason(reason);
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()),
                      info.SerializeAsString());
}

}  // namespace strata

#endif  // STRATA_COMMON_GRPC_STATUS_H_
