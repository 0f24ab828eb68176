// ParamClient's dense path chunk by chunk (the view's chunk_bytes) against
// real pserver partitions behind a TCP transport: partitions larger than a
// chunk go as one request per chunk, each landing in place; a push whose
// sender's connection closed between its chunks (and in the middle of
// one) is applied once when it comes again; bsp pulls sent before the
// pushes wait for their chunk's version; and the result is bit for bit
// that of whole partitions.
#include <unistd.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pserver/partition.h"
#include "tests/testing/status_matchers.h"
#include "tests/transport/raw_socket.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/transport.h"
#include "worker/param_client.h"

namespace strata::worker {
namespace {

using ::strata::testing::IsOk;
using ::testing::SizeIs;
using transport::Message;
using transport::MessageType;

constexpr uint32_t kNode = 5;
// Table 0: 23 floats in partitions 0 [0, 13) and 1 [13, 23); table 1: 3
// floats in partition 2.
constexpr uint64_t kTable0 = 23, kSplit = 13, kTable1 = 3;

// Dense partitions (momentum, so each element's state matters), served on
// one TCP transport, cut into chunks of `chunk_floats`.
class DenseServer {
 public:
  DenseServer(Consistency consistency, uint64_t chunk_floats) : chunk_floats_(chunk_floats) {
    const uint64_t lengths[] = {kSplit, kTable0 - kSplit, kTable1};
    for (uint32_t id = 0; id < 3; ++id) {
      OptimizerSection c;
      c.type = "momentum";
      c.learning_rate = 0.5;
      c.momentum = 0.9;
      std::vector<float> values(lengths[id]);
      for (size_t i = 0; i < values.size(); ++i) values[i] = 0.1f * (id + 1) * (i + 1);
      parts_[id] = std::make_unique<pserver::Partition>(
          id, "t", std::move(values), std::move(*Optimizer::Create(c, lengths[id])), consistency,
          chunk_floats);
      parts_[id]->SetStepWorkers({kNode});
    }
    transport_ = *transport::CreateTransport(transport::TransportOptions());
    EXPECT_THAT(transport_->Listen("127.0.0.1", 0,
                                   [this](Message m, std::shared_ptr<transport::Responder> r) {
                                     {
                                       absl::MutexLock l(&mu_);
                                       requests_.emplace_back(m.header.partition, m.header.flags);
                                     }
                                     pserver::Partition* p = parts_.at(m.header.partition).get();
                                     if (m.header.type == MessageType::kPullRequest) {
                                       p->Pull(m, std::move(r));
                                     } else {
                                       p->Push(m, std::move(r));
                                     }
                                   }),
                IsOk());
  }
  ~DenseServer() { transport_->Shutdown(); }

  proto::ClusterView View() const {
    proto::ClusterView view;
    view.set_epoch(1);
    view.set_ready(true);
    view.set_chunk_bytes(chunk_floats_ * sizeof(float));
    auto* m = view.add_members();
    m->set_id(1);
    m->set_role(proto::PSERVER);
    m->set_data_address(transport_->listen_address());
    const uint32_t tables[] = {0, 0, 1};
    const uint64_t offsets[] = {0, kSplit, 0};
    const uint64_t lengths[] = {kSplit, kTable0 - kSplit, kTable1};
    for (uint32_t id = 0; id < 3; ++id) {
      auto* p = view.add_partitions();
      p->set_id(id);
      p->set_table_id(tables[id]);
      p->set_offset(offsets[id]);
      p->set_length(lengths[id]);
      p->set_owner(1);
    }
    view.add_tables()->set_num_elements(kTable0);
    view.add_tables()->set_num_elements(kTable1);
    return view;
  }
  std::string address() const { return transport_->listen_address(); }
  pserver::Partition& partition(uint32_t id) { return *parts_.at(id); }
  // (partition, flags) of every request so far.
  std::vector<std::pair<uint32_t, uint32_t>> TakeRequests() {
    absl::MutexLock l(&mu_);
    return std::move(requests_);
  }

 private:
  const uint64_t chunk_floats_;
  std::map<uint32_t, std::unique_ptr<pserver::Partition>> parts_;
  std::unique_ptr<transport::Transport> transport_;
  absl::Mutex mu_;
  std::vector<std::pair<uint32_t, uint32_t>> requests_ ABSL_GUARDED_BY(mu_);
};

struct Client {
  explicit Client(const proto::ClusterView& view) {
    transport = *transport::CreateTransport(transport::TransportOptions());
    client = std::make_unique<ParamClient>(
        transport.get(), kNode,
        []() -> absl::StatusOr<proto::ClusterView> { return absl::UnavailableError("none"); },
        absl::Seconds(10));
    client->SetView(view);
  }
  ~Client() { transport->Shutdown(); }
  std::unique_ptr<transport::Transport> transport;
  std::unique_ptr<ParamClient> client;
};

std::vector<std::vector<float>> Gradient(uint64_t step) {
  std::vector<std::vector<float>> g = {std::vector<float>(kTable0), std::vector<float>(kTable1)};
  for (size_t t = 0; t < g.size(); ++t) {
    for (size_t i = 0; i < g[t].size(); ++i) {
      g[t][i] = 0.01f * static_cast<float>((i * 7 + t * 3 + step) % 11) - 0.05f;
    }
  }
  return g;
}

// Three steps of push-then-pull; returns the tables pulled last.
std::vector<std::vector<float>> Train(Consistency consistency, uint64_t chunk_floats,
                                      std::vector<std::pair<uint32_t, uint32_t>>* requests) {
  DenseServer server(consistency, chunk_floats);
  Client c(server.View());
  std::vector<std::vector<float>> tables;
  for (uint64_t step = 0; step < 3; ++step) {
    const auto grads = Gradient(step);
    PushResult pushed;
    auto version = c.client->PushThenPull(
        grads, step, 1, consistency == Consistency::kBsp ? step + 1 : 0, &tables, &pushed);
    EXPECT_THAT(version.status(), IsOk());
    if (version.ok()) EXPECT_EQ(*version, step + 1);
  }
  // Every push acknowledged once per partition, not per chunk.
  const auto acked = c.client->AckedPushes();
  EXPECT_EQ(acked, (std::map<uint32_t, uint64_t>{{0, 3}, {1, 3}, {2, 3}}));
  for (uint32_t id = 0; id < 3; ++id) {
    EXPECT_EQ(server.partition(id).applied_by_sender(), (std::map<uint32_t, uint64_t>{{kNode, 3}}));
  }
  if (requests != nullptr) *requests = server.TakeRequests();
  return tables;
}

TEST(ChunkedClientTest, ChunkedExchangesGiveWhatWholePartitionsGive) {
  for (Consistency mode : {Consistency::kBsp, Consistency::kAsp}) {
    SCOPED_TRACE(mode == Consistency::kBsp ? "bsp" : "asp");
    const auto whole = Train(mode, 0, nullptr);
    // One float, not dividing the partitions, larger than partition 2 but
    // not the others, larger than every partition.
    for (uint64_t cf : {1u, 4u, 5u, 16u}) {
      SCOPED_TRACE(::testing::Message() << "chunks of " << cf << " floats");
      std::vector<std::pair<uint32_t, uint32_t>> requests;
      EXPECT_EQ(Train(mode, cf, &requests), whole);
      // Each partition larger than a chunk went chunk by chunk.
      std::map<uint32_t, std::set<uint32_t>> chunks_seen;
      for (const auto& [partition, flags] : requests) {
        if (flags & transport::kFlagChunk)
          chunks_seen[partition].insert(transport::ChunkIndex(flags));
      }
      const uint64_t lengths[] = {kSplit, kTable0 - kSplit, kTable1};
      for (uint32_t id = 0; id < 3; ++id) {
        const size_t want = lengths[id] > cf ? (lengths[id] + cf - 1) / cf : 0;
        EXPECT_EQ(chunks_seen[id].size(), want) << "partition " << id;
      }
    }
  }
}

// A worker's connection closed after the first chunk of a push and in the
// middle of the second (a crash, a reset link): the push comes again with
// the same seq on a new connection and is applied once.
TEST(ChunkedClientTest, PushCutBetweenChunksIsAppliedOnceWhenItComesAgain) {
  constexpr uint64_t kChunk = 4;
  DenseServer server(Consistency::kAsp, kChunk);
  DenseServer reference(Consistency::kAsp, 0);
  const auto grads = Gradient(0);
  {
    // Raw frames: chunk 0 of partition 0's push (seq 1, the client's first),
    // then half of chunk 1's frame, then the connection closes.
    const int fd = transport::testing::RawConnect(server.address());
    auto frame = [&](uint32_t chunk) {
      Message m;
      m.header.type = MessageType::kPushRequest;
      m.header.sender_id = kNode;
      m.header.epoch = 1;
      m.header.seq = 1;
      m.header.partition = 0;
      m.header.count = 1;
      m.header.flags = transport::ChunkFlags(chunk);
      m.header.request_id = 100 + chunk;
      const float* g = grads[0].data() + chunk * kChunk;
      char head[transport::tcp::kFrameHeaderBytes];
      transport::tcp::EncodeFrameHeader(m.header, kChunk * sizeof(float), head);
      return std::string(head, sizeof(head)) +
             std::string(reinterpret_cast<const char*>(g), kChunk * sizeof(float));
    };
    const std::string first = frame(0), second = frame(1);
    ASSERT_EQ(::write(fd, first.data(), first.size()), static_cast<ssize_t>(first.size()));
    const size_t half = second.size() - 6;
    ASSERT_EQ(::write(fd, second.data(), half), static_cast<ssize_t>(half));
    // The first chunk's ack: it was applied.
    char ack[transport::tcp::kFrameHeaderBytes];
    ASSERT_EQ(::read(fd, ack, sizeof(ack)), static_cast<ssize_t>(sizeof(ack)));
    ::close(fd);
  }
  for (int i = 0; i < 200 && server.partition(0).stats().newest_chunk_version == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(server.partition(0).stats().newest_chunk_version, 1u);
  EXPECT_EQ(server.partition(0).stats().version, 0u);
  EXPECT_TRUE(server.partition(0).applied_by_sender().empty());  // not complete

  Client c(server.View());
  Client r(reference.View());
  PushResult pushed;
  ASSERT_THAT(c.client->PushAll(grads, 0, 1).status(), IsOk());
  ASSERT_THAT(r.client->PushAll(grads, 0, 1).status(), IsOk());
  for (uint32_t id = 0; id < 3; ++id) {
    SCOPED_TRACE(::testing::Message() << "partition " << id);
    EXPECT_EQ(server.partition(id).ValuesForTesting(), reference.partition(id).ValuesForTesting());
    EXPECT_EQ(server.partition(id).applied_by_sender(), (std::map<uint32_t, uint64_t>{{kNode, 1}}));
    EXPECT_EQ(server.partition(id).stats().version, 1u);
  }
  EXPECT_EQ(server.partition(0).stats().duplicate_pushes, 1u);
}

// Bsp: pulls issued before the pushes they wait for (a pull overtaking a
// push) are answered chunk by chunk once the push's chunks are applied.
TEST(ChunkedClientTest, BspPullsSentBeforeThePushWaitForTheirChunks) {
  DenseServer server(Consistency::kBsp, 4);
  Client c(server.View());
  std::vector<std::vector<float>> tables;
  uint64_t lowest = 0;
  auto pull = c.client->StartPull(1, &tables, &lowest);
  pull->IssueAll();
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(server.partition(0).stats().pulls_served, 0u);
  const auto grads = Gradient(0);
  ASSERT_THAT(c.client->PushAll(grads, 0, 1).status(), IsOk());
  ASSERT_THAT(pull->Finish(), IsOk());
  EXPECT_EQ(lowest, 1u);
  EXPECT_EQ(server.partition(0).stats().pulls_served, 4u);  // 13 floats in chunks of 4
  std::vector<float> expect = server.partition(0).ValuesForTesting();
  const auto p1 = server.partition(1).ValuesForTesting();
  expect.insert(expect.end(), p1.begin(), p1.end());
  EXPECT_EQ(tables[0], expect);
  EXPECT_EQ(tables[1], server.partition(2).ValuesForTesting());
}

}  // namespace
}  // namespace strata::worker
