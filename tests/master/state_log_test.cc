#include "master/state_log.h"

#include <unistd.h>

#include <optional>
#include <string>

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

proto::MasterState State(const std::string& job_state, uint32_t next_node_id) {
  proto::MasterState s;
  s.set_job_state(job_state);
  s.set_next_node_id(next_node_id);
  s.add_tasks_done(3);
  return s;
}

class StateLogTest : public ::testing::Test {
 protected:
  std::optional<proto::MasterState> Reopen() {
    std::optional<proto::MasterState> state;
    auto log = StateLog::Open(fs_.get(), "/state", &state);
    EXPECT_THAT(log.status(), IsOk());
    if (log.ok()) log_ = std::move(*log);
    return state;
  }
  std::unique_ptr<storage::FileSystem> fs_ = storage::NewMemoryFileSystem();
  std::unique_ptr<StateLog> log_;
};

TEST_F(StateLogTest, AnEmptyDirectoryHasNoStateAndTheNewestRecordWins) {
  EXPECT_FALSE(Reopen().has_value());
  ASSERT_THAT(log_->Append(State("waiting", 2)), IsOk());
  ASSERT_THAT(log_->Append(State("running", 5)), IsOk());
  auto state = Reopen();
  ASSERT_TRUE(state.has_value());
  EXPECT_EQ(state->job_state(), "running");
  EXPECT_EQ(state->next_node_id(), 5u);
  // Reopening wrote it as the snapshot: it survives another reopen, and
  // records appended after it are newer.
  ASSERT_THAT(log_->Append(State("evaluating", 6)), IsOk());
  EXPECT_EQ(Reopen()->job_state(), "evaluating");
}

TEST_F(StateLogTest, ManyRecordsRollIntoSnapshotsAndNothingIsLost) {
  Reopen();
  for (uint32_t i = 1; i <= 3 * StateLog::kSnapshotEvery + 5; ++i) {
    ASSERT_THAT(log_->Append(State("running", i)), IsOk());
  }
  auto log = fs_->ReadFile("/state/log");
  ASSERT_THAT(log.status(), IsOk());
  // The log holds the records since the last snapshot only.
  EXPECT_LT(log->size(), 20 * EncodeStateRecord(State("running", 1)).size());
  EXPECT_EQ(Reopen()->next_node_id(), 3u * StateLog::kSnapshotEvery + 5);
}

TEST_F(StateLogTest, ATornOrCorruptTailLosesOnlyThatRecord) {
  Reopen();
  ASSERT_THAT(log_->Append(State("running", 2)), IsOk());
  ASSERT_THAT(log_->Append(State("running", 3)), IsOk());
  log_.reset();
  auto bytes = fs_->ReadFile("/state/log");
  ASSERT_THAT(bytes.status(), IsOk());
  const size_t one = EncodeStateRecord(State("running", 3)).size();
  // Every truncation of the last record, and a flipped bit in it.
  for (size_t cut = 1; cut < one; cut += 7) {
    ASSERT_THAT(fs_->WriteFileAtomic("/state/log", bytes->substr(0, bytes->size() - cut)), IsOk());
    auto state = Reopen();
    ASSERT_TRUE(state.has_value());
    EXPECT_EQ(state->next_node_id(), 2u) << cut;
    log_.reset();
    // Put the two records back for the next round (the reopen rewrote them).
    ASSERT_THAT(fs_->DeleteFile("/state/snapshot"), IsOk());
  }
  std::string flipped = *bytes;
  flipped[flipped.size() - 3] ^= 0x10;
  ASSERT_THAT(fs_->WriteFileAtomic("/state/log", flipped), IsOk());
  EXPECT_EQ(Reopen()->next_node_id(), 2u);
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
