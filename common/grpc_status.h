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
    out = WithErrorInfo(std::move(out), info);  // (a reason this build does not know: dropped)
  }
  return out;
}

inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  const proto::ErrorInfo info = ErrorInfoOf(s);
  if (info.reason() == proto::REASON_UNSPECIFIED) {
    return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
  }
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()),
                      info.SerializeAsString());
}

}  // namespace strata

#endif  // STRATA_COMMON_GRPC_STATUS_H_
