// A standby master's redirect (master/standby.h), followed by a node's
// agent (common/node_agent.h, common/grpc_channel.h) through real gRPC
// servers: to the leader it names, past a dead master in the list.
#include "master/standby.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/error_reason.h"
#include "common/grpc_status.h"
#include "common/http_client.h"
#include "common/http_server.h"
#include "common/metrics.h"
#include "common/node_agent.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/strata.grpc.pb.h"
#include "tests/testing/etcd_process.h"
#include "tools/cli/common.h"

namespace strata::master {
namespace {

using ::testing::HasSubstr;

class LeaderMaster : public proto::Master::Service {
 public:
  std::atomic<int> views{0};
  grpc::Status GetClusterView(grpc::ServerContext*, const proto::GetClusterViewRequest*,
                              proto::ClusterView* view) override {
    ++views;
    view->set_epoch(9);
    return grpc::Status::OK;
  }
  std::atomic<int> statuses{0};
  grpc::Status GetStatus(grpc::ServerContext*, const proto::GetStatusRequest*,
                         proto::GetStatusResponse* resp) override {
    ++statuses;
    resp->mutable_job()->set_name("led");
    return grpc::Status::OK;
  }
};

std::unique_ptr<grpc::Server> Serve(grpc::Service* service, std::string* address) {
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.RegisterService(service);
  auto server = b.BuildAndStart();
  *address = absl::StrCat("127.0.0.1:", port);
  return server;
}

class StandbyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    leader_server_ = Serve(&leader_, &leader_address_);
    standby_ = NewStandbyService("standby", [this] {
      absl::MutexLock l(&mu_);
      return known_leader_;
    });
    standby_server_ = Serve(standby_.get(), &standby_address_);
  }
  void TearDown() override {
    standby_server_->Shutdown();
    leader_server_->Shutdown();
  }
  std::unique_ptr<NodeAgent> Agent(const std::string& masters) {
    NodeAgent::Options o;
    o.master_address = masters;
    o.credentials = grpc::InsecureChannelCredentials();
    o.name = "worker 0";
    o.request_timeout = absl::Seconds(10);
    o.control_connect_ms = 100;
    return std::make_unique<NodeAgent>(std::move(o));
  }
  absl::Status FetchView(NodeAgent* agent, proto::ClusterView* view) {
    return agent->Call(
        [&](grpc::ClientContext* ctx) {
          return agent->master()->GetClusterView(ctx, proto::GetClusterViewRequest(), view);
        },
        nullptr);
  }
  void SetLeader(const std::string& l) {
    absl::MutexLock l2(&mu_);
    known_leader_ = l;
  }

  LeaderMaster leader_;
  std::unique_ptr<grpc::Server> leader_server_;
  std::string leader_address_;
  std::unique_ptr<grpc::Service> standby_;
  std::unique_ptr<grpc::Server> standby_server_;
  std::string standby_address_;
  absl::Mutex mu_;
  std::string known_leader_;
};

TEST_F(StandbyTest, AStandbyAnswersEveryCallWithTheLeadersAddress) {
  SetLeader(leader_address_);
  auto stub = proto::Master::NewStub(
      grpc::CreateChannel(standby_address_, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  proto::RegisterResponse resp;
  absl::Status s = FromGrpcStatus(stub->Register(&ctx, proto::RegisterRequest(), &resp));
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_TRUE(HasReason(s, proto::REASON_NOT_LEADER)) << s;
  EXPECT_EQ(LeaderOf(s), leader_address_);
  EXPECT_THAT(s.message(), HasSubstr("master standby is a standby master: the leading master is " +
                                     leader_address_));
  // No leader yet: said so, and nothing to follow.
  SetLeader("");
  grpc::ClientContext ctx2;
  proto::GetStatusResponse status;
  s = FromGrpcStatus(stub->GetStatus(&ctx2, proto::GetStatusRequest(), &status));
  EXPECT_TRUE(HasReason(s, proto::REASON_NOT_LEADER)) << s;
  EXPECT_EQ(LeaderOf(s), "");
  EXPECT_THAT(s.message(), HasSubstr("no master leads yet"));
}

TEST_F(StandbyTest, ANodeFollowsTheStandbysRedirectToTheLeader) {
  SetLeader(leader_address_);
  auto agent = Agent(standby_address_);  // (the leader is not in its list)
  proto::ClusterView view;
  ASSERT_TRUE(FetchView(agent.get(), &view).ok());
  EXPECT_EQ(view.epoch(), 9u);
  EXPECT_EQ(leader_.views.load(), 1);
}

TEST_F(StandbyTest, ANodeSkipsADeadMasterInItsList) {
  SetLeader(leader_address_);
  const std::string dead = absl::StrCat("127.0.0.1:", testing::FreeLocalPort());
  auto agent = Agent(absl::StrCat(dead, ",", standby_address_));
  proto::ClusterView view;
  const absl::Time start = absl::Now();
  ASSERT_TRUE(FetchView(agent.get(), &view).ok());
  EXPECT_EQ(view.epoch(), 9u);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_F(StandbyTest, ANodeWaitsThroughAnElectionForTheLeader) {
  // No leader known at first; the standby then learns one.
  auto agent = Agent(standby_address_);
  std::thread elect([this] {
    absl::SleepFor(absl::Milliseconds(700));
    SetLeader(leader_address_);
  });
  proto::ClusterView view;
  absl::Status s = FetchView(agent.get(), &view);
  elect.join();
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(leader_.views.load(), 1);
}

// The CLI (`strata status --master A,B`): the leader of the list, by the
// standby's redirect or past a dead master, asked for its status once.
TEST_F(StandbyTest, TheCliFindsTheLeaderOfAListAndAsksItOnce) {
  SetLeader(leader_address_);
  tools::cli::ClusterAccess cli;
  EXPECT_EQ(cli.Leader(standby_address_ + "," + leader_address_), leader_address_);
  const std::string dead = absl::StrCat("127.0.0.1:", testing::FreeLocalPort());
  EXPECT_EQ(cli.Leader(dead + "," + leader_address_), leader_address_);
  EXPECT_EQ(cli.Leader(dead), dead);  // one address: taken as it is
  leader_.statuses = 0;
  auto status = cli.FetchStatus(dead + "," + leader_address_);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->job().name(), "led");
  EXPECT_EQ(leader_.statuses.load(), 1);
  // None answering: the first, whose error the caller sees.
  SetLeader("");
  EXPECT_EQ(cli.Leader(dead + "," + standby_address_), dead);
  // `strata status` on a list: what each master is, each asked once, the
  // leader's status kept.
  SetLeader(leader_address_);
  leader_.statuses = 0;
  std::optional<proto::GetStatusResponse> answered;
  const auto roles = cli.Masters(standby_address_ + "," + leader_address_ + "," + dead, &answered);
  ASSERT_EQ(roles.size(), 3u);
  EXPECT_EQ(roles[0].address, standby_address_);
  EXPECT_EQ(roles[0].role, "standby");
  EXPECT_EQ(roles[1].role, "leads");
  EXPECT_THAT(roles[2].role, HasSubstr("unreachable ("));
  ASSERT_TRUE(answered.has_value());
  EXPECT_EQ(answered->job().name(), "led");
  EXPECT_EQ(leader_.statuses.load(), 1);
  // A leader paused (its lease in etcd not renewed) refuses as a standby
  // that knows no leader, while the standby still names it.
  auto paused = NewStandbyService("paused", [] { return std::string(); });
  std::string paused_address;
  auto paused_server = Serve(paused.get(), &paused_address);
  SetLeader(paused_address);
  std::optional<proto::GetStatusResponse> none;
  const auto while_paused = cli.Masters(standby_address_ + "," + paused_address, &none);
  ASSERT_EQ(while_paused.size(), 2u);
  EXPECT_EQ(while_paused[0].role, "standby");
  EXPECT_EQ(while_paused[0].leader, paused_address);
  EXPECT_EQ(while_paused[1].role, "leads, paused (its lease in etcd not renewed)");
  EXPECT_FALSE(none.has_value());
  paused_server->Shutdown();
}

TEST(LeaderValueTest, CarriesTheGrpcAndHttpAddresses) {
  const LeaderAddresses both = ParseLeaderValue(LeaderValue("10.0.0.1:7070", "10.0.0.1:7071"));
  EXPECT_EQ(both.address, "10.0.0.1:7070");
  EXPECT_EQ(both.http, "10.0.0.1:7071");
  const LeaderAddresses grpc_only = ParseLeaderValue(LeaderValue("[::1]:7070", ""));
  EXPECT_EQ(grpc_only.address, "[::1]:7070");
  EXPECT_EQ(grpc_only.http, "");
  EXPECT_EQ(LeaderValue("[::1]:7070", ""), "[::1]:7070");  // as before HTTP was named
}

// A standby's HTTP port: its own health and metrics; the leader's pages
// redirected to the leader's HTTP address, 503 while none is known.
TEST(StandbyHttpTest, RedirectsTheLeadersPagesAndServesItsOwnHealthAndMetrics) {
  absl::Mutex mu;
  LeaderAddresses leader;
  MetricsRegistry metrics;
  HttpServer http;
  ServeStandbyHttp(
      &http, &metrics,
      [&] {
        absl::MutexLock l(&mu);
        return leader;
      },
      /*https=*/false);
  ASSERT_TRUE(http.Start("127.0.0.1", 0).ok());
  const std::string base = absl::StrCat("http://127.0.0.1:", http.port());
  auto get = [&](const std::string& path) {
    auto r = HttpFetch(base + path, HttpClientOptions{});
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : HttpResult{};
  };
  HttpResult r = get("/status");
  EXPECT_EQ(r.status, 503);
  EXPECT_THAT(r.body, HasSubstr("no leading master is known yet"));
  {
    absl::MutexLock l(&mu);
    leader = {"10.0.0.1:7070", ""};
  }
  r = get("/");
  EXPECT_EQ(r.status, 503);
  EXPECT_THAT(r.body, HasSubstr("the leading master 10.0.0.1:7070 serves no HTTP"));
  {
    absl::MutexLock l(&mu);
    leader = {"10.0.0.1:7070", "10.0.0.1:7071"};
  }
  r = get("/?refresh=0");
  EXPECT_EQ(r.status, 307);
  EXPECT_EQ(r.location, "http://10.0.0.1:7071/?refresh=0");
  r = get("/status");
  EXPECT_EQ(r.status, 307);
  EXPECT_EQ(r.location, "http://10.0.0.1:7071/status");
  r = get("/healthz");
  EXPECT_EQ(r.status, 200);
  EXPECT_THAT(r.body,
              HasSubstr("standby; the leading master is 10.0.0.1:7070 (http 10.0.0.1:7071)"));
  r = get("/metrics");
  EXPECT_EQ(r.status, 200);
  EXPECT_THAT(r.body, HasSubstr("strata_master_leader 0"));
  EXPECT_EQ(r.location, "");
  http.Shutdown();
}

}  // namespace
}  // namespace strata::master
