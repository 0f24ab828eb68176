#include "pserver/partition.h"

#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/error_reason.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pserver/replica_streams.h"
#include "tests/testing/queue_sink.h"
#include "tests/testing/recording_responder.h"
#include "tests/testing/status_matchers.h"
#include "transport/inproc/inproc_transport.h"
#include "transport/transport.h"

namespace strata::pserver {
namespace {

using ::strata::testing::IsOk;
using ::strata::testing::QueueSink;
using ::strata::testing::RecordingResponder;
using ::strata::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::FloatNear;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;
using transport::Message;
using transport::MessageType;

constexpr uint32_t kPartitionId = 7;
constexpr float kTol = 1e-6f;

std::string FloatBytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

std::vector<float> BytesToFloats(const std::string& bytes) {
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

Message PushMsg(uint32_t sender, uint64_t seq, uint64_t step, uint64_t count,
                const std::vector<float>& grad_sum) {
  Message m;
  m.header.type = MessageType::kPushRequest;
  m.header.sender_id = sender;
  m.header.request_id = 1000 + seq;
  m.header.seq = seq;
  m.header.partition = kPartitionId;
  m.header.version = step;
  m.header.count = count;
  m.payload = FloatBytes(grad_sum);
  return m;
}

Message PullMsg(uint32_t sender, uint64_t min_version, uint64_t request_id) {
  Message m;
  m.header.type = MessageType::kPullRequest;
  m.header.sender_id = sender;
  m.header.request_id = request_id;
  m.header.partition = kPartitionId;
  m.header.version = min_version;
  return m;
}

std::unique_ptr<Optimizer> Sgd(double lr) {
  OptimizerSection c;
  c.type = "sgd";
  c.learning_rate = lr;
  auto opt = Optimizer::Create(c, 3);
  CHECK(opt.ok()) << opt.status();
  return std::move(*opt);
}

// Partition 7 of table "fc0.weight" holding {1, 2, 3}, SGD with lr 0.5.
std::unique_ptr<Partition> MakePartition(Consistency consistency) {
  return std::make_unique<Partition>(kPartitionId, "fc0.weight", std::vector<float>{1.f, 2.f, 3.f},
                                     Sgd(0.5), consistency);
}

// Pushes and returns the single response the push got at once.
Message PushAndGetResponse(Partition& p, const Message& m) {
  auto r = std::make_shared<RecordingResponder>();
  p.Push(m, r);
  auto responses = r->responses();
  EXPECT_THAT(responses, SizeIs(1));
  return responses.empty() ? Message() : responses[0];
}

void ExpectPushAck(const Message& resp, uint32_t sender, uint64_t seq) {
  SCOPED_TRACE(::testing::Message() << "push ack to node " << sender);
  EXPECT_EQ(resp.header.type, MessageType::kPushResponse);
  EXPECT_EQ(resp.header.status, 0);
  EXPECT_EQ(resp.header.seq, seq);
  EXPECT_EQ(resp.header.request_id, 1000 + seq);
  EXPECT_EQ(resp.header.partition, kPartitionId);
  EXPECT_THAT(transport::ResponseStatus(resp), IsOk());
  EXPECT_THAT(resp.payload, IsEmpty());  // the gradient is not echoed
}

TEST(PartitionTest, PullReturnsValuesAsFp32Bytes) {
  auto p = MakePartition(Consistency::kBsp);
  EXPECT_EQ(p->id(), kPartitionId);
  EXPECT_EQ(p->table(), "fc0.weight");
  EXPECT_EQ(p->length(), 3u);
  auto r = std::make_shared<RecordingResponder>();
  p->Pull(PullMsg(4, 0, 55), r);
  auto responses = r->responses();
  ASSERT_THAT(responses, SizeIs(1));
  const Message& resp = responses[0];
  EXPECT_EQ(resp.header.type, MessageType::kPullResponse);
  EXPECT_EQ(resp.header.status, 0);
  EXPECT_EQ(resp.header.request_id, 55u);
  EXPECT_EQ(resp.header.partition, kPartitionId);
  EXPECT_EQ(resp.header.version, 0u);
  EXPECT_EQ(resp.payload, FloatBytes({1.f, 2.f, 3.f}));
  EXPECT_EQ(p->stats().pulls_served, 1u);
}

TEST(PartitionTest, BspAppliesOnceEveryStepWorkerPushedWithSampleWeightedAverage) {
  auto p = MakePartition(Consistency::kBsp);
  p->SetStepWorkers({1, 2});

  // Worker 1: gradient sum {2, 4, -2} over 2 samples. Not applied yet.
  ExpectPushAck(PushAndGetResponse(*p, PushMsg(1, 1, 0, 2, {2.f, 4.f, -2.f})), 1, 1);
  EXPECT_EQ(p->stats().version, 0u);
  EXPECT_EQ(p->stats().pushes_applied, 1u);
  EXPECT_EQ(p->stats().updates_applied, 0u);
  EXPECT_THAT(p->ValuesForTesting(), ElementsAre(1.f, 2.f, 3.f));

  // A pull for version 1 waits for the step.
  auto waiting = std::make_shared<RecordingResponder>();
  p->Pull(PullMsg(3, 1, 77), waiting);
  EXPECT_THAT(waiting->responses(), IsEmpty());
  EXPECT_EQ(p->stats().pulls_served, 0u);

  // Worker 2: sum {1, -1, 7} over 3 samples completes the step.
  ExpectPushAck(PushAndGetResponse(*p, PushMsg(2, 1, 0, 3, {1.f, -1.f, 7.f})), 2, 1);
  // sum of sums = {3, 3, 5}, samples = 2 + 3 = 5, mean = {0.6, 0.6, 1.0}
  // SGD lr 0.5: {1 - 0.3, 2 - 0.3, 3 - 0.5} = {0.7, 1.7, 2.5}
  // (Averaging each worker's mean instead would give {1-0.5*(1+1/3)/2, ...}
  //  = {0.6667, ...}: the sample weighting matters.)
  const PartitionStats st = p->stats();
  EXPECT_EQ(st.version, 1u);
  EXPECT_EQ(st.pushes_applied, 2u);
  EXPECT_EQ(st.updates_applied, 1u);
  EXPECT_EQ(st.duplicate_pushes, 0u);
  EXPECT_EQ(st.rejected_pushes, 0u);
  EXPECT_THAT(p->ValuesForTesting(),
              ElementsAre(FloatNear(0.7f, kTol), FloatNear(1.7f, kTol), FloatNear(2.5f, kTol)));

  // The waiting pull is answered with version 1 and the new values.
  auto responses = waiting->responses();
  ASSERT_THAT(responses, SizeIs(1));
  EXPECT_EQ(responses[0].header.type, MessageType::kPullResponse);
  EXPECT_EQ(responses[0].header.status, 0);
  EXPECT_EQ(responses[0].header.request_id, 77u);
  EXPECT_EQ(responses[0].header.version, 1u);
  EXPECT_THAT(BytesToFloats(responses[0].payload),
              ElementsAre(FloatNear(0.7f, kTol), FloatNear(1.7f, kTol), FloatNear(2.5f, kTol)));
  EXPECT_EQ(p->stats().pulls_served, 1u);
}

TEST(PartitionTest, AnOpenBspStepIsCountedUntilItsUpdateIsApplied) {
  auto p = MakePartition(Consistency::kBsp);
  p->SetStepWorkers({1, 2});
  ExpectPushAck(PushAndGetResponse(*p, PushMsg(1, 1, 0, 1, {1.f, 1.f, 1.f})), 1, 1);
  // Acknowledged, but not applied (nor in the ledger) until worker 2's
  // push or a step set without it.
  EXPECT_EQ(p->stats().open_chunks, 1u);
  EXPECT_THAT(p->applied_by_sender(), IsEmpty());
  p->SetStepWorkers({1});
  EXPECT_EQ(p->stats().open_chunks, 0u);
  EXPECT_EQ(p->applied_by_sender(), (std::map<uint32_t, uint64_t>{{1, 1}}));
}

TEST(PartitionTest, AHostsPushCountsForItsWorkersOnceAStepWhoeverPushesIt) {
  // Node-local aggregation: workers 5 and 6 are host member 100, worker 7
  // is alone on its host (member 200).
  auto p = MakePartition(Consistency::kBsp);
  const std::map<uint32_t, uint32_t> member_of{{5, 100}, {6, 100}, {7, 200}};
  p->SetStepWorkers({100, 200}, member_of);
  // Host 100's aggregating worker (5) pushes the host's sum: 2 samples.
  ExpectPushAck(PushAndGetResponse(*p, PushMsg(5, 1, 0, 2, {2.f, 2.f, 2.f})), 5, 1);
  EXPECT_EQ(p->stats().open_chunks, 1u);
  // 5 dies; 6 takes over and pushes the same step again (its sum lacks
  // 5's gradient): dropped, the host's gradient is in the step already;
  // answered once the step completes (had the partition gone away first,
  // 6 would have been told to retry at its new owner).
  p->SetStepWorkers({100, 200}, {{6, 100}, {7, 200}});
  auto held = std::make_shared<RecordingResponder>();
  p->Push(PushMsg(6, 1, 0, 1, {9.f, 9.f, 9.f}), held);
  EXPECT_THAT(held->responses(), IsEmpty());
  EXPECT_EQ(p->stats().version, 0u);  // still waiting for host 200
  // Worker 7 completes the step: {2,2,2} + {0,0,0} over 2 + 2 samples,
  // mean {0.5, 0.5, 0.5}, lr 0.5 -> {0.75, 1.75, 2.75}.
  ExpectPushAck(PushAndGetResponse(*p, PushMsg(7, 1, 0, 2, {0.f, 0.f, 0.f})), 7, 1);
  EXPECT_EQ(p->stats().version, 1u);
  ASSERT_THAT(held->responses(), SizeIs(1));
  const absl::Status again = transport::ResponseStatus(held->responses()[0]);
  EXPECT_THAT(again,
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("node 6"), HasSubstr("host's gradient is in the step"))));
  EXPECT_EQ(ReasonOf(again), proto::REASON_STALE_GRADIENT);
  EXPECT_THAT(p->ValuesForTesting(),
              ElementsAre(FloatNear(0.75f, kTol), FloatNear(1.75f, kTol), FloatNear(2.75f, kTol)));
  EXPECT_EQ(p->applied_by_sender(), (std::map<uint32_t, uint64_t>{{5, 1}, {7, 1}}));
  // The next step waits for host 100 as a whole: 6 pushes it now.
  ExpectPushAck(PushAndGetResponse(*p, PushMsg(7, 2, 1, 1, {0.f, 0.f, 0.f})), 7, 2);
  EXPECT_EQ(p->stats().version, 1u);
  ExpectPushAck(PushAndGetResponse(*p, PushMsg(6, 2, 1, 1, {0.f, 0.f, 0.f})), 6, 2);
  EXPECT_EQ(p->stats().version, 2u);
  // A worker's own retry within a step is still a duplicate, acknowledged.
  ExpectPushAck(PushAndGetResponse(*p, PushMsg(6, 3, 2, 1, {0.f, 0.f, 0.f})), 6, 3);
  ExpectPushAck(PushAndGetResponse(*p, PushMsg(6, 3, 2, 1, {0.f, 0.f, 0.f})), 6, 3);
  EXPECT_EQ(p->stats().duplicate_pushes, 1u);
}

TEST(PartitionTest, AHostsCoveredPushIsToldToRetryWhenThePartitionGoesAwayFirst) {
  auto p = MakePartition(Consistency::kBsp);
  p->SetStepWorkers({100, 200}, {{5, 100}, {6, 100}, {7, 200}});
  ExpectPushAck(PushAndGetResponse(*p, PushMsg(5, 1, 0, 2, {2.f, 2.f, 2.f})), 5, 1);
  auto held = std::make_shared<RecordingResponder>();
  p->Push(PushMsg(6, 1, 0, 1, {9.f, 9.f, 9.f}), held);
  EXPECT_THAT(held->responses(), IsEmpty());
  p.reset();  // moved away (or its pserver failed over) mid-step
  ASSERT_THAT(held->responses(), SizeIs(1));
  EXPECT_EQ(ReasonOf(transport::ResponseStatus(held->responses()[0])), proto::REASON_NOT_SERVED);
}

TEST(PartitionTest, BspPullForAFutureVersionWaitsForThatVersion) {
  auto p = MakePartition(Consistency::kBsp);
  p->SetStepWorkers({1});
  auto wants2 = std::make_shared<RecordingResponder>();
  p->Pull(PullMsg(3, 2, 1), wants2);
  // Step 0: sum {1, 1, 1} over 1 sample -> {0.5, 1.5, 2.5}, version 1.
  ExpectPushAck(PushAndGetResponse(*p, PushMsg(1, 1, 0, 1, {1.f, 1.f, 1.f})), 1, 1);
  EXPECT_THAT(wants2->responses(), IsEmpty());
  // Step 1: sum {2, 0, 0} over 2 samples -> mean {1, 0, 0} -> {0, 1.5, 2.5}.
  ExpectPushAck(PushAndGetResponse(*p, PushMsg(1, 2, 1, 2, {2.f, 0.f, 0.f})), 1, 2);
  auto responses = wants2->responses();
  ASSERT_THAT(responses, SizeIs(1));
  EXPECT_EQ(responses[0].header.version, 2u);
  EXPECT_THAT(BytesToFloats(responses[0].payload),
              ElementsAre(FloatNear(0.f, kTol), FloatNear(1.5f, kTol), FloatNear(2.5f, kTol)));
}

TEST(PartitionTest, DuplicatePushIsAckedButNotApplied) {
  auto p = MakePartition(Consistency::kBsp);
  p->SetStepWorkers({1, 2});
  ExpectPushAck(PushAndGetResponse(*p, PushMsg(1, 1, 0, 1, {2.f, 2.f, 2.f})), 1, 1);
  // The same (sender, seq) again, e.g. a retry after a lost ack.
  ExpectPushAck(PushAndGetResponse(*p, PushMsg(1, 1, 0, 1, {2.f, 2.f, 2.f})), 1, 1);
  EXPECT_EQ(p->stats().duplicate_pushes, 1u);
  EXPECT_EQ(p->stats().pushes_applied, 1u);
  EXPECT_EQ(p->stats().version, 0u);

  ExpectPushAck(PushAndGetResponse(*p, PushMsg(2, 1, 0, 1, {0.f, 0.f, 0.f})), 2, 1);
  // Counted once: sums {2, 2, 2} over 1 + 1 = 2 samples, mean {1, 1, 1};
  // lr 0.5 -> {0.5, 1.5, 2.5}. (Counted twice it would be {4,4,4}/3.)
  EXPECT_EQ(p->stats().version, 1u);
  EXPECT_THAT(p->ValuesForTesting(),
              ElementsAre(FloatNear(0.5f, kTol), FloatNear(1.5f, kTol), FloatNear(2.5f, kTol)));

  // A retry of a push of the finished step is still a duplicate, not stale.
  ExpectPushAck(PushAndGetResponse(*p, PushMsg(2, 1, 0, 1, {0.f, 0.f, 0.f})), 2, 1);
  EXPECT_EQ(p->stats().duplicate_pushes, 2u);
  EXPECT_EQ(p->stats().rejected_pushes, 0u);
  EXPECT_EQ(p->stats().version, 1u);
}

TEST(PartitionTest, StalePushIsFailedPrecondition) {
  auto p = MakePartition(Consistency::kBsp);
  p->SetStepWorkers({1});
  ExpectPushAck(PushAndGetResponse(*p, PushMsg(1, 1, 0, 1, {1.f, 1.f, 1.f})), 1, 1);
  ASSERT_EQ(p->stats().version, 1u);
  // A new push (seq 2) for step 0, but the partition is at version 1.
  Message resp = PushAndGetResponse(*p, PushMsg(1, 2, 0, 1, {9.f, 9.f, 9.f}));
  EXPECT_EQ(resp.header.type, MessageType::kPushResponse);
  EXPECT_EQ(resp.header.request_id, 1002u);
  EXPECT_THAT(transport::ResponseStatus(resp),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("partition 7"), HasSubstr("step 0"))));
  // The worker decides on the reason, not the text.
  EXPECT_EQ(ReasonOf(transport::ResponseStatus(resp)), proto::REASON_STALE_GRADIENT);
  EXPECT_EQ(p->stats().rejected_pushes, 1u);
  EXPECT_EQ(p->stats().version, 1u);
  // {1,2,3} - 0.5 * {1,1,1}; the stale gradient left no trace.
  EXPECT_THAT(p->ValuesForTesting(),
              ElementsAre(FloatNear(0.5f, kTol), FloatNear(1.5f, kTol), FloatNear(2.5f, kTol)));
}

TEST(PartitionTest, PushForAFutureStepIsOutOfRange) {
  auto p = MakePartition(Consistency::kBsp);
  p->SetStepWorkers({1});
  Message resp = PushAndGetResponse(*p, PushMsg(1, 1, 3, 1, {1.f, 1.f, 1.f}));
  EXPECT_THAT(transport::ResponseStatus(resp),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("step 3")));
  EXPECT_EQ(p->stats().rejected_pushes, 1u);
  EXPECT_EQ(p->stats().version, 0u);
}

TEST(PartitionTest, PushFromOutsideTheStepSetIsUnavailable) {
  auto p = MakePartition(Consistency::kBsp);
  p->SetStepWorkers({1});
  Message resp = PushAndGetResponse(*p, PushMsg(5, 1, 0, 1, {1.f, 1.f, 1.f}));
  EXPECT_THAT(transport::ResponseStatus(resp),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("node 5")));
  EXPECT_EQ(p->stats().pushes_applied, 0u);
  // Not remembered: once in the step set, the same seq is accepted.
  p->SetStepWorkers({1, 5});
  ExpectPushAck(PushAndGetResponse(*p, PushMsg(5, 1, 0, 1, {1.f, 1.f, 1.f})), 5, 1);
  EXPECT_EQ(p->stats().pushes_applied, 1u);
  EXPECT_EQ(p->stats().duplicate_pushes, 0u);
}

TEST(PartitionTest, WrongPayloadSizeIsInvalidArgumentNamingThePartition) {
  auto p = MakePartition(Consistency::kBsp);
  p->SetStepWorkers({1});
  Message resp = PushAndGetResponse(*p, PushMsg(1, 1, 0, 1, {1.f, 1.f}));
  EXPECT_EQ(resp.header.type, MessageType::kPushResponse);
  EXPECT_THAT(transport::ResponseStatus(resp),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("partition 7"), HasSubstr("fc0.weight"),
                             HasSubstr("expected 12 bytes"), HasSubstr("got 8"))));
  // Zero samples is refused the same way.
  resp = PushAndGetResponse(*p, PushMsg(1, 2, 0, 0, {1.f, 1.f, 1.f}));
  EXPECT_THAT(transport::ResponseStatus(resp),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("partition 7")));
  EXPECT_EQ(p->stats().rejected_pushes, 2u);
  EXPECT_EQ(p->stats().pushes_applied, 0u);
  EXPECT_THAT(p->ValuesForTesting(), ElementsAre(1.f, 2.f, 3.f));
}

TEST(PartitionTest, ShrinkingTheStepSetCompletesThePendingStep) {
  auto p = MakePartition(Consistency::kBsp);
  p->SetStepWorkers({1, 2});
  ExpectPushAck(PushAndGetResponse(*p, PushMsg(1, 1, 0, 2, {2.f, 4.f, -2.f})), 1, 1);
  auto waiting = std::make_shared<RecordingResponder>();
  p->Pull(PullMsg(1, 1, 9), waiting);
  EXPECT_THAT(waiting->responses(), IsEmpty());

  // Worker 2 died: the step proceeds with worker 1's gradient alone.
  p->SetStepWorkers({1});
  // mean = {2, 4, -2} / 2 = {1, 2, -1}; lr 0.5 -> {0.5, 1, 3.5}
  EXPECT_EQ(p->stats().version, 1u);
  EXPECT_EQ(p->stats().updates_applied, 1u);
  EXPECT_THAT(p->ValuesForTesting(),
              ElementsAre(FloatNear(0.5f, kTol), FloatNear(1.f, kTol), FloatNear(3.5f, kTol)));
  auto responses = waiting->responses();
  ASSERT_THAT(responses, SizeIs(1));
  EXPECT_EQ(responses[0].header.version, 1u);
  EXPECT_EQ(responses[0].payload, FloatBytes(p->ValuesForTesting()));
}

TEST(PartitionTest, SetStepWorkersWithoutPushesAppliesNothing) {
  auto p = MakePartition(Consistency::kBsp);
  p->SetStepWorkers({1, 2});
  p->SetStepWorkers({1});
  p->SetStepWorkers({});
  EXPECT_EQ(p->stats().version, 0u);
  EXPECT_EQ(p->stats().updates_applied, 0u);
  EXPECT_THAT(p->ValuesForTesting(), ElementsAre(1.f, 2.f, 3.f));
}

TEST(PartitionTest, AspAppliesEachPushAtOnceWithItsOwnAverage) {
  auto p = MakePartition(Consistency::kAsp);
  // No step set is needed in ASP.
  // Push 1: {2, 4, -2} / 2 = {1, 2, -1}; lr 0.5 -> {0.5, 1, 3.5}
  ExpectPushAck(PushAndGetResponse(*p, PushMsg(1, 1, 0, 2, {2.f, 4.f, -2.f})), 1, 1);
  EXPECT_EQ(p->stats().version, 1u);
  EXPECT_THAT(p->ValuesForTesting(),
              ElementsAre(FloatNear(0.5f, kTol), FloatNear(1.f, kTol), FloatNear(3.5f, kTol)));
  // Push 2 (another worker, any step): {4, 0, 2} / 4 = {1, 0, 0.5}
  // -> {0.5 - 0.5, 1 - 0, 3.5 - 0.25} = {0, 1, 3.25}
  ExpectPushAck(PushAndGetResponse(*p, PushMsg(2, 1, 17, 4, {4.f, 0.f, 2.f})), 2, 1);
  EXPECT_EQ(p->stats().version, 2u);
  EXPECT_EQ(p->stats().updates_applied, 2u);
  EXPECT_EQ(p->stats().pushes_applied, 2u);
  EXPECT_THAT(p->ValuesForTesting(),
              ElementsAre(FloatNear(0.f, kTol), FloatNear(1.f, kTol), FloatNear(3.25f, kTol)));
  // A duplicate is still acked and dropped.
  ExpectPushAck(PushAndGetResponse(*p, PushMsg(2, 1, 17, 4, {4.f, 0.f, 2.f})), 2, 1);
  EXPECT_EQ(p->stats().duplicate_pushes, 1u);
  EXPECT_EQ(p->stats().version, 2u);

  // ASP pulls never wait, whatever version they ask for.
  auto r = std::make_shared<RecordingResponder>();
  p->Pull(PullMsg(1, 50, 3), r);
  auto responses = r->responses();
  ASSERT_THAT(responses, SizeIs(1));
  EXPECT_EQ(responses[0].header.version, 2u);
  EXPECT_THAT(BytesToFloats(responses[0].payload),
              ElementsAre(FloatNear(0.f, kTol), FloatNear(1.f, kTol), FloatNear(3.25f, kTol)));
}

// SSP with staleness 2: pulls of worker 1 against the clock of worker 2.
TEST(PartitionTest, SspPullWaitsExactlyWhileTheSlowestWorkerIsMoreThanStalenessBehind) {
  auto p =
      std::make_unique<Partition>(kPartitionId, "fc0.weight", std::vector<float>{1.f, 2.f, 3.f},
                                  Sgd(0.5), SyncMode(Consistency::kSsp, 2));
  p->SetStepWorkers({1, 2});
  // Step 0 of both: applied on arrival, each with its own average.
  ExpectPushAck(PushAndGetResponse(*p, PushMsg(1, 1, 0, 1, {1.f, 0.f, 0.f})), 1, 1);
  ExpectPushAck(PushAndGetResponse(*p, PushMsg(2, 1, 0, 1, {1.f, 0.f, 0.f})), 2, 1);
  EXPECT_EQ(p->stats().updates_applied, 2u);
  EXPECT_THAT(p->ValuesForTesting(),
              ElementsAre(FloatNear(0.f, kTol), FloatNear(2.f, kTol), FloatNear(3.f, kTol)));
  // Worker 1 goes on alone: steps 1 and 2 pushed, its clock 3, worker 2's 1.
  uint64_t seq = 2;
  for (uint64_t step = 1; step <= 2; ++step, ++seq) {
    ExpectPushAck(PushAndGetResponse(*p, PushMsg(1, seq, step, 1, {0.f, 0.f, 0.f})), 1, seq);
  }
  // Clock 3 is 2 ahead of the slowest: answered, with the puller's clock.
  auto at3 = std::make_shared<RecordingResponder>();
  p->Pull(PullMsg(1, 3, 1), at3);
  ASSERT_THAT(at3->responses(), SizeIs(1));
  EXPECT_EQ(at3->responses()[0].header.version, 3u);
  // Clock 4 would be 3 ahead: it waits, through worker 1's own push of 3.
  ExpectPushAck(PushAndGetResponse(*p, PushMsg(1, seq, 3, 1, {0.f, 0.f, 0.f})), 1, seq);
  auto at4 = std::make_shared<RecordingResponder>();
  p->Pull(PullMsg(1, 4, 2), at4);
  EXPECT_THAT(at4->responses(), IsEmpty());
  // A worker outside the step set holds nothing back.
  ExpectPushAck(PushAndGetResponse(*p, PushMsg(9, 1, 0, 1, {0.f, 0.f, 0.f})), 9, 1);
  EXPECT_THAT(at4->responses(), IsEmpty());
  // Worker 2's step 1 brings its clock to 2: clock 4 is 2 ahead now.
  ExpectPushAck(PushAndGetResponse(*p, PushMsg(2, 2, 1, 1, {2.f, 2.f, 2.f})), 2, 2);
  auto responses = at4->responses();
  ASSERT_THAT(responses, SizeIs(1));
  EXPECT_EQ(responses[0].header.version, 4u);
  // Every update so far is in the values it pulled: {0, 2, 3} - 0.5 * 2.
  EXPECT_THAT(BytesToFloats(responses[0].payload),
              ElementsAre(FloatNear(-1.f, kTol), FloatNear(1.f, kTol), FloatNear(2.f, kTol)));
  EXPECT_EQ(p->ssp_clocks(), (std::map<uint32_t, uint64_t>{{1, 4}, {2, 2}, {9, 1}}));
}

TEST(PartitionTest, SspWorkerThatLeavesHoldsNothingAndAJoiningOneStartsAtTheSlowestClock) {
  auto p =
      std::make_unique<Partition>(kPartitionId, "fc0.weight", std::vector<float>{1.f, 2.f, 3.f},
                                  Sgd(0.5), SyncMode(Consistency::kSsp, 0));
  p->SetStepWorkers({1, 2});
  ExpectPushAck(PushAndGetResponse(*p, PushMsg(1, 1, 0, 1, {0.f, 0.f, 0.f})), 1, 1);
  ExpectPushAck(PushAndGetResponse(*p, PushMsg(2, 1, 0, 1, {0.f, 0.f, 0.f})), 2, 1);
  ExpectPushAck(PushAndGetResponse(*p, PushMsg(1, 2, 1, 1, {0.f, 0.f, 0.f})), 1, 2);
  // Staleness 0: clock 2 waits for worker 2's step 1...
  auto at2 = std::make_shared<RecordingResponder>();
  p->Pull(PullMsg(1, 2, 1), at2);
  EXPECT_THAT(at2->responses(), IsEmpty());
  // ... until worker 2 leaves the step set (it died): then at once.
  p->SetStepWorkers({1});
  ASSERT_THAT(at2->responses(), SizeIs(1));
  EXPECT_EQ(at2->responses()[0].header.version, 2u);
  // Worker 3 joins: until its first push it holds nobody back, and its
  // first pull (clock 0) is answered with the slowest clock, 2.
  p->SetStepWorkers({1, 3});
  auto joiner = std::make_shared<RecordingResponder>();
  p->Pull(PullMsg(3, 0, 2), joiner);
  ASSERT_THAT(joiner->responses(), SizeIs(1));
  EXPECT_EQ(joiner->responses()[0].header.version, 2u);
  // From its first push (step 2) on, it holds the others as any worker.
  ExpectPushAck(PushAndGetResponse(*p, PushMsg(3, 1, 2, 1, {0.f, 0.f, 0.f})), 3, 1);
  ExpectPushAck(PushAndGetResponse(*p, PushMsg(1, 3, 2, 1, {0.f, 0.f, 0.f})), 1, 3);
  ExpectPushAck(PushAndGetResponse(*p, PushMsg(1, 4, 3, 1, {0.f, 0.f, 0.f})), 1, 4);
  auto at4 = std::make_shared<RecordingResponder>();
  p->Pull(PullMsg(1, 4, 3), at4);
  EXPECT_THAT(at4->responses(), IsEmpty()) << "served before worker 3 pushed step 3";
  ExpectPushAck(PushAndGetResponse(*p, PushMsg(3, 2, 3, 1, {0.f, 0.f, 0.f})), 3, 2);
  EXPECT_THAT(at4->responses(), SizeIs(1));
}

// Sparse partitions: rows of dim 2, zeros at first, SGD with lr 0.5.
std::unique_ptr<Partition> MakeSparsePartition(Consistency consistency) {
  RowOptimizerSection c;
  c.type = "sgd";
  c.learning_rate = 0.5;
  auto opt = RowOptimizer::Create(c);
  CHECK(opt.ok());
  auto init = RowInitializer::Create("zeros", 0, 0, 0);
  CHECK(init.ok());
  SparseTableOptions o;
  o.dim = 2;
  o.optimizer = std::shared_ptr<const RowOptimizer>(std::move(*opt));
  o.initializer = &*init;
  auto rows = SparseTable::Create(o);
  CHECK(rows.ok());
  return std::make_unique<Partition>(kPartitionId, "embedding", std::move(*rows), consistency);
}

std::string KeyBytes(const std::vector<uint64_t>& keys) {
  return std::string(reinterpret_cast<const char*>(keys.data()), keys.size() * sizeof(uint64_t));
}

Message SparsePullMsg(uint32_t sender, uint64_t min_version, const std::vector<uint64_t>& keys) {
  Message m = PullMsg(sender, min_version, 500);
  m.header.flags = transport::kFlagSparse;
  m.payload = KeyBytes(keys);
  return m;
}

Message SparsePushMsg(uint32_t sender, uint64_t seq, uint64_t step, uint64_t count,
                      const std::vector<uint64_t>& keys, const std::vector<float>& rows) {
  Message m = PushMsg(sender, seq, step, count, rows);
  m.header.flags = transport::kFlagSparse;
  m.payload = KeyBytes(keys) + FloatBytes(rows);
  return m;
}

std::vector<float> PullRows(Partition& p, const std::vector<uint64_t>& keys) {
  auto r = std::make_shared<RecordingResponder>();
  p.Pull(SparsePullMsg(9, 0, keys), r);
  auto responses = r->responses();
  EXPECT_THAT(responses, SizeIs(1));
  if (responses.empty()) return {};
  EXPECT_THAT(transport::ResponseStatus(responses[0]), IsOk());
  return BytesToFloats(responses[0].payload);
}

TEST(SparsePartitionTest, AspPushUpdatesTheRowsOfItsKeysAndPullReturnsThemInKeyOrder) {
  auto p = MakeSparsePartition(Consistency::kAsp);
  EXPECT_TRUE(p->sparse());
  EXPECT_EQ(p->length(), 0u);
  EXPECT_THAT(PullRows(*p, {5, 9}), ElementsAre(0.f, 0.f, 0.f, 0.f));
  // Keys 5 and 9, gradient sums over 2 samples: rows -= 0.5 * sum / 2.
  ExpectPushAck(PushAndGetResponse(*p, SparsePushMsg(1, 1, 0, 2, {5, 9}, {2.f, 4.f, -2.f, 0.f})), 1,
                1);
  EXPECT_THAT(PullRows(*p, {9, 7, 5}),
              ElementsAre(FloatNear(0.5f, kTol), FloatNear(0.f, kTol),      // key 9
                          0.f, 0.f,                                         // key 7: no row
                          FloatNear(-0.5f, kTol), FloatNear(-1.f, kTol)));  // key 5
  EXPECT_EQ(p->stats().version, 1u);
  EXPECT_EQ(p->sparse_stats().rows, 2u);
  EXPECT_EQ(p->sparse_stats().admitted, 2u);
  // A retried push (same sender and seq) is acknowledged, not applied again.
  ExpectPushAck(PushAndGetResponse(*p, SparsePushMsg(1, 1, 0, 2, {5, 9}, {2.f, 4.f, -2.f, 0.f})), 1,
                1);
  EXPECT_EQ(p->stats().duplicate_pushes, 1u);
  EXPECT_THAT(PullRows(*p, {5}), ElementsAre(FloatNear(-0.5f, kTol), FloatNear(-1.f, kTol)));
}

TEST(SparsePartitionTest, BspSumsEveryWorkersRowsOfAKeyAndAppliesOnce) {
  auto p = MakeSparsePartition(Consistency::kBsp);
  p->SetStepWorkers({1, 2});
  // Worker 1 pushes keys 3 and 4 over 1 sample, worker 2 keys 4 and 8 over 3.
  ExpectPushAck(PushAndGetResponse(*p, SparsePushMsg(1, 1, 0, 1, {3, 4}, {1.f, 1.f, 2.f, 2.f})), 1,
                1);
  auto waiting = std::make_shared<RecordingResponder>();
  p->Pull(SparsePullMsg(1, 1, {4, 3, 8}), waiting);
  EXPECT_THAT(waiting->responses(), IsEmpty());
  EXPECT_EQ(p->sparse_stats().rows, 0u);  // nothing applied before the step completes
  ExpectPushAck(PushAndGetResponse(*p, SparsePushMsg(2, 1, 0, 3, {4, 8}, {2.f, -2.f, 4.f, 4.f})), 2,
                1);
  // Mean over 4 samples: key 3 {1, 1}/4, key 4 {4, 0}/4, key 8 {4, 4}/4;
  // SGD lr 0.5 from zeros.
  auto responses = waiting->responses();
  ASSERT_THAT(responses, SizeIs(1));
  EXPECT_EQ(responses[0].header.version, 1u);
  EXPECT_THAT(BytesToFloats(responses[0].payload),
              ElementsAre(FloatNear(-0.5f, kTol), FloatNear(0.f, kTol),        // key 4
                          FloatNear(-0.125f, kTol), FloatNear(-0.125f, kTol),  // key 3
                          FloatNear(-0.5f, kTol), FloatNear(-0.5f, kTol)));    // key 8
  EXPECT_EQ(p->stats().updates_applied, 1u);
  EXPECT_EQ(p->sparse_stats().rows, 3u);
  EXPECT_EQ(p->sparse_stats().updates, 1u);
}

TEST(SparsePartitionTest, MalformedSparseRequestsAreRefusedNamingWhatIsWrong) {
  auto sparse = MakeSparsePartition(Consistency::kAsp);
  // A push whose bytes are not whole (key, 2 floats) rows.
  Message torn = SparsePushMsg(1, 1, 0, 1, {5}, {1.f, 2.f});
  torn.payload.pop_back();
  EXPECT_THAT(transport::ResponseStatus(PushAndGetResponse(*sparse, torn)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("sparse push to partition 7 (embedding) from node 1"),
                             HasSubstr("rows of 16 bytes"))));
  // A dense push to a sparse partition, and a sparse one to a dense partition.
  EXPECT_THAT(
      transport::ResponseStatus(PushAndGetResponse(*sparse, PushMsg(1, 2, 0, 1, {1.f, 2.f}))),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("dense push request from node 1 to sparse partition 7")));
  auto dense = MakePartition(Consistency::kAsp);
  EXPECT_THAT(transport::ResponseStatus(
                  PushAndGetResponse(*dense, SparsePushMsg(1, 1, 0, 1, {5}, {1.f, 2.f}))),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("sparse push request from node 1 to dense partition 7")));
  // Keys that are not whole uint64s.
  Message pull = SparsePullMsg(1, 0, {1, 2});
  pull.payload.resize(13);
  auto r = std::make_shared<RecordingResponder>();
  sparse->Pull(pull, r);
  ASSERT_THAT(r->responses(), SizeIs(1));
  EXPECT_THAT(transport::ResponseStatus(r->responses()[0]),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("13 bytes of keys")));
  EXPECT_EQ(sparse->stats().rejected_pushes, 2u);
  EXPECT_EQ(sparse->sparse_stats().rows, 0u);
}

// Replication (docs/reliability.md): hands each record the primary sent
// (kept by a QueueSink) to `backup` and returns its answers.
std::vector<Message> Deliver(QueueSink& sink, Partition& backup) {
  std::vector<Message> answers;
  for (auto& [node, record] : sink.Take()) {
    auto r = std::make_shared<RecordingResponder>();
    backup.ApplyReplica(record, r);
    auto got = r->responses();
    EXPECT_THAT(got, SizeIs(1));
    if (!got.empty()) answers.push_back(got[0]);
  }
  return answers;
}

// Delivers and acknowledges every queued record from `backup` (node 5),
// and those the acks bring (a new backup's caught-up marker).
void Replicate(QueueSink& sink, Partition& primary, Partition& backup) {
  for (auto records = sink.Take(); !records.empty(); records = sink.Take()) {
    for (auto& [node, record] : records) {
      auto r = std::make_shared<RecordingResponder>();
      backup.ApplyReplica(record, r);
      auto got = r->responses();
      ASSERT_THAT(got, SizeIs(1));
      ASSERT_THAT(transport::ResponseStatus(got[0]), IsOk());
      primary.OnReplicaAck(node, record.header.seq);
    }
  }
}

TEST(ReplicationTest, BspStepIsAcknowledgedAndServedOnlyOnceTheBackupHoldsIt) {
  QueueSink sink;
  auto primary = MakePartition(Consistency::kBsp);
  auto backup = MakePartition(Consistency::kBsp);
  backup->MakeBackup();
  EXPECT_FALSE(backup->synced());
  primary->SetStepWorkers({1, 2});
  primary->SetBackups({5}, &sink);
  Replicate(sink, *primary, *backup);  // the copy
  EXPECT_TRUE(backup->synced());
  EXPECT_EQ(backup->role(), PartitionRole::kBackup);

  auto r1 = std::make_shared<RecordingResponder>();
  auto r2 = std::make_shared<RecordingResponder>();
  auto pull = std::make_shared<RecordingResponder>();
  primary->Push(PushMsg(1, 1, 0, 1, {2.f, 2.f, 2.f}), r1);
  primary->Push(PushMsg(2, 1, 0, 1, {0.f, 2.f, 4.f}), r2);
  primary->Pull(PullMsg(1, 1, 9), pull);
  // Applied on the primary, but neither acknowledged nor served yet.
  EXPECT_EQ(primary->stats().version, 1u);
  EXPECT_THAT(r1->responses(), IsEmpty());
  EXPECT_THAT(r2->responses(), IsEmpty());
  EXPECT_THAT(pull->responses(), IsEmpty());
  auto answers = Deliver(sink, *backup);
  ASSERT_THAT(answers, SizeIs(1));
  EXPECT_THAT(transport::ResponseStatus(answers[0]), IsOk());
  EXPECT_THAT(r1->responses(), IsEmpty());  // until the ack reaches the primary
  primary->OnReplicaAck(5, 1);
  ASSERT_THAT(r1->responses(), SizeIs(1));
  ExpectPushAck(r1->responses()[0], 1, 1);
  ASSERT_THAT(r2->responses(), SizeIs(1));
  ASSERT_THAT(pull->responses(), SizeIs(1));
  EXPECT_EQ(pull->responses()[0].header.version, 1u);
  // The backup holds exactly the primary's state: mean {1, 2, 3} * 0.5.
  EXPECT_EQ(backup->ValuesForTesting(), primary->ValuesForTesting());
  EXPECT_THAT(backup->ValuesForTesting(),
              ElementsAre(FloatNear(0.5f, kTol), FloatNear(1.f, kTol), FloatNear(1.5f, kTol)));
  EXPECT_EQ(backup->stats().version, 1u);
  EXPECT_EQ(backup->applied_by_sender(), primary->applied_by_sender());
}

// Found by drain_test: a partition that moves away is freed once its last
// user lets go, and what still waited in it (acks held for a backup, a
// pull of a version not reached) is answered UNAVAILABLE with
// REASON_NOT_SERVED, so that the senders retry at its new owner. Dropped,
// they would be an Internal error that fails the worker.
TEST(ReplicationTest, APartitionThatGoesAwayAnswersWhatWaitsInIt) {
  QueueSink sink;
  auto primary = MakePartition(Consistency::kBsp);
  auto backup = MakePartition(Consistency::kBsp);
  backup->MakeBackup();
  primary->SetStepWorkers({1, 2});
  primary->SetBackups({5}, &sink);
  Replicate(sink, *primary, *backup);  // the copy
  auto r1 = std::make_shared<RecordingResponder>();
  auto r2 = std::make_shared<RecordingResponder>();
  auto pull = std::make_shared<RecordingResponder>();
  primary->Push(PushMsg(1, 1, 0, 1, {2.f, 2.f, 2.f}), r1);
  primary->Push(PushMsg(2, 1, 0, 1, {0.f, 2.f, 4.f}), r2);  // held for the backup
  primary->Pull(PullMsg(1, 5, 9), pull);                    // a version far ahead
  ASSERT_THAT(r1->responses(), IsEmpty());
  ASSERT_THAT(pull->responses(), IsEmpty());
  primary.reset();
  for (const auto* r : {r1.get(), r2.get(), pull.get()}) {
    auto got = r->responses();
    ASSERT_THAT(got, SizeIs(1));
    const absl::Status s = transport::ResponseStatus(got[0]);
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("left this pserver")));
    EXPECT_EQ(ReasonOf(s), proto::REASON_NOT_SERVED);
  }
  EXPECT_EQ(pull->responses()[0].header.type, MessageType::kPullResponse);
  EXPECT_EQ(r1->responses()[0].header.type, MessageType::kPushResponse);
}

TEST(ReplicationTest, PromotedBackupServesAndKnowsThePushesItHolds) {
  QueueSink sink;
  auto primary = MakePartition(Consistency::kAsp);
  auto backup = MakePartition(Consistency::kAsp);
  backup->MakeBackup();
  // Updates before the backup joined reach it in the copy.
  ExpectPushAck(PushAndGetResponse(*primary, PushMsg(3, 1, 0, 2, {2.f, 4.f, -2.f})), 3, 1);
  primary->SetBackups({5}, &sink);
  Replicate(sink, *primary, *backup);
  for (uint64_t seq = 2; seq <= 4; ++seq) {
    auto r = std::make_shared<RecordingResponder>();
    primary->Push(PushMsg(3, seq, 0, 1, {1.f, -1.f, 0.5f}), r);
    EXPECT_THAT(r->responses(), IsEmpty());
    Replicate(sink, *primary, *backup);
    ASSERT_THAT(r->responses(), SizeIs(1));
  }
  EXPECT_EQ(backup->ValuesForTesting(), primary->ValuesForTesting());
  EXPECT_EQ(backup->stats().version, 4u);
  EXPECT_EQ(backup->applied_by_sender(), (std::map<uint32_t, uint64_t>{{3, 4}}));
  // A backup serves nothing; promoted, it does, and a push it holds
  // already (the worker retrying after the primary died) is not applied
  // again.
  auto refused = std::make_shared<RecordingResponder>();
  backup->Pull(PullMsg(3, 0, 1), refused);
  ASSERT_THAT(refused->responses(), SizeIs(1));
  EXPECT_THAT(transport::ResponseStatus(refused->responses()[0]),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("backup")));
  backup->Promote();
  EXPECT_EQ(backup->role(), PartitionRole::kPrimary);
  ExpectPushAck(PushAndGetResponse(*backup, PushMsg(3, 4, 0, 1, {1.f, -1.f, 0.5f})), 3, 4);
  EXPECT_EQ(backup->stats().duplicate_pushes, 1u);
  EXPECT_EQ(backup->ValuesForTesting(), primary->ValuesForTesting());
}

TEST(ReplicationTest, ABackupLeavingTheViewReleasesWhatWaitedForIt) {
  QueueSink sink;
  auto primary = MakePartition(Consistency::kBsp);
  auto backup = MakePartition(Consistency::kBsp);
  backup->MakeBackup();
  primary->SetStepWorkers({1});
  primary->SetBackups({5}, &sink);
  Replicate(sink, *primary, *backup);  // the copy: counted
  auto r = std::make_shared<RecordingResponder>();
  primary->Push(PushMsg(1, 1, 0, 1, {1.f, 1.f, 1.f}), r);
  EXPECT_THAT(r->responses(), IsEmpty());
  primary->SetBackups({}, &sink);  // the backup died
  ASSERT_THAT(r->responses(), SizeIs(1));
  ExpectPushAck(r->responses()[0], 1, 1);
}

// A move's target catches up without holding training back: the primary
// acknowledges while the copy and the records after it are on their way,
// and counts the backup (it waits for it, the backup reports itself in
// sync) once it holds everything sent until it acknowledged the copy.
TEST(ReplicationTest, AMovesTargetCatchingUpHoldsNothingBackUntilItHasEverything) {
  QueueSink sink;
  auto primary = MakePartition(Consistency::kBsp);
  auto backup = MakePartition(Consistency::kBsp);
  backup->MakeBackup();
  primary->SetStepWorkers({1});
  primary->SetBackups({5}, &sink, /*move_target=*/5);
  // The copy (record 0) not taken in yet: a step is acknowledged and served.
  ExpectPushAck(PushAndGetResponse(*primary, PushMsg(1, 1, 0, 1, {1.f, 1.f, 1.f})), 1, 1);
  auto copy_and_first = sink.Take();
  ASSERT_THAT(copy_and_first, SizeIs(2));  // the copy, record 1
  auto apply = [&](const Message& m) {
    auto r = std::make_shared<RecordingResponder>();
    backup->ApplyReplica(m, r);
    auto got = r->responses();
    return got.empty() ? absl::InternalError("no answer") : transport::ResponseStatus(got[0]);
  };
  ASSERT_THAT(apply(copy_and_first[0].second), IsOk());
  primary->OnReplicaAck(5, 0);
  EXPECT_FALSE(backup->synced());  // (it must hold record 1 too)
  // Still catching up: record 2's push goes out at once.
  ExpectPushAck(PushAndGetResponse(*primary, PushMsg(1, 2, 1, 1, {1.f, 1.f, 1.f})), 1, 2);
  ASSERT_THAT(apply(copy_and_first[1].second), IsOk());
  primary->OnReplicaAck(5, 1);  // counted: the marker follows record 2
  auto r3 = std::make_shared<RecordingResponder>();
  primary->Push(PushMsg(1, 3, 2, 1, {1.f, 1.f, 1.f}), r3);
  EXPECT_THAT(r3->responses(), IsEmpty());  // held for the backup now
  auto rest = sink.Take();
  ASSERT_THAT(rest, SizeIs(3));  // record 2, the marker, record 3
  EXPECT_EQ(rest[1].second.header.flags & transport::kFlagReplicaCaughtUp,
            transport::kFlagReplicaCaughtUp);
  ASSERT_THAT(apply(rest[0].second), IsOk());
  EXPECT_FALSE(backup->synced());
  ASSERT_THAT(apply(rest[1].second), IsOk());
  EXPECT_TRUE(backup->synced());
  ASSERT_THAT(apply(rest[1].second), IsOk());  // (a resent marker)
  ASSERT_THAT(apply(rest[2].second), IsOk());
  primary->OnReplicaAck(5, 2);
  primary->OnReplicaAck(5, 3);
  ASSERT_THAT(r3->responses(), SizeIs(1));
  ExpectPushAck(r3->responses()[0], 1, 3);
  EXPECT_EQ(backup->ValuesForTesting(), primary->ValuesForTesting());
  EXPECT_EQ(backup->stats().version, 3u);
  // A marker before any copy is refused (the stream sends it again).
  auto fresh = MakePartition(Consistency::kBsp);
  fresh->MakeBackup();
  auto r = std::make_shared<RecordingResponder>();
  fresh->ApplyReplica(rest[1].second, r);
  ASSERT_THAT(r->responses(), SizeIs(1));
  EXPECT_THAT(transport::ResponseStatus(r->responses()[0]),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("no copy yet")));
  EXPECT_FALSE(fresh->synced());
}

// Any other new backup (a new owner's, a replacement) is waited for from
// its copy on: what the primary acknowledges is on it when it takes over.
TEST(ReplicationTest, ANewBackupNotAMovesTargetIsWaitedForFromItsCopyOn) {
  QueueSink sink;
  auto primary = MakePartition(Consistency::kAsp);
  auto backup = MakePartition(Consistency::kAsp);
  backup->MakeBackup();
  primary->SetBackups({5}, &sink);
  auto r = std::make_shared<RecordingResponder>();
  primary->Push(PushMsg(1, 1, 0, 1, {1.f, 1.f, 1.f}), r);
  EXPECT_THAT(r->responses(), IsEmpty());  // the backup has no copy yet
  Replicate(sink, *primary, *backup);
  ASSERT_THAT(r->responses(), SizeIs(1));
  ExpectPushAck(r->responses()[0], 1, 1);
  EXPECT_TRUE(backup->synced());
  EXPECT_EQ(backup->ValuesForTesting(), primary->ValuesForTesting());
}

// Found by ctr_launch_grow_test: a bsp push to a step still open is not
// in a new backup's copy. Acknowledged before its step completed, it was
// lost when the move cut over with the step open: the new owner waited
// for a push its sender never sent again, and the job hung. It waits for
// its step instead, and is refused (and sent again to the new owner) when
// the old owner lets the partition go.
TEST(ReplicationTest, ABspPushWaitsForItsStepWhileANewBackupCatchesUp) {
  QueueSink sink;
  auto primary = MakePartition(Consistency::kBsp);
  auto backup = MakePartition(Consistency::kBsp);
  backup->MakeBackup();
  primary->SetStepWorkers({1, 2});
  backup->SetStepWorkers({1, 2});
  primary->SetBackups({5}, &sink, 5);  // a move's target, catching up
  auto r1 = std::make_shared<RecordingResponder>();
  primary->Push(PushMsg(1, 1, 0, 1, {2.f, 2.f, 2.f}), r1);
  EXPECT_THAT(r1->responses(), IsEmpty());  // its step is open
  Replicate(sink, *primary, *backup);       // the copy, the marker
  ASSERT_TRUE(backup->synced());
  // The cut-over: the backup takes over, the old owner lets go.
  backup->Promote();
  primary.reset();
  ASSERT_THAT(r1->responses(), SizeIs(1));
  EXPECT_THAT(transport::ResponseStatus(r1->responses()[0]),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("left this pserver")));
  // Node 1 sends its push again to the new owner: the step completes.
  ExpectPushAck(PushAndGetResponse(*backup, PushMsg(1, 1, 0, 1, {2.f, 2.f, 2.f})), 1, 1);
  ExpectPushAck(PushAndGetResponse(*backup, PushMsg(2, 1, 0, 1, {0.f, 2.f, 4.f})), 2, 1);
  EXPECT_EQ(backup->stats().version, 1u);
  EXPECT_THAT(backup->ValuesForTesting(),
              ElementsAre(FloatNear(0.5f, kTol), FloatNear(1.f, kTol), FloatNear(1.5f, kTol)));

  // A step completed while the backup catches up is acknowledged at once.
  QueueSink sink2;
  auto p2 = MakePartition(Consistency::kBsp);
  p2->SetStepWorkers({1, 2});
  p2->SetBackups({5}, &sink2, 5);
  auto a = std::make_shared<RecordingResponder>();
  p2->Push(PushMsg(1, 1, 0, 1, {2.f, 2.f, 2.f}), a);
  EXPECT_THAT(a->responses(), IsEmpty());
  ExpectPushAck(PushAndGetResponse(*p2, PushMsg(2, 1, 0, 1, {0.f, 2.f, 4.f})), 2, 1);
  ASSERT_THAT(a->responses(), SizeIs(1));
  ExpectPushAck(a->responses()[0], 1, 1);
}

// A backup leaving while a step is open: the acks held for the step go
// out (without backups none waits), not when a record that is never sent
// would be acknowledged.
TEST(ReplicationTest, ABackupLeavingMidStepReleasesTheStepsAcks) {
  QueueSink sink;
  auto primary = MakePartition(Consistency::kBsp);
  auto backup = MakePartition(Consistency::kBsp);
  backup->MakeBackup();
  primary->SetStepWorkers({1, 2});
  primary->SetBackups({5}, &sink);
  Replicate(sink, *primary, *backup);  // counted
  auto r1 = std::make_shared<RecordingResponder>();
  primary->Push(PushMsg(1, 1, 0, 1, {1.f, 1.f, 1.f}), r1);
  EXPECT_THAT(r1->responses(), IsEmpty());
  primary->SetBackups({}, &sink);  // the backup died
  ASSERT_THAT(r1->responses(), SizeIs(1));
  ExpectPushAck(r1->responses()[0], 1, 1);
  ExpectPushAck(PushAndGetResponse(*primary, PushMsg(2, 1, 0, 1, {1.f, 1.f, 1.f})), 2, 1);
  EXPECT_EQ(primary->stats().version, 1u);
}

TEST(ReplicationTest, RecordsOutOfOrderCorruptOrMisdirectedAreRefused) {
  QueueSink sink;
  auto primary = MakePartition(Consistency::kAsp);
  auto backup = MakePartition(Consistency::kAsp);
  backup->MakeBackup();
  primary->SetBackups({5}, &sink);
  auto copy = sink.Take();
  ASSERT_THAT(copy, SizeIs(1));
  // (Acknowledged at once: the backup is still catching up.)
  primary->Push(PushMsg(3, 1, 0, 1, {1.f, 1.f, 1.f}), std::make_shared<RecordingResponder>());
  primary->Push(PushMsg(3, 2, 0, 1, {1.f, 1.f, 1.f}), std::make_shared<RecordingResponder>());
  auto updates = sink.Take();
  ASSERT_THAT(updates, SizeIs(2));
  auto apply = [&](const Message& m) {
    auto r = std::make_shared<RecordingResponder>();
    backup->ApplyReplica(m, r);
    auto got = r->responses();
    return got.empty() ? absl::InternalError("no answer") : transport::ResponseStatus(got[0]);
  };
  // No copy yet: the primary must send it first.
  EXPECT_THAT(apply(updates[0].second), StatusIs(absl::StatusCode::kUnavailable));
  // A truncated copy names what is wrong and changes nothing.
  Message bad = copy[0].second;
  bad.payload.resize(bad.payload.size() / 2);
  EXPECT_THAT(apply(bad), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated")));
  EXPECT_FALSE(backup->synced());
  EXPECT_THAT(apply(copy[0].second), IsOk());
  EXPECT_THAT(apply(copy[0].second), IsOk());  // a resend is held already
  // A gap in the stream.
  EXPECT_THAT(apply(updates[1].second),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("after record 0")));
  Message garbled = updates[0].second;
  garbled.payload.resize(7);
  EXPECT_THAT(apply(garbled), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(apply(updates[0].second), IsOk());
  EXPECT_THAT(apply(updates[1].second), IsOk());
  EXPECT_EQ(backup->ValuesForTesting(), primary->ValuesForTesting());
  // The primary takes no records.
  auto r = std::make_shared<RecordingResponder>();
  primary->ApplyReplica(updates[0].second, r);
  ASSERT_THAT(r->responses(), SizeIs(1));
  EXPECT_THAT(transport::ResponseStatus(r->responses()[0]),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("primary")));
}

TEST(ReplicationTest, SparseBackupHoldsTheSameRows) {
  QueueSink sink;
  auto primary = MakeSparsePartition(Consistency::kBsp);
  auto backup = MakeSparsePartition(Consistency::kBsp);
  backup->MakeBackup();
  primary->SetStepWorkers({1, 2});
  primary->Push(SparsePushMsg(1, 1, 0, 1, {11, 12}, {1, 1, 2, 2}),
                std::make_shared<RecordingResponder>());
  primary->Push(SparsePushMsg(2, 1, 0, 1, {12, 13}, {4, 4, 6, 6}),
                std::make_shared<RecordingResponder>());
  primary->SetBackups({5}, &sink);
  Replicate(sink, *primary, *backup);
  primary->Push(SparsePushMsg(1, 2, 1, 1, {13, 14}, {1, 2, 3, 4}),
                std::make_shared<RecordingResponder>());
  primary->Push(SparsePushMsg(2, 2, 1, 1, {11}, {5, 5}), std::make_shared<RecordingResponder>());
  Replicate(sink, *primary, *backup);
  EXPECT_EQ(backup->stats().version, 2u);
  EXPECT_EQ(backup->sparse_stats().rows, primary->sparse_stats().rows);
  backup->Promote();
  EXPECT_EQ(PullRows(*backup, {11, 12, 13, 14, 15}), PullRows(*primary, {11, 12, 13, 14, 15}));
}

// A backup that takes a record and never answers it (an answer lost on the
// way) must not hold the primary's acknowledgements for good: after the
// ack timeout the stream sends everything unacknowledged again, on a new
// connection, and reports the backup (the master then probes it).
TEST(ReplicaStreamsTest, RecordLeftUnansweredIsSentAgainAfterTheAckTimeout) {
  auto network = std::make_shared<transport::InProcNetwork>();
  auto make = [&]() {
    transport::TransportOptions options;
    options.kind = "inproc";
    options.inproc_network = network;
    auto t = transport::CreateTransport(options);
    EXPECT_THAT(t, IsOk());
    return std::move(t).value();
  };
  auto backup_transport = make();
  auto primary_transport = make();
  // Shared: ReplicaStreams shares the partition of each record it queues.
  std::shared_ptr<Partition> primary = MakePartition(Consistency::kBsp);
  auto backup = MakePartition(Consistency::kBsp);
  backup->MakeBackup();

  absl::Mutex mu;
  int swallowed = 0;
  std::vector<std::shared_ptr<transport::Responder>> held;  // never answered
  ASSERT_THAT(backup_transport->Listen(
                  "backup", 0,
                  [&](Message request, std::shared_ptr<transport::Responder> responder) {
                    {
                      absl::MutexLock l(&mu);
                      // The first record that follows the copy is taken and
                      // left unanswered.
                      if (request.header.seq == 1 && swallowed == 0) {
                        ++swallowed;
                        held.push_back(std::move(responder));
                        return;
                      }
                    }
                    backup->ApplyReplica(request, std::move(responder));
                  }),
              IsOk());

  absl::Mutex report_mu;
  std::vector<std::string> reports;
  ReplicaStreams streams(
      primary_transport.get(), [] { return 1u; }, [] { return uint64_t{1}; }, [] {},
      [&](uint32_t node, const std::string& why) {
        absl::MutexLock l(&report_mu);
        reports.push_back(absl::StrCat(node, ": ", why));
      },
      absl::Milliseconds(100));
  streams.SetBackups({{5, backup_transport->listen_address()}});
  primary->SetStepWorkers({2});
  primary->SetBackups({5}, &streams);
  // The copy, then the caught-up marker: counted from then on.
  for (int i = 0; i < 500 && !backup->synced(); ++i) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_TRUE(backup->synced());

  auto ack = std::make_shared<RecordingResponder>();
  primary->Push(PushMsg(2, 1, 0, 1, {2.f, 2.f, 2.f}), ack);
  // Acknowledged once the backup holds the step: after the resend.
  for (int i = 0; i < 500 && ack->responses().empty(); ++i) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_THAT(ack->responses(), SizeIs(1));
  ExpectPushAck(ack->responses()[0], 2, 1);
  EXPECT_EQ(backup->stats().version, 1u);
  EXPECT_EQ(backup->ValuesForTesting(), primary->ValuesForTesting());
  EXPECT_GE(streams.stats().ack_timeouts, 1u);
  {
    absl::MutexLock l(&report_mu);
    ASSERT_THAT(reports, SizeIs(1));
    EXPECT_THAT(reports[0], AllOf(HasSubstr("5: replication record 1 of partition 7"),
                                  HasSubstr("unanswered for")));
  }
  streams.Shutdown();
  primary_transport->Shutdown();
  backup_transport->Shutdown();
}

// Chunks (cluster.chunk_bytes): a partition of 5 floats, Adam (its state
// per element and its bias correction by update number), pushed and pulled
// chunk by chunk.
constexpr uint64_t kChunkedLength = 5;

std::unique_ptr<Partition> MakeChunked(Consistency consistency, uint64_t chunk_floats) {
  OptimizerSection c;
  c.type = "adam";
  c.learning_rate = 0.1;
  auto opt = Optimizer::Create(c, kChunkedLength);
  CHECK(opt.ok()) << opt.status();
  return std::make_unique<Partition>(kPartitionId, "fc0.weight",
                                     std::vector<float>{1.f, -2.f, 3.f, 0.5f, 7.f}, std::move(*opt),
                                     consistency, chunk_floats);
}

uint32_t ChunksOf(uint64_t chunk_floats) {
  if (chunk_floats == 0 || chunk_floats >= kChunkedLength) return 1;
  return static_cast<uint32_t>((kChunkedLength + chunk_floats - 1) / chunk_floats);
}

// Chunk c of a push of `grad` (the whole partition's gradient).
Message ChunkPush(uint32_t sender, uint64_t seq, uint64_t step, uint64_t count,
                  const std::vector<float>& grad, uint64_t chunk_floats, uint32_t c) {
  const uint64_t per = ChunksOf(chunk_floats) == 1 ? kChunkedLength : chunk_floats;
  const uint64_t begin = c * per, end = std::min(kChunkedLength, begin + per);
  Message m = PushMsg(sender, seq, step, count,
                      std::vector<float>(grad.begin() + begin, grad.begin() + end));
  m.header.flags = transport::ChunkFlags(c);
  return m;
}

Message ChunkPull(uint32_t sender, uint64_t min_version, uint32_t c) {
  Message m = PullMsg(sender, min_version, 500 + c);
  m.header.flags = transport::ChunkFlags(c);
  return m;
}

std::vector<float> StepGradient(uint32_t worker, uint64_t step) {
  std::vector<float> g(kChunkedLength);
  for (size_t i = 0; i < g.size(); ++i) {
    g[i] = 0.25f * static_cast<float>(i + 1) * (worker == 1 ? 1.f : -0.5f) +
           0.125f * static_cast<float>(step);
  }
  return g;
}

// Every chunk size (one float, not dividing the partition, dividing it,
// the partition's, larger than it) gives bit for bit what whole pushes
// give, in bsp (the chunks of the two workers interleaved in opposite
// orders) and asp (each chunk's pushes in the whole pushes' order); the
// pulls of the chunks put the partition together.
TEST(ChunkedPartitionTest, EveryChunkSizeGivesWhatWholePushesGive) {
  for (Consistency mode : {Consistency::kBsp, Consistency::kAsp}) {
    for (uint64_t cf : {1u, 2u, 3u, 5u, 8u}) {
      SCOPED_TRACE(::testing::Message() << (mode == Consistency::kBsp ? "bsp" : "asp")
                                        << ", chunks of " << cf << " floats");
      auto whole = MakeChunked(mode, 0);
      auto chunked = MakeChunked(mode, cf);
      whole->SetStepWorkers({1, 2});
      chunked->SetStepWorkers({1, 2});
      const uint32_t n = ChunksOf(cf);
      EXPECT_EQ(chunked->stats().chunks, n);
      for (uint64_t step = 0; step < 3; ++step) {
        const uint64_t v = mode == Consistency::kBsp ? step : 2 * step;  // asp: 2 pushes a step
        for (uint32_t w : {1u, 2u}) {
          ExpectPushAck(
              PushAndGetResponse(*whole, PushMsg(w, step + 1, v, w, StepGradient(w, step))), w,
              step + 1);
        }
        for (uint32_t i = 0; i < n; ++i) {
          ExpectPushAck(PushAndGetResponse(
                            *chunked, ChunkPush(1, step + 1, v, 1, StepGradient(1, step), cf, i)),
                        1, step + 1);
          ExpectPushAck(
              PushAndGetResponse(*chunked, ChunkPush(2, step + 1, v, 2, StepGradient(2, step), cf,
                                                     mode == Consistency::kBsp ? n - 1 - i : i)),
              2, step + 1);
        }
        std::vector<float> pulled;
        for (uint32_t i = 0; i < n; ++i) {
          auto r = std::make_shared<RecordingResponder>();
          chunked->Pull(ChunkPull(1, mode == Consistency::kBsp ? step + 1 : 0, i), r);
          ASSERT_THAT(r->responses(), SizeIs(1));
          EXPECT_EQ(r->responses()[0].header.flags, transport::ChunkFlags(i));
          for (float f : BytesToFloats(r->responses()[0].payload)) pulled.push_back(f);
        }
        EXPECT_EQ(pulled, whole->ValuesForTesting());
        EXPECT_EQ(chunked->stats().version, whole->stats().version);
        EXPECT_EQ(chunked->stats().newest_chunk_version, whole->stats().version);
      }
      EXPECT_EQ(chunked->ValuesForTesting(), whole->ValuesForTesting());
      EXPECT_EQ(chunked->applied_by_sender(), whole->applied_by_sender());
      EXPECT_EQ(chunked->stats().pushes_applied, whole->stats().pushes_applied);
      EXPECT_EQ(chunked->stats().updates_applied, whole->stats().updates_applied);
    }
  }
}

// A pull that overtakes the push it waits for (bsp): a chunk's pull is
// answered as soon as that chunk is at the version, not the partition;
// the whole partition's pull once every chunk is.
TEST(ChunkedPartitionTest, BspPullOfAChunkWaitsForThatChunkOnly) {
  auto p = MakeChunked(Consistency::kBsp, 2);  // chunks [0, 2) [2, 4) [4, 5)
  p->SetStepWorkers({1});
  auto chunk1 = std::make_shared<RecordingResponder>();
  auto all = std::make_shared<RecordingResponder>();
  p->Pull(ChunkPull(1, 1, 1), chunk1);
  p->Pull(PullMsg(1, 1, 77), all);
  EXPECT_THAT(chunk1->responses(), IsEmpty());
  ExpectPushAck(PushAndGetResponse(*p, ChunkPush(1, 1, 0, 1, StepGradient(1, 0), 2, 1)), 1, 1);
  ASSERT_THAT(chunk1->responses(), SizeIs(1));
  EXPECT_EQ(chunk1->responses()[0].header.version, 1u);
  const std::vector<float> got = BytesToFloats(chunk1->responses()[0].payload);
  ASSERT_THAT(got, SizeIs(2));
  const std::vector<float> now = p->ValuesForTesting();
  EXPECT_EQ(got, std::vector<float>(now.begin() + 2, now.begin() + 4));
  EXPECT_NE(got[0], 3.f);  // updated
  EXPECT_THAT(all->responses(), IsEmpty());
  EXPECT_EQ(p->stats().version, 0u);
  EXPECT_EQ(p->stats().newest_chunk_version, 1u);
  // A chunk at the version answers at once; one that is not, waits.
  auto chunk1_again = std::make_shared<RecordingResponder>();
  auto chunk0 = std::make_shared<RecordingResponder>();
  p->Pull(ChunkPull(1, 1, 1), chunk1_again);
  p->Pull(ChunkPull(1, 1, 0), chunk0);
  EXPECT_THAT(chunk1_again->responses(), SizeIs(1));
  EXPECT_THAT(chunk0->responses(), IsEmpty());
  ExpectPushAck(PushAndGetResponse(*p, ChunkPush(1, 1, 0, 1, StepGradient(1, 0), 2, 0)), 1, 1);
  EXPECT_THAT(chunk0->responses(), SizeIs(1));
  EXPECT_THAT(all->responses(), IsEmpty());
  ExpectPushAck(PushAndGetResponse(*p, ChunkPush(1, 1, 0, 1, StepGradient(1, 0), 2, 2)), 1, 1);
  ASSERT_THAT(all->responses(), SizeIs(1));
  EXPECT_EQ(all->responses()[0].header.version, 1u);
  EXPECT_EQ(BytesToFloats(all->responses()[0].payload), p->ValuesForTesting());
  EXPECT_EQ(p->stats().version, 1u);
  EXPECT_EQ(p->stats().updates_applied, 1u);
}

// The sender's connection closed after some chunks of a push: the retry
// (same seq, chunk by chunk or whole) applies only the chunks not applied
// yet, and the ledger counts the push once, when it is complete.
TEST(ChunkedPartitionTest, ARetriedPushAppliesOnlyTheChunksNotAppliedYet) {
  for (bool whole_retry : {false, true}) {
    SCOPED_TRACE(whole_retry ? "whole retry" : "chunked retry");
    auto reference = MakeChunked(Consistency::kAsp, 0);
    ExpectPushAck(PushAndGetResponse(*reference, PushMsg(1, 1, 0, 2, StepGradient(1, 0))), 1, 1);
    auto p = MakeChunked(Consistency::kAsp, 2);
    ExpectPushAck(PushAndGetResponse(*p, ChunkPush(1, 1, 0, 2, StepGradient(1, 0), 2, 0)), 1, 1);
    EXPECT_THAT(p->applied_by_sender(), IsEmpty());  // not complete
    EXPECT_EQ(p->stats().version, 0u);
    EXPECT_EQ(p->stats().newest_chunk_version, 1u);
    if (whole_retry) {
      ExpectPushAck(PushAndGetResponse(*p, PushMsg(1, 1, 0, 2, StepGradient(1, 0))), 1, 1);
    } else {
      for (uint32_t c : {0u, 1u, 2u}) {
        ExpectPushAck(PushAndGetResponse(*p, ChunkPush(1, 1, 0, 2, StepGradient(1, 0), 2, c)), 1,
                      1);
      }
    }
    EXPECT_EQ(p->stats().duplicate_pushes, 1u);
    EXPECT_EQ(p->ValuesForTesting(), reference->ValuesForTesting());
    EXPECT_EQ(p->applied_by_sender(), reference->applied_by_sender());
    EXPECT_EQ(p->stats().version, 1u);
    // Complete now: any chunk of it again is a duplicate.
    ExpectPushAck(PushAndGetResponse(*p, ChunkPush(1, 1, 0, 2, StepGradient(1, 0), 2, 2)), 1, 1);
    EXPECT_EQ(p->stats().duplicate_pushes, 2u);
    EXPECT_EQ(p->ValuesForTesting(), reference->ValuesForTesting());
  }
}

// An asp checkpoint taken between the chunks of a push keeps each chunk's
// version and the push's applied chunks: a partition restored from it
// applies only the rest when the push comes again.
TEST(ChunkedPartitionTest, SnapshotBetweenChunksRestoresChunkVersionsAndPartialPushes) {
  auto reference = MakeChunked(Consistency::kAsp, 0);
  ExpectPushAck(PushAndGetResponse(*reference, PushMsg(3, 4, 0, 1, StepGradient(1, 1))), 3, 4);
  auto p = MakeChunked(Consistency::kAsp, 2);
  ExpectPushAck(PushAndGetResponse(*p, ChunkPush(3, 4, 0, 1, StepGradient(1, 1), 2, 1)), 3, 4);
  absl::StatusOr<PartitionSnapshot> snap = absl::UnknownError("not taken");
  SnapshotRequest req;
  req.job = "j";
  req.seq = 1;
  p->RequestSnapshot(req, [&](absl::StatusOr<PartitionSnapshot> s) { snap = std::move(s); });
  ASSERT_THAT(snap.status(), IsOk());
  EXPECT_EQ(snap->header.version(), 0u);
  EXPECT_THAT(snap->header.chunk_versions(), ElementsAre(0u, 1u, 0u));
  ASSERT_EQ(snap->header.partial_pushes_size(), 1);
  EXPECT_EQ(snap->header.partial_pushes(0).sender(), 3u);
  EXPECT_EQ(snap->header.partial_pushes(0).seq(), 4u);
  EXPECT_THAT(snap->header.partial_pushes(0).chunks(), ElementsAre(1u));

  auto restored = MakeChunked(Consistency::kAsp, 2);
  ASSERT_THAT(restored->ApplyCheckpointFile(
                  {{storage::BlockType::kHeader, snap->header.SerializeAsString()},
                   {storage::BlockType::kDenseValues, snap->values},
                   {storage::BlockType::kOptimizerState, snap->optimizer_state}},
                  "snap"),
              IsOk());
  EXPECT_EQ(restored->stats().newest_chunk_version, 1u);
  ExpectPushAck(PushAndGetResponse(*restored, PushMsg(3, 4, 0, 1, StepGradient(1, 1))), 3, 4);
  EXPECT_EQ(restored->stats().duplicate_pushes, 1u);
  EXPECT_EQ(restored->ValuesForTesting(), reference->ValuesForTesting());
  EXPECT_EQ(restored->applied_by_sender(), reference->applied_by_sender());
  EXPECT_EQ(restored->stats().version, 1u);
}

// A bsp checkpoint's cut: the snapshot waits until every chunk reached it;
// a cut some chunk has passed is refused.
TEST(ChunkedPartitionTest, BspCutWaitsForEveryChunkAndRefusesOneAChunkPassed) {
  auto p = MakeChunked(Consistency::kBsp, 2);
  p->SetStepWorkers({1});
  int taken = 0;
  uint64_t taken_at = 0;
  SnapshotRequest at1;
  at1.seq = 1;
  at1.at_version = true;
  at1.version = 1;
  p->RequestSnapshot(at1, [&](absl::StatusOr<PartitionSnapshot> s) {
    ASSERT_THAT(s.status(), IsOk());
    ++taken;
    taken_at = s->header.version();
  });
  ExpectPushAck(PushAndGetResponse(*p, ChunkPush(1, 1, 0, 1, StepGradient(1, 0), 2, 0)), 1, 1);
  EXPECT_EQ(taken, 0);
  SnapshotRequest at0 = at1;
  at0.seq = 2;
  at0.version = 0;
  absl::Status refused;
  p->RequestSnapshot(at0, [&](absl::StatusOr<PartitionSnapshot> s) { refused = s.status(); });
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kFailedPrecondition,
                                HasSubstr("past the checkpoint's cut at version 0")));
  EXPECT_TRUE(HasReason(refused, proto::REASON_CUT_PASSED));
  ExpectPushAck(PushAndGetResponse(*p, ChunkPush(1, 1, 0, 1, StepGradient(1, 0), 2, 1)), 1, 1);
  ExpectPushAck(PushAndGetResponse(*p, ChunkPush(1, 1, 0, 1, StepGradient(1, 0), 2, 2)), 1, 1);
  EXPECT_EQ(taken, 1);
  EXPECT_EQ(taken_at, 1u);
}

TEST(ChunkedPartitionTest, ChunkRequestsThatDoNotFitAreRefusedNamingTheChunk) {
  auto p = MakeChunked(Consistency::kAsp, 2);
  Message beyond = ChunkPush(1, 1, 0, 1, StepGradient(1, 0), 2, 0);
  beyond.header.flags = transport::ChunkFlags(3);
  EXPECT_THAT(
      transport::ResponseStatus(PushAndGetResponse(*p, beyond)),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("chunk 3"), HasSubstr("partition 7"),
                     HasSubstr("3 chunk(s) of 8 bytes"), HasSubstr("cluster.chunk_bytes"))));
  Message short_last = ChunkPush(1, 1, 0, 1, StepGradient(1, 0), 2, 1);  // 2 floats
  short_last.header.flags = transport::ChunkFlags(2);                    // holds 1
  EXPECT_THAT(transport::ResponseStatus(PushAndGetResponse(*p, short_last)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("chunk 2"), HasSubstr("expected 4 bytes"))));
  auto pull = std::make_shared<RecordingResponder>();
  p->Pull(ChunkPull(1, 0, 9), pull);
  ASSERT_THAT(pull->responses(), SizeIs(1));
  EXPECT_THAT(transport::ResponseStatus(pull->responses()[0]),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pull of chunk 9")));
  EXPECT_EQ(p->stats().rejected_pushes, 2u);
  EXPECT_EQ(p->ValuesForTesting(), MakeChunked(Consistency::kAsp, 2)->ValuesForTesting());
}

// Replication chunk by chunk: each chunk's update is its own record; a
// chunk's pull is served, and the step's acks go, once the backup holds
// it; the backup ends with the primary's values, versions and ledger, and
// promoted, knows which chunks of a push it holds.
TEST(ChunkedPartitionTest, ReplicatesChunkByChunk) {
  for (Consistency mode : {Consistency::kBsp, Consistency::kAsp}) {
    SCOPED_TRACE(mode == Consistency::kBsp ? "bsp" : "asp");
    QueueSink sink;
    auto primary = MakeChunked(mode, 2);
    auto backup = MakeChunked(mode, 2);
    backup->MakeBackup();
    primary->SetStepWorkers({1});
    primary->SetBackups({5}, &sink);
    Replicate(sink, *primary, *backup);  // the copy
    auto ack0 = std::make_shared<RecordingResponder>();
    auto pull0 = std::make_shared<RecordingResponder>();
    primary->Push(ChunkPush(1, 1, 0, 1, StepGradient(1, 0), 2, 0), ack0);
    primary->Pull(ChunkPull(1, 1, 0), pull0);
    EXPECT_THAT(ack0->responses(), IsEmpty());
    if (mode == Consistency::kBsp) EXPECT_THAT(pull0->responses(), IsEmpty());
    Replicate(sink, *primary, *backup);
    ASSERT_THAT(pull0->responses(), SizeIs(1));
    // Bsp: the step's acks wait for its last chunk.
    EXPECT_THAT(ack0->responses(), SizeIs(mode == Consistency::kBsp ? 0 : 1));
    auto ack1 = std::make_shared<RecordingResponder>();
    primary->Push(ChunkPush(1, 1, 0, 1, StepGradient(1, 0), 2, 1), ack1);
    Replicate(sink, *primary, *backup);
    EXPECT_THAT(ack1->responses(), SizeIs(mode == Consistency::kBsp ? 0 : 1));
    // The primary dies here: the backup holds chunks 0 and 1 of the push.
    backup->Promote();
    backup->SetStepWorkers({1});
    for (uint32_t c : {0u, 1u, 2u}) {
      ExpectPushAck(PushAndGetResponse(*backup, ChunkPush(1, 1, 0, 1, StepGradient(1, 0), 2, c)), 1,
                    1);
    }
    EXPECT_EQ(backup->stats().duplicate_pushes, 2u);
    EXPECT_EQ(backup->stats().version, 1u);
    auto reference = MakeChunked(mode, 0);
    reference->SetStepWorkers({1});
    ExpectPushAck(PushAndGetResponse(*reference, PushMsg(1, 1, 0, 1, StepGradient(1, 0))), 1, 1);
    EXPECT_EQ(backup->ValuesForTesting(), reference->ValuesForTesting());
    EXPECT_EQ(backup->applied_by_sender(), reference->applied_by_sender());
    // And the primary, had it lived, holds the same once its last chunk is in.
    primary->Push(ChunkPush(1, 1, 0, 1, StepGradient(1, 0), 2, 2), ack1);
    EXPECT_EQ(primary->ValuesForTesting(), reference->ValuesForTesting());
    primary.reset();  // answers what it held back (as a partition moving away does)
  }
}

}  // namespace
}  // namespace strata::pserver

namespace strata::pserver {
namespace {

// A training script's first worker writes its model's values into the
// tables it declared (transport::kFlagInitialValues): taken while the
// partition is untrained, replicated to its backup, refused once trained.
TEST(InitialValuesTest, TakenWhileUntrainedReplicatedAndRefusedAfterwards) {
  QueueSink sink;
  auto primary = MakePartition(Consistency::kBsp);
  auto backup = MakePartition(Consistency::kBsp);
  backup->MakeBackup();
  primary->SetStepWorkers({1, 2});
  primary->SetBackups({5}, &sink);
  Replicate(sink, *primary, *backup);  // the copy
  Message init = PushMsg(1, 0, 0, 1, {7.f, 8.f, 9.f});
  init.header.flags = transport::kFlagInitialValues;
  auto r = std::make_shared<RecordingResponder>();
  primary->Push(init, r);
  EXPECT_THAT(r->responses(), IsEmpty());  // held until the backup has them
  Replicate(sink, *primary, *backup);
  ASSERT_THAT(r->responses(), SizeIs(1));
  EXPECT_THAT(transport::ResponseStatus(r->responses()[0]), IsOk());
  EXPECT_THAT(primary->ValuesForTesting(), ElementsAre(7.f, 8.f, 9.f));
  EXPECT_EQ(backup->ValuesForTesting(), primary->ValuesForTesting());
  // Written again (a second writer after the first left): still untrained.
  init.payload = FloatBytes({1.f, 1.f, 1.f});
  primary->Push(init, std::make_shared<RecordingResponder>());
  Replicate(sink, *primary, *backup);
  EXPECT_THAT(backup->ValuesForTesting(), ElementsAre(1.f, 1.f, 1.f));
  EXPECT_EQ(primary->stats().version, 0u);
  EXPECT_EQ(primary->stats().pushes_applied, 0u);  // (not an update: the ledger counts none)
  // A step trains it (sgd 0.5 over the mean {2, 2, 2}); then values are refused.
  primary->Push(PushMsg(1, 1, 0, 1, {2.f, 2.f, 2.f}), std::make_shared<RecordingResponder>());
  primary->Push(PushMsg(2, 1, 0, 1, {2.f, 2.f, 2.f}), std::make_shared<RecordingResponder>());
  Replicate(sink, *primary, *backup);
  EXPECT_THAT(backup->ValuesForTesting(), ElementsAre(0.f, 0.f, 0.f));
  const Message refused = PushAndGetResponse(*primary, init);
  EXPECT_EQ(transport::ResponseStatus(refused).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(transport::ResponseStatus(refused).message(),
              HasSubstr("initial values from node 1 for partition 7 (fc0.weight), which is "
                        "trained already (version 1): refused"));
  EXPECT_THAT(primary->ValuesForTesting(), ElementsAre(0.f, 0.f, 0.f));
}

TEST(InitialValuesTest, ASparsePartitionRefusesThem) {
  auto p = MakeSparsePartition(Consistency::kAsp);
  Message init = PushMsg(1, 0, 0, 1, {});
  init.header.flags = transport::kFlagInitialValues | transport::kFlagSparse;
  const Message refused = PushAndGetResponse(*p, init);
  EXPECT_EQ(transport::ResponseStatus(refused).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(transport::ResponseStatus(refused).message(),
              HasSubstr("a sparse table's rows start from sparse.init"));
}

// A node that stops backing one partition (it moved, or the master placed
// its backup elsewhere) refuses that partition's records; while it still
// backs another of this primary's, the stream to it lives on, in order.
// KeepOnly drops the refused partition's records, which would otherwise
// hold the other partition's records (and acknowledgements) for good.
TEST(ReplicaStreamsTest, RecordsToANodeThatBacksThePartitionNoMoreAreDropped) {
  auto network = std::make_shared<transport::InProcNetwork>();
  auto make = [&]() {
    transport::TransportOptions options;
    options.kind = "inproc";
    options.inproc_network = network;
    auto t = transport::CreateTransport(options);
    EXPECT_THAT(t, IsOk());
    return std::move(t).value();
  };
  auto backup_transport = make();
  auto primary_transport = make();
  std::shared_ptr<Partition> gone =  // partition 7: its backup went elsewhere
      std::make_shared<Partition>(kPartitionId, "fc0.weight", std::vector<float>{1.f, 2.f, 3.f},
                                  Sgd(0.5), Consistency::kBsp);
  std::shared_ptr<Partition> kept = std::make_shared<Partition>(
      kPartitionId + 1, "fc0.bias", std::vector<float>{1.f}, Sgd(0.5), Consistency::kBsp);
  auto kept_backup = std::make_shared<Partition>(
      kPartitionId + 1, "fc0.bias", std::vector<float>{1.f}, Sgd(0.5), Consistency::kBsp);
  kept_backup->MakeBackup();
  ASSERT_THAT(backup_transport->Listen(
                  "backup", 0,
                  [&](Message request, std::shared_ptr<transport::Responder> responder) {
                    if (request.header.partition == kPartitionId) {
                      responder->Respond(transport::MakeErrorResponse(
                          request.header, MessageType::kReplicateResponse,
                          absl::FailedPreconditionError("not its primary here")));
                      return;
                    }
                    kept_backup->ApplyReplica(request, std::move(responder));
                  }),
              IsOk());
  ReplicaStreams streams(
      primary_transport.get(), [] { return 1u; }, [] { return uint64_t{1}; }, [] {}, {},
      absl::Seconds(10));
  streams.SetBackups({{5, backup_transport->listen_address()}});
  gone->SetStepWorkers({2});
  kept->SetStepWorkers({2});
  gone->SetBackups({5}, &streams, 5);  // its copy: refused, resent, refused...
  kept->SetBackups({5}, &streams, 5);  // ...and this one's waits behind it
  auto ack = std::make_shared<RecordingResponder>();
  Message push = PushMsg(2, 1, 0, 1, {2.f});
  push.header.partition = kPartitionId + 1;
  kept->Push(push, ack);
  // (Acknowledged at once: nothing waits for a move's target catching up.)
  ASSERT_THAT(ack->responses(), SizeIs(1));
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(kept_backup->synced());  // stuck behind the refused copy
  streams.KeepOnly({{kPartitionId + 1, {5}}});
  for (int i = 0; i < 500 && !kept_backup->synced(); ++i) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_TRUE(kept_backup->synced());
  EXPECT_EQ(kept_backup->ValuesForTesting(), kept->ValuesForTesting());
  streams.Shutdown();
  primary_transport->Shutdown();
  backup_transport->Shutdown();
}

}  // namespace
}  // namespace strata::pserver
