#include "storage/audit_log.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/faulty_file_system.h"
#include "storage/file_system.h"

namespace strata::storage {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string Read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}
void Write(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::trunc);
  f << text;
}

class AuditLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = absl::StrCat(::testing::TempDir(), "/audit_",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name(), ".jsonl");
    std::remove(path_.c_str());
  }
  // A log of n records.
  std::vector<std::string> MakeLog(int n) {
    auto log = AuditLog::Open(fs_.get(), path_);
    EXPECT_TRUE(log.ok()) << log.status();
    for (int i = 0; i < n; ++i) {
      AuditRecord r{absl::StrCat("operator:node", i),
                    absl::StrCat("ipv4:10.0.0.", i, ":5000"),
                    i % 2 ? "checkpoint" : "register",
                    absl::StrCat("worker ", i),
                    "ok",
                    "a \"quoted\" detail\nover lines"};
      EXPECT_TRUE((*log)->Append(r, absl::FromUnixMillis(1764590000000 + i)).ok());
    }
    return absl::StrSplit(Read(path_), '\n', absl::SkipEmpty());
  }
  std::unique_ptr<FileSystem> fs_ = NewPosixFileSystem();
  std::string path_;
};

TEST_F(AuditLogTest, RecordsChainAndVerify) {
  const std::vector<std::string> lines = MakeLog(5);
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_THAT(
      lines[0],
      ::testing::StartsWith(
          "{\"seq\": 1, \"unix_ms\": 1764590000000, \"time\": "
          "\"2025-12-01T11:53:20.000Z\", \"who\": \"operator:node0\", "
          "\"from\": \"ipv4:10.0.0.0:5000\", \"action\": \"register\", \"target\": \"worker 0\", "
          "\"result\": "
          "\"ok\", \"detail\": \"a \\\"quoted\\\" detail\\u000aover lines\", "
          "\"prev\": \"0000000000000000000000000000000000000000000000000000000000000000\""));
  auto head = VerifyAuditLog(Read(path_), path_);
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->seq, 5u);
  EXPECT_THAT(lines[4], HasSubstr(head->hash));
  // Each record's prev is the hash before it.
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::string hash_before = lines[i - 1].substr(lines[i - 1].size() - 66, 64);
    EXPECT_THAT(lines[i], HasSubstr("\"prev\": \"" + hash_before + "\"")) << i;
  }
  // Mode 0640: the log is not for everyone.
  struct stat st;
  ASSERT_EQ(stat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
}

TEST_F(AuditLogTest, AReopenedLogCarriesTheChainOn) {
  MakeLog(3);
  {
    auto log = AuditLog::Open(fs_.get(), path_);
    ASSERT_TRUE(log.ok()) << log.status();
    EXPECT_EQ((*log)->head().seq, 3u);
    ASSERT_TRUE(
        (*log)->Append({"master", "", "node_dead", "pserver 1", "ok", ""}, absl::Now()).ok());
  }
  auto head = VerifyAuditLog(Read(path_), path_);
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->seq, 4u);
}

TEST_F(AuditLogTest, AnEditIsDetected) {
  std::vector<std::string> lines = MakeLog(4);
  lines[2].replace(lines[2].find("\"result\": \"ok\""), 14, "\"result\": \"no\"");
  auto head = VerifyAuditLog(absl::StrJoin(lines, "\n") + "\n", "audit.jsonl");
  EXPECT_EQ(head.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(head.status().message(), HasSubstr("audit.jsonl:3: the hash does not match"));
}

TEST_F(AuditLogTest, AnEditWithItsHashRecomputedIsDetectedByTheNext) {
  // Whoever edits a record and fixes its hash breaks the next one's prev.
  std::vector<std::string> lines = MakeLog(4);
  AuditHead before{1, lines[0].substr(lines[0].size() - 66, 64)};
  std::string hash;
  lines[1] =
      AuditLine({"mallory", "checkpoint", "", "ok", ""}, absl::FromUnixMillis(1), before, &hash);
  lines[1].pop_back();  // (the newline)
  auto head = VerifyAuditLog(absl::StrJoin(lines, "\n") + "\n", "a");
  EXPECT_THAT(head.status().message(), HasSubstr("a:3: prev is not the hash of record 2"));
}

TEST_F(AuditLogTest, ADeletionIsDetected) {
  std::vector<std::string> lines = MakeLog(4);
  lines.erase(lines.begin() + 1);
  auto head = VerifyAuditLog(absl::StrJoin(lines, "\n") + "\n", "a");
  EXPECT_THAT(head.status().message(), HasSubstr("a:2: seq 3 where 2 was due"));
}

TEST_F(AuditLogTest, AReorderingIsDetected) {
  std::vector<std::string> lines = MakeLog(4);
  std::swap(lines[1], lines[2]);
  auto head = VerifyAuditLog(absl::StrJoin(lines, "\n") + "\n", "a");
  EXPECT_THAT(head.status().message(), HasSubstr("a:2: seq 3 where 2 was due"));
}

TEST_F(AuditLogTest, ATornOrForeignLineIsDetected) {
  std::vector<std::string> lines = MakeLog(2);
  const std::string whole = absl::StrJoin(lines, "\n") + "\n";
  EXPECT_THAT(VerifyAuditLog(whole.substr(0, whole.size() - 10), "a").status().message(),
              HasSubstr("a:2: the last record has no end of line"));
  EXPECT_THAT(VerifyAuditLog(whole + "{\"seq\": 3}\n", "a").status().message(),
              HasSubstr("a:3: not an audit record"));
  EXPECT_THAT(VerifyAuditLog("\n" + whole, "a").status().message(),
              HasSubstr("a:1: an empty line"));
  EXPECT_TRUE(VerifyAuditLog("", "a").ok());
}

TEST_F(AuditLogTest, OpenRefusesALogThatDoesNotVerify) {
  std::vector<std::string> lines = MakeLog(3);
  lines.erase(lines.begin());
  Write(path_, absl::StrJoin(lines, "\n") + "\n");
  auto log = AuditLog::Open(fs_.get(), path_);
  EXPECT_EQ(log.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(log.status().message(),
              AllOf(HasSubstr(path_ + ":1: seq 2 where 1 was due"), HasSubstr("move it aside")));
}

// A disk that fills mid-record, or an fsync that fails: the append is
// refused and what was written of it is cut off, so the chain stays whole and
// the next record follows the last good one.
TEST(AuditLogFaultTest, AFailedAppendLeavesNoTornRecord) {
  std::unique_ptr<FileSystem> mem = NewMemoryFileSystem();
  FaultyFileSystem fs(mem.get());
  const std::string path = "/logs/audit.jsonl";
  auto log = AuditLog::Open(&fs, path);
  ASSERT_TRUE(log.ok()) << log.status();
  const AuditRecord r{"operator:alice", "ipv4:10.0.0.1:5000", "drain", "worker 1", "ok", ""};
  ASSERT_TRUE((*log)->Append(r, absl::FromUnixMillis(1764590000000)).ok());

  fs.SetSpaceLimit(10);  // part of the next line fits
  absl::Status full = (*log)->Append(r, absl::FromUnixMillis(1764590000001));
  EXPECT_EQ(full.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(full.message(), AllOf(HasSubstr("audit log /logs/audit.jsonl: cannot append"),
                                    HasSubstr("No space left")));
  fs.ClearFaults();
  fs.FailOp(FsOp::kSync, "audit", absl::DataLossError("fsync: Input/output error"), 1);
  EXPECT_EQ((*log)->Append(r, absl::FromUnixMillis(1764590000002)).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ((*log)->head().seq, 1u);
  auto head = VerifyAuditLog(*mem->ReadFile(path), path);
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->seq, 1u);

  ASSERT_TRUE((*log)->Append(r, absl::FromUnixMillis(1764590000003)).ok());
  head = VerifyAuditLog(*mem->ReadFile(path), path);
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->seq, 2u);
}

TEST(AuditLogFaultTest, AnUnopenableLogIsUnavailable) {
  std::unique_ptr<FileSystem> mem = NewMemoryFileSystem();
  FaultyFileSystem fs(mem.get());
  fs.FailOp(FsOp::kOpen, "audit", absl::PermissionDeniedError("open: Permission denied"));
  auto log = AuditLog::Open(&fs, "/logs/audit.jsonl");
  EXPECT_EQ(log.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(log.status().message(), HasSubstr("audit log /logs/audit.jsonl: cannot open"));
}

}  // namespace
}  // namespace strata::storage
