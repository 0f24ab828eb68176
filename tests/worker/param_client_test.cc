// ParamClient against a fake pserver on a real TCP socket: the pieces of an
// exchange go out and come back as the worker's overlap needs them.
#include "worker/param_client.h"

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/error_reason.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/data_plane_auth.h"
#include "transport/transport.h"

namespace strata::worker {
namespace {

using transport::Message;
using transport::MessageType;

// Answers pushes at once and pulls with partition p's values p*1000 + i,
// except pulls of partitions in `hold`, which wait for Release(p).
class FakePServer {
 public:
  // `options`: the server's transport (membership keys: a data-plane
  // handshake first).
  explicit FakePServer(transport::TransportOptions options = transport::TransportOptions()) {
    transport_ = *transport::CreateTransport(options);
    EXPECT_TRUE(transport_
                    ->Listen("127.0.0.1", 0,
                             [this](Message m, std::shared_ptr<transport::Responder> r) {
                               Handle(std::move(m), std::move(r));
                             })
                    .ok());
  }
  ~FakePServer() { transport_->Shutdown(); }
  std::string address() const { return transport_->listen_address(); }

  void Hold(uint32_t partition) {
    absl::MutexLock l(&mu_);
    hold_[partition];
  }
  // Pushes are kept unanswered from now on.
  void HoldPushes() {
    absl::MutexLock l(&mu_);
    hold_pushes_ = true;
  }
  // The first push to `partition` is refused ("retry"), and pushes to the
  // others are held until one to `partition` is accepted: a bsp step whose
  // acknowledgements wait for the step to complete, which needs the retry.
  void RefuseFirstPushAndHoldTheRest(uint32_t partition) {
    absl::MutexLock l(&mu_);
    refuse_first_ = partition;
  }
  // The first pushes to partitions 0 and 2 are refused as sent with a stale
  // view epoch (the pserver is at 4); partition 2's refusal arrives only
  // after partition 0's push came again (with the refreshed view).
  void RefuseStaleEpochOnce() {
    absl::MutexLock l(&mu_);
    stale_epoch_ = true;
  }
  // The first push to `refused` is refused as sent with a stale view epoch;
  // pushes to `silent` are never answered (an owner that stopped).
  void RefuseOnceAndLeaveSilent(uint32_t refused, uint32_t silent) {
    absl::MutexLock l(&mu_);
    stale_once_ = refused;
    silent_ = silent;
  }
  // A bsp partition pushed chunk by chunk, with backups: the first push of
  // chunk `chunk` of `partition` is refused as sent with a stale view epoch
  // (the pserver took a new view between the chunks' arrivals), and the
  // partition's other chunks are acknowledged only once that chunk came
  // again (their step completes, and is replicated, with its last chunk).
  void RefuseAChunkOnceAndHoldItsStep(uint32_t partition, uint32_t chunk) {
    absl::MutexLock l(&mu_);
    step_partition_ = partition;
    step_chunk_ = chunk;
  }
  // The client address (ip:port) each request came from, in arrival order.
  std::vector<std::string> peers() const {
    absl::MutexLock l(&mu_);
    return peers_;
  }
  void Release(uint32_t partition) {
    std::vector<std::pair<std::shared_ptr<transport::Responder>, Message>> out;
    {
      absl::MutexLock l(&mu_);
      auto it = hold_.find(partition);
      if (it == hold_.end()) return;
      out = std::move(it->second);
      hold_.erase(it);
    }
    for (auto& [r, req] : out) r->Respond(PullAnswer(req));
  }
  // (type, partition) of every request, in arrival order.
  std::vector<std::pair<MessageType, uint32_t>> requests() const {
    absl::MutexLock l(&mu_);
    return requests_;
  }
  std::map<uint32_t, std::vector<float>> pushed() const {
    absl::MutexLock l(&mu_);
    return pushed_;
  }
  // Waits until `n` requests have arrived.
  bool AwaitRequests(size_t n) {
    absl::MutexLock l(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return requests_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
  }

  static constexpr uint32_t kLength = 10;

 private:
  // A push refused as sent with view epoch 3, the pserver being at 4.
  static Message StaleEpochRefusal(const Message& req) {
    Message err = transport::MakeErrorResponse(
        req.header, MessageType::kPushResponse,
        WithReason(absl::FailedPreconditionError("request epoch 3 < pserver epoch 4"),
                   proto::REASON_STALE_EPOCH));
    err.header.epoch = 4;
    return err;
  }

  static Message PullAnswer(const Message& req) {
    std::vector<float> v(kLength);
    for (uint32_t i = 0; i < kLength; ++i) v[i] = req.header.partition * 1000.f + i;
    Message resp;
    resp.header = req.header;
    resp.header.type = MessageType::kPullResponse;
    resp.header.version = 7;
    resp.payload.assign(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
    return resp;
  }

  void Handle(Message m, std::shared_ptr<transport::Responder> r) {
    absl::MutexLock l(&mu_);
    requests_.emplace_back(m.header.type, m.header.partition);
    peers_.push_back(r->peer());
    if (m.header.type == MessageType::kPushRequest && hold_pushes_) {
      held_pushes_.push_back(std::move(r));
      return;
    }
    if (m.header.type == MessageType::kPushRequest && silent_ == m.header.partition) {
      held_pushes_.push_back(std::move(r));  // never answered
      return;
    }
    if (m.header.type == MessageType::kPushRequest && stale_once_ == m.header.partition) {
      stale_once_.reset();
      r->Respond(StaleEpochRefusal(m));
      return;
    }
    if (m.header.type == MessageType::kPushRequest && stale_epoch_) {
      auto refuse = StaleEpochRefusal;
      const uint32_t p = m.header.partition;
      if (p == 0 && pushes_to_0_++ == 0) {
        r->Respond(refuse(m));
        return;
      }
      if (p == 2 && !held_stale_.has_value() && !stale_2_answered_) {
        held_stale_.emplace(std::move(r), std::move(m));
        return;
      }
      if (p == 0 && held_stale_.has_value()) {  // partition 0 again: now refuse 2
        held_stale_->first->Respond(refuse(held_stale_->second));
        held_stale_.reset();
        stale_2_answered_ = true;
      }
    }
    if (m.header.type == MessageType::kPushRequest && step_partition_ == m.header.partition) {
      const uint32_t c =
          (m.header.flags & transport::kFlagChunk) != 0 ? transport::ChunkIndex(m.header.flags) : 0;
      if (c != step_chunk_) {
        step_held_.emplace_back(std::move(r), m.header);  // answered once the step completes
        return;
      }
      if (!step_refused_) {
        step_refused_ = true;
        r->Respond(StaleEpochRefusal(m));
        return;
      }
      step_partition_.reset();  // the step completes: its held acks go
      for (auto& [held, header] : step_held_) {
        Message ack;
        ack.header = header;
        ack.header.type = MessageType::kPushResponse;
        held->Respond(std::move(ack));
      }
      step_held_.clear();
    }
    if (m.header.type == MessageType::kPushRequest && refuse_first_.has_value()) {
      if (m.header.partition != *refuse_first_) {
        held_pushes_.push_back(std::move(r));  // answered once the step completes
        return;
      }
      if (!refused_) {
        refused_ = true;
        r->Respond(transport::MakeErrorResponse(
            m.header, MessageType::kPushResponse,
            absl::UnavailableError("pserver epoch 3 behind request epoch 4; retry")));
        return;
      }
      refuse_first_.reset();
      for (auto& held : held_pushes_) {
        Message ack;
        ack.header.type = MessageType::kPushResponse;
        held->Respond(std::move(ack));
      }
      held_pushes_.clear();
    }
    if (m.header.type == MessageType::kPushRequest) {
      const float* g = reinterpret_cast<const float*>(m.payload.data());
      pushed_[m.header.partition].assign(g, g + m.payload.size() / sizeof(float));
      Message resp;
      resp.header = m.header;
      resp.header.type = MessageType::kPushResponse;
      r->Respond(std::move(resp));
      return;
    }
    auto it = hold_.find(m.header.partition);
    if (it != hold_.end()) {
      it->second.emplace_back(std::move(r), std::move(m));
      return;
    }
    r->Respond(PullAnswer(m));
  }

  std::unique_ptr<transport::Transport> transport_;
  mutable absl::Mutex mu_;
  std::vector<std::pair<MessageType, uint32_t>> requests_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, std::vector<float>> pushed_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> peers_ ABSL_GUARDED_BY(mu_);
  bool hold_pushes_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<uint32_t> refuse_first_ ABSL_GUARDED_BY(mu_);
  bool stale_epoch_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<uint32_t> stale_once_ ABSL_GUARDED_BY(mu_);
  std::optional<uint32_t> silent_ ABSL_GUARDED_BY(mu_);
  int pushes_to_0_ ABSL_GUARDED_BY(mu_) = 0;
  bool stale_2_answered_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<std::pair<std::shared_ptr<transport::Responder>, Message>> held_stale_
      ABSL_GUARDED_BY(mu_);
  bool refused_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<uint32_t> step_partition_ ABSL_GUARDED_BY(mu_);
  uint32_t step_chunk_ ABSL_GUARDED_BY(mu_) = 0;
  bool step_refused_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::pair<std::shared_ptr<transport::Responder>, transport::MessageHeader>> step_held_
      ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<transport::Responder>> held_pushes_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, std::vector<std::pair<std::shared_ptr<transport::Responder>, Message>>> hold_
      ABSL_GUARDED_BY(mu_);
};

class ParamClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    client_transport_ = *transport::CreateTransport(transport::TransportOptions());
    client_ = std::make_unique<ParamClient>(
        client_transport_.get(), /*node_id=*/5,
        []() -> absl::StatusOr<proto::ClusterView> {
          return absl::UnavailableError("no master in this test");
        },
        absl::Seconds(10));
    // Table 0: three partitions (ids 0-2, elements 0-29); table 1: one
    // (id 3, elements 0-9). All on the fake pserver.
    proto::ClusterView view;
    view.set_epoch(3);
    view.set_ready(true);
    auto* m = view.add_members();
    m->set_id(1);
    m->set_role(proto::PSERVER);
    m->set_data_address(server_.address());
    const uint32_t tables[] = {0, 0, 0, 1};
    const uint64_t offsets[] = {0, 10, 20, 0};
    for (uint32_t id = 0; id < 4; ++id) {
      auto* p = view.add_partitions();
      p->set_id(id);
      p->set_table_id(tables[id]);
      p->set_offset(offsets[id]);
      p->set_length(FakePServer::kLength);
      p->set_owner(1);
    }
    view.add_tables()->set_num_elements(30);
    view.add_tables()->set_num_elements(10);
    client_->SetView(view);
    view_ = view;
  }
  void TearDown() override { client_transport_->Shutdown(); }

  FakePServer server_;
  std::unique_ptr<transport::Transport> client_transport_;
  std::unique_ptr<ParamClient> client_;
  proto::ClusterView view_;
};

// A push exchange given up with answers outstanding drops its connections:
// the transport may be sending the gradient in place until the answer
// (rdma), so nothing may read it once the caller reuses it. The next
// exchange reconnects.
TEST_F(ParamClientTest, AbandonedPushDropsItsConnection) {
  server_.HoldPushes();
  std::vector<std::vector<float>> grads = {std::vector<float>(30, 1.f),
                                           std::vector<float>(10, 1.f)};
  PushResult pushed;
  auto push = client_->StartPush(&grads, 1, 1, &pushed);
  push->IssueAll();
  ASSERT_TRUE(server_.AwaitRequests(4));
  push.reset();  // unanswered: gives the gradient back
  std::vector<std::vector<float>> tables;
  uint64_t lowest = 0;
  auto pull = client_->StartPull(0, &tables, &lowest);
  ASSERT_TRUE(pull->Finish().ok());
  const std::vector<std::string> peers = server_.peers();
  ASSERT_EQ(peers.size(), 8u);
  EXPECT_NE(peers.front(), peers.back()) << "the pull reused the push's connection";
}

// Likewise a pull given up with answers outstanding: its connection goes,
// so a late answer stops landing in the destination (rdma: at once, the
// queue pair destroyed under the channel's lock; tcp: once its thread sees
// the socket closed, so the destination is kept alive here).
TEST_F(ParamClientTest, AbandonedPullDropsItsConnection) {
  server_.Hold(1);
  std::vector<std::vector<float>> abandoned;
  {
    uint64_t lowest = 0;
    auto pull = client_->StartPull(0, &abandoned, &lowest);
    pull->IssueAll();
    ASSERT_TRUE(server_.AwaitRequests(4));
  }                    // given up with partition 1 unanswered
  server_.Release(1);  // the late answer goes to a closed connection
  std::vector<std::vector<float>> tables;
  uint64_t lowest = 0;
  ASSERT_TRUE(client_->StartPull(0, &tables, &lowest)->Finish().ok());
  EXPECT_EQ(tables[0][10], 1000.f);
  const std::vector<std::string> peers = server_.peers();
  ASSERT_EQ(peers.size(), 8u);
  EXPECT_NE(peers.front(), peers.back()) << "the pull reused the abandoned connection";
}

TEST_F(ParamClientTest, SettledPushKeepsItsConnection) {
  std::vector<std::vector<float>> grads = {std::vector<float>(30, 1.f),
                                           std::vector<float>(10, 1.f)};
  PushResult pushed;
  auto push = client_->StartPush(&grads, 1, 1, &pushed);
  ASSERT_TRUE(push->Finish().ok());
  push.reset();
  std::vector<std::vector<float>> tables;
  uint64_t lowest = 0;
  ASSERT_TRUE(client_->StartPull(0, &tables, &lowest)->Finish().ok());
  const std::vector<std::string> peers = server_.peers();
  ASSERT_EQ(peers.size(), 8u);
  EXPECT_EQ(peers.front(), peers.back());
}

// The master moved the data-plane key epoch on (a node left) and the
// worker's first connection meets a pserver that has not had the new keys
// yet: its handshake is refused for the epoch, for longer than one
// Connect waits. The exchange tries again until the pserver has them, and
// never reports the pserver to the master: a stale key is no sign of a
// dead pserver (reported, the master once declared a live one dead).
TEST(ParamClientKeyEpochTest, AKeyEpochRefusalIsRetriedAndNeverReported) {
  const std::string old_secret = transport::RandomBytes(32);
  const std::string new_secret = transport::RandomBytes(32);
  auto server_keys = std::make_shared<transport::MembershipKeys>();
  server_keys->Update(1, 7, transport::DeriveNodeKey(old_secret, 1), old_secret);
  transport::TransportOptions server_options;
  server_options.membership = server_keys;
  FakePServer server(server_options);
  auto client_keys = std::make_shared<transport::MembershipKeys>();
  client_keys->Update(5, 8, transport::DeriveNodeKey(new_secret, 5), "");
  transport::TransportOptions client_options;
  client_options.membership = client_keys;
  client_options.tcp_connect_timeout = absl::Milliseconds(300);
  auto client_transport = *transport::CreateTransport(client_options);
  ParamClient client(
      client_transport.get(), /*node_id=*/5,
      []() -> absl::StatusOr<proto::ClusterView> {
        return absl::UnavailableError("no master in this test");
      },
      absl::Seconds(20));
  proto::ClusterView view;
  view.set_epoch(3);
  view.set_ready(true);
  auto* m = view.add_members();
  m->set_id(1);
  m->set_role(proto::PSERVER);
  m->set_data_address(server.address());
  auto* p = view.add_partitions();
  p->set_id(0);
  p->set_table_id(0);
  p->set_length(FakePServer::kLength);
  p->set_owner(1);
  view.add_tables()->set_num_elements(FakePServer::kLength);
  client.SetView(view);
  std::atomic<int> reports{0};
  client.SetSuspectReporter(
      [&reports](uint32_t node, const std::string& why) {
        ++reports;
        ADD_FAILURE() << "pserver node " << node << " reported: " << why;
      },
      /*suspect_after=*/absl::Milliseconds(200), /*ping_timeout=*/absl::Milliseconds(200));
  // The pserver's heartbeat brings epoch 8 only after a few of the
  // client's Connects gave up.
  std::thread heartbeat([&] {
    absl::SleepFor(absl::Milliseconds(1500));
    server_keys->Update(1, 8, transport::DeriveNodeKey(new_secret, 1), new_secret);
  });
  std::vector<std::vector<float>> tables;
  uint64_t lowest = 0;
  const absl::Status pulled = client.StartPull(0, &tables, &lowest)->Finish();
  heartbeat.join();
  ASSERT_TRUE(pulled.ok()) << pulled;
  ASSERT_EQ(tables.size(), 1u);
  EXPECT_EQ(tables[0][3], 3.f);
  EXPECT_EQ(reports.load(), 0);
  client_transport->Shutdown();
}

// A refused request is sent again at once, not after the rest of the
// exchange is answered: in bsp with backups the other partitions'
// acknowledgements wait for the step to complete, which needs the retry
// (waiting for them first deadlocked two workers once).
TEST_F(ParamClientTest, RefusedPushIsRetriedWhileOthersAreStillUnanswered) {
  server_.RefuseFirstPushAndHoldTheRest(2);
  std::vector<std::vector<float>> grads = {std::vector<float>(30, 1.f),
                                           std::vector<float>(10, 1.f)};
  PushResult pushed;
  auto push = client_->StartPush(&grads, 1, 1, &pushed);
  const absl::Time start = absl::Now();
  EXPECT_TRUE(push->Finish().ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "the retry waited for the held answers";
  // Partition 2 twice (refused, then accepted), the others once.
  int to_2 = 0;
  for (const auto& [type, partition] : server_.requests()) to_2 += partition == 2;
  EXPECT_EQ(to_2, 2);
  EXPECT_EQ(server_.requests().size(), 5u);
}

// A push refused for the view epoch it was sent with is sent again even
// when the answer comes after the exchange took the newer view for another
// partition's retry: taken for a stale gradient, it was dropped, and its
// bsp step never completed.
TEST_F(ParamClientTest, PushRefusedForItsSentEpochIsRetriedAfterTheViewMovedOn) {
  proto::ClusterView newer = view_;
  newer.set_epoch(4);
  auto client = std::make_unique<ParamClient>(
      client_transport_.get(), /*node_id=*/5,
      [newer]() -> absl::StatusOr<proto::ClusterView> { return newer; }, absl::Seconds(10));
  client->SetView(view_);
  server_.RefuseStaleEpochOnce();
  std::vector<std::vector<float>> grads = {std::vector<float>(30, 1.f),
                                           std::vector<float>(10, 1.f)};
  PushResult pushed;
  auto push = client->StartPush(&grads, 1, 1, &pushed);
  EXPECT_TRUE(push->Finish().ok());
  EXPECT_EQ(pushed.stale_partitions, 0);
  int to_2 = 0;
  for (const auto& [type, partition] : server_.requests()) to_2 += partition == 2;
  EXPECT_EQ(to_2, 2) << "partition 2's refused push was not sent again";
  EXPECT_THAT(server_.pushed(), ::testing::SizeIs(4));
}

// When a retry brings a newer view, a request still waiting on an owner
// that the view moves its partition away from is given up and sent to the
// new owner: the exchange takes the new routes (and epoch) at once, so later
// checks for moved partitions no longer see it as moved.
TEST_F(ParamClientTest, RequestToAMovedOwnerIsSentToTheNewOneWhenARetryRefreshesTheView) {
  FakePServer other;
  proto::ClusterView newer = view_;
  newer.set_epoch(4);
  auto* m = newer.add_members();
  m->set_id(2);
  m->set_role(proto::PSERVER);
  m->set_data_address(other.address());
  newer.mutable_partitions(1)->set_owner(2);
  auto client = std::make_unique<ParamClient>(
      client_transport_.get(), /*node_id=*/5,
      [newer]() -> absl::StatusOr<proto::ClusterView> { return newer; }, absl::Seconds(10));
  client->SetView(view_);
  server_.RefuseOnceAndLeaveSilent(/*refused=*/0, /*silent=*/1);
  std::vector<std::vector<float>> grads = {std::vector<float>(30, 1.f),
                                           std::vector<float>(10, 1.f)};
  PushResult pushed;
  auto push = client->StartPush(&grads, 1, 1, &pushed);
  const absl::Time start = absl::Now();
  EXPECT_TRUE(push->Finish().ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "waited on the old owner";
  EXPECT_THAT(other.pushed(), ::testing::ElementsAre(::testing::Key(1)));
}

// A bsp partition pushed chunk by chunk with backups acknowledges a chunk
// only once its whole step is replicated. A view change at the pserver
// between the arrivals of one push's chunks refuses the later ones (sent
// with the old epoch) while the earlier ones wait for the step: the refused
// chunk must be sent again at once. WaitRange waited for every answer of
// the partitions it reads before retrying any, and the worker stopped for
// good (migration_bench --replication 1: partition 2's push at the view
// that cut partition 3 over and started a move of partition 2's backup).
TEST_F(ParamClientTest, WaitRangeRetriesARefusedChunkWhileItsStepHoldsTheOthers) {
  proto::ClusterView view = view_;
  view.set_chunk_bytes(5 * sizeof(float));  // partitions of 10 floats: 2 chunks each
  proto::ClusterView newer = view;
  newer.set_epoch(4);
  auto client = std::make_unique<ParamClient>(
      client_transport_.get(), /*node_id=*/5,
      [newer]() -> absl::StatusOr<proto::ClusterView> { return newer; }, absl::Seconds(10));
  client->SetView(view);
  server_.RefuseAChunkOnceAndHoldItsStep(/*partition=*/2, /*chunk=*/1);
  std::vector<std::vector<float>> grads = {std::vector<float>(30, 1.f),
                                           std::vector<float>(10, 1.f)};
  PushResult pushed;
  auto push = client->StartPush(&grads, 1, 1, &pushed);
  push->IssueRange(0, 30);  // the backward pass has table 0's gradient
  // The next forward pass reads table 0 (partitions 0-2) and first waits
  // for their pushes (MlpTrainer::PipelinedStep).
  // (Without the retry, the wait ends only at the request timeout, 10 s,
  // with an error.)
  const absl::Status waited = push->WaitRange(0, 30);
  EXPECT_TRUE(waited.ok()) << waited;
  EXPECT_TRUE(push->Finish().ok());
  EXPECT_EQ(pushed.stale_partitions, 0);
  int to_2 = 0;
  for (const auto& [type, partition] : server_.requests()) to_2 += partition == 2;
  EXPECT_EQ(to_2, 3) << "partition 2: chunk 0 once, chunk 1 refused and sent again";
}

TEST_F(ParamClientTest, PartitionStartsFollowTheView) {
  EXPECT_THAT(client_->PartitionStarts(0), ::testing::ElementsAre(0, 10, 20));
  EXPECT_THAT(client_->PartitionStarts(1), ::testing::ElementsAre(0));
  EXPECT_THAT(client_->PartitionStarts(9), ::testing::IsEmpty());
}

TEST_F(ParamClientTest, WaitRangeWaitsOnlyForThePartitionsItReads) {
  server_.Hold(1);
  server_.Hold(2);
  std::vector<std::vector<float>> tables;
  uint64_t lowest = 0;
  auto pull = client_->StartPull(0, &tables, &lowest);
  ASSERT_EQ(tables.size(), 2u);
  // Nothing is sent before it is asked for.
  EXPECT_TRUE(server_.requests().empty());
  pull->IssueAll();
  ASSERT_TRUE(server_.AwaitRequests(4));
  // Elements [0, 10) are partition 0 only; table 1 does not wait for table 0.
  ASSERT_TRUE(pull->WaitRange(0, 10).ok());
  ASSERT_TRUE(pull->WaitRange(1, UINT64_MAX).ok());
  for (uint32_t i = 0; i < 10; ++i) {
    EXPECT_EQ(tables[0][i], 0.f * 1000 + i);
    EXPECT_EQ(tables[1][i], 3.f * 1000 + i);  // straight into the tensor
  }
  // Element 10 lives in held partition 1.
  server_.Release(1);
  ASSERT_TRUE(pull->WaitRange(0, 11).ok());
  EXPECT_EQ(tables[0][15], 1000.f + 5);
  server_.Release(2);
  ASSERT_TRUE(pull->Finish().ok());
  EXPECT_EQ(tables[0][29], 2000.f + 9);
  EXPECT_EQ(lowest, 7u);
}

TEST_F(ParamClientTest, IssueRangeSendsWholePartitionsOnceEach) {
  std::vector<std::vector<float>> grads = {std::vector<float>(30), std::vector<float>(10)};
  for (size_t t = 0; t < grads.size(); ++t) {
    for (size_t i = 0; i < grads[t].size(); ++i) grads[t][i] = 100.f * t + i;
  }
  PushResult result;
  auto push = client_->StartPush(&grads, /*step=*/4, /*count=*/2, &result);
  push->IssueRange(0, 15);  // partition 0 is whole, partition 1 is not
  ASSERT_TRUE(server_.AwaitRequests(1));
  push->IssueRange(0, 20);
  push->IssueRange(0, 20);  // again: nothing new
  ASSERT_TRUE(server_.AwaitRequests(2));
  push->IssueRange(1, 10);
  ASSERT_TRUE(server_.AwaitRequests(3));
  ASSERT_TRUE(push->Finish().ok());  // sends what is left: partition 2
  using Req = std::pair<MessageType, uint32_t>;
  EXPECT_THAT(
      server_.requests(),
      ::testing::ElementsAre(Req{MessageType::kPushRequest, 0}, Req{MessageType::kPushRequest, 1},
                             Req{MessageType::kPushRequest, 3}, Req{MessageType::kPushRequest, 2}));
  const auto pushed = server_.pushed();
  ASSERT_EQ(pushed.size(), 4u);
  for (uint32_t p = 0; p < 3; ++p) {
    EXPECT_THAT(pushed.at(p), ::testing::ElementsAreArray(grads[0].data() + 10 * p, 10))
        << "partition " << p;
  }
  EXPECT_THAT(pushed.at(3), ::testing::ElementsAreArray(grads[1]));
  EXPECT_EQ(result.stale_partitions, 0);
}

TEST_F(ParamClientTest, PushThenPullSendsThePullsRightBehindThePushes) {
  std::vector<std::vector<float>> grads = {std::vector<float>(30, 1.f),
                                           std::vector<float>(10, 2.f)};
  std::vector<std::vector<float>> tables;
  PushResult result;
  auto lowest = client_->PushThenPull(grads, /*step=*/1, /*count=*/1,
                                      /*min_version=*/0, &tables, &result);
  ASSERT_TRUE(lowest.ok()) << lowest.status();
  EXPECT_EQ(*lowest, 7u);
  // One connection, so arrival order is send order: every push first.
  const auto requests = server_.requests();
  ASSERT_EQ(requests.size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(requests[i].first, i < 4 ? MessageType::kPushRequest : MessageType::kPullRequest)
        << i;
  }
  EXPECT_EQ(server_.pushed().size(), 4u);
  ASSERT_EQ(tables.size(), 2u);
  EXPECT_EQ(tables[0][25], 2000.f + 5);
  EXPECT_EQ(tables[1][9], 3000.f + 9);
}

}  // namespace
}  // namespace strata::worker
