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
      std::string templ =
          absl::StrCat(::testing::TempDir(), "strata_fs_test.XXXXXX");
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

  std::string Path(const std::string& rel) const {
    return absl::StrCat(root_, "/", rel);
  }

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
  EXPECT_THAT(fs_->ReadFile(path),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
  EXPECT_THAT(fs_->FileSize(path),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
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
        EXPECT_THAT(fs_->WriteFileAtomic(Path(absl::StrCat("t", t)),
                                         absl::StrCat(t, ":", i)),
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

INSTANTIATE_TEST_SUITE_P(
    AllFileSystems, FileSystemTest,
    ::testing::Values(FsFactory{"Posix", NewPosixFileSystem, true},
                      FsFactory{"Memory", NewMemoryFileSystem, false}),
    [](const ::testing::TestParamInfo<FsFactory>& info) {
      return info.param.name;
    });

// POSIX-only behaviour.

class PosixFileSystemTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ =
        absl::StrCat(::testing::TempDir(), "strata_posix_fs_test.XXXXXX");
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
  EXPECT_THAT(
      fs_->ReadFile(path),
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

}  // namespace
}  // namespace strata::storage
