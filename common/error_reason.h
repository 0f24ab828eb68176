// Typed reasons for errors between daemons (proto::ErrorReason). A reason
// rides in an absl::Status as a payload, so it survives Annotate-style
// rewrapping that keeps payloads, and crosses the wire beside the code: gRPC
// replies carry it in the status details (common/grpc_status.h), data-plane
// responses in their header (transport/transport.h). Decisions are taken on
// ReasonOf(), never on a message's text.
//
// Thread-safe: free functions over values.
#ifndef STRATA_COMMON_ERROR_REASON_H_
#define STRATA_COMMON_ERROR_REASON_H_

#include <string>

#include "absl/status/status.h"
#include "proto/strata.pb.h"

namespace strata {

// `s` with `reason` attached (replacing any reason it had). An OK status
// stays OK: a reason belongs to an error.
absl::Status WithReason(absl::Status s, proto::ErrorReason reason);

// The reason attached to `s`; REASON_UNSPECIFIED for OK, for an error
// without one, and for a reason number this build does not know.
proto::ErrorReason ReasonOf(const absl::Status& s);

inline bool HasReason(const absl::Status& s, proto::ErrorReason reason) {
  return !s.ok() && ReasonOf(s) == reason;
}

// The same error as `s` with `reason`'s wire number, as read off a peer's
// reply; numbers outside the enum are dropped (REASON_UNSPECIFIED).
absl::Status WithWireReason(absl::Status s, uint64_t wire_reason);

// A standby master's answer (REASON_NOT_LEADER): UNAVAILABLE, so that
// callers retry, naming the leading master's address (`leader`, "" when
// unknown) for them to follow (common/grpc_channel.h).
absl::Status NotLeaderError(const std::string& who, const std::string& leader);
// The leader a REASON_NOT_LEADER error names; "" for any other status.
std::string LeaderOf(const absl::Status& s);

// The whole typed part of `s` (its reason and leader), and `s` with it
// attached: what crosses the wire (common/grpc_status.h).
proto::ErrorInfo ErrorInfoOf(const absl::Status& s);
absl::Status WithErrorInfo(absl::Status s, const proto::ErrorInfo& info);

}  // namespace strata

#endif  // STRATA_COMMON_ERROR_REASON_H_
