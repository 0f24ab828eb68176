#include "common/error_reason.h"

#include <string>

#include "absl/status/status.h"
#include "common/grpc_status.h"
#include "common/proto_names.h"
#include "gtest/gtest.h"
#include "proto/strata.pb.h"

namespace strata {
namespace {

TEST(ErrorReasonTest, AReasonRidesInTheStatus) {
  const absl::Status s =
      WithReason(absl::FailedPreconditionError("stale"), proto::REASON_STALE_GRADIENT);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "stale");
  EXPECT_EQ(ReasonOf(s), proto::REASON_STALE_GRADIENT);
  EXPECT_TRUE(HasReason(s, proto::REASON_STALE_GRADIENT));
  EXPECT_FALSE(HasReason(s, proto::REASON_STALE_EPOCH));
}

TEST(ErrorReasonTest, NoReasonUnlessGiven) {
  EXPECT_EQ(ReasonOf(absl::FailedPreconditionError("STALE_EPOCH: looks typed, is text")),
            proto::REASON_UNSPECIFIED);
  EXPECT_EQ(ReasonOf(absl::OkStatus()), proto::REASON_UNSPECIFIED);
  // An OK status takes no reason.
  EXPECT_TRUE(WithReason(absl::OkStatus(), proto::REASON_STALE_EPOCH).ok());
  EXPECT_FALSE(HasReason(absl::OkStatus(), proto::REASON_UNSPECIFIED));
}

TEST(ErrorReasonTest, ANewReasonReplacesTheOldAndUnspecifiedClearsIt) {
  absl::Status s = WithReason(absl::UnavailableError("x"), proto::REASON_EPOCH_AHEAD);
  s = WithReason(s, proto::REASON_NOT_SERVED);
  EXPECT_EQ(ReasonOf(s), proto::REASON_NOT_SERVED);
  s = WithReason(s, proto::REASON_UNSPECIFIED);
  EXPECT_EQ(ReasonOf(s), proto::REASON_UNSPECIFIED);
}

TEST(ErrorReasonTest, WireNumbersOutsideTheEnumAreDropped) {
  const absl::Status base = absl::UnavailableError("x");
  EXPECT_EQ(ReasonOf(WithWireReason(base, proto::REASON_KEY_EPOCH)), proto::REASON_KEY_EPOCH);
  EXPECT_EQ(ReasonOf(WithWireReason(base, 0)), proto::REASON_UNSPECIFIED);
  EXPECT_EQ(ReasonOf(WithWireReason(base, 9999)), proto::REASON_UNSPECIFIED);
  EXPECT_EQ(ReasonOf(WithWireReason(base, uint64_t{1} << 40)), proto::REASON_UNSPECIFIED);
  EXPECT_EQ(WithWireReason(base, 9999).message(), "x");
}

TEST(ErrorReasonTest, TheReasonCrossesGrpc) {
  const absl::Status s = WithReason(absl::FailedPreconditionError("node 4 was declared dead"),
                                    proto::REASON_DECLARED_DEAD);
  const grpc::Status g = ToGrpcStatus(s);
  EXPECT_EQ(g.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(g.error_message(), "node 4 was declared dead");
  const absl::Status back = FromGrpcStatus(g, "master 127.0.0.1:1");
  EXPECT_EQ(back.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(back.message(), "master 127.0.0.1:1: node 4 was declared dead");
  EXPECT_EQ(ReasonOf(back), proto::REASON_DECLARED_DEAD);
  // Without a reason, or with details that do not parse, there is none.
  EXPECT_EQ(ReasonOf(FromGrpcStatus(ToGrpcStatus(absl::UnavailableError("u")))),
            proto::REASON_UNSPECIFIED);
  EXPECT_EQ(ReasonOf(FromGrpcStatus(
                grpc::Status(grpc::StatusCode::UNAVAILABLE, "u", std::string("\xff\xff", 2)))),
            proto::REASON_UNSPECIFIED);
}

// The job state's names are what people and scripts read (JobStatus.state,
// summary.json), and what state directories of before JobState recorded.
TEST(ProtoNamesTest, EveryJobStateHasItsNameAndTheNameGivesItBack) {
  EXPECT_STREQ(JobStateName(proto::JOB_RUNNING), "running");
  EXPECT_STREQ(JobStateName(proto::JOB_SUCCEEDED), "succeeded");
  for (int s = proto::JOB_WAITING; s <= proto::JOB_STOPPED; ++s) {
    const auto state = static_cast<proto::JobState>(s);
    EXPECT_EQ(ParseJobStateName(JobStateName(state)), state) << s;
    EXPECT_EQ(IsJobOver(state), s >= proto::JOB_SUCCEEDED) << s;
  }
  EXPECT_EQ(ParseJobStateName("RUNNING"), proto::JOB_STATE_UNSPECIFIED);
  EXPECT_EQ(ParseJobStateName(""), proto::JOB_STATE_UNSPECIFIED);
}

}  // namespace
}  // namespace strata
