#include "common/error_reason.h"

#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace strata {
namespace {

constexpr char kReasonUrl[] = "type.googleapis.com/strata.proto.ErrorInfo";

}  // namespace

absl::Status WithReason(absl::Status s, proto::ErrorReason reason) {
  proto::ErrorInfo info;
  info.set_reason(reason);
  return WithErrorInfo(std::move(s), info);
}

proto::ErrorReason ReasonOf(const absl::Status& s) { return ErrorInfoOf(s).reason(); }

proto::ErrorInfo ErrorInfoOf(const absl::Status& s) {
  proto::ErrorInfo info;
  if (s.ok()) return info;
  auto payload = s.GetPayload(kReasonUrl);
  if (!payload.has_value() || !info.ParseFromString(std::string(*payload)) ||
      !proto::ErrorReason_IsValid(info.reason())) {
    return proto::ErrorInfo();
  }
  return info;
}

absl::Status WithErrorInfo(absl::Status s, const proto::ErrorInfo& info) {
  if (s.ok()) return s;
  if (info.reason() == proto::REASON_UNSPECIFIED || !proto::ErrorReason_IsValid(info.reason())) {
    s.ErasePayload(kReasonUrl);
    return s;
  }
  s.SetPayload(kReasonUrl, absl::Cord(info.SerializeAsString()));
  return s;
}

absl::Status NotLeaderError(const std::string& who, const std::string& leader) {
  proto::ErrorInfo info;
  info.set_reason(proto::REASON_NOT_LEADER);
  info.set_leader(leader);
  return WithErrorInfo(absl::UnavailableError(absl::StrCat(
                           who, " is a standby master: ",
                           leader.empty() ? "no master leads yet (an election is under way)"
                                          : absl::StrCat("the leading master is ", leader))),
                       info);
}

std::string LeaderOf(const absl::Status& s) {
  const proto::ErrorInfo info = ErrorInfoOf(s);
  return info.reason() == proto::REASON_NOT_LEADER ? info.leader() : "";
}

absl::Status WithWireReason(absl::Status s, uint64_t wire_reason) {
  if (wire_reason > static_cast<uint64_t>(proto::ErrorReason_MAX) ||
      !proto::ErrorReason_IsValid(static_cast<int>(wire_reason))) {
    return s;
  }
  return WithReason(std::move(s), static_cast<proto::ErrorReason>(wire_reason));
}

}  // namespace strata
