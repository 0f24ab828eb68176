#include "storage/faulty_file_system.h"

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/file_system.h"
#include "tests/testing/status_matchers.h"

namespace strata::storage {
namespace {

using ::strata::testing::IsOk;
using ::strata::testing::StatusIs;
using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::Eq;
using ::testing::HasSubstr;

// A FaultyFileSystem over a private memory file system. Checks read the
// base directly, so they see what is there whatever faults are set.
class FaultyFileSystemTest : public ::testing::Test {
 protected:
  // The base's contents of `path`, or "<absent>" when it does not exist.
  std::string Contents(const std::string& path) {
    absl::StatusOr<std::string> data = base_->ReadFile(path);
    if (data.ok()) return *data;
    if (absl::IsNotFound(data.status())) return "<absent>";
    return data.status().ToString();
  }

  std::unique_ptr<FileSystem> base_ = NewMemoryFileSystem();
  FaultyFileSystem fs_{base_.get()};
};

TEST_F(FaultyFileSystemTest, PassesOperationsThroughWithoutFaults) {
  ASSERT_THAT(fs_.WriteFileAtomic("/d/f", "contents"), IsOk());
  EXPECT_EQ(Contents("/d/f"), "contents");
  auto read = fs_.ReadFile("/d/f");
  ASSERT_THAT(read, IsOk());
  EXPECT_EQ(*read, "contents");
  auto names = fs_.ListDir("/d");
  ASSERT_THAT(names, IsOk());
  EXPECT_THAT(*names, ::testing::ElementsAre("f"));
  EXPECT_FALSE(fs_.crashed());
}

TEST_F(FaultyFileSystemTest, FailedAppendReturnsTheErrorAndWritesNothing) {
  STRATA_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> f, fs_.NewWritableFile("/d/f"));
  STRATA_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> g, fs_.NewWritableFile("/d/g"));
  ASSERT_THAT(f->Append("abc"), IsOk());
  fs_.FailOp(FsOp::kAppend, "/d/f", absl::UnavailableError("injected append error"));

  EXPECT_THAT(f->Append("def"),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("injected append error")));
  EXPECT_EQ(Contents("/d/f"), "abc");
  // Other paths are not affected.
  EXPECT_THAT(g->Append("xyz"), IsOk());
  EXPECT_EQ(Contents("/d/g"), "xyz");
}

TEST_F(FaultyFileSystemTest, FailedSyncReturnsTheErrorAndMakesNothingDurable) {
  STRATA_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> f, fs_.NewWritableFile("/d/f"));
  ASSERT_THAT(f->Append("abc"), IsOk());
  ASSERT_THAT(f->Sync(), IsOk());
  ASSERT_THAT(fs_.SyncDir("/d"), IsOk());
  ASSERT_THAT(f->Append("def"), IsOk());
  fs_.FailOp(FsOp::kSync, "/d/f", absl::InternalError("injected sync error"));

  EXPECT_THAT(f->Sync(), StatusIs(absl::StatusCode::kInternal, HasSubstr("injected sync error")));
  EXPECT_EQ(Contents("/d/f"), "abcdef");
  fs_.DropUnsyncedData();
  EXPECT_EQ(Contents("/d/f"), "abc");
}

// An appendable file: what it held is durable, what is appended after it only
// once synced; a cut also cuts what is durable.
TEST_F(FaultyFileSystemTest, AppendableFilesKeepTheirDurablePart) {
  ASSERT_THAT(base_->WriteFileAtomic("/d/log", "old\n"), IsOk());
  STRATA_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> f, fs_.NewAppendableFile("/d/log"));
  ASSERT_THAT(f->Append("new\n"), IsOk());
  fs_.FailOp(FsOp::kTruncate, "/d/log", absl::InternalError("injected truncate error"), 1);
  EXPECT_THAT(f->Truncate(4),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("injected truncate error")));
  ASSERT_THAT(f->Truncate(4), IsOk());
  ASSERT_THAT(f->Append("x"), IsOk());
  ASSERT_THAT(f->Sync(), IsOk());
  ASSERT_THAT(f->Append("lost"), IsOk());
  EXPECT_EQ(Contents("/d/log"), "old\nxlost");
  fs_.DropUnsyncedData();
  EXPECT_EQ(Contents("/d/log"), "old\nx");
}

TEST_F(FaultyFileSystemTest, FailedLockIsTheInjectedError) {
  fs_.FailOp(FsOp::kLock, "LOCK", absl::PermissionDeniedError("injected lock error"), 1);
  EXPECT_THAT(fs_.LockFile("/d/LOCK").status(),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("injected lock error")));
  EXPECT_THAT(fs_.LockFile("/d/LOCK").status(), IsOk());
}

TEST_F(FaultyFileSystemTest, FailedRenameLeavesTheSourceInPlace) {
  ASSERT_THAT(fs_.WriteFileAtomic("/d/a", "A"), IsOk());
  fs_.FailOp(FsOp::kRename, "/d/", absl::PermissionDeniedError("injected rename error"));

  EXPECT_THAT(fs_.RenameFile("/d/a", "/d/b"),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("injected rename error")));
  EXPECT_EQ(Contents("/d/a"), "A");
  EXPECT_FALSE(base_->Exists("/d/b"));
}

TEST_F(FaultyFileSystemTest, FailedSyncDirMakesNothingDurable) {
  STRATA_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> f, fs_.NewWritableFile("/d/new"));
  ASSERT_THAT(f->Append("data"), IsOk());
  ASSERT_THAT(f->Sync(), IsOk());
  ASSERT_THAT(f->Close(), IsOk());
  fs_.FailOp(FsOp::kSyncDir, "/d", absl::InternalError("injected syncdir error"));

  EXPECT_THAT(fs_.SyncDir("/d"),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("injected syncdir error")));
  fs_.DropUnsyncedData();
  EXPECT_FALSE(base_->Exists("/d/new"));
}

TEST_F(FaultyFileSystemTest, FaultWithACountFailsOnlyThatManyTimes) {
  STRATA_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> f, fs_.NewWritableFile("/d/f"));
  fs_.FailOp(FsOp::kAppend, "", absl::UnavailableError("once"), /*count=*/1);
  EXPECT_THAT(f->Append("x"), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(f->Append("y"), IsOk());
  EXPECT_THAT(f->Append("z"), IsOk());
  EXPECT_EQ(Contents("/d/f"), "yz");

  fs_.FailOp(FsOp::kAppend, "", absl::UnavailableError("twice"), /*count=*/2);
  EXPECT_THAT(f->Append("1"), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(f->Append("2"), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(f->Append("3"), IsOk());
  EXPECT_EQ(Contents("/d/f"), "yz3");
}

TEST_F(FaultyFileSystemTest, ClearFaultsEndsInjectedErrors) {
  STRATA_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> f, fs_.NewWritableFile("/d/f"));
  fs_.FailOp(FsOp::kAppend, "", absl::UnavailableError("always"));
  EXPECT_THAT(f->Append("a"), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(f->Append("b"), StatusIs(absl::StatusCode::kUnavailable));
  fs_.ClearFaults();
  EXPECT_THAT(f->Append("c"), IsOk());
  EXPECT_EQ(Contents("/d/f"), "c");
}

TEST_F(FaultyFileSystemTest, SpaceLimitWritesWhatFitsThenFailsWithNoSpace) {
  const std::string path = "/d/f";
  STRATA_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> f, fs_.NewWritableFile(path));
  fs_.SetSpaceLimit(5);
  ASSERT_THAT(f->Append("abc"), IsOk());
  EXPECT_THAT(f->Append("defgh"),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("No space left on device"), HasSubstr(path))));
  EXPECT_EQ(Contents(path), "abcde");
  EXPECT_THAT(f->Append("x"), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(Contents(path), "abcde");

  fs_.SetSpaceLimit(-1);
  EXPECT_THAT(f->Append("x"), IsOk());
  EXPECT_EQ(Contents(path), "abcdex");
}

TEST_F(FaultyFileSystemTest, CrashAfterFailsTheNthWriteOpAndEverythingAfter) {
  ASSERT_THAT(fs_.WriteFileAtomic("/d/old", "durable"), IsOk());
  fs_.CrashAfter(2);
  STRATA_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> f,
                              fs_.NewWritableFile("/d/f"));  // op 0
  ASSERT_THAT(f->Append("abc"), IsOk());                     // op 1
  EXPECT_FALSE(fs_.crashed());

  EXPECT_THAT(f->Append("def"),  // op 2
              StatusIs(absl::StatusCode::kAborted, HasSubstr("simulated crash")));
  EXPECT_TRUE(fs_.crashed());
  EXPECT_EQ(Contents("/d/f"), "abc");

  const auto aborted = StatusIs(absl::StatusCode::kAborted);
  EXPECT_THAT(f->Append("ghi"), aborted);
  EXPECT_THAT(f->Sync(), aborted);
  EXPECT_THAT(f->Close(), aborted);
  EXPECT_THAT(fs_.ReadFile("/d/old"), aborted);
  EXPECT_THAT(fs_.FileSize("/d/old"), aborted);
  EXPECT_THAT(fs_.ListDir("/d"), aborted);
  EXPECT_THAT(fs_.NewWritableFile("/d/g"), aborted);
  EXPECT_THAT(fs_.RenameFile("/d/old", "/d/renamed"), aborted);
  EXPECT_THAT(fs_.SyncDir("/d"), aborted);
  EXPECT_THAT(fs_.DeleteFile("/d/old"), aborted);
  EXPECT_THAT(fs_.CreateDirs("/e"), aborted);
  EXPECT_THAT(fs_.DeleteDir("/d"), aborted);
  EXPECT_THAT(fs_.WriteFileAtomic("/d/h", "x"), aborted);
  EXPECT_TRUE(fs_.crashed());

  // None of them had an effect.
  EXPECT_EQ(Contents("/d/f"), "abc");
  EXPECT_EQ(Contents("/d/old"), "durable");
  EXPECT_FALSE(base_->Exists("/d/g"));
  EXPECT_FALSE(base_->Exists("/d/renamed"));
  EXPECT_FALSE(base_->Exists("/d/h"));
  EXPECT_FALSE(base_->Exists("/e"));
}

TEST_F(FaultyFileSystemTest, CrashAfterZeroFailsTheNextWriteOp) {
  fs_.CrashAfter(0);
  EXPECT_THAT(fs_.NewWritableFile("/d/f"), StatusIs(absl::StatusCode::kAborted));
  EXPECT_TRUE(fs_.crashed());
  EXPECT_FALSE(base_->Exists("/d/f"));
}

TEST_F(FaultyFileSystemTest, ReadsDoNotCountTowardsTheCrash) {
  ASSERT_THAT(fs_.WriteFileAtomic("/d/f", "x"), IsOk());
  fs_.CrashAfter(1);
  EXPECT_THAT(fs_.ReadFile("/d/f"), IsOk());
  EXPECT_THAT(fs_.FileSize("/d/f"), IsOk());
  EXPECT_THAT(fs_.ListDir("/d"), IsOk());
  EXPECT_THAT(fs_.CreateDirs("/e"), IsOk());  // op 0
  EXPECT_FALSE(fs_.crashed());
  EXPECT_THAT(fs_.CreateDirs("/g"), StatusIs(absl::StatusCode::kAborted));  // op 1
  EXPECT_TRUE(fs_.crashed());
}

TEST_F(FaultyFileSystemTest, WriteOpsCountsWriteOperationsOnly) {
  EXPECT_EQ(fs_.write_ops(), 0);
  STRATA_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> f, fs_.NewWritableFile("/d/f"));
  EXPECT_EQ(fs_.write_ops(), 1);
  ASSERT_THAT(f->Append("abc"), IsOk());
  EXPECT_EQ(fs_.write_ops(), 2);
  ASSERT_THAT(f->Sync(), IsOk());
  EXPECT_EQ(fs_.write_ops(), 3);
  ASSERT_THAT(f->Close(), IsOk());
  EXPECT_EQ(fs_.write_ops(), 4);

  ASSERT_THAT(fs_.ReadFile("/d/f"), IsOk());
  ASSERT_THAT(fs_.FileSize("/d/f"), IsOk());
  ASSERT_THAT(fs_.ListDir("/d"), IsOk());
  EXPECT_TRUE(fs_.Exists("/d/f"));
  EXPECT_TRUE(fs_.IsDirectory("/d"));
  EXPECT_EQ(fs_.write_ops(), 4);

  ASSERT_THAT(fs_.RenameFile("/d/f", "/d/g"), IsOk());
  EXPECT_EQ(fs_.write_ops(), 5);
  ASSERT_THAT(fs_.SyncDir("/d"), IsOk());
  EXPECT_EQ(fs_.write_ops(), 6);
  ASSERT_THAT(fs_.CreateDirs("/e"), IsOk());
  EXPECT_EQ(fs_.write_ops(), 7);
  ASSERT_THAT(fs_.DeleteDir("/e"), IsOk());
  EXPECT_EQ(fs_.write_ops(), 8);
  ASSERT_THAT(fs_.DeleteFile("/d/g"), IsOk());
  EXPECT_EQ(fs_.write_ops(), 9);
}

TEST_F(FaultyFileSystemTest, DropUnsyncedDataLosesUnsyncedAppends) {
  STRATA_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> f, fs_.NewWritableFile("/d/f"));
  ASSERT_THAT(f->Append("synced"), IsOk());
  ASSERT_THAT(f->Sync(), IsOk());
  ASSERT_THAT(fs_.SyncDir("/d"), IsOk());
  ASSERT_THAT(f->Append("ABCDEFGH"), IsOk());
  EXPECT_EQ(Contents("/d/f"), "syncedABCDEFGH");

  fs_.DropUnsyncedData();
  EXPECT_EQ(Contents("/d/f"), "synced");
}

TEST_F(FaultyFileSystemTest, DropUnsyncedDataTornKeepsHalfTheUnsyncedTail) {
  STRATA_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> f, fs_.NewWritableFile("/d/f"));
  ASSERT_THAT(f->Append("synced"), IsOk());
  ASSERT_THAT(f->Sync(), IsOk());
  ASSERT_THAT(fs_.SyncDir("/d"), IsOk());
  ASSERT_THAT(f->Append("ABCDEFGH"), IsOk());

  fs_.DropUnsyncedData(/*torn=*/true);
  EXPECT_EQ(Contents("/d/f"), "syncedABCD");
}

TEST_F(FaultyFileSystemTest, SyncedFileWhoseDirectoryWasNeverSyncedDisappears) {
  STRATA_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> f, fs_.NewWritableFile("/d/new"));
  ASSERT_THAT(f->Append("data"), IsOk());
  ASSERT_THAT(f->Sync(), IsOk());
  ASSERT_THAT(f->Close(), IsOk());

  fs_.DropUnsyncedData();
  EXPECT_FALSE(base_->Exists("/d/new"));
}

TEST_F(FaultyFileSystemTest, NewFileSurvivesOnceItsDirectoryIsSynced) {
  STRATA_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> f, fs_.NewWritableFile("/d/new"));
  ASSERT_THAT(f->Append("data"), IsOk());
  ASSERT_THAT(f->Sync(), IsOk());
  ASSERT_THAT(f->Close(), IsOk());
  ASSERT_THAT(fs_.SyncDir("/d"), IsOk());

  fs_.DropUnsyncedData();
  EXPECT_EQ(Contents("/d/new"), "data");
}

TEST_F(FaultyFileSystemTest, RenameWithoutSyncDirIsUndone) {
  ASSERT_THAT(fs_.WriteFileAtomic("/d/old", "contents"), IsOk());
  ASSERT_THAT(fs_.RenameFile("/d/old", "/d/new"), IsOk());
  EXPECT_FALSE(base_->Exists("/d/old"));
  EXPECT_EQ(Contents("/d/new"), "contents");

  fs_.DropUnsyncedData();
  EXPECT_EQ(Contents("/d/old"), "contents");
  EXPECT_FALSE(base_->Exists("/d/new"));
}

TEST_F(FaultyFileSystemTest, RenameOfAFileWrittenBeforeWrappingIsUndone) {
  // Files the faulty file system never saw count as durable.
  ASSERT_THAT(base_->WriteFileAtomic("/d/old", "from before"), IsOk());
  ASSERT_THAT(fs_.RenameFile("/d/old", "/d/new"), IsOk());

  fs_.DropUnsyncedData();
  EXPECT_EQ(Contents("/d/old"), "from before");
  EXPECT_FALSE(base_->Exists("/d/new"));
}

TEST_F(FaultyFileSystemTest, RenameSurvivesOnceTheDirectoryIsSynced) {
  ASSERT_THAT(fs_.WriteFileAtomic("/d/old", "contents"), IsOk());
  ASSERT_THAT(fs_.RenameFile("/d/old", "/d/new"), IsOk());
  ASSERT_THAT(fs_.SyncDir("/d"), IsOk());

  fs_.DropUnsyncedData();
  EXPECT_EQ(Contents("/d/new"), "contents");
  EXPECT_FALSE(base_->Exists("/d/old"));
}

TEST_F(FaultyFileSystemTest, WorksAgainAfterDropUnsyncedData) {
  fs_.FailOp(FsOp::kAppend, "", absl::InternalError("injected"));
  fs_.SetSpaceLimit(0);
  fs_.CrashAfter(0);
  EXPECT_THAT(fs_.WriteFileAtomic("/d/f", "lost"), StatusIs(absl::StatusCode::kAborted));
  EXPECT_TRUE(fs_.crashed());

  fs_.DropUnsyncedData();
  EXPECT_FALSE(fs_.crashed());
  // Neither the crash nor the append fault nor the space limit is left.
  ASSERT_THAT(fs_.WriteFileAtomic("/d/f", "after the reboot"), IsOk());
  auto read = fs_.ReadFile("/d/f");
  ASSERT_THAT(read, IsOk());
  EXPECT_EQ(*read, "after the reboot");
  EXPECT_FALSE(fs_.crashed());
}

// A crash anywhere inside WriteFileAtomic, followed by the loss of what was
// not durable, leaves the old file or the whole new one: never a torn or
// missing one.
TEST(FaultyFileSystemCrashTest, WriteFileAtomicIsAllOrNothingAtEveryCrashPoint) {
  const std::string path = "/d/target";
  const std::string old_contents = "old contents, longer than the new ones";
  const std::string new_contents = "new contents";

  // The write ops a successful WriteFileAtomic takes.
  int64_t ops = 0;
  {
    std::unique_ptr<FileSystem> base = NewMemoryFileSystem();
    FaultyFileSystem fs(base.get());
    ASSERT_THAT(fs.WriteFileAtomic(path, old_contents), IsOk());
    const int64_t before = fs.write_ops();
    ASSERT_THAT(fs.WriteFileAtomic(path, new_contents), IsOk());
    ops = fs.write_ops() - before;
  }
  ASSERT_GE(ops, 3);  // at least: write the temp file, rename, sync the directory

  for (const bool had_old : {true, false}) {
    for (const bool torn : {false, true}) {
      for (int64_t n = 0; n <= ops; ++n) {
        SCOPED_TRACE(absl::StrCat("had_old=", had_old, " torn=", torn, " crash at write op ", n,
                                  " of ", ops));
        std::unique_ptr<FileSystem> base = NewMemoryFileSystem();
        FaultyFileSystem fs(base.get());
        if (had_old) ASSERT_THAT(fs.WriteFileAtomic(path, old_contents), IsOk());

        fs.CrashAfter(n);
        const absl::Status status = fs.WriteFileAtomic(path, new_contents);
        if (n < ops) {
          EXPECT_THAT(status, StatusIs(absl::StatusCode::kAborted));
          EXPECT_TRUE(fs.crashed());
        } else {
          EXPECT_THAT(status, IsOk());
          EXPECT_FALSE(fs.crashed());
        }

        fs.DropUnsyncedData(torn);
        absl::StatusOr<std::string> after = fs.ReadFile(path);
        std::string got;
        if (after.ok()) {
          got = *after;
        } else if (absl::IsNotFound(after.status())) {
          got = "<absent>";
        } else {
          got = after.status().ToString();
        }
        const std::string old_state = had_old ? old_contents : "<absent>";
        if (status.ok()) {
          // Once WriteFileAtomic returned OK the new contents are durable.
          EXPECT_EQ(got, new_contents);
        } else {
          EXPECT_THAT(got, AnyOf(Eq(old_state), Eq(new_contents)));
        }
      }
    }
  }
}

}  // namespace
}  // namespace strata::storage
