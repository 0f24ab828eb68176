#include "master/master_server.h"

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/error_reason.h"
#include "common/grpc_status.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "master/state_log.h"
#include "proto/strata.grpc.pb.h"
#include "storage/faulty_file_system.h"
#include "storage/file_system.h"
#include "tests/testing/gzip.h"
#include "tests/testing/status_matchers.h"

namespace strata::master {
namespace {

using ::strata::testing::IsOk;
using ::strata::testing::StatusIs;
using ::testing::AllOf;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::SizeIs;

constexpr char kLabels[] = "/data/train-labels-idx1-ubyte";
constexpr char kSummary[] = "/out/summary.json";

// summary.json, parsed.
google::protobuf::Struct ParseJson(const std::string& text) {
  google::protobuf::Struct json;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(text, &json).ok()) << text;
  return json;
}

// IDX label file: magic 0,0,8,1, big-endian count, then one byte per label.
std::string IdxLabels(uint32_t n) {
  std::string s = {0, 0, 8, 1};
  s += static_cast<char>(n >> 24);
  s += static_cast<char>(n >> 16);
  s += static_cast<char>(n >> 8);
  s += static_cast<char>(n);
  for (uint32_t i = 0; i < n; ++i) s += static_cast<char>(i % 10);
  return s;
}

// IDX image file of n 2x2 images.
std::string IdxImages(uint32_t n) {
  std::string s = {0, 0, 8, 3};
  for (uint32_t d : {n, 2u, 2u}) {
    for (int shift = 24; shift >= 0; shift -= 8) s += static_cast<char>(d >> shift);
  }
  s += std::string(n * 4, '\1');
  return s;
}

// A pserver admin service that accepts every assignment and records it,
// and answers status probes (unless told not to). Thread-safe (gRPC
// threads call it).
class FakePServerAdmin final : public proto::PServerAdmin::Service {
 public:
  grpc::Status GetStatus(grpc::ServerContext*, const proto::PServerStatusRequest*,
                         proto::PServerStatusResponse*) override {
    if (unreachable_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "unreachable");
    return grpc::Status::OK;
  }
  std::atomic<bool> unreachable_{false};
  grpc::Status AssignPartitions(grpc::ServerContext*, const proto::AssignPartitionsRequest* req,
                                proto::AssignPartitionsResponse* resp) override {
    absl::MutexLock l(&mu_);
    requests_.push_back(*req);
    for (const auto& p : req->view().partitions()) {
      if (p.owner() == req->node_id()) resp->add_partitions(p.id());
    }
    return grpc::Status::OK;
  }
  std::vector<proto::AssignPartitionsRequest> requests() const {
    absl::MutexLock l(&mu_);
    return requests_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<proto::AssignPartitionsRequest> requests_ ABSL_GUARDED_BY(mu_);
};

class MasterServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fs_ = storage::NewMemoryFileSystem();
    // 10 training records, tasks of 4: [0,4) [4,8) [8,10) -> 3 tasks.
    ASSERT_THAT(fs_->WriteFileAtomic(kLabels, IdxLabels(10)), IsOk());
    ASSERT_THAT(fs_->WriteFileAtomic("/data/train-images", IdxImages(10)), IsOk());

    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&admin_);
    admin_server_ = builder.BuildAndStart();
    ASSERT_NE(admin_server_, nullptr);
    ASSERT_NE(port, 0);
    admin_address_ = absl::StrCat("127.0.0.1:", port);

    JobConfig& c = options_.config;
    c.job.name = "unit-job";
    c.job.consistency = Consistency::kBsp;
    c.job.epochs = 1;
    c.model.layers = {4, 3, 2};  // tables of 12, 3, 6, 2 elements
    c.data.train_images = "/data/train-images";
    c.data.train_labels = kLabels;
    c.data.test_images = "/data/test-images";
    c.data.test_labels = "/data/test-labels";
    c.data.task_records = 4;
    c.cluster.heartbeat_interval_ms = 500;
    c.cluster.dead_timeout_ms = 5000;
    c.cluster.task_lease_timeout_ms = 120000;
    options_.expected_pservers = 1;
    options_.expected_workers = 1;
    options_.port = 0;
    options_.http_port = -1;
    options_.summary_path = kSummary;
    options_.clock = &clock_;
    options_.fs = fs_.get();
  }

  void TearDown() override {
    master_.reset();
    if (admin_server_) admin_server_->Shutdown();
  }

  void CreateMaster() {
    auto m = MasterServer::Create(options_);
    ASSERT_TRUE(m.ok()) << m.status();
    master_ = std::move(*m);
  }

  uint32_t RegisterPserver(int index, const std::string& grpc_address) {
    proto::RegisterRequest req;
    req.set_role(proto::PSERVER);
    req.set_index(index);
    req.set_host("127.0.0.1");
    req.set_grpc_address(grpc_address);
    req.set_data_address("127.0.0.1:9");
    auto r = master_->Register(req, "ipv4:127.0.0.1:5000");
    EXPECT_THAT(r, IsOk());
    return r.ok() ? r->node_id() : 0;
  }
  uint32_t RegisterWorker(int index) {
    proto::RegisterRequest req;
    req.set_role(proto::WORKER);
    req.set_index(index);
    req.set_host("127.0.0.1");
    auto r = master_->Register(req, "ipv4:127.0.0.1:5001");
    EXPECT_THAT(r, IsOk());
    return r.ok() ? r->node_id() : 0;
  }

  absl::Status Heartbeat(uint32_t node) {
    proto::HeartbeatRequest req;
    req.set_node_id(node);
    return master_->Heartbeat(req).status();
  }
  absl::StatusOr<proto::LeaseTaskResponse> Lease(uint32_t node) {
    proto::LeaseTaskRequest req;
    req.set_node_id(node);
    return master_->LeaseTask(req);
  }
  absl::Status Complete(uint32_t node, uint64_t task, uint64_t last_step) {
    proto::CompleteTaskRequest req;
    req.set_node_id(node);
    req.set_task_id(task);
    req.set_last_step(last_step);
    return master_->CompleteTask(req);
  }

  proto::NodeState StateOf(uint32_t node) {
    const proto::GetStatusResponse status = master_->GetStatus();
    for (const auto& n : status.view().members()) {
      if (n.id() == node) return n.state();
    }
    ADD_FAILURE() << "node " << node << " not in the view";
    return proto::NODE_STATE_UNSPECIFIED;
  }
  std::string JobState() { return master_->GetStatus().job().state(); }

  // Registers pserver 0 (the fake admin service) and worker 0, then places.
  void StartRunningJob(uint32_t* pserver, uint32_t* worker) {
    *pserver = RegisterPserver(0, admin_address_);
    *worker = RegisterWorker(0);
    master_->TickForTesting();
    ASSERT_EQ(JobState(), "running");
  }

  FakeClock clock_;
  std::unique_ptr<storage::FileSystem> fs_;
  FakePServerAdmin admin_;
  std::unique_ptr<grpc::Server> admin_server_;
  std::string admin_address_;
  MasterOptions options_;
  std::unique_ptr<MasterServer> master_;
};

TEST_F(MasterServerTest, CreateRequiresFileSystemAndLabels) {
  MasterOptions no_fs = options_;
  no_fs.fs = nullptr;
  EXPECT_THAT(MasterServer::Create(no_fs),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("fs")));
  MasterOptions no_labels = options_;
  no_labels.config.data.train_labels = "/data/missing";
  EXPECT_THAT(MasterServer::Create(no_labels),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/data/missing")));
  MasterOptions no_workers = options_;
  no_workers.expected_workers = 0;
  EXPECT_THAT(MasterServer::Create(no_workers), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(MasterServerTest, ImagesAndLabelsOfDifferentCountsAreNamedAtStart) {
  ASSERT_THAT(fs_->WriteFileAtomic("/data/train-images", IdxImages(9)), IsOk());
  EXPECT_THAT(
      MasterServer::Create(options_),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("/data/train-images has 9 examples"), HasSubstr("has 10 labels"))));
  // Truncated: its size does not fit its header.
  std::string cut = IdxImages(10);
  cut.pop_back();
  ASSERT_THAT(fs_->WriteFileAtomic("/data/train-images", cut), IsOk());
  EXPECT_THAT(MasterServer::Create(options_),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("/data/train-images")));
}

TEST_F(MasterServerTest, TasksComeFromTheLabelCountAndTrainLimit) {
  CreateMaster();
  EXPECT_EQ(master_->GetStatus().job().tasks_total(), 3u);  // ceil(10 / 4)
  options_.config.data.train_limit = 4;
  CreateMaster();
  EXPECT_EQ(master_->GetStatus().job().tasks_total(), 1u);  // 4 records
}

TEST_F(MasterServerTest, RegisterAssignsDistinctIdsAndBumpsEpoch) {
  CreateMaster();
  const proto::ClusterView v0 = master_->View();
  EXPECT_EQ(v0.epoch(), 1u);
  ASSERT_THAT(v0.members(), SizeIs(1));
  EXPECT_EQ(v0.members(0).id(), 0u);
  EXPECT_EQ(v0.members(0).role(), proto::MASTER);
  EXPECT_THAT(v0.tables(), SizeIs(4));

  const uint32_t ps = RegisterPserver(0, admin_address_);
  EXPECT_EQ(master_->View().epoch(), 2u);
  const uint32_t w0 = RegisterWorker(0);
  EXPECT_EQ(master_->View().epoch(), 3u);
  const uint32_t w1 = RegisterWorker(1);
  EXPECT_EQ(master_->View().epoch(), 4u);
  EXPECT_EQ(ps, 1u);
  EXPECT_EQ(w0, 2u);
  EXPECT_EQ(w1, 3u);

  const proto::ClusterView v = master_->View();
  ASSERT_THAT(v.members(), SizeIs(4));
  EXPECT_EQ(v.members(1).role(), proto::PSERVER);
  EXPECT_EQ(v.members(1).grpc_address(), admin_address_);
  EXPECT_EQ(v.members(1).state(), proto::ALIVE);
  EXPECT_EQ(v.members(3).role(), proto::WORKER);
  EXPECT_EQ(v.members(3).index(), 1);
}

TEST_F(MasterServerTest, RegisterRejectsBadRequests) {
  CreateMaster();
  proto::RegisterRequest master_role;
  master_role.set_role(proto::MASTER);
  EXPECT_THAT(master_->Register(master_role, "peer-x"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("peer-x")));
  proto::RegisterRequest no_address;
  no_address.set_role(proto::PSERVER);
  EXPECT_THAT(master_->Register(no_address, "peer-y"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("grpc_address")));
  EXPECT_EQ(master_->View().epoch(), 1u);
  EXPECT_THAT(master_->View().members(), SizeIs(1));
}

TEST_F(MasterServerTest, RegisterRefusesANodeOfAnotherJobNamingBoth) {
  options_.config.job.name = "mine";
  CreateMaster();
  proto::RegisterRequest req;
  req.set_role(proto::WORKER);
  req.set_index(2);
  req.set_host("127.0.0.1");
  req.set_job("theirs");
  absl::StatusOr<proto::RegisterResponse> r = master_->Register(req, "peer-z");
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kFailedPrecondition,
                          AllOf(HasSubstr("peer-z"), HasSubstr("worker 2"),
                                HasSubstr("job 'theirs'"), HasSubstr("runs job 'mine'"))));
  EXPECT_EQ(ReasonOf(r.status()), proto::REASON_WRONG_JOB);
  EXPECT_THAT(master_->View().members(), SizeIs(1));
  req.set_job("mine");
  EXPECT_THAT(master_->Register(req, "peer-z"), IsOk());
}

TEST_F(MasterServerTest, ReRegisteringAnIndexMarksThePredecessorDead) {
  CreateMaster();
  const uint32_t first = RegisterWorker(0);
  const uint32_t second = RegisterWorker(0);
  EXPECT_NE(first, second);
  EXPECT_EQ(StateOf(first), proto::DEAD);
  EXPECT_EQ(StateOf(second), proto::ALIVE);
  EXPECT_THAT(Heartbeat(first), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_F(MasterServerTest, HeartbeatFromUnknownNodeIsNotFound) {
  CreateMaster();
  EXPECT_THAT(Heartbeat(42), StatusIs(absl::StatusCode::kNotFound, HasSubstr("42")));
}

TEST_F(MasterServerTest, HeartbeatReturnsEpochAndJobState) {
  CreateMaster();
  const uint32_t w = RegisterWorker(0);
  proto::HeartbeatRequest req;
  req.set_node_id(w);
  STRATA_ASSERT_OK_AND_ASSIGN(auto resp, master_->Heartbeat(req));
  EXPECT_EQ(resp.epoch(), 2u);
  EXPECT_EQ(resp.job_state(), proto::JOB_WAITING);
  clock_.Advance(absl::Milliseconds(1234));
  ASSERT_THAT(Heartbeat(w), IsOk());
  EXPECT_EQ(master_->View().members(1).last_heartbeat_unix_ms(), 1234);
}

TEST_F(MasterServerTest, JobRunsOncePartitionsArePlacedAndTheWorkerRegistered) {
  CreateMaster();
  const uint32_t ps = RegisterPserver(0, admin_address_);
  master_->TickForTesting();
  // Placed (epoch 2 -> 3) but no worker yet.
  EXPECT_EQ(JobState(), "waiting");
  EXPECT_FALSE(master_->View().ready());
  EXPECT_EQ(master_->View().epoch(), 3u);
  const auto requests = admin_.requests();
  ASSERT_THAT(requests, SizeIs(1));
  EXPECT_EQ(requests[0].node_id(), ps);
  // fc0.weight 12, fc0.bias 3, fc1.weight 6, fc1.bias 2 elements: one
  // partition each under the default 4 MiB slices, all on the one pserver.
  ASSERT_THAT(requests[0].view().partitions(), SizeIs(4));
  const uint64_t lengths[] = {12, 3, 6, 2};
  for (int i = 0; i < 4; ++i) {
    const auto& p = requests[0].view().partitions(i);
    EXPECT_EQ(p.table_id(), static_cast<uint32_t>(i));
    EXPECT_EQ(p.offset(), 0u);
    EXPECT_EQ(p.length(), lengths[i]);
    EXPECT_EQ(p.owner(), ps);
  }
  EXPECT_EQ(requests[0].view().epoch(), 3u);

  // Another tick does not place again.
  master_->TickForTesting();
  EXPECT_THAT(admin_.requests(), SizeIs(1));

  const uint32_t w = RegisterWorker(0);  // epoch 4, then ready: 5
  EXPECT_EQ(JobState(), "running");
  EXPECT_TRUE(master_->View().ready());
  EXPECT_EQ(master_->View().epoch(), 5u);
  STRATA_ASSERT_OK_AND_ASSIGN(auto lease, Lease(w));
  EXPECT_EQ(lease.outcome(), proto::LeaseTaskResponse::TASK);
}

TEST_F(MasterServerTest, WaitsWhileNotPlaced) {
  CreateMaster();
  const uint32_t w = RegisterWorker(0);
  master_->TickForTesting();  // no pserver: nothing to place on
  EXPECT_EQ(JobState(), "waiting");
  EXPECT_THAT(admin_.requests(), SizeIs(0));
  STRATA_ASSERT_OK_AND_ASSIGN(auto lease, Lease(w));
  EXPECT_EQ(lease.outcome(), proto::LeaseTaskResponse::WAIT);
}

TEST_F(MasterServerTest, UnreachablePserverKeepsTheJobWaiting) {
  CreateMaster();
  // Port 1 on loopback refuses connections: AssignPartitions fails.
  RegisterPserver(0, "127.0.0.1:1");
  const uint32_t w = RegisterWorker(0);
  master_->TickForTesting();
  EXPECT_EQ(JobState(), "waiting");
  EXPECT_FALSE(master_->View().ready());
  STRATA_ASSERT_OK_AND_ASSIGN(auto lease, Lease(w));
  EXPECT_EQ(lease.outcome(), proto::LeaseTaskResponse::WAIT);
}

// A leader of several that could not renew its lease (docs/reliability.md,
// "Master high availability") heard no heartbeat while paused: resumed, it
// gives every node the dead timeout anew instead of taking them all for
// dead, and says so.
TEST_F(MasterServerTest, AResumedMasterGivesEveryNodeTheDeadTimeoutAnew) {
  CreateMaster();
  uint32_t ps, a;
  StartRunningJob(&ps, &a);
  master_->Pause();
  EXPECT_TRUE(master_->paused());
  clock_.Advance(absl::Seconds(20));  // (no heartbeats while paused)
  master_->Resume();
  EXPECT_FALSE(master_->paused());
  master_->TickForTesting();
  EXPECT_EQ(StateOf(a), proto::ALIVE);
  EXPECT_EQ(StateOf(ps), proto::ALIVE);
  EXPECT_THAT(master_->GetStatus().job().events(), Contains(HasSubstr("master resumed")));
  // Past the dead timeout (5000 ms) from the resume, silence is death again.
  clock_.Advance(absl::Milliseconds(5001));
  master_->TickForTesting();
  EXPECT_EQ(StateOf(a), proto::DEAD);
}

TEST_F(MasterServerTest, WorkerWithoutHeartbeatsIsDeadAfterTheTimeoutAndLosesItsTasks) {
  CreateMaster();
  uint32_t ps, a;
  StartRunningJob(&ps, &a);
  const uint32_t b = RegisterWorker(1);
  STRATA_ASSERT_OK_AND_ASSIGN(auto lease, Lease(a));
  ASSERT_EQ(lease.outcome(), proto::LeaseTaskResponse::TASK);
  const uint64_t task = lease.task().id();
  const uint64_t epoch = master_->View().epoch();

  // Exactly dead_timeout_ms (5000) of silence from `a`: still alive.
  clock_.Advance(absl::Milliseconds(2500));
  ASSERT_THAT(Heartbeat(ps), IsOk());
  ASSERT_THAT(Heartbeat(b), IsOk());
  master_->TickForTesting();
  clock_.Advance(absl::Milliseconds(2500));
  ASSERT_THAT(Heartbeat(ps), IsOk());
  ASSERT_THAT(Heartbeat(b), IsOk());
  master_->TickForTesting();
  EXPECT_EQ(StateOf(a), proto::ALIVE);
  EXPECT_EQ(master_->View().epoch(), epoch);

  // 5001 ms: dead. The others heartbeated and stay alive.
  clock_.Advance(absl::Milliseconds(1));
  master_->TickForTesting();
  EXPECT_EQ(StateOf(a), proto::DEAD);
  EXPECT_EQ(StateOf(ps), proto::ALIVE);
  // (b registered once the job ran: it joins the step set with its first
  // data task.)
  EXPECT_EQ(StateOf(b), proto::JOINING);
  EXPECT_EQ(master_->View().epoch(), epoch + 1);
  EXPECT_EQ(JobState(), "running");

  // The dead worker is refused everywhere.
  EXPECT_THAT(Heartbeat(a),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("declared dead")));
  EXPECT_THAT(Lease(a), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(Complete(a, task, 0), StatusIs(absl::StatusCode::kFailedPrecondition));

  // Its task went back to the front of the queue: the next lease gets it.
  STRATA_ASSERT_OK_AND_ASSIGN(auto again, Lease(b));
  ASSERT_EQ(again.outcome(), proto::LeaseTaskResponse::TASK);
  EXPECT_EQ(again.task().id(), task);
  EXPECT_THAT(Complete(b, task, 0), IsOk());
}

TEST_F(MasterServerTest, LosingTheOnlyWorkerFailsTheJob) {
  CreateMaster();
  uint32_t ps, w;
  StartRunningJob(&ps, &w);
  clock_.Advance(absl::Milliseconds(5001));
  ASSERT_THAT(Heartbeat(ps), IsOk());
  master_->TickForTesting();
  EXPECT_EQ(StateOf(w), proto::DEAD);
  const proto::JobStatus job = master_->GetStatus().job();
  EXPECT_EQ(job.state(), "failed");
  EXPECT_THAT(job.message(), HasSubstr("no live worker left with 3 data task(s)"));
  STRATA_ASSERT_OK_AND_ASSIGN(std::string summary, fs_->ReadFile(kSummary));
  EXPECT_THAT(summary, HasSubstr("\"state\": \"failed\""));
}

TEST_F(MasterServerTest, ExpiredTaskLeaseGoesBackToTheQueue) {
  options_.config.cluster.task_lease_timeout_ms = 1000;
  CreateMaster();
  uint32_t ps, w;
  StartRunningJob(&ps, &w);
  STRATA_ASSERT_OK_AND_ASSIGN(auto lease, Lease(w));
  ASSERT_EQ(lease.outcome(), proto::LeaseTaskResponse::TASK);
  // The worker is silent for the lease timeout (1 s) but not yet dead (5 s):
  // its lease expires and the task goes back to the queue.
  clock_.Advance(absl::Milliseconds(1000));
  ASSERT_THAT(Heartbeat(ps), IsOk());
  master_->TickForTesting();
  EXPECT_EQ(StateOf(w), proto::ALIVE);
  EXPECT_THAT(Complete(w, lease.task().id(), 0), StatusIs(absl::StatusCode::kFailedPrecondition));
  STRATA_ASSERT_OK_AND_ASSIGN(auto again, Lease(w));
  EXPECT_EQ(again.task().id(), lease.task().id());
}

TEST_F(MasterServerTest, HeartbeatsRenewTaskLeases) {
  options_.config.cluster.task_lease_timeout_ms = 1000;
  CreateMaster();
  uint32_t ps, w;
  StartRunningJob(&ps, &w);
  STRATA_ASSERT_OK_AND_ASSIGN(auto lease, Lease(w));
  ASSERT_EQ(lease.outcome(), proto::LeaseTaskResponse::TASK);
  // A task that takes 3 s, with a heartbeat every 500 ms, keeps its lease.
  for (int i = 0; i < 6; ++i) {
    clock_.Advance(absl::Milliseconds(500));
    ASSERT_THAT(Heartbeat(ps), IsOk());
    ASSERT_THAT(Heartbeat(w), IsOk());
    master_->TickForTesting();
  }
  EXPECT_THAT(Complete(w, lease.task().id(), 0), IsOk());
}

TEST_F(MasterServerTest, DeadPserverWithPartitionsFailsTheJob) {
  CreateMaster();
  uint32_t ps, w;
  StartRunningJob(&ps, &w);
  clock_.Advance(absl::Milliseconds(5001));
  ASSERT_THAT(Heartbeat(w), IsOk());
  master_->TickForTesting();
  EXPECT_EQ(StateOf(ps), proto::DEAD);
  const proto::JobStatus job = master_->GetStatus().job();
  EXPECT_EQ(job.state(), "failed");
  EXPECT_THAT(job.message(), HasSubstr("pserver 0"));
  EXPECT_THAT(job.message(), HasSubstr("no replica"));
}

TEST_F(MasterServerTest, ReplicationNeedsMorePserversThanBackups) {
  options_.config.cluster.replication = 1;
  auto m = MasterServer::Create(options_);
  EXPECT_THAT(m.status(), StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr("cluster.replication 1 needs at least 2 pservers")));
}

// Two pservers (both the fake admin service), replication 1: the dead
// one's partitions go to the backup that holds their copy, in a new epoch;
// one it does not hold (yet) is lost, and with no checkpoint the job fails.
class ReplicatedMasterTest : public MasterServerTest {
 protected:
  void Start() {
    options_.config.cluster.replication = 1;
    options_.expected_pservers = 2;
    CreateMaster();
    ps0_ = RegisterPserver(0, admin_address_);
    ps1_ = RegisterPserver(1, admin_address_);
    w_ = RegisterWorker(0);
    master_->TickForTesting();
    ASSERT_EQ(JobState(), "running");
    const proto::ClusterView view = master_->View();
    for (const auto& p : view.partitions()) {
      ASSERT_EQ(p.backups_size(), 1) << "partition " << p.id();
      EXPECT_NE(p.backups(0), p.owner());
      (p.owner() == ps1_ ? of_ps1_ : of_ps0_).push_back(p.id());
    }
    ASSERT_FALSE(of_ps1_.empty());
    ASSERT_FALSE(of_ps0_.empty());
  }
  // Heartbeat of pserver 0 holding `replicas` as synced backups.
  void HeartbeatPs0(const std::vector<uint32_t>& replicas) {
    proto::HeartbeatRequest req;
    req.set_node_id(ps0_);
    for (uint32_t id : replicas) req.add_replicas(id);
    ASSERT_THAT(master_->Heartbeat(req).status(), IsOk());
  }
  // Pserver 1 stops heartbeating; pserver 0 holds `replicas`.
  void KillPs1(const std::vector<uint32_t>& replicas) {
    clock_.Advance(absl::Milliseconds(5001));
    ASSERT_THAT(Heartbeat(w_), IsOk());
    HeartbeatPs0(replicas);
    master_->TickForTesting();
  }
  uint32_t ps0_ = 0, ps1_ = 0, w_ = 0;
  std::vector<uint32_t> of_ps0_, of_ps1_;
};

TEST_F(ReplicatedMasterTest, SyncedBackupsArePromotedInANewEpoch) {
  Start();
  const uint64_t epoch = master_->View().epoch();
  KillPs1(of_ps1_);
  EXPECT_EQ(StateOf(ps1_), proto::DEAD);
  EXPECT_EQ(JobState(), "running");
  const proto::ClusterView view = master_->View();
  EXPECT_GT(view.epoch(), epoch);
  for (const auto& p : view.partitions()) {
    EXPECT_EQ(p.owner(), ps0_) << "partition " << p.id();
    EXPECT_EQ(p.backups_size(), 0) << "no other pserver to back it up";
    EXPECT_EQ(p.restore_seq(), 0u);
  }
  const proto::JobStatus job = master_->GetStatus().job();
  EXPECT_EQ(job.failovers(), of_ps1_.size());
  EXPECT_THAT(job.events(), Contains(HasSubstr("failed over to their backups")));
  // A fresh pserver becomes the backups' home.
  const uint32_t ps2 = RegisterPserver(1, admin_address_);
  master_->TickForTesting();
  const proto::ClusterView after = master_->View();
  for (const auto& p : after.partitions()) {
    ASSERT_EQ(p.backups_size(), 1);
    EXPECT_EQ(p.backups(0), ps2);
  }
}

TEST_F(ReplicatedMasterTest, APartitionWithoutASyncedBackupIsLost) {
  Start();
  // Pserver 0 holds the copy of all but one of pserver 1's partitions.
  std::vector<uint32_t> held(of_ps1_.begin() + 1, of_ps1_.end());
  KillPs1(held);
  const proto::JobStatus job = master_->GetStatus().job();
  EXPECT_EQ(job.state(), "failed");
  EXPECT_THAT(job.message(), HasSubstr("1 partition(s) and no replica to take over"));
  EXPECT_EQ(job.failovers(), held.size());
}

TEST_F(ReplicatedMasterTest, SuspicionReportsAreCheckedByProbing) {
  Start();
  proto::ReportSuspectRequest req;
  req.set_node_id(w_);
  req.set_suspect(ps1_);
  req.set_reason("connection reset");
  // The fake admin service answers the probe: not dead.
  auto r = master_->ReportSuspect(req);
  ASSERT_THAT(r, IsOk());
  EXPECT_FALSE(r->declared_dead());
  master_->TickForTesting();
  EXPECT_EQ(StateOf(ps1_), proto::ALIVE);
  // Reports about a node that is not a pserver are refused.
  req.set_suspect(w_);
  EXPECT_THAT(master_->ReportSuspect(req).status(), StatusIs(absl::StatusCode::kInvalidArgument));
  // Kept up for longer than the dead timeout (heard by the master or not):
  // dead.
  req.set_suspect(ps1_);
  int rounds = 0;
  for (; rounds < 20 && StateOf(ps1_) == proto::ALIVE; ++rounds) {
    clock_.Advance(absl::Milliseconds(500));
    ASSERT_THAT(Heartbeat(w_), IsOk());
    ASSERT_THAT(Heartbeat(ps1_), IsOk());
    HeartbeatPs0(of_ps1_);
    ASSERT_THAT(master_->ReportSuspect(req), IsOk());
    master_->TickForTesting();
  }
  EXPECT_EQ(StateOf(ps1_), proto::DEAD);
  EXPECT_GE(rounds, 10);  // not before the dead timeout (5 s)
  EXPECT_LE(rounds, 12);
  EXPECT_THAT(master_->GetStatus().job().events(), Contains(HasSubstr("unreachable from workers")));
}

TEST_F(ReplicatedMasterTest, ASuspectTheMasterCannotReachEitherIsDeadAtOnce) {
  Start();
  HeartbeatPs0(of_ps1_);
  admin_.unreachable_ = true;  // both pservers' probes fail (one fake)
  proto::ReportSuspectRequest req;
  req.set_node_id(w_);
  req.set_suspect(ps1_);
  req.set_reason("connection reset");
  ASSERT_THAT(master_->ReportSuspect(req), IsOk());
  master_->TickForTesting();  // no time passes: the probe decides
  EXPECT_EQ(StateOf(ps1_), proto::DEAD);
  EXPECT_EQ(StateOf(ps0_), proto::ALIVE);
  EXPECT_THAT(master_->GetStatus().job().events(),
              Contains(HasSubstr("the master's probe failed too")));
  EXPECT_EQ(JobState(), "running");
}

TEST_F(MasterServerTest, ARestartedMasterCarriesOnFromItsStateDirectory) {
  options_.state_dir = "/master-state";
  CreateMaster();
  uint32_t ps, w;
  StartRunningJob(&ps, &w);
  auto first = Lease(w);
  ASSERT_THAT(first, IsOk());
  ASSERT_THAT(Complete(w, first->task().id(), 3), IsOk());
  auto held = Lease(w);  // in flight when the master dies
  ASSERT_THAT(held, IsOk());
  const uint64_t epoch = master_->View().epoch();
  master_.reset();  // killed: nothing is written on the way out

  CreateMaster();
  const proto::GetStatusResponse st = master_->GetStatus();
  EXPECT_EQ(st.job().state(), "running");
  EXPECT_EQ(st.job().tasks_done(), 1u);
  EXPECT_GT(st.view().epoch(), epoch);  // everyone fetches the view again
  EXPECT_THAT(st.job().events(), Contains(HasSubstr("master restarted (restart 1)")));
  // The nodes get twice the dead timeout to reconnect.
  clock_.Advance(absl::Milliseconds(9000));
  master_->TickForTesting();
  EXPECT_EQ(StateOf(ps), proto::ALIVE);
  EXPECT_EQ(StateOf(w), proto::ALIVE);
  // The nodes carry on under their ids, the worker with the task it holds.
  EXPECT_THAT(Heartbeat(ps), IsOk());
  EXPECT_THAT(Heartbeat(w), IsOk());
  EXPECT_THAT(Complete(w, held->task().id(), 7), IsOk());
  EXPECT_EQ(master_->GetStatus().job().tasks_done(), 2u);
  // New nodes get ids after the old ones.
  EXPECT_GT(RegisterWorker(1), w);
}

// The state log records changes (master/state_log.h): after the first
// record (the whole state), a completed task is a small record however
// many tasks the job has, and a restart adds them up to the same state.
TEST_F(MasterServerTest, TheStateLogRecordsChangesAndARestartAddsThemUp) {
  options_.state_dir = "/master-state";
  options_.config.data.task_records = 1;  // 10 tasks
  options_.config.job.epochs = 30;        // 300
  CreateMaster();
  uint32_t ps, w;
  StartRunningJob(&ps, &w);
  for (int i = 0; i < 20; ++i) {
    auto t = Lease(w);
    ASSERT_THAT(t, IsOk());
    ASSERT_EQ(t->outcome(), proto::LeaseTaskResponse::TASK);
    ASSERT_THAT(Complete(w, t->task().id(), i), IsOk());
  }
  auto held = Lease(w);
  ASSERT_THAT(held, IsOk());
  auto log = fs_->ReadFile("/master-state/log");
  ASSERT_THAT(log, IsOk());
  StateRecords records = DecodeStateRecords("/master-state/log", *log);
  ASSERT_TRUE(records.bad.empty()) << records.bad;
  ASSERT_GE(records.states.size(), 20u);
  for (const proto::MasterState& r : records.states) {
    EXPECT_TRUE(r.delta());
    EXPECT_LE(r.tasks_done_size(), 1);
    EXPECT_LE(r.task_leases_size(), 1);
  }
  master_.reset();
  CreateMaster();
  EXPECT_EQ(master_->GetStatus().job().tasks_done(), 20u);
  auto again = Lease(w);  // the lease in flight survived
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(again->task().id(), held->task().id());
}

// A state directory written before JobState has the job state's name
// only (MasterState.job_state_name): a master started on it still carries
// on in that state.
TEST_F(MasterServerTest, AStateDirectoryFromBeforeTheJobStateEnumIsStillRead) {
  options_.state_dir = "/master-state";
  CreateMaster();
  uint32_t ps, w;
  StartRunningJob(&ps, &w);
  master_.reset();
  std::optional<proto::MasterState> st;
  {
    auto log = StateLog::Open(fs_.get(), "/master-state", &st);  // the state, as a snapshot
    ASSERT_THAT(log.status(), IsOk());
  }
  ASSERT_TRUE(st.has_value());
  ASSERT_EQ(st->job_state(), proto::JOB_RUNNING);
  st->clear_job_state();
  st->set_job_state_name("running");
  ASSERT_THAT(fs_->WriteFileAtomic("/master-state/snapshot", EncodeStateRecord(*st)), IsOk());
  ASSERT_THAT(fs_->WriteFileAtomic("/master-state/log", ""), IsOk());
  CreateMaster();
  EXPECT_EQ(JobState(), "running");
  EXPECT_EQ(master_->GetStatus().job().job_state(), proto::JOB_RUNNING);
}

// Found by the master-kill fault test: the master recorded a lease and was
// killed before its answer left. The worker asks again after the restart
// and must get that same task; a new one would leave the first leased to a
// live worker that does not know it, and the job one task short for good.
TEST_F(MasterServerTest, AWorkerWhoseLeaseAnswerWasLostGetsTheSameTaskAgain) {
  options_.state_dir = "/master-state";
  CreateMaster();
  uint32_t ps, w;
  StartRunningJob(&ps, &w);
  auto lost = Lease(w);  // recorded, but the answer never arrives
  ASSERT_THAT(lost, IsOk());
  ASSERT_EQ(lost->outcome(), proto::LeaseTaskResponse::TASK);
  master_.reset();
  CreateMaster();

  auto again = Lease(w);
  ASSERT_THAT(again, IsOk());
  ASSERT_EQ(again->outcome(), proto::LeaseTaskResponse::TASK);
  EXPECT_EQ(again->task().id(), lost->task().id());
  // Without a restart too: asking twice gives the task held.
  auto twice = Lease(w);
  ASSERT_THAT(twice, IsOk());
  EXPECT_EQ(twice->task().id(), lost->task().id());
  // Once it is completed, the next one is a new task.
  ASSERT_THAT(Complete(w, again->task().id(), 3), IsOk());
  auto next = Lease(w);
  ASSERT_THAT(next, IsOk());
  ASSERT_EQ(next->outcome(), proto::LeaseTaskResponse::TASK);
  EXPECT_NE(next->task().id(), lost->task().id());
}

// A master that cannot record its state acknowledges nothing: the caller
// gets UNAVAILABLE with REASON_NOT_PERSISTED and retries; once the disk
// takes the record, the retry is acknowledged and survives a restart.
TEST_F(MasterServerTest, AMasterThatCannotRecordItsStateAcknowledgesNothing) {
  storage::FaultyFileSystem faulty(fs_.get());
  options_.fs = &faulty;
  options_.state_dir = "/master-state";
  CreateMaster();
  uint32_t ps, w;
  StartRunningJob(&ps, &w);
  auto task = Lease(w);
  ASSERT_THAT(task, IsOk());
  ASSERT_EQ(task->outcome(), proto::LeaseTaskResponse::TASK);

  faulty.FailOp(storage::FsOp::kAppend, "/master-state", absl::DataLossError("EIO"));
  const absl::Status refused = Complete(w, task->task().id(), 3);
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kUnavailable,
                                AllOf(HasSubstr("cannot record its state"), HasSubstr("EIO"))));
  EXPECT_EQ(ReasonOf(refused), proto::REASON_NOT_PERSISTED);
  // Nor is a new node told its id, nor a worker a task.
  proto::RegisterRequest reg;
  reg.set_role(proto::WORKER);
  reg.set_index(1);
  reg.set_host("127.0.0.1");
  EXPECT_THAT(master_->Register(reg, "ipv4:127.0.0.1:5002").status(),
              StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(Lease(w).status(), StatusIs(absl::StatusCode::kUnavailable));
  // The reason crosses gRPC to the worker, whose retry loop takes
  // UNAVAILABLE as transient.
  EXPECT_EQ(ReasonOf(FromGrpcStatus(ToGrpcStatus(refused))), proto::REASON_NOT_PERSISTED);

  faulty.ClearFaults();
  EXPECT_THAT(Complete(w, task->task().id(), 3), IsOk());  // the retry
  master_.reset();                                         // killed
  CreateMaster();
  EXPECT_EQ(master_->GetStatus().job().tasks_done(), 1u);
  master_.reset();  // before `faulty`, which its files go through
}

TEST_F(MasterServerTest, WorkerInputErrorFailsTheJobWithItsMessage) {
  CreateMaster();
  uint32_t ps, w;
  StartRunningJob(&ps, &w);
  proto::ReportProgressRequest req;
  req.set_node_id(w);
  req.set_error("/data/t10k-labels: record 3 has label 12 outside [0, 10)");
  ASSERT_THAT(master_->ReportProgress(req), IsOk());
  const proto::JobStatus job = master_->GetStatus().job();
  EXPECT_EQ(job.state(), "failed");
  EXPECT_THAT(job.message(), HasSubstr("worker 0"));
  EXPECT_THAT(job.message(), HasSubstr("record 3 has label 12"));
}

TEST_F(MasterServerTest, CompleteTaskErrors) {
  CreateMaster();
  uint32_t ps, w;
  StartRunningJob(&ps, &w);
  EXPECT_THAT(Complete(w, 99, 0), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(Complete(ps, 0, 0),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("not a registered worker")));
  EXPECT_THAT(Complete(w, 0, 0), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_F(MasterServerTest, JobRunsToEvaluationAndSucceeds) {
  CreateMaster();
  uint32_t ps, a;
  StartRunningJob(&ps, &a);
  const uint32_t b = RegisterWorker(1);

  // Three tasks; last steps pushed 3, 5 and 7.
  const uint32_t who[] = {a, b, a};
  const uint64_t last_step[] = {3, 5, 7};
  for (int i = 0; i < 3; ++i) {
    STRATA_ASSERT_OK_AND_ASSIGN(auto lease, Lease(who[i]));
    ASSERT_EQ(lease.outcome(), proto::LeaseTaskResponse::TASK) << i;
    if (i == 2) clock_.Advance(absl::Seconds(2));  // training time
    ASSERT_THAT(Complete(who[i], lease.task().id(), last_step[i]), IsOk());
  }
  EXPECT_EQ(JobState(), "evaluating");
  EXPECT_EQ(master_->GetStatus().job().tasks_done(), 3u);

  // b runs out first and becomes the evaluator; BSP: min_version =
  // max last step + 1 = 7 + 1 = 8.
  const uint64_t epoch = master_->View().epoch();
  STRATA_ASSERT_OK_AND_ASSIGN(auto eval, Lease(b));
  EXPECT_EQ(eval.outcome(), proto::LeaseTaskResponse::EVALUATE);
  EXPECT_EQ(eval.min_version(), 8u);
  EXPECT_EQ(StateOf(b), proto::FINISHED);
  EXPECT_EQ(master_->View().epoch(), epoch + 1);
  STRATA_ASSERT_OK_AND_ASSIGN(auto wait, Lease(a));
  EXPECT_EQ(wait.outcome(), proto::LeaseTaskResponse::WAIT);
  EXPECT_EQ(StateOf(a), proto::FINISHED);

  // Progress reports; only the evaluator may report an accuracy.
  proto::ReportProgressRequest pa;
  pa.set_node_id(a);
  pa.set_steps_done(4);
  pa.set_samples(6);
  pa.set_loss(0.5);
  pa.set_busy_seconds(2.0);
  pa.set_comm_seconds(0.5);
  pa.set_has_test_accuracy(true);
  pa.set_test_accuracy(0.1);
  EXPECT_THAT(master_->ReportProgress(pa),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not the evaluator")));
  pa.set_has_test_accuracy(false);
  ASSERT_THAT(master_->ReportProgress(pa), IsOk());
  EXPECT_EQ(JobState(), "evaluating");

  clock_.Advance(absl::Seconds(1));  // the evaluation: not training time
  proto::ReportProgressRequest pb;
  pb.set_node_id(b);
  pb.set_steps_done(4);
  pb.set_samples(4);
  pb.set_loss(0.25);
  pb.set_busy_seconds(2.0);
  pb.set_comm_seconds(1.5);
  pb.set_has_test_accuracy(true);
  pb.set_test_accuracy(0.875);
  pb.set_test_loss(0.25);
  ASSERT_THAT(master_->ReportProgress(pb), IsOk());

  const proto::JobStatus job = master_->GetStatus().job();
  EXPECT_EQ(job.state(), "succeeded");
  EXPECT_TRUE(job.has_test_accuracy());
  EXPECT_DOUBLE_EQ(job.test_accuracy(), 0.875);
  EXPECT_EQ(job.steps(), 8u);           // BSP: max last step 7 + 1
  EXPECT_EQ(job.samples(), 10u);        // 6 + 4
  EXPECT_DOUBLE_EQ(job.loss(), 0.375);  // (0.5 + 0.25) / 2
  EXPECT_DOUBLE_EQ(job.wall_seconds(), 3.0);
  EXPECT_DOUBLE_EQ(job.train_seconds(), 2.0);
  EXPECT_DOUBLE_EQ(job.samples_per_sec(), 5.0);  // 10 / 2 s of training
  EXPECT_DOUBLE_EQ(job.comm_share(), 0.5);       // (0.5 + 1.5) / (2 + 2)

  STRATA_ASSERT_OK_AND_ASSIGN(std::string summary, fs_->ReadFile(kSummary));
  const google::protobuf::Struct json = ParseJson(summary);
  const auto& f = json.fields();
  EXPECT_EQ(f.at("job").string_value(), "unit-job");
  EXPECT_EQ(f.at("state").string_value(), "succeeded");
  EXPECT_DOUBLE_EQ(f.at("final_test_accuracy").number_value(), 0.875);
  EXPECT_DOUBLE_EQ(f.at("final_test_loss").number_value(), 0.25);
  EXPECT_DOUBLE_EQ(f.at("steps").number_value(), 8);
  EXPECT_DOUBLE_EQ(f.at("samples").number_value(), 10);
  EXPECT_DOUBLE_EQ(f.at("tasks_done").number_value(), 3);
  EXPECT_DOUBLE_EQ(f.at("wall_seconds").number_value(), 3);
  EXPECT_DOUBLE_EQ(f.at("train_seconds").number_value(), 2);

  // Everyone is told to exit.
  STRATA_ASSERT_OK_AND_ASSIGN(auto done, Lease(a));
  EXPECT_EQ(done.outcome(), proto::LeaseTaskResponse::DONE);
}

// A Criteo line (label, 13 integers, 26 hex values).
std::string CriteoLine(int i) {
  std::string line = std::to_string(i % 2);
  for (int j = 0; j < 13; ++j) absl::StrAppend(&line, "\t", j);
  for (int j = 0; j < 26; ++j) absl::StrAppend(&line, "\t", absl::Hex(0x10000000 + i * 26 + j));
  return line;
}

TEST_F(MasterServerTest, CtrJobCutsTextByBytesAndCountsGzippedLines) {
  JobConfig& c = options_.config;
  c.model.type = "wide_deep";
  c.data.format = "criteo";
  c.data.train = "/ctr/train.txt";
  c.data.task_records = 2;
  const std::string text = absl::StrCat(CriteoLine(0), "\n", CriteoLine(1), "\n\n", CriteoLine(2),
                                        "\n", CriteoLine(3), "\n", CriteoLine(4), "\n");
  // Plain text: cut into byte ranges of about 2 records each, covering it.
  ASSERT_THAT(fs_->WriteFileAtomic("/ctr/train.txt", text), IsOk());
  CreateMaster();
  EXPECT_EQ(master_->GetStatus().job().tasks_total(), 3u);
  uint32_t ps, a;
  StartRunningJob(&ps, &a);
  int64_t covered = 0;
  for (int i = 0; i < 3; ++i) {
    STRATA_ASSERT_OK_AND_ASSIGN(auto lease, Lease(a));
    ASSERT_EQ(lease.outcome(), proto::LeaseTaskResponse::TASK) << i;
    EXPECT_TRUE(lease.task().by_bytes());
    covered += lease.task().byte_end() - lease.task().byte_begin();
    ASSERT_THAT(Complete(a, lease.task().id(), i), IsOk());
  }
  EXPECT_EQ(covered, static_cast<int64_t>(text.size()));
  master_.reset();
  // A file that is not Criteo text fails at start, naming it and the line.
  ASSERT_THAT(fs_->WriteFileAtomic("/ctr/train.txt", "a\nb\n"), IsOk());
  EXPECT_THAT(MasterServer::Create(options_),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("/ctr/train.txt:1:")));
  // Gzipped: its lines are counted (5 records, 3 tasks of 2).
  ASSERT_THAT(fs_->WriteFileAtomic("/ctr/train.txt", ::strata::testing::Gzip(text)), IsOk());
  CreateMaster();
  EXPECT_EQ(master_->GetStatus().job().tasks_total(), 3u);
  StartRunningJob(&ps, &a);
  STRATA_ASSERT_OK_AND_ASSIGN(auto lease, Lease(a));
  EXPECT_FALSE(lease.task().by_bytes());
}

TEST_F(MasterServerTest, CtrJobReportsAucBesideThePlantedModel) {
  JobConfig& c = options_.config;
  c.model.type = "wide_deep";
  c.data.format = "criteo";
  c.data.train = "/ctr/train.txt";
  c.data.test = "/ctr/test.txt";
  c.data.planted = "/ctr/planted.json";
  c.data.task_records = 2;
  // 5 records: 3 tasks.
  ASSERT_THAT(
      fs_->WriteFileAtomic("/ctr/train.txt",
                           absl::StrCat(CriteoLine(0), "\n", CriteoLine(1), "\n\n", CriteoLine(2),
                                        "\n", CriteoLine(3), "\n", CriteoLine(4), "\n")),
      IsOk());
  // planted.json must carry both figures.
  ASSERT_THAT(fs_->WriteFileAtomic("/ctr/planted.json", "{\"planted_test_auc\": 0.7}"), IsOk());
  EXPECT_THAT(MasterServer::Create(options_),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("/ctr/planted.json (data.planted)"),
                             HasSubstr("planted_test_logloss"))));
  ASSERT_THAT(fs_->WriteFileAtomic("/ctr/planted.json", "not json"), IsOk());
  EXPECT_THAT(MasterServer::Create(options_),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("/ctr/planted.json")));
  ASSERT_THAT(fs_->WriteFileAtomic(
                  "/ctr/planted.json",
                  "{\"planted_test_auc\": 0.78, \"planted_test_logloss\": 0.46, \"seed\": 1}"),
              IsOk());
  CreateMaster();
  EXPECT_EQ(master_->GetStatus().job().tasks_total(), 3u);

  uint32_t ps, a;
  StartRunningJob(&ps, &a);
  for (int i = 0; i < 3; ++i) {
    STRATA_ASSERT_OK_AND_ASSIGN(auto lease, Lease(a));
    ASSERT_EQ(lease.outcome(), proto::LeaseTaskResponse::TASK) << i;
    ASSERT_THAT(Complete(a, lease.task().id(), i), IsOk());
  }
  STRATA_ASSERT_OK_AND_ASSIGN(auto eval, Lease(a));
  ASSERT_EQ(eval.outcome(), proto::LeaseTaskResponse::EVALUATE);
  proto::ReportProgressRequest r;
  r.set_node_id(a);
  r.set_has_test_accuracy(true);
  r.set_test_accuracy(0.77);
  r.set_test_loss(0.47);
  r.set_has_test_auc(true);
  r.set_test_auc(0.75);
  ASSERT_THAT(master_->ReportProgress(r), IsOk());
  EXPECT_EQ(JobState(), "succeeded");
  EXPECT_TRUE(master_->GetStatus().job().has_test_auc());
  STRATA_ASSERT_OK_AND_ASSIGN(std::string summary, fs_->ReadFile(kSummary));
  const google::protobuf::Struct json = ParseJson(summary);
  const auto& f = json.fields();
  EXPECT_DOUBLE_EQ(f.at("final_test_auc").number_value(), 0.75);
  EXPECT_DOUBLE_EQ(f.at("final_test_logloss").number_value(), 0.47);
  EXPECT_DOUBLE_EQ(f.at("planted_test_auc").number_value(), 0.78);
  EXPECT_DOUBLE_EQ(f.at("planted_test_logloss").number_value(), 0.46);
}

TEST_F(MasterServerTest, AspEvaluatorNeedsNoMinimumVersion) {
  options_.config.job.consistency = Consistency::kAsp;
  options_.config.data.task_records = 10;  // one task
  CreateMaster();
  uint32_t ps, w;
  StartRunningJob(&ps, &w);
  STRATA_ASSERT_OK_AND_ASSIGN(auto lease, Lease(w));
  ASSERT_THAT(Complete(w, lease.task().id(), 12), IsOk());
  STRATA_ASSERT_OK_AND_ASSIGN(auto eval, Lease(w));
  EXPECT_EQ(eval.outcome(), proto::LeaseTaskResponse::EVALUATE);
  EXPECT_EQ(eval.min_version(), 0u);
}

// strata drain (docs/operations.md).
absl::StatusOr<proto::DrainResponse> DrainNode(MasterServer* m, uint32_t node) {
  proto::DrainRequest req;
  req.set_node_id(node);
  req.set_reason("test");
  return m->Drain(req);
}

TEST_F(MasterServerTest, ADrainedWorkerLeavesAfterItsTaskAndTheJobGoesOn) {
  CreateMaster();
  uint32_t ps, a;
  StartRunningJob(&ps, &a);
  const uint32_t b = RegisterWorker(1);
  STRATA_ASSERT_OK_AND_ASSIGN(auto lease, Lease(a));
  ASSERT_EQ(lease.outcome(), proto::LeaseTaskResponse::TASK);
  STRATA_ASSERT_OK_AND_ASSIGN(auto d, DrainNode(master_.get(), a));
  EXPECT_TRUE(d.node().draining());
  EXPECT_EQ(d.node().state(), proto::ALIVE);
  EXPECT_THAT(d.message(), HasSubstr("leaves after its current data task"));
  // Its task is finished, not taken away.
  EXPECT_THAT(Complete(a, lease.task().id(), 0), IsOk());
  const uint64_t epoch = master_->View().epoch();
  STRATA_ASSERT_OK_AND_ASSIGN(auto next, Lease(a));
  EXPECT_EQ(next.outcome(), proto::LeaseTaskResponse::DONE);
  EXPECT_TRUE(next.drained());
  EXPECT_EQ(StateOf(a), proto::DRAINED);
  EXPECT_GT(master_->View().epoch(), epoch);  // out of the step set
  // Not dead later for its silence, and nothing of it requeued.
  clock_.Advance(absl::Milliseconds(6000));
  ASSERT_THAT(Heartbeat(ps), IsOk());
  ASSERT_THAT(Heartbeat(b), IsOk());
  master_->TickForTesting();
  EXPECT_EQ(StateOf(a), proto::DRAINED);
  EXPECT_EQ(JobState(), "running");
  const proto::JobStatus job = master_->GetStatus().job();
  EXPECT_EQ(job.tasks_requeued(), 0u);
  EXPECT_THAT(job.events(), Contains(HasSubstr("drained: left after its data task")));
  // The other worker trains the rest.
  STRATA_ASSERT_OK_AND_ASSIGN(auto rest, Lease(b));
  EXPECT_EQ(rest.outcome(), proto::LeaseTaskResponse::TASK);
  // Draining again answers so. A drained worker asking again (its answer
  // was lost) gets the same answer, not an error that would restart it;
  // its other calls are refused.
  STRATA_ASSERT_OK_AND_ASSIGN(auto again, DrainNode(master_.get(), a));
  EXPECT_THAT(again.message(), HasSubstr("already drained"));
  STRATA_ASSERT_OK_AND_ASSIGN(auto repeat, Lease(a));
  EXPECT_EQ(repeat.outcome(), proto::LeaseTaskResponse::DONE);
  EXPECT_TRUE(repeat.drained());
  EXPECT_THAT(Complete(a, lease.task().id(), 0),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("drained")));
}

TEST_F(MasterServerTest, DrainRefusesTheMasterTheLastWorkerAndAnUnknownNode) {
  CreateMaster();
  uint32_t ps, w;
  StartRunningJob(&ps, &w);
  EXPECT_THAT(DrainNode(master_.get(), 0),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("`strata stop`")));
  EXPECT_THAT(DrainNode(master_.get(), w),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("the last worker")));
  EXPECT_THAT(DrainNode(master_.get(), 99), StatusIs(absl::StatusCode::kNotFound));
  // The only pserver holds the only copy of its partitions.
  EXPECT_THAT(DrainNode(master_.get(), ps),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("is the last pserver: draining it would remove the last copy")));
  EXPECT_EQ(StateOf(ps), proto::ALIVE);
  EXPECT_EQ(StateOf(w), proto::ALIVE);
}

TEST_F(ReplicatedMasterTest, ADrainedPserverHandsItsPartitionsToTheirBackups) {
  Start();
  // Until pserver 0 holds pserver 1's partitions in sync, pserver 1 is
  // leaving (its partitions would move); once they are, it drains at once.
  STRATA_ASSERT_OK_AND_ASSIGN(auto leaving, DrainNode(master_.get(), ps1_));
  EXPECT_EQ(leaving.node().state(), proto::ALIVE);
  EXPECT_TRUE(leaving.node().draining());
  EXPECT_THAT(leaving.message(), HasSubstr("its partitions move to the other pservers"));
  HeartbeatPs0(of_ps1_);
  const uint64_t epoch = master_->View().epoch();
  STRATA_ASSERT_OK_AND_ASSIGN(auto d, DrainNode(master_.get(), ps1_));
  EXPECT_EQ(d.node().state(), proto::DRAINED);
  EXPECT_THAT(d.message(), HasSubstr("taken over by their backups"));
  const proto::ClusterView view = master_->View();
  EXPECT_GT(view.epoch(), epoch);
  for (const auto& p : view.partitions()) {
    EXPECT_EQ(p.owner(), ps0_) << "partition " << p.id();
    EXPECT_THAT(p.backups(), Not(Contains(ps1_)));
  }
  EXPECT_EQ(JobState(), "running");
  // Its next heartbeat tells it to leave; then it is not declared dead.
  proto::HeartbeatRequest hb;
  hb.set_node_id(ps1_);
  STRATA_ASSERT_OK_AND_ASSIGN(auto resp, master_->Heartbeat(hb));
  EXPECT_TRUE(resp.drained());
  clock_.Advance(absl::Milliseconds(6000));
  ASSERT_THAT(Heartbeat(w_), IsOk());
  HeartbeatPs0({});
  master_->TickForTesting();
  EXPECT_EQ(StateOf(ps1_), proto::DRAINED);
  EXPECT_EQ(JobState(), "running");
  // The last pserver is not drained.
  EXPECT_THAT(DrainNode(master_.get(), ps0_), StatusIs(absl::StatusCode::kFailedPrecondition));
}

}  // namespace
}  // namespace strata::master
