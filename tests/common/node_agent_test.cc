#include "common/node_agent.h"

#include <atomic>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/error_reason.h"
#include "common/grpc_channel.h"
#include "common/grpc_status.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/strata.grpc.pb.h"
#include "tests/testing/status_matchers.h"
#include "transport/data_plane_auth.h"

namespace strata {
namespace {

using ::strata::testing::IsOk;
using ::strata::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// A master that refuses the first `refuse` calls of each kind with
// UNAVAILABLE, then answers: node id 7, and a data-plane key of epoch 3.
class FakeMaster : public proto::Master::Service {
 public:
  std::atomic<int> refuse{0};
  std::atomic<int> registers{0}, heartbeats{0}, suspects{0}, views{0};
  std::atomic<uint32_t> heartbeat_node{0}, suspect_node{0}, suspect{0};

  grpc::Status Register(grpc::ServerContext*, const proto::RegisterRequest* req,
                        proto::RegisterResponse* resp) override {
    if (++registers <= refuse) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "starting");
    if (!req->job().empty() && req->job() != "mine") {
      return ToGrpcStatus(WithReason(absl::FailedPreconditionError(absl::StrCat(
                                         "this master runs job 'mine', not '", req->job(), "'")),
                                     proto::REASON_WRONG_JOB));
    }
    resp->set_node_id(7);
    resp->mutable_view()->set_epoch(2);
    Key(resp->mutable_data_key(), "k1");
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const proto::HeartbeatRequest* req,
                         proto::HeartbeatResponse* resp) override {
    ++heartbeats;
    heartbeat_node = req->node_id();
    resp->set_epoch(2);
    Key(resp->mutable_data_key(), "k2");
    return grpc::Status::OK;
  }
  grpc::Status GetClusterView(grpc::ServerContext*, const proto::GetClusterViewRequest*,
                              proto::ClusterView* view) override {
    if (++views <= refuse) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "restarting");
    view->set_epoch(5);
    return grpc::Status::OK;
  }
  grpc::Status ReportSuspect(grpc::ServerContext*, const proto::ReportSuspectRequest* req,
                             proto::ReportSuspectResponse*) override {
    ++suspects;
    suspect_node = req->node_id();
    suspect = req->suspect();
    return grpc::Status::OK;
  }

 private:
  static void Key(proto::DataPlaneKey* k, const std::string& key) {
    k->set_epoch(3);
    k->set_key(key);
  }
};

class NodeAgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(&master_);
    server_ = b.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    address_ = absl::StrCat("127.0.0.1:", port);
  }
  void TearDown() override { server_->Shutdown(); }

  std::unique_ptr<NodeAgent> Agent(const std::string& address) {
    NodeAgent::Options o;
    o.master_address = address;
    o.credentials = grpc::InsecureChannelCredentials();
    o.name = "worker 3";
    o.request_timeout = absl::Seconds(5);
    o.membership = keys_;
    return std::make_unique<NodeAgent>(std::move(o));
  }

  FakeMaster master_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::shared_ptr<transport::MembershipKeys> keys_ = std::make_shared<transport::MembershipKeys>();
  absl::Notification stop_;
};

TEST_F(NodeAgentTest, RegisterRetriesAMasterThatIsNotReadyAndTakesTheIdAndKey) {
  master_.refuse = 2;
  auto agent = Agent(address_);
  EXPECT_EQ(agent->node_id(), 0u);
  auto resp = agent->Register(proto::RegisterRequest(), absl::Seconds(10), stop_);
  ASSERT_THAT(resp, IsOk());
  EXPECT_EQ(master_.registers.load(), 3);
  EXPECT_EQ(agent->node_id(), 7u);
  auto own = keys_->OwnKey();
  ASSERT_THAT(own, IsOk());
  EXPECT_EQ(own->node_id, 7u);
  EXPECT_EQ(own->epoch, 3u);
  EXPECT_EQ(own->key, "k1");
}

// A master of another job: no retry, the node gives up at once saying so.
TEST_F(NodeAgentTest, RegisterGivesUpAtOnceWhenTheMasterRunsAnotherJob) {
  auto agent = Agent(address_);
  proto::RegisterRequest req;
  req.set_job("theirs");
  auto resp = agent->Register(req, absl::Seconds(30), stop_);
  EXPECT_THAT(resp.status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("worker 3"), HasSubstr("runs job 'mine', not 'theirs'"))));
  EXPECT_EQ(master_.registers.load(), 1);
  req.set_job("mine");
  EXPECT_THAT(agent->Register(req, absl::Seconds(10), stop_), IsOk());
}

TEST_F(NodeAgentTest, RegisterGivesUpAfterItsTimeoutNamingTheNodeAndTheMaster) {
  // Nothing listens there.
  auto agent = Agent("127.0.0.1:1");
  auto resp = agent->Register(proto::RegisterRequest(), absl::Milliseconds(300), stop_);
  EXPECT_THAT(resp.status(),
              StatusIs(absl::StatusCode::kUnavailable, AllOf(HasSubstr("worker 3: cannot register"),
                                                             HasSubstr("master 127.0.0.1:1"))));
}

TEST_F(NodeAgentTest, HeartbeatsAndReportsSpeakForTheRegisteredNodeAndRefreshTheKey) {
  auto agent = Agent(address_);
  ASSERT_THAT(agent->Register(proto::RegisterRequest(), absl::Seconds(10), stop_), IsOk());
  proto::HeartbeatResponse resp;
  ASSERT_THAT(agent->Heartbeat(proto::HeartbeatRequest(), absl::Seconds(2), &resp), IsOk());
  EXPECT_EQ(master_.heartbeat_node.load(), 7u);
  EXPECT_EQ(keys_->OwnKey()->key, "k2");
  ASSERT_THAT(agent->ReportSuspect(4, "replication: timed out", absl::Seconds(2)), IsOk());
  EXPECT_EQ(master_.suspect_node.load(), 7u);
  EXPECT_EQ(master_.suspect.load(), 4u);
}

TEST_F(NodeAgentTest, CallRetriesWhileTheMasterIsUnavailableAndStopsOnStop) {
  master_.refuse = 2;
  auto agent = Agent(address_);
  proto::ClusterView view;
  auto fetch = [&](grpc::ClientContext* ctx) {
    return agent->master()->GetClusterView(ctx, proto::GetClusterViewRequest(), &view);
  };
  ASSERT_THAT(agent->Call(fetch, &stop_), IsOk());
  EXPECT_EQ(view.epoch(), 5u);
  EXPECT_EQ(master_.views.load(), 3);
  // One try only (FetchView), and the error names the master.
  master_.views = 0;
  EXPECT_THAT(agent->FetchView(absl::Seconds(2), &view),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("master " + address_)));
  // Stopping: no more retries.
  master_.views = 0;
  master_.refuse = 100;
  stop_.Notify();
  EXPECT_THAT(agent->Call(fetch, &stop_), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(master_.views.load(), 1);
}

TEST(ReconnectingChannelTest, KeepsAYoungChannelThroughFailuresAndRenewsAnOldOne) {
  const auto creds = grpc::InsecureChannelCredentials();
  // Failures of calls shorter than its first connection attempt (a TLS
  // handshake on a loaded machine): the channel is given its connect_ms.
  ReconnectingChannel young("127.0.0.1:1", creds, /*connect_ms=*/600000);
  const std::shared_ptr<grpc::Channel> first = young.Get();
  for (int i = 0; i < 10; ++i) young.Report(absl::DeadlineExceededError("heartbeat deadline"));
  EXPECT_EQ(young.Get(), first);
  // Past connect_ms, three failures in a row make a new one; a success in
  // between starts the count again.
  ReconnectingChannel old("127.0.0.1:1", creds, /*connect_ms=*/1);
  const std::shared_ptr<grpc::Channel> before = old.Get();
  absl::SleepFor(absl::Milliseconds(20));
  old.Report(absl::UnavailableError("gone"));
  old.Report(absl::UnavailableError("gone"));
  old.Report(absl::OkStatus());
  old.Report(absl::UnavailableError("gone"));
  EXPECT_EQ(old.Get(), before);
  old.Report(absl::UnavailableError("gone"));
  old.Report(absl::DeadlineExceededError("slow"));
  EXPECT_NE(old.Get(), before);
}

}  // namespace
}  // namespace strata
