#include "master/event_sink.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/audit_log.h"
#include "storage/faulty_file_system.h"
#include "storage/file_system.h"
#include "tests/testing/status_matchers.h"

namespace strata::master {
namespace {

using ::strata::testing::IsOk;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::SizeIs;

class EventSinkTest : public ::testing::Test {
 protected:
  // A sink whose writer writes only when flushed (or destroyed).
  std::unique_ptr<EventSink> Open() {
    EventSink::Options o;
    o.fs = &fs_;
    o.event_log = "/logs/events.jsonl";
    o.audit_log = "/logs/audit.jsonl";
    o.job = "fmnist \"mlp\"";
    o.clock = &clock_;
    o.write_every = absl::Hours(1);
    auto sink = EventSink::Open(std::move(o));
    EXPECT_THAT(sink.status(), IsOk());
    return sink.ok() ? *std::move(sink) : nullptr;
  }
  std::vector<std::string> Lines(const std::string& path) {
    auto data = mem_->ReadFile(path);
    if (!data.ok()) return {};
    return absl::StrSplit(*data, '\n', absl::SkipEmpty());
  }

  FakeClock clock_{absl::FromUnixMillis(1764590000123)};
  std::unique_ptr<storage::FileSystem> mem_ = storage::NewMemoryFileSystem();
  storage::FaultyFileSystem fs_{mem_.get()};
};

TEST_F(EventSinkTest, PostingOnlyQueuesAndTheWriterWritesInOrder) {
  std::unique_ptr<EventSink> sink = Open();
  ASSERT_NE(sink, nullptr);
  proto::NodeInfo node;
  node.set_role(proto::WORKER);
  node.set_index(2);
  node.set_id(7);
  sink->Event("node_dead", "worker 2 declared dead", &node);
  clock_.Advance(absl::Milliseconds(5));
  sink->Event("checkpoint", "checkpoint 1 (full) at step 10");
  sink->Audit({"operator:alice", "ipv4:10.0.0.5:1", "drain", "worker 2", "ok", ""});
  // Nothing is written by the callers themselves.
  EXPECT_FALSE(mem_->Exists("/logs/events.jsonl"));
  EXPECT_EQ(sink->audit_head().seq, 0u);

  sink->Flush();
  const std::vector<std::string> events = Lines("/logs/events.jsonl");
  ASSERT_THAT(events, SizeIs(2));
  EXPECT_EQ(events[0],
            "{\"unix_ms\": 1764590000123, \"time\": \"2025-12-01T11:53:20.123Z\", \"job\": "
            "\"fmnist \\\"mlp\\\"\", \"kind\": \"node_dead\", \"message\": \"worker 2 declared "
            "dead\", \"role\": \"worker\", \"index\": 2, \"node\": 7}");
  EXPECT_THAT(events[1], AllOf(HasSubstr("\"unix_ms\": 1764590000128"),
                               HasSubstr("\"kind\": \"checkpoint\""), Not(HasSubstr("role"))));
  const std::vector<std::string> audit = Lines("/logs/audit.jsonl");
  ASSERT_THAT(audit, SizeIs(3));
  EXPECT_THAT(audit[0], AllOf(HasSubstr("\"who\": \"master\""), HasSubstr("\"node_dead\""),
                              HasSubstr("worker 2 (node 7)")));
  EXPECT_THAT(audit[2], AllOf(HasSubstr("operator:alice"), HasSubstr("\"drain\"")));
  auto head = storage::VerifyAuditLog(*mem_->ReadFile("/logs/audit.jsonl"), "audit");
  ASSERT_THAT(head.status(), IsOk());
  EXPECT_EQ(head->seq, 3u);
  EXPECT_EQ(sink->audit_head().hash, head->hash);
}

TEST_F(EventSinkTest, WhatIsQueuedIsWrittenWhenTheSinkCloses) {
  std::unique_ptr<EventSink> sink = Open();
  ASSERT_NE(sink, nullptr);
  sink->Event("job_state", "job done");
  sink.reset();
  EXPECT_THAT(Lines("/logs/events.jsonl"), SizeIs(1));
  EXPECT_THAT(Lines("/logs/audit.jsonl"), SizeIs(1));
}

TEST_F(EventSinkTest, TheWriterWritesOnItsOwnAtItsPace) {
  EventSink::Options o;
  o.fs = &fs_;
  o.event_log = "/logs/events.jsonl";
  o.write_every = absl::Milliseconds(10);
  auto sink = EventSink::Open(std::move(o));
  ASSERT_THAT(sink.status(), IsOk());
  (*sink)->Event("event", "one");
  // The file may exist (opened for appending) before the line is in it.
  for (int i = 0; i < 1000 && Lines("/logs/events.jsonl").empty(); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_THAT(Lines("/logs/events.jsonl"), SizeIs(1));
  EXPECT_FALSE((*sink)->auditing());
}

// A disk that refuses the event log loses those lines (they are in the
// master's log too), not the audit records, and the sink carries on.
TEST_F(EventSinkTest, AFailingEventLogDoesNotStopTheSink) {
  std::unique_ptr<EventSink> sink = Open();
  ASSERT_NE(sink, nullptr);
  fs_.FailOp(storage::FsOp::kAppend, "events", absl::ResourceExhaustedError("disk full"));
  sink->Event("event", "lost");
  sink->Flush();
  EXPECT_THAT(Lines("/logs/audit.jsonl"), SizeIs(1));
  fs_.ClearFaults();
  sink->Event("event", "kept");
  sink->Flush();
  const std::vector<std::string> events = Lines("/logs/events.jsonl");
  ASSERT_THAT(events, SizeIs(1));
  EXPECT_THAT(events[0], HasSubstr("kept"));
  EXPECT_THAT(Lines("/logs/audit.jsonl"), SizeIs(2));
}

TEST_F(EventSinkTest, AnAuditLogThatDoesNotVerifyKeepsItFromOpening) {
  ASSERT_THAT(mem_->WriteFileAtomic("/logs/audit.jsonl", "not a record\n"), IsOk());
  EventSink::Options o;
  o.fs = &fs_;
  o.audit_log = "/logs/audit.jsonl";
  auto sink = EventSink::Open(std::move(o));
  EXPECT_EQ(sink.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(sink.status().message(), HasSubstr("/logs/audit.jsonl:1"));
}

}  // namespace
}  // namespace strata::master
