#include "master/state_log.h"

#include <unistd.h>

#include <optional>
#include <string>
#include <vector>

#include "common/error_reason.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/faulty_file_system.h"
#include "storage/file_system.h"
#include "tests/testing/status_matchers.h"

namespace strata::master {
namespace {

using ::strata::testing::IsOk;
using ::strata::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

proto::MasterState State(proto::JobState job_state, uint32_t next_node_id) {
  proto::MasterState s;
  s.set_job_state(job_state);
  s.set_next_node_id(next_node_id);
  s.add_tasks_done(3);
  return s;
}

// A record of changes: task `done` completed, task `leased` leased to node
// 7, `ended`'s lease ended.
proto::MasterState Delta(uint32_t next_node_id, std::optional<uint64_t> done,
                         std::optional<uint64_t> leased = std::nullopt,
                         std::optional<uint64_t> ended = std::nullopt) {
  proto::MasterState s;
  s.set_delta(true);
  s.set_job_state(proto::JOB_RUNNING);
  s.set_next_node_id(next_node_id);
  if (done.has_value()) s.add_tasks_done(*done);
  if (leased.has_value()) (*s.mutable_task_leases())[*leased] = 7;
  if (ended.has_value()) s.add_leases_ended(*ended);
  return s;
}

class StateLogTest : public ::testing::Test {
 protected:
  std::optional<proto::MasterState> Reopen(StateLog::Options o = StateLog::Options()) {
    std::optional<proto::MasterState> state;
    auto log = StateLog::Open(fs_.get(), "/state", &state, o);
    EXPECT_THAT(log.status(), IsOk());
    if (log.ok()) log_ = std::move(*log);
    return state;
  }
  std::unique_ptr<storage::FileSystem> fs_ = storage::NewMemoryFileSystem();
  std::unique_ptr<StateLog> log_;
};

TEST_F(StateLogTest, AnEmptyDirectoryHasNoStateAndTheNewestRecordWins) {
  EXPECT_FALSE(Reopen().has_value());
  ASSERT_THAT(log_->Append(State(proto::JOB_WAITING, 2)), IsOk());
  ASSERT_THAT(log_->Append(State(proto::JOB_RUNNING, 5)), IsOk());
  auto state = Reopen();
  ASSERT_TRUE(state.has_value());
  EXPECT_EQ(state->job_state(), proto::JOB_RUNNING);
  EXPECT_EQ(state->next_node_id(), 5u);
  // Reopening wrote it as the snapshot: it survives another reopen, and
  // records appended after it are newer.
  ASSERT_THAT(log_->Append(State(proto::JOB_EVALUATING, 6)), IsOk());
  EXPECT_EQ(Reopen()->job_state(), proto::JOB_EVALUATING);
}

TEST_F(StateLogTest, RecordsOfChangesAddUpToTheState) {
  Reopen();
  proto::MasterState whole = State(proto::JOB_RUNNING, 2);
  *whole.mutable_view()->add_members() = proto::NodeInfo();
  whole.mutable_view()->set_epoch(4);
  whole.add_events("first");
  ASSERT_THAT(log_->Append(whole), IsOk());
  ASSERT_THAT(log_->Append(Delta(3, std::nullopt, /*leased=*/5)), IsOk());
  proto::MasterState d = Delta(4, /*done=*/5, /*leased=*/6, /*ended=*/5);
  d.add_events("second");
  d.set_job_message("");  // a small field back to its default is whole too
  ASSERT_THAT(log_->Append(d), IsOk());
  // The view changes only when a record carries one.
  proto::MasterState v = Delta(4, std::nullopt);
  v.mutable_view()->set_epoch(5);
  ASSERT_THAT(log_->Append(v), IsOk());
  // The log holds the changes, not the state (the snapshot does).
  auto bytes = fs_->ReadFile("/state/log");
  ASSERT_THAT(bytes.status(), IsOk());
  StateRecords r = DecodeStateRecords("/state/log", *bytes);
  ASSERT_EQ(r.states.size(), 3u) << r.bad;
  EXPECT_TRUE(r.states[0].delta());
  EXPECT_EQ(r.states[0].record_seq(), 2u);
  EXPECT_EQ(r.states[0].tasks_done_size(), 0);
  // What the log holds in memory, and what a replay finds.
  for (bool replay : {false, true}) {
    SCOPED_TRACE(replay ? "replayed" : "in memory");
    std::optional<proto::MasterState> replayed = replay ? Reopen() : log_->state();
    ASSERT_TRUE(replayed.has_value());
    const proto::MasterState* state = &*replayed;
    EXPECT_FALSE(state->delta());
    EXPECT_EQ(state->record_seq(), 4u);
    EXPECT_EQ(state->next_node_id(), 4u);
    EXPECT_THAT(state->tasks_done(), ::testing::ElementsAre(3, 5));
    EXPECT_EQ(state->task_leases().size(), 1u);
    EXPECT_EQ(state->task_leases().at(6), 7u);
    EXPECT_THAT(state->events(), ::testing::ElementsAre("first", "second"));
    EXPECT_EQ(state->view().epoch(), 5u);
    EXPECT_EQ(state->view().members_size(), 0);
  }
}

TEST_F(StateLogTest, TheLogRollsIntoASnapshotOnceItIsAsBigAndNothingIsLost) {
  StateLog::Options o;
  o.min_log_bytes = 256;
  Reopen(o);
  proto::MasterState whole = State(proto::JOB_RUNNING, 1);
  for (uint64_t t = 100; t < 150; ++t) whole.add_tasks_done(t);  // a snapshot of ~60 bytes
  ASSERT_THAT(log_->Append(whole), IsOk());
  for (uint32_t i = 1; i <= 500; ++i) {
    ASSERT_THAT(log_->Append(Delta(i, 1000 + i)), IsOk());
    auto log = fs_->ReadFile("/state/log");
    ASSERT_THAT(log.status(), IsOk());
    auto snapshot = fs_->ReadFile("/state/snapshot");
    ASSERT_THAT(snapshot.status(), IsOk());
    // Replay reads at most about twice the state.
    ASSERT_LE(log->size(), std::max<size_t>(o.min_log_bytes, snapshot->size())) << i;
  }
  auto state = Reopen(o);
  ASSERT_TRUE(state.has_value());
  EXPECT_EQ(state->next_node_id(), 500u);
  EXPECT_EQ(state->tasks_done_size(), 1 + 50 + 500);
  EXPECT_EQ(state->tasks_done(state->tasks_done_size() - 1), 1500u);
}

TEST_F(StateLogTest, ATornOrCorruptTailLosesOnlyThatRecord) {
  Reopen();
  ASSERT_THAT(log_->Append(State(proto::JOB_RUNNING, 1)), IsOk());  // the snapshot
  ASSERT_THAT(log_->Append(Delta(2, 10)), IsOk());
  ASSERT_THAT(log_->Append(Delta(3, 11)), IsOk());
  log_.reset();
  auto bytes = fs_->ReadFile("/state/log");
  ASSERT_THAT(bytes.status(), IsOk());
  auto snapshot = fs_->ReadFile("/state/snapshot");
  ASSERT_THAT(snapshot.status(), IsOk());
  const size_t one = EncodeStateRecord(Delta(3, 11)).size();
  // Every truncation of the last record, and a flipped bit in it.
  for (size_t cut = 1; cut < one; cut += 3) {
    ASSERT_THAT(fs_->WriteFileAtomic("/state/log", bytes->substr(0, bytes->size() - cut)), IsOk());
    auto state = Reopen();
    ASSERT_TRUE(state.has_value());
    EXPECT_EQ(state->next_node_id(), 2u) << cut;
    EXPECT_THAT(state->tasks_done(), ::testing::ElementsAre(3, 10)) << cut;
    log_.reset();
    // Put the snapshot back for the next round (the reopen rewrote it).
    ASSERT_THAT(fs_->WriteFileAtomic("/state/snapshot", *snapshot), IsOk());
  }
  std::string flipped = *bytes;
  flipped[flipped.size() - 3] ^= 0x10;
  ASSERT_THAT(fs_->WriteFileAtomic("/state/log", flipped), IsOk());
  EXPECT_EQ(Reopen()->next_node_id(), 2u);
}

TEST_F(StateLogTest, ARecordOfChangesWithoutItsPredecessorEndsTheReplay) {
  Reopen();
  ASSERT_THAT(log_->Append(State(proto::JOB_RUNNING, 1)), IsOk());
  log_.reset();
  proto::MasterState gap = Delta(9, 20);
  gap.set_record_seq(5);  // records 2 to 4 are missing
  ASSERT_THAT(fs_->WriteFileAtomic("/state/log", EncodeStateRecord(gap)), IsOk());
  auto state = Reopen();
  ASSERT_TRUE(state.has_value());
  EXPECT_EQ(state->next_node_id(), 1u);
  EXPECT_THAT(state->tasks_done(), ::testing::ElementsAre(3));
}

// A failed append leaves a tail that may be torn: nothing is appended
// after it; the next append writes the whole state as the snapshot, the
// failed records' changes included.
TEST_F(StateLogTest, AfterAFailedWriteTheNextRecordIsTheWholeState) {
  storage::FaultyFileSystem faulty(fs_.get());
  std::optional<proto::MasterState> state;
  auto log = StateLog::Open(&faulty, "/state", &state);
  ASSERT_THAT(log.status(), IsOk());
  ASSERT_THAT((*log)->Append(State(proto::JOB_RUNNING, 1)), IsOk());
  ASSERT_THAT((*log)->Append(Delta(2, 10)), IsOk());
  faulty.SetSpaceLimit(5);  // the disk fills part-way through the record
  EXPECT_THAT((*log)->Append(Delta(3, 11)),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("/state/log")));
  faulty.ClearFaults();
  ASSERT_THAT((*log)->Append(Delta(4, 12)), IsOk());
  log->reset();
  state = Reopen();
  ASSERT_TRUE(state.has_value());
  EXPECT_EQ(state->next_node_id(), 4u);
  EXPECT_THAT(state->tasks_done(), ::testing::ElementsAre(3, 10, 11, 12));
}

TEST_F(StateLogTest, ABadSnapshotIsAnErrorNamingIt) {
  ASSERT_THAT(fs_->CreateDirs("/state"), IsOk());
  ASSERT_THAT(fs_->WriteFileAtomic("/state/snapshot", "not a record"), IsOk());
  std::optional<proto::MasterState> state;
  EXPECT_THAT(StateLog::Open(fs_.get(), "/state", &state).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("/state/snapshot")));
}

}  // namespace
}  // namespace strata::master

namespace strata::master {
namespace {

// The state directory's lock (moved here from master_main.cc): a second
// holder is refused, naming the file and the holder's pid, until the first
// lets go.
// The master's side: what each record holds, and the group commit.
class StateRecorderTest : public StateLogTest {
 protected:
  // The small state of a master whose view is at `epoch`.
  static proto::MasterState Small(uint64_t epoch, uint32_t next_node_id) {
    proto::MasterState s;
    s.mutable_view()->set_epoch(epoch);
    s.set_next_node_id(next_node_id);
    s.set_job_state(proto::JOB_RUNNING);
    return s;
  }
  static proto::MasterState Tasks(std::vector<uint64_t> done) {
    proto::MasterState t;
    for (uint64_t id : done) t.add_tasks_done(id);
    return t;
  }
  uint64_t Record(StateRecorder* r, proto::MasterState small, proto::MasterState tasks) {
    return r->Record(
        std::move(small), std::move(tasks), events_.size(),
        [this](size_t from) {
          return std::vector<std::string>(events_.begin() + static_cast<ptrdiff_t>(from),
                                          events_.end());
        },
        [this] {
          ++wholes_;
          proto::MasterState w = Small(1, 1);
          for (const auto& e : events_) w.add_events(e);
          return w;
        });
  }
  std::vector<std::string> events_;
  int wholes_ = 0;
};

TEST_F(StateRecorderTest, RecordsWhatChangedOnceAndSyncsThemTogether) {
  storage::FaultyFileSystem faulty(fs_.get());
  std::optional<proto::MasterState> state;
  auto log = StateLog::Open(&faulty, "/state", &state);
  ASSERT_THAT(log.status(), IsOk());
  StateRecorder r(*std::move(log));
  const uint64_t first = Record(&r, Small(1, 1), Tasks({}));
  EXPECT_EQ(wholes_, 1);                                 // the first record is the whole state
  EXPECT_EQ(Record(&r, Small(1, 1), Tasks({})), first);  // nothing changed: no record
  events_.push_back("0.1s worker 0 joined");
  const uint64_t second = Record(&r, Small(2, 2), Tasks({5}));
  const uint64_t third = Record(&r, Small(2, 3), Tasks({6}));
  EXPECT_EQ(third, second + 1);
  EXPECT_EQ(wholes_, 1);
  ASSERT_THAT(r.AwaitDurable(third), IsOk());  // one write for all three
  EXPECT_THAT(r.AwaitDurable(second), IsOk());
  EXPECT_THAT(r.AwaitDurable(0), IsOk());  // (no record)
  // A disk that refuses: UNAVAILABLE, REASON_NOT_PERSISTED; the retry
  // queues a record again (the state log then writes its whole state), and
  // the one refused is durable with it.
  faulty.SetSpaceLimit(5);
  const uint64_t refused = Record(&r, Small(3, 4), Tasks({7}));
  const absl::Status s = r.AwaitDurable(refused);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(HasReason(s, proto::REASON_NOT_PERSISTED)) << s;
  EXPECT_EQ(r.AwaitDurable(refused).code(), absl::StatusCode::kUnavailable);  // still
  faulty.ClearFaults();
  const uint64_t retried = Record(&r, Small(3, 4), Tasks({}));
  EXPECT_GT(retried, refused);
  EXPECT_THAT(r.AwaitDurable(retried), IsOk());
  state = Reopen();
  ASSERT_TRUE(state.has_value());
  EXPECT_THAT(state->events(), ::testing::ElementsAre("0.1s worker 0 joined"));
  EXPECT_THAT(state->tasks_done(), ::testing::ElementsAre(5, 6, 7));
  EXPECT_EQ(state->next_node_id(), 4u);
}

TEST(StateDirLockTest, OneHolderAtATime) {
  const std::string dir = ::testing::TempDir() + "/state_dir_lock_test";
  auto fs = storage::NewPosixFileSystem();
  auto first = StateDirLock::Acquire(fs.get(), dir);
  ASSERT_THAT(first.status(), IsOk());
  EXPECT_THAT(
      StateDirLock::Acquire(fs.get(), dir).status(),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               AllOf(HasSubstr(dir + "/LOCK"), HasSubstr("held by another strata-master (pid " +
                                                         std::to_string(::getpid()) + ")"))));
  first->reset();
  EXPECT_THAT(StateDirLock::Acquire(fs.get(), dir).status(), IsOk());
}

// The lock goes through the file-system seam, so a test can fail it.
TEST(StateDirLockTest, AFailedLockIsAnErrorNamingIt) {
  auto mem = storage::NewMemoryFileSystem();
  storage::FaultyFileSystem fs(mem.get());
  fs.FailOp(storage::FsOp::kLock, "LOCK", absl::PermissionDeniedError("lock /s/LOCK: denied"));
  EXPECT_THAT(StateDirLock::Acquire(&fs, "/s").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("lock /s/LOCK: denied")));
  fs.ClearFaults();
  auto first = StateDirLock::Acquire(&fs, "/s");
  ASSERT_THAT(first.status(), IsOk());
  EXPECT_THAT(StateDirLock::Acquire(&fs, "/s").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("/s/LOCK: held by another strata-master")));
}

TEST(StateDirLockTest, ADirectoryThatCannotBeMadeIsAnErrorNamingIt) {
  auto fs = storage::NewPosixFileSystem();
  EXPECT_THAT(StateDirLock::Acquire(fs.get(), "/proc/strata-no-such/state").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("/proc/strata-no-such")));
}

}  // namespace
}  // namespace strata::master
