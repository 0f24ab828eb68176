#include "storage/file_system.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace strata::storage {
namespace {

using ::strata::testing::IsOk;
using ::strata::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Runs every test against both implementations. The POSIX one works in a
// fresh mkdtemp directory, removed afterwards.
struct FsFactory {
  std::string name;
  std::function<std::unique_ptr<FileSystem>()> make;
  bool posix;
};

class FileSystemTest : public ::testing::TestWithParam<FsFactory> {
 protected:
  void SetUp() override {
    fs_ = GetParam().make();
    if (GetParam().posix) {
      std::string templ = absl::StrCat(::testing::TempDir(), "strata_fs_test.XXXXXX");
      ASSERT_NE(mkdtemp(templ.data()), nullptr);
      root_ = templ;
    } else {
      root_ = "/mem";
    }
  }

  void TearDown() override {
    if (GetParam().posix && !root_.empty()) {
      std::string cmd = absl::StrCat("rm -rf '", root_, "'");
      ASSERT_EQ(std::system(cmd.c_str()), 0);
    }
  }

  std::string Path(const std::string& rel) const { return absl::StrCat(root_, "/", rel); }

  std::unique_ptr<FileSystem> fs_;
  std::string root_;
};

TEST_P(FileSystemTest, WriteThenRead) {
  const std::string path = Path("a.bin");
  std::string contents("hello\0world", 11);
  ASSERT_THAT(fs_->WriteFileAtomic(path, contents), IsOk());
  auto read = fs_->ReadFile(path);
  ASSERT_THAT(read, IsOk());
  EXPECT_EQ(*read, contents);
  auto size = fs_->FileSize(path);
  ASSERT_THAT(size, IsOk());
  EXPECT_EQ(*size, 11u);
}

TEST_P(FileSystemTest, EmptyAndLargeFiles) {
  ASSERT_THAT(fs_->WriteFileAtomic(Path("empty"), ""), IsOk());
  auto empty = fs_->ReadFile(Path("empty"));
  ASSERT_THAT(empty, IsOk());
  EXPECT_EQ(*empty, "");

  std::string big(1 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 31);
  ASSERT_THAT(fs_->WriteFileAtomic(Path("big"), big), IsOk());
  auto read = fs_->ReadFile(Path("big"));
  ASSERT_THAT(read, IsOk());
  EXPECT_EQ(*read, big);
}

TEST_P(FileSystemTest, AtomicWriteReplacesAndLeavesNoTempFile) {
  const std::string path = Path("current");
  ASSERT_THAT(fs_->WriteFileAtomic(path, "old contents, longer"), IsOk());
  ASSERT_THAT(fs_->WriteFileAtomic(path, "new"), IsOk());
  auto read = fs_->ReadFile(path);
  ASSERT_THAT(read, IsOk());
  EXPECT_EQ(*read, "new");
  EXPECT_FALSE(fs_->Exists(path + ".tmp"));
}

TEST_P(FileSystemTest, ReadMissingIsNotFoundNamingThePath) {
  const std::string path = Path("missing/file");
  EXPECT_THAT(fs_->ReadFile(path), StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
  EXPECT_THAT(fs_->FileSize(path), StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
  EXPECT_FALSE(fs_->Exists(path));
}

TEST_P(FileSystemTest, CreateDirsIsMkdirP) {
  const std::string dir = Path("x/y/z");
  ASSERT_THAT(fs_->CreateDirs(dir), IsOk());
  EXPECT_TRUE(fs_->Exists(Path("x")));
  EXPECT_TRUE(fs_->Exists(Path("x/y")));
  EXPECT_TRUE(fs_->Exists(dir));
  // Again: already there is fine.
  ASSERT_THAT(fs_->CreateDirs(dir), IsOk());
  ASSERT_THAT(fs_->CreateDirs(dir + "/"), IsOk());

  ASSERT_THAT(fs_->WriteFileAtomic(dir + "/f", "data"), IsOk());
  EXPECT_TRUE(fs_->Exists(dir + "/f"));
}

TEST_P(FileSystemTest, CreateDirsThroughAFileFails) {
  ASSERT_THAT(fs_->WriteFileAtomic(Path("file"), "x"), IsOk());
  absl::Status status = fs_->CreateDirs(Path("file/sub"));
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr(Path("file")));
}

TEST_P(FileSystemTest, ConcurrentWritersOfDifferentFiles) {
  constexpr int kThreads = 4;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([this, t] {
      for (int i = 0; i < 20; ++i) {
        EXPECT_THAT(fs_->WriteFileAtomic(Path(absl::StrCat("t", t)), absl::StrCat(t, ":", i)),
                    IsOk());
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    auto read = fs_->ReadFile(Path(absl::StrCat("t", t)));
    ASSERT_THAT(read, IsOk());
    EXPECT_EQ(*read, absl::StrCat(t, ":19"));
  }
}

TEST_P(FileSystemTest, NewWritableFileCreatesAnEmptyFile) {
  const std::string path = Path("w");
  STRATA_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> f, fs_->NewWritableFile(path));
  EXPECT_TRUE(fs_->Exists(path));
  EXPECT_FALSE(fs_->IsDirectory(path));
  ASSERT_THAT(f->Close(), IsOk());
  auto read = fs_->ReadFile(path);
  ASSERT_THAT(read, IsOk());
  EXPECT_EQ(*read, "");
}

TEST_P(FileSystemTest, NewWritableFileTruncatesAnExistingFile) {
  const std::string path = Path("w");
  ASSERT_THAT(fs_->WriteFileAtomic(path, "old contents, longer than the new"), IsOk());
  STRATA_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> f, fs_->NewWritableFile(path));
  auto empty = fs_->ReadFile(path);
  ASSERT_THAT(empty, IsOk());
  EXPECT_EQ(*empty, "");
  ASSERT_THAT(f->Append("new"), IsOk());
  ASSERT_THAT(f->Close(), IsOk());
  auto read = fs_->ReadFile(path);
  ASSERT_THAT(read, IsOk());
  EXPECT_EQ(*read, "new");
}

TEST_P(FileSystemTest, AppendsConcatenate) {
  const std::string path = Path("w");
  const std::string binary("c\0d", 3);
  std::string big(100000, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7);
  STRATA_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> f, fs_->NewWritableFile(path));
  ASSERT_THAT(f->Append("ab"), IsOk());
  ASSERT_THAT(f->Append(""), IsOk());
  ASSERT_THAT(f->Append(binary), IsOk());
  ASSERT_THAT(f->Append(big), IsOk());
  ASSERT_THAT(f->Sync(), IsOk());
  ASSERT_THAT(f->Append("tail"), IsOk());
  ASSERT_THAT(f->Close(), IsOk());
  const std::string expected = absl::StrCat("ab", binary, big, "tail");
  auto read = fs_->ReadFile(path);
  ASSERT_THAT(read, IsOk());
  EXPECT_EQ(read->size(), expected.size());
  EXPECT_TRUE(*read == expected);
  auto size = fs_->FileSize(path);
  ASSERT_THAT(size, IsOk());
  EXPECT_EQ(*size, expected.size());
}

TEST_P(FileSystemTest, AppendAfterCloseIsFailedPreconditionAndCloseIsIdempotent) {
  const std::string path = Path("w");
  STRATA_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> f, fs_->NewWritableFile(path));
  ASSERT_THAT(f->Append("a"), IsOk());
  EXPECT_THAT(f->Close(), IsOk());
  EXPECT_THAT(f->Close(), IsOk());
  EXPECT_THAT(f->Append("b"), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(path)));
  auto read = fs_->ReadFile(path);
  ASSERT_THAT(read, IsOk());
  EXPECT_EQ(*read, "a");
}

TEST_P(FileSystemTest, RenameReplacesTheTarget) {
  const std::string from = Path("from");
  const std::string to = Path("to");
  ASSERT_THAT(fs_->WriteFileAtomic(from, "new"), IsOk());
  ASSERT_THAT(fs_->WriteFileAtomic(to, "old contents"), IsOk());
  ASSERT_THAT(fs_->RenameFile(from, to), IsOk());
  EXPECT_FALSE(fs_->Exists(from));
  auto read = fs_->ReadFile(to);
  ASSERT_THAT(read, IsOk());
  EXPECT_EQ(*read, "new");
}

TEST_P(FileSystemTest, RenameToANewNameMovesTheFile) {
  ASSERT_THAT(fs_->WriteFileAtomic(Path("a"), "data"), IsOk());
  ASSERT_THAT(fs_->RenameFile(Path("a"), Path("b")), IsOk());
  EXPECT_FALSE(fs_->Exists(Path("a")));
  auto read = fs_->ReadFile(Path("b"));
  ASSERT_THAT(read, IsOk());
  EXPECT_EQ(*read, "data");
}

TEST_P(FileSystemTest, RenameOfAMissingFileIsNotFoundNamingIt) {
  const std::string from = Path("missing");
  const std::string to = Path("to");
  ASSERT_THAT(fs_->WriteFileAtomic(to, "untouched"), IsOk());
  EXPECT_THAT(fs_->RenameFile(from, to), StatusIs(absl::StatusCode::kNotFound, HasSubstr(from)));
  auto read = fs_->ReadFile(to);
  ASSERT_THAT(read, IsOk());
  EXPECT_EQ(*read, "untouched");
}

TEST_P(FileSystemTest, SyncDirOfAnExistingDirectoryIsOk) {
  ASSERT_THAT(fs_->CreateDirs(Path("d")), IsOk());
  EXPECT_THAT(fs_->SyncDir(Path("d")), IsOk());
  ASSERT_THAT(fs_->WriteFileAtomic(Path("d/f"), "x"), IsOk());
  EXPECT_THAT(fs_->SyncDir(Path("d")), IsOk());
  EXPECT_THAT(fs_->SyncDir(root_), IsOk());
}

TEST_P(FileSystemTest, SyncDirOfAMissingDirectoryFails) {
  const std::string dir = Path("missing");
  EXPECT_THAT(fs_->SyncDir(dir), StatusIs(absl::StatusCode::kNotFound, HasSubstr(dir)));
}

TEST_P(FileSystemTest, ListDirGivesSortedNamesOfFilesAndDirectories) {
  ASSERT_THAT(fs_->CreateDirs(Path("d/sub")), IsOk());
  ASSERT_THAT(fs_->CreateDirs(Path("d/empty")), IsOk());
  ASSERT_THAT(fs_->WriteFileAtomic(Path("d/b"), "b"), IsOk());
  ASSERT_THAT(fs_->WriteFileAtomic(Path("d/a"), "a"), IsOk());
  ASSERT_THAT(fs_->WriteFileAtomic(Path("d/sub/inner"), "i"), IsOk());
  // Siblings whose names start with "d" are not in it.
  ASSERT_THAT(fs_->WriteFileAtomic(Path("d.txt"), "s"), IsOk());
  ASSERT_THAT(fs_->WriteFileAtomic(Path("d0"), "s"), IsOk());

  auto names = fs_->ListDir(Path("d"));
  ASSERT_THAT(names, IsOk());
  EXPECT_THAT(*names, ElementsAre("a", "b", "empty", "sub"));
  auto inner = fs_->ListDir(Path("d/sub"));
  ASSERT_THAT(inner, IsOk());
  EXPECT_THAT(*inner, ElementsAre("inner"));
  auto empty = fs_->ListDir(Path("d/empty"));
  ASSERT_THAT(empty, IsOk());
  EXPECT_THAT(*empty, ::testing::IsEmpty());
}

TEST_P(FileSystemTest, ListDirOfAMissingDirectoryIsNotFound) {
  const std::string dir = Path("missing");
  EXPECT_THAT(fs_->ListDir(dir), StatusIs(absl::StatusCode::kNotFound, HasSubstr(dir)));
}

TEST_P(FileSystemTest, DeleteFileRemovesItAndAMissingOneIsNotFound) {
  const std::string path = Path("f");
  ASSERT_THAT(fs_->WriteFileAtomic(path, "x"), IsOk());
  ASSERT_THAT(fs_->DeleteFile(path), IsOk());
  EXPECT_FALSE(fs_->Exists(path));
  EXPECT_THAT(fs_->DeleteFile(path), StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
}

TEST_P(FileSystemTest, DeleteDirRemovesOnlyAnEmptyDirectory) {
  const std::string dir = Path("d");
  ASSERT_THAT(fs_->CreateDirs(dir), IsOk());
  ASSERT_THAT(fs_->WriteFileAtomic(dir + "/f", "x"), IsOk());

  const absl::Status not_empty = fs_->DeleteDir(dir);
  EXPECT_FALSE(not_empty.ok());
  EXPECT_THAT(not_empty.message(), HasSubstr(dir));
  EXPECT_TRUE(fs_->IsDirectory(dir));
  EXPECT_TRUE(fs_->Exists(dir + "/f"));

  ASSERT_THAT(fs_->DeleteFile(dir + "/f"), IsOk());
  EXPECT_THAT(fs_->DeleteDir(dir), IsOk());
  EXPECT_FALSE(fs_->Exists(dir));
  EXPECT_THAT(fs_->DeleteDir(dir), StatusIs(absl::StatusCode::kNotFound, HasSubstr(dir)));
}

TEST_P(FileSystemTest, IsDirectoryTellsDirectoriesFromFiles) {
  ASSERT_THAT(fs_->CreateDirs(Path("d")), IsOk());
  ASSERT_THAT(fs_->WriteFileAtomic(Path("d/f"), "x"), IsOk());
  EXPECT_TRUE(fs_->IsDirectory(Path("d")));
  EXPECT_TRUE(fs_->IsDirectory(Path("d/")));
  EXPECT_FALSE(fs_->IsDirectory(Path("d/f")));
  EXPECT_FALSE(fs_->IsDirectory(Path("missing")));
}

TEST_P(FileSystemTest, DeleteRecursivelyRemovesANestedTree) {
  ASSERT_THAT(fs_->CreateDirs(Path("t/a/b")), IsOk());
  ASSERT_THAT(fs_->CreateDirs(Path("t/c")), IsOk());
  ASSERT_THAT(fs_->WriteFileAtomic(Path("t/f1"), "1"), IsOk());
  ASSERT_THAT(fs_->WriteFileAtomic(Path("t/a/f2"), "2"), IsOk());
  ASSERT_THAT(fs_->WriteFileAtomic(Path("t/a/b/f3"), "3"), IsOk());
  // A sibling sharing the name's prefix stays.
  ASSERT_THAT(fs_->WriteFileAtomic(Path("t2"), "keep"), IsOk());

  ASSERT_THAT(fs_->DeleteRecursively(Path("t")), IsOk());
  EXPECT_FALSE(fs_->Exists(Path("t")));
  EXPECT_FALSE(fs_->Exists(Path("t/a/b/f3")));
  EXPECT_FALSE(fs_->Exists(Path("t/c")));
  auto kept = fs_->ReadFile(Path("t2"));
  ASSERT_THAT(kept, IsOk());
  EXPECT_EQ(*kept, "keep");
}

TEST_P(FileSystemTest, DeleteRecursivelyOfAFileOrAMissingPath) {
  ASSERT_THAT(fs_->WriteFileAtomic(Path("f"), "x"), IsOk());
  ASSERT_THAT(fs_->DeleteRecursively(Path("f")), IsOk());
  EXPECT_FALSE(fs_->Exists(Path("f")));
  EXPECT_THAT(fs_->DeleteRecursively(Path("missing")), IsOk());
  EXPECT_THAT(fs_->DeleteRecursively(Path("missing/deeper")), IsOk());
}

TEST_P(FileSystemTest, WriteFileAtomicLeavesNoTempFileInTheDirectory) {
  ASSERT_THAT(fs_->CreateDirs(Path("d")), IsOk());
  ASSERT_THAT(fs_->WriteFileAtomic(Path("d/x"), "first"), IsOk());
  ASSERT_THAT(fs_->WriteFileAtomic(Path("d/x"), "second"), IsOk());
  auto names = fs_->ListDir(Path("d"));
  ASSERT_THAT(names, IsOk());
  EXPECT_THAT(*names, ElementsAre("x"));
}

TEST_P(FileSystemTest, AnAppendableFileKeepsWhatTheFileHeldAndCanBeCut) {
  const std::string path = Path("log");
  {
    STRATA_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> f, fs_->NewAppendableFile(path));
    ASSERT_THAT(f->Append("one\n"), IsOk());
    ASSERT_THAT(f->Close(), IsOk());
  }
  STRATA_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> f, fs_->NewAppendableFile(path));
  ASSERT_THAT(f->Append("two\n"), IsOk());
  ASSERT_THAT(f->Sync(), IsOk());
  EXPECT_EQ(*fs_->ReadFile(path), "one\ntwo\n");
  // A torn record cut off; the next append follows what is left.
  ASSERT_THAT(f->Append("thr"), IsOk());
  ASSERT_THAT(f->Truncate(8), IsOk());
  ASSERT_THAT(f->Append("three\n"), IsOk());
  ASSERT_THAT(f->Close(), IsOk());
  EXPECT_EQ(*fs_->ReadFile(path), "one\ntwo\nthree\n");
  EXPECT_THAT(f->Truncate(0), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_P(FileSystemTest, TruncateOfAWritableFileMovesItsEnd) {
  const std::string path = Path("f");
  STRATA_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> f, fs_->NewWritableFile(path));
  ASSERT_THAT(f->Append("abcdef"), IsOk());
  ASSERT_THAT(f->Truncate(2), IsOk());
  ASSERT_THAT(f->Append("XY"), IsOk());
  ASSERT_THAT(f->Close(), IsOk());
  EXPECT_EQ(*fs_->ReadFile(path), "abXY");
}

TEST_P(FileSystemTest, OneLockHolderAtATime) {
  const std::string path = Path("LOCK");
  STRATA_ASSERT_OK_AND_ASSIGN(std::unique_ptr<FileLock> lock, fs_->LockFile(path));
  EXPECT_EQ(*fs_->ReadFile(path), std::to_string(getpid()));
  EXPECT_THAT(fs_->LockFile(path).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("lock " + path),
                             HasSubstr("held by pid " + std::to_string(getpid())))));
  lock.reset();
  EXPECT_THAT(fs_->LockFile(path).status(), IsOk());
}

INSTANTIATE_TEST_SUITE_P(AllFileSystems, FileSystemTest,
                         ::testing::Values(FsFactory{"Posix", NewPosixFileSystem, true},
                                           FsFactory{"Memory", NewMemoryFileSystem, false}),
                         [](const ::testing::TestParamInfo<FsFactory>& info) {
                           return info.param.name;
                         });

// POSIX-only behaviour.

class PosixFileSystemTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = absl::StrCat(::testing::TempDir(), "strata_posix_fs_test.XXXXXX");
    ASSERT_NE(mkdtemp(templ.data()), nullptr);
    root_ = templ;
  }
  void TearDown() override {
    ASSERT_EQ(std::system(absl::StrCat("rm -rf '", root_, "'").c_str()), 0);
  }

  std::unique_ptr<FileSystem> fs_ = NewPosixFileSystem();
  std::string root_;
};

TEST_F(PosixFileSystemTest, ErrorsCarryTheErrnoText) {
  const std::string path = root_ + "/nope";
  EXPECT_THAT(fs_->ReadFile(path),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("open " + path + ": No such file or directory")));
}

TEST_F(PosixFileSystemTest, WriteIntoMissingDirectoryFailsNamingTheTempFile) {
  const std::string path = root_ + "/no/such/dir/f";
  EXPECT_THAT(fs_->WriteFileAtomic(path, "x"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(path + ".tmp")));
}

TEST_F(PosixFileSystemTest, WrittenFileIsVisibleToPlainPosix) {
  const std::string path = root_ + "/f";
  ASSERT_THAT(fs_->WriteFileAtomic(path, "abc"), IsOk());
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 3);
  EXPECT_TRUE(S_ISREG(st.st_mode));
}

TEST_F(PosixFileSystemTest, ReadingADirectoryFails) {
  EXPECT_FALSE(fs_->ReadFile(root_).ok());
  EXPECT_FALSE(fs_->FileSize(root_).ok());
}

TEST(MemoryFileSystemTest, InstancesArePrivate) {
  auto a = NewMemoryFileSystem();
  auto b = NewMemoryFileSystem();
  ASSERT_THAT(a->WriteFileAtomic("/f", "a"), IsOk());
  EXPECT_TRUE(a->Exists("/f"));
  EXPECT_FALSE(b->Exists("/f"));
}

TEST(MemoryFileSystemTest, ParentsOfFilesExistImplicitly) {
  auto fs = NewMemoryFileSystem();
  ASSERT_THAT(fs->WriteFileAtomic("/d/e/f", "x"), IsOk());
  EXPECT_TRUE(fs->Exists("/d"));
  EXPECT_TRUE(fs->Exists("/d/e"));
  EXPECT_FALSE(fs->Exists("/d/e/f/g"));
  EXPECT_FALSE(fs->Exists("/d/ee"));
}

TEST(PathTest, ParentDirAndJoinPath) {
  EXPECT_EQ(ParentDir("a/b"), "a");
  EXPECT_EQ(ParentDir("/a/b/c"), "/a/b");
  EXPECT_EQ(ParentDir("b"), ".");
  EXPECT_EQ(ParentDir("/b"), "/");

  EXPECT_EQ(JoinPath("a", "b"), "a/b");
  EXPECT_EQ(JoinPath("a/", "b"), "a/b");
  EXPECT_EQ(JoinPath("/", "b"), "/b");
  EXPECT_EQ(JoinPath("", "b"), "b");
  EXPECT_EQ(ParentDir(JoinPath("/x/y", "z")), "/x/y");
}

}  // namespace
}  // namespace strata::storage
