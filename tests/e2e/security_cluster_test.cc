// A cluster with mTLS on every gRPC channel (docs/security.md): it trains;
// every role calling every method gets what the policy says; strangers
// (plain text, no credentials, another CA, an expired certificate) are
// refused; a node cannot speak for another; refusals are in the audit log.
#include <poll.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/security.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/strata.grpc.pb.h"
#include "tests/testing/inproc_cluster.h"
#include "tests/testing/read_file.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_certs.h"
#include "tests/transport/raw_socket.h"

namespace strata::testing {
namespace {

using ::testing::HasSubstr;

struct Client {
  std::string name;
  Role role;                      // kNone: must be refused before the policy
  ControlPlaneSecurity security;  // its channels to the master and to pservers
};

// One call of a method by a client: its status code.
using Call = std::function<grpc::Status(const std::shared_ptr<grpc::Channel>&)>;

template <typename Req>
Req Node999() {
  Req r;
  r.set_node_id(999);  // no such node: an allowed caller gets a harmless error
  return r;
}

std::map<std::string, Call> MasterCalls() {
  using proto::Master;
  auto stub = [](const std::shared_ptr<grpc::Channel>& ch) { return Master::NewStub(ch); };
  auto ctx = [] {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return c;
  };
  std::map<std::string, Call> m;
  m["/strata.proto.Master/Register"] = [=](auto ch) {
    proto::RegisterResponse r;  // no role: InvalidArgument when allowed
    return stub(ch)->Register(ctx().get(), proto::RegisterRequest(), &r);
  };
  m["/strata.proto.Master/Heartbeat"] = [=](auto ch) {
    proto::HeartbeatResponse r;
    return stub(ch)->Heartbeat(ctx().get(), Node999<proto::HeartbeatRequest>(), &r);
  };
  m["/strata.proto.Master/GetClusterView"] = [=](auto ch) {
    proto::ClusterView r;
    return stub(ch)->GetClusterView(ctx().get(), proto::GetClusterViewRequest(), &r);
  };
  m["/strata.proto.Master/LeaseTask"] = [=](auto ch) {
    proto::LeaseTaskResponse r;
    return stub(ch)->LeaseTask(ctx().get(), Node999<proto::LeaseTaskRequest>(), &r);
  };
  m["/strata.proto.Master/CompleteTask"] = [=](auto ch) {
    proto::CompleteTaskResponse r;
    return stub(ch)->CompleteTask(ctx().get(), Node999<proto::CompleteTaskRequest>(), &r);
  };
  m["/strata.proto.Master/ReportProgress"] = [=](auto ch) {
    proto::ReportProgressResponse r;
    return stub(ch)->ReportProgress(ctx().get(), Node999<proto::ReportProgressRequest>(), &r);
  };
  m["/strata.proto.Master/GetStatus"] = [=](auto ch) {
    proto::GetStatusResponse r;
    return stub(ch)->GetStatus(ctx().get(), proto::GetStatusRequest(), &r);
  };
  m["/strata.proto.Master/Checkpoint"] = [=](auto ch) {
    proto::CheckpointResponse r;  // no checkpoint section: FailedPrecondition
    return stub(ch)->Checkpoint(ctx().get(), proto::CheckpointRequest(), &r);
  };
  m["/strata.proto.Master/Stop"] = [=](auto ch) {
    proto::StopResponse r;  // the job has ended: refused when allowed
    return stub(ch)->Stop(ctx().get(), proto::StopRequest(), &r);
  };
  m["/strata.proto.Master/Drain"] = [=](auto ch) {
    proto::DrainResponse r;
    return stub(ch)->Drain(ctx().get(), Node999<proto::DrainRequest>(), &r);
  };
  m["/strata.proto.Master/Scale"] = [=](auto ch) {
    proto::ScaleResponse r;  // the job has ended: refused when allowed
    proto::ScaleRequest req;
    req.mutable_workers()->set_by(1);
    return stub(ch)->Scale(ctx().get(), req, &r);
  };
  m["/strata.proto.Master/ReportSuspect"] = [=](auto ch) {
    proto::ReportSuspectResponse r;
    return stub(ch)->ReportSuspect(ctx().get(), Node999<proto::ReportSuspectRequest>(), &r);
  };
  m["/strata.proto.Master/DeclareTables"] = [=](auto ch) {
    proto::DeclareTablesResponse r;
    return stub(ch)->DeclareTables(ctx().get(), Node999<proto::DeclareTablesRequest>(), &r);
  };
  return m;
}

std::map<std::string, Call> PServerCalls(const std::string& ckpt_root) {
  using proto::PServerAdmin;
  auto stub = [](const std::shared_ptr<grpc::Channel>& ch) { return PServerAdmin::NewStub(ch); };
  auto ctx = [] {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return c;
  };
  std::map<std::string, Call> m;
  m["/strata.proto.PServerAdmin/AssignPartitions"] = [=](auto ch) {
    proto::AssignPartitionsResponse r;  // another node's: FailedPrecondition
    return stub(ch)->AssignPartitions(ctx().get(), Node999<proto::AssignPartitionsRequest>(), &r);
  };
  m["/strata.proto.PServerAdmin/GetStatus"] = [=](auto ch) {
    proto::PServerStatusResponse r;
    return stub(ch)->GetStatus(ctx().get(), proto::PServerStatusRequest(), &r);
  };
  m["/strata.proto.PServerAdmin/CheckpointPartitions"] = [=](auto ch) {
    proto::CheckpointPartitionsRequest req;
    req.set_root(ckpt_root);
    req.set_seq(1);
    proto::CheckpointPartitionsResponse r;
    return stub(ch)->CheckpointPartitions(ctx().get(), req, &r);
  };
  return m;
}

ControlPlaneSecurity Security(const std::string& dir, const std::string& cert,
                              const std::string& token_file = "") {
  TlsOptions o;
  o.dir = dir;
  o.cert_name = cert;
  o.token_file = token_file;
  auto s = MakeControlPlaneSecurity(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : ControlPlaneSecurity();
}

// Credentials for calling the master.
std::shared_ptr<grpc::ChannelCredentials> Creds(const std::string& dir, const std::string& cert,
                                                const std::string& token_file = "") {
  return Security(dir, cert, token_file).client;
}

class SecurityClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
    certs_ = ::testing::TempDir() + "/security_cluster_certs";
    STRATA_ASSERT_OK(MakeTestCerts(certs_));
    audit_ = ::testing::TempDir() + "/security_cluster_audit.jsonl";
    std::remove(audit_.c_str());
    InProcClusterOptions opts;
    opts.config = SmallFashionMnistConfig();
    opts.config.data.train_limit = 1000;
    opts.pservers = 1;
    opts.workers = 1;
    opts.transport = "tcp";
    // The data plane sealed too (the real-daemon tests run it in the clear).
    opts.config.security.encrypt_data_plane = true;
    opts.tls_dir = certs_ + "/127.0.0.1";
    opts.token_file = certs_ + "/tokens";
    opts.audit_log = audit_;
    STRATA_ASSERT_OK_AND_ASSIGN(cluster_, InProcCluster::Start(std::move(opts)));
  }
  void TearDown() override {
    if (cluster_) cluster_->Shutdown();
  }
  std::string certs_, audit_;
  std::unique_ptr<InProcCluster> cluster_;
};

TEST_F(SecurityClusterTest, EveryRoleGetsWhatThePolicySaysAndStrangersNothing) {
  // It trains, over TLS and sealed frames throughout.
  cluster_->RunWorkers();
  STRATA_ASSERT_OK(cluster_->JoinWorkers());
  ASSERT_TRUE(cluster_->master()->WaitForJobEnd(absl::Seconds(60)));
  const proto::JobStatus job = cluster_->master()->GetStatus().job();
  EXPECT_EQ(job.state(), "succeeded");
  EXPECT_EQ(job.security(), "mtls, data plane sealed");

  const std::string host = certs_ + "/127.0.0.1";
  const std::vector<Client> clients = {
      {"master cert", Role::kMaster, Security(host, "master")},
      {"pserver cert", Role::kPServer, Security(host, "pserver")},
      {"worker cert", Role::kWorker, Security(host, "worker")},
      {"admin cert", Role::kAdmin, Security(certs_ + "/admin", "client")},
      {"operator cert", Role::kOperator, Security(certs_ + "/users/alice", "client")},
      {"viewer cert", Role::kViewer, Security(certs_ + "/users/bob", "client")},
      {"operator token", Role::kOperator, Security(host, "", certs_ + "/users/carol/token")},
  };
  const std::vector<std::pair<Client, std::string>> strangers = {
      {{"no credentials", Role::kNone, Security(host, "")},
       "no client certificate and no bearer token"},
      {{"expired cert", Role::kNone, Security(certs_ + "/users/old", "client")}, "expired"},
      {{"other CA's cert", Role::kNone, Security(certs_ + "/mallory", "client")},
       "'mallory' refused"},
  };
  std::map<std::string, Call> calls = MasterCalls();
  for (auto& [m, c] : PServerCalls(::testing::TempDir() + "/security_matrix_ckpt")) calls[m] = c;
  ASSERT_EQ(calls.size(), RpcPolicy().size());
  const std::string master = cluster_->master()->address();
  const std::string pserver = cluster_->pserver(0)->admin_address();
  int checked = 0;
  for (const auto& [method, call] : calls) {
    const bool to_master = absl::StartsWith(method, "/strata.proto.Master/");
    const std::string target = to_master ? master : pserver;
    auto creds = [to_master](const Client& c) {
      return to_master ? c.security.client : c.security.ForPServers();
    };
    for (const Client& c : clients) {
      const grpc::Status s = call(grpc::CreateChannel(target, creds(c)));
      const auto& allowed = RpcPolicy().at(method);
      const bool want = std::find(allowed.begin(), allowed.end(), c.role) != allowed.end();
      EXPECT_NE(s.error_code(), grpc::StatusCode::UNAUTHENTICATED)
          << c.name << " " << method << ": " << s.error_message();
      EXPECT_NE(s.error_code(), grpc::StatusCode::UNAVAILABLE)
          << c.name << " " << method << ": " << s.error_message();
      if (want) {
        EXPECT_NE(s.error_code(), grpc::StatusCode::PERMISSION_DENIED)
            << c.name << " " << method << ": " << s.error_message();
      } else {
        EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED)
            << c.name << " " << method << ": " << s.error_message();
        EXPECT_THAT(s.error_message(), HasSubstr("may not call " + method));
      }
      ++checked;
    }
    for (const auto& [c, why] : strangers) {
      const grpc::Status s = call(grpc::CreateChannel(target, creds(c)));
      EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << c.name << " " << method;
      EXPECT_THAT(s.error_message(), HasSubstr(why)) << c.name << " " << method;
    }
    // Plain text does not get through the TLS handshake.
    const grpc::Status plain =
        call(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
    EXPECT_EQ(plain.error_code(), grpc::StatusCode::UNAVAILABLE) << method;
    // Nor does a client that expects the other server role: the admin
    // calling this server as if it were a pserver (or the master) refuses
    // it at the handshake, before sending anything.
    const Client& admin = clients[3];
    const grpc::Status wrong_server = call(grpc::CreateChannel(
        target, to_master ? admin.security.ForPServers() : admin.security.client));
    EXPECT_EQ(wrong_server.error_code(), grpc::StatusCode::UNAVAILABLE)
        << method << ": " << wrong_server.error_message();
  }
  EXPECT_EQ(checked, static_cast<int>(calls.size() * clients.size()));

  // The master's refusals are in its audit log, with who and from where.
  const std::string log = ReadFileForTesting(audit_);
  EXPECT_THAT(log, HasSubstr("\"who\": \"worker:worker@127.0.0.1\", \"from\": \"ipv4:127.0.0.1:"));
  EXPECT_THAT(log,
              HasSubstr("\"action\": \"stop\", \"target\": \"\", \"result\": \"refused: "
                        "PERMISSION_DENIED: role worker may not call /strata.proto.Master/Stop"));
  EXPECT_THAT(log, HasSubstr("\"who\": \"viewer:bob\""));
  EXPECT_THAT(log, HasSubstr("\"who\": \"operator:carol\""));
  EXPECT_THAT(log, HasSubstr("refused: UNAUTHENTICATED: client certificate 'old' refused: "
                             "certificate has expired"));
  EXPECT_THAT(log, HasSubstr("refused: UNAUTHENTICATED: client certificate 'mallory' refused"));
  EXPECT_THAT(log, HasSubstr("\"who\": \"unauthenticated\""));
  // Plain text fails the TLS handshake, inside gRPC: audited without the
  // peer's address, which gRPC does not give.
  EXPECT_THAT(log, HasSubstr("\"action\": \"tls handshake\", \"target\": \"\", \"result\": "
                             "\"refused: UNAUTHENTICATED: TLS handshake failed: wrong version "
                             "number (not TLS: a plain-text client?)\""));
  // Admin actions are recorded with the caller's identity.
  EXPECT_THAT(log, HasSubstr("\"who\": \"admin:admin\", \"from\": \"ipv4:127.0.0.1:"));
}

TEST_F(SecurityClusterTest, ANodeSpeaksOnlyForItself) {
  const std::string host = certs_ + "/127.0.0.1";
  auto worker = proto::Master::NewStub(
      grpc::CreateChannel(cluster_->master()->address(), Creds(host, "worker")));
  uint32_t pserver_node = 0;
  const proto::GetStatusResponse before = cluster_->master()->GetStatus();
  for (const auto& n : before.view().members()) {
    if (n.role() == proto::PSERVER) {
      pserver_node = n.id();
      EXPECT_EQ(n.identity(), "pserver:pserver@127.0.0.1");
    }
  }
  ASSERT_NE(pserver_node, 0u);
  {
    grpc::ClientContext ctx;
    proto::HeartbeatRequest req;
    req.set_node_id(pserver_node);
    proto::HeartbeatResponse resp;
    grpc::Status s = worker->Heartbeat(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(s.error_message(), HasSubstr("worker:worker@127.0.0.1 cannot speak for node"));
  }
  {
    grpc::ClientContext ctx;
    proto::RegisterRequest req;
    req.set_role(proto::PSERVER);
    req.set_host("127.0.0.1");
    req.set_grpc_address("127.0.0.1:1");
    req.set_data_address("127.0.0.1:2");
    proto::RegisterResponse resp;
    grpc::Status s = worker->Register(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(s.error_message(), HasSubstr("cannot register a pserver"));
  }
  {
    grpc::ClientContext ctx;
    proto::RegisterRequest req;
    req.set_role(proto::WORKER);
    req.set_index(7);
    req.set_host("10.9.9.9");
    proto::RegisterResponse resp;
    grpc::Status s = worker->Register(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(s.error_message(), HasSubstr("cannot register host 10.9.9.9"));
  }
  {
    // An instance's own certificate (gen-certs.sh makes worker-0 for the
    // host file's first worker) registers its index only.
    auto worker0 = proto::Master::NewStub(
        grpc::CreateChannel(cluster_->master()->address(), Creds(host, "worker-0")));
    grpc::ClientContext ctx;
    proto::RegisterRequest req;
    req.set_role(proto::WORKER);
    req.set_index(5);
    req.set_host("127.0.0.1");
    proto::RegisterResponse resp;
    grpc::Status s = worker0->Register(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(s.error_message(),
                HasSubstr("certificate of worker:worker-0@127.0.0.1 cannot register worker 5"));
  }
  // Nothing of that changed the cluster.
  int members = 0;
  const proto::GetStatusResponse after = cluster_->master()->GetStatus();
  for (const auto& n : after.view().members()) {
    if (n.state() == proto::ALIVE) ++members;
  }
  EXPECT_EQ(members, 3);  // master, pserver, worker
}

TEST_F(SecurityClusterTest, OversizedRequestsAndStalledHandshakesAreRefusedAndTheMasterCarriesOn) {
  // A connection that never starts its TLS handshake is closed by the
  // server (ApplyServerLimits: 10 s here), not held for gRPC's 120 s.
  const int stalled = transport::testing::RawConnect(cluster_->master()->address());
  const absl::Time opened = absl::Now();
  auto admin = proto::Master::NewStub(
      grpc::CreateChannel(cluster_->master()->address(), Creds(certs_ + "/admin", "client")));
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("x-padding", std::string(kMaxControlMetadataBytes * 4, 'a'));
    proto::GetStatusResponse resp;
    grpc::Status s = admin->GetStatus(&ctx, proto::GetStatusRequest(), &resp);
    EXPECT_FALSE(s.ok()) << "metadata over the limit was accepted";
  }
  {
    grpc::ClientContext ctx;
    proto::DrainRequest req;
    req.set_reason(std::string(kMaxControlMessageBytes + 1024, 'r'));
    proto::DrainResponse resp;
    grpc::Status s = admin->Drain(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  }
  grpc::ClientContext ctx;
  proto::GetStatusResponse resp;
  grpc::Status s = admin->GetStatus(&ctx, proto::GetStatusRequest(), &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.job().security(), "mtls, data plane sealed");
  pollfd p{stalled, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 60 * 1000), 1) << "the stalled connection is still open after 60 s";
  char byte;
  EXPECT_EQ(::recv(stalled, &byte, 1, 0), 0) << "closed, with nothing sent";
  LOG(INFO) << "stalled handshake closed after " << absl::Now() - opened;
  ::close(stalled);
}

}  // namespace
}  // namespace strata::testing
