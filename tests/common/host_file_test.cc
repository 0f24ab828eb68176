#include "common/host_file.h"

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace strata {
namespace {

using ::strata::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

template <typename... Parts>
void ExpectError(const absl::StatusOr<HostFile>& result, const std::string& position,
                 const Parts&... parts) {
  EXPECT_THAT(result, StatusIs(absl::StatusCode::kInvalidArgument,
                               AllOf(StartsWith(position), HasSubstr(parts)...)));
}

TEST(ParseHostFileTest, HeaderExampleParses) {
  const std::string text =
      "# comment\n"
      "127.0.0.1   master pserver=2 worker=2\n"
      "node-a      pserver          # \"pserver\" alone means pserver=1\n"
      "\n"
      "node-b      worker=4\n";
  STRATA_ASSERT_OK_AND_ASSIGN(HostFile f, ParseHostFile(text, "hosts"));
  EXPECT_EQ(f.source, "hosts");  // (what errors name)
  ASSERT_EQ(f.hosts.size(), 3u);
  EXPECT_EQ(f.hosts[0].host, "127.0.0.1");
  EXPECT_EQ(f.hosts[0].line, 2);
  EXPECT_EQ(f.hosts[0].masters, 1);
  EXPECT_EQ(f.hosts[0].pservers, 2);
  EXPECT_EQ(f.hosts[0].workers, 2);
  EXPECT_EQ(f.hosts[1].host, "node-a");
  EXPECT_EQ(f.hosts[1].line, 3);
  EXPECT_EQ(f.hosts[1].masters, 0);
  EXPECT_EQ(f.hosts[1].pservers, 1);
  EXPECT_EQ(f.hosts[1].workers, 0);
  EXPECT_EQ(f.hosts[2].host, "node-b");
  EXPECT_EQ(f.hosts[2].line, 5);
  EXPECT_EQ(f.hosts[2].workers, 4);
  EXPECT_EQ(f.total_pservers(), 3);
  EXPECT_EQ(f.total_workers(), 6);
  EXPECT_EQ(f.master_host().host, "127.0.0.1");
}

TEST(ParseHostFileTest, MasterNeedNotBeFirstAndTabsAndCrlfAreFine) {
  STRATA_ASSERT_OK_AND_ASSIGN(HostFile f,
                              ParseHostFile("a\tworker=1\r\n  fe80::1\tpserver master=1\r\n"
                                            "#end",
                                            "hosts"));
  ASSERT_EQ(f.hosts.size(), 2u);
  EXPECT_EQ(f.hosts[1].host, "fe80::1");
  EXPECT_EQ(f.master_host().host, "fe80::1");
  EXPECT_EQ(f.master_host().line, 2);
}

TEST(ParseHostFileTest, UnknownRole) {
  ExpectError(ParseHostFile("h master pserver worker\nx ps=2\n", "hosts.txt"),
              "hosts.txt:2: ", "unknown role 'ps'", "'ps=2'");
}

TEST(ParseHostFileTest, ZeroCount) {
  ExpectError(ParseHostFile("h master pserver worker=0\n", "hosts.txt"),
              "hosts.txt:1: ", "bad count in 'worker=0'", ">= 1");
}

TEST(ParseHostFileTest, NonNumericCount) {
  ExpectError(ParseHostFile("h master pserver\ng worker=x\n", "hosts.txt"),
              "hosts.txt:2: ", "bad count in 'worker=x'");
  ExpectError(ParseHostFile("h master pserver=\n", "hosts.txt"),
              "hosts.txt:1: ", "bad count in 'pserver='");
  ExpectError(ParseHostFile("h master pserver=-1\n", "hosts.txt"),
              "hosts.txt:1: ", "bad count in 'pserver=-1'");
  ExpectError(ParseHostFile("h master pserver=99999999999\n", "hosts.txt"),
              "hosts.txt:1: ", "bad count in 'pserver=99999999999'");
}

TEST(ParseHostFileTest, MasterCountMustBeOne) {
  ExpectError(ParseHostFile("h master=2 pserver worker\n", "hosts.txt"),
              "hosts.txt:1: ", "bad count in 'master=2'");
}

TEST(ParseHostFileTest, RoleTwiceOnOneLine) {
  ExpectError(ParseHostFile("h master worker pserver worker=2\n", "hosts.txt"),
              "hosts.txt:1: ", "role 'worker' given twice", "'h'");
}

TEST(ParseHostFileTest, DuplicateHostNamesEarlierLine) {
  ExpectError(ParseHostFile("# hosts\nnode-a master pserver\nnode-b worker\n"
                            "node-a worker\n",
                            "hosts.txt"),
              "hosts.txt:4: ", "duplicate host 'node-a'", "first on line 2");
}

// A leader and standbys (docs/reliability.md, "Master high availability"):
// up to three masters, which need etcd.
TEST(ParseHostFileTest, TwoOrThreeMastersAreALeaderAndStandbysThatNeedEtcd) {
  auto two = ParseHostFile("a master pserver\nb worker\nc master\n", "hosts.txt");
  ASSERT_TRUE(two.ok()) << two.status();
  ASSERT_EQ(two->master_hosts().size(), 2u);
  EXPECT_EQ(two->master_host().host, "a");
  EXPECT_EQ(two->master_hosts()[1].host, "c");
  EXPECT_TRUE(CheckMasterHosts(*two, /*etcd_configured=*/true).ok());
  const absl::Status s = CheckMasterHosts(*two, /*etcd_configured=*/false);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr("hosts.txt: 2 masters (lines 1, 3)"),
                                              HasSubstr("no cluster.etcd.endpoints")));
  auto one = ParseHostFile("fe80::1 master pserver worker\n", "h");
  ASSERT_TRUE(one.ok());
  EXPECT_TRUE(CheckMasterHosts(*one, false).ok());
}

TEST(ParseHostFileTest, FourMastersNameTheirLines) {
  ExpectError(ParseHostFile("a master pserver\nb master worker\nc master\nd master\n", "hosts.txt"),
              "hosts.txt:4: ", "more than 3 masters", "lines 1, 2, 3, 4");
}

TEST(ParseHostFileTest, NoMaster) {
  ExpectError(ParseHostFile("a pserver\nb worker\n", "hosts.txt"), "hosts.txt: ", "no master");
}

TEST(ParseHostFileTest, NoPserver) {
  ExpectError(ParseHostFile("a master worker=3\n", "hosts.txt"), "hosts.txt: ", "no pserver");
}

TEST(ParseHostFileTest, NoWorker) {
  ExpectError(ParseHostFile("a master pserver=3\n", "hosts.txt"), "hosts.txt: ", "no worker");
}

TEST(ParseHostFileTest, RangesLeaveRoomToScaleNumberedAfterTheStartedOnes) {
  STRATA_ASSERT_OK_AND_ASSIGN(HostFile f, ParseHostFile("a master pserver=1..2 worker=1..3\n"
                                                        "b worker=0..2 pserver\n"
                                                        "c worker=2\n",
                                                        "hosts"));
  EXPECT_EQ(f.total_pservers(), 2);
  EXPECT_EQ(f.max_pservers(), 3);
  EXPECT_EQ(f.total_workers(), 3);
  EXPECT_EQ(f.max_workers(), 7);
  EXPECT_EQ(f.hosts[1].workers, 0);
  EXPECT_EQ(f.hosts[1].max_workers, 2);
  std::vector<std::string> got;
  for (const HostSlot& s : f.Slots()) {
    got.push_back(absl::StrCat(s.role, "-", s.index, "@", s.host, s.initial ? "" : "+"));
  }
  EXPECT_THAT(got, ::testing::ElementsAre("pserver-0@a", "pserver-1@b", "pserver-2@a+",
                                          "worker-0@a", "worker-1@c", "worker-2@c", "worker-3@a+",
                                          "worker-4@a+", "worker-5@b+", "worker-6@b+"));
}

TEST(ParseHostFileTest, BadRangesNameTheItem) {
  ExpectError(ParseHostFile("a master pserver worker=3..2\n", "h"),
              "h:1: ", "bad range in 'worker=3..2'");
  ExpectError(ParseHostFile("a master pserver worker=0..0\n", "h"),
              "h:1: ", "bad range in 'worker=0..0'");
  ExpectError(ParseHostFile("a master pserver worker=1..\n", "h"), "h:1: ", "bad range");
  ExpectError(ParseHostFile("a master=1..2 pserver worker\n", "h"),
              "h:1: ", "a host runs one master");
  ExpectError(ParseHostFile("a master pserver=0..2 worker\n", "h"),
              "h: ", "no pserver started with the job");
}

TEST(ParseHostFileTest, EmptyFile) {
  ExpectError(ParseHostFile("# nothing\n\n", "hosts.txt"), "hosts.txt: ", "no hosts");
  ExpectError(ParseHostFile("", "hosts.txt"), "hosts.txt: ", "no hosts");
}

TEST(ParseHostFileTest, HostWithoutRoles) {
  ExpectError(ParseHostFile("a master pserver worker\nnode-c   # later\n", "hosts.txt"),
              "hosts.txt:2: ", "host 'node-c' has no roles");
}

TEST(ParseHostFileTest, LineWithoutHost) {
  ExpectError(ParseHostFile("a master pserver\n  worker=2\n", "hosts.txt"),
              "hosts.txt:2: ", "'worker=2' is not a host name");
}

TEST(ParseHostFileTest, BadHostCharacters) {
  ExpectError(ParseHostFile("a master pserver worker\nnode,b worker\n", "hosts.txt"),
              "hosts.txt:2: ", "bad host 'node,b'");
}

TEST(LoadHostFileTest, MissingFileIsNotFoundNamingPath) {
  const std::string path = ::testing::TempDir() + "/no-such-hosts";
  EXPECT_THAT(LoadHostFile(path), StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
}

TEST(LoadHostFileTest, ReadsFileAndSetsSource) {
  const std::string path = ::testing::TempDir() + "/host_file_test_hosts";
  {
    std::ofstream out(path);
    out << "localhost master pserver=2 worker=3\n";
  }
  STRATA_ASSERT_OK_AND_ASSIGN(HostFile f, LoadHostFile(path));
  EXPECT_EQ(f.source, path);
  EXPECT_EQ(f.total_workers(), 3);
  std::remove(path.c_str());
}

TEST(LoadHostFileTest, ErrorsNameThePath) {
  const std::string path = ::testing::TempDir() + "/host_file_test_bad";
  {
    std::ofstream out(path);
    out << "localhost master pserver=2 wrker=3\n";
  }
  EXPECT_THAT(LoadHostFile(path), StatusIs(absl::StatusCode::kInvalidArgument,
                                           StartsWith(path + ":1: unknown role 'wrker'")));
  std::remove(path.c_str());
}

TEST(IsLocalHostTest, LoopbackNamesAndAddresses) {
  EXPECT_TRUE(IsLocalHost("localhost"));
  EXPECT_TRUE(IsLocalHost("127.0.0.1"));
  EXPECT_TRUE(IsLocalHost("127.1.2.3"));
  EXPECT_TRUE(IsLocalHost("127.255.255.255"));
  EXPECT_TRUE(IsLocalHost("::1"));
}

TEST(IsLocalHostTest, OtherHostsAreRemote) {
  EXPECT_FALSE(IsLocalHost("10.0.0.1"));
  EXPECT_FALSE(IsLocalHost("128.0.0.1"));
  EXPECT_FALSE(IsLocalHost("127.0.0.256"));
  EXPECT_FALSE(IsLocalHost("127.0.0"));
  EXPECT_FALSE(IsLocalHost("127.example.com"));
  EXPECT_FALSE(IsLocalHost("node-a"));
  EXPECT_FALSE(IsLocalHost("::2"));
  EXPECT_FALSE(IsLocalHost(""));
}

}  // namespace
}  // namespace strata
