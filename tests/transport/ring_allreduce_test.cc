// Strata's ring allreduce (transport/ring_allreduce.h) against a sum
// computed directly: rings of 2-4 ranks over the inproc and tcp
// transports, buffers from 1 float to more than a chunk of chunks, chunk
// sizes that do not divide them; and its errors: a rank that never comes,
// ranks that disagree on the buffer, a malformed message.
#include "transport/ring_allreduce.h"

#include <cmath>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace strata::transport {
namespace {

using ::strata::testing::IsOk;
using ::strata::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// A ring of `w` ranks, each on a transport of its own.
struct Ring {
  std::vector<std::unique_ptr<Transport>> transports;
  std::vector<std::unique_ptr<RingAllreduce>> ranks;
  ~Ring() {
    for (auto& t : transports) t->Shutdown();
  }
};

// (max_chunks 0 by default: the chunk sizes the tests ask for, however
// many chunks a segment then has.)
std::unique_ptr<Ring> MakeRing(int w, size_t chunk_bytes, const std::string& kind = "inproc",
                               absl::Duration timeout = absl::Seconds(30),
                               uint32_t max_chunks = 0) {
  auto ring = std::make_unique<Ring>();
  TransportOptions to;
  to.kind = kind;
  to.lend_request_payloads = true;  // (tcp: chunks reduced from the connection's buffer)
  if (kind == "inproc") to.inproc_network = NewInProcNetwork();
  std::vector<std::string> addresses;
  for (int i = 0; i < w; ++i) {
    auto t = CreateTransport(to);
    EXPECT_THAT(t, IsOk());
    if (!t.ok()) return nullptr;
    ring->transports.push_back(*std::move(t));
    RingAllreduce::Options o;
    o.rank = i;
    o.size = w;
    o.node_id = 100 + i;
    o.chunk_bytes = chunk_bytes;
    o.max_chunks = max_chunks;
    o.timeout = timeout;
    auto r = RingAllreduce::Create(ring->transports.back().get(), o);
    EXPECT_THAT(r, IsOk());
    if (!r.ok()) return nullptr;
    ring->ranks.push_back(*std::move(r));
    RingAllreduce* rank = ring->ranks.back().get();
    EXPECT_THAT(ring->transports.back()->Listen("127.0.0.1", 0,
                                                [rank](Message m, std::shared_ptr<Responder> resp) {
                                                  rank->Handle(std::move(m), std::move(resp));
                                                }),
                IsOk());
    addresses.push_back(ring->transports.back()->listen_address());
  }
  for (int i = 0; i < w; ++i) {
    EXPECT_THAT(ring->ranks[i]->ConnectNext(addresses[(i + 1) % w]), IsOk());
  }
  return ring;
}

// Rank r's buffer of n floats for operation op.
std::vector<float> Input(int r, size_t n, uint64_t op) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i) + r + 0.1 * op)) * (r + 1);
  }
  return v;
}

// Runs `op` on every rank at once (each rank's n in `sizes`); the buffers
// after and each rank's status.
std::vector<absl::Status> RunAll(Ring& ring, std::vector<std::vector<float>>* bufs, uint64_t op,
                                 const std::vector<int>& absent = {}) {
  const int w = static_cast<int>(ring.ranks.size());
  std::vector<absl::Status> status(w);
  std::vector<std::thread> threads;
  for (int r = 0; r < w; ++r) {
    if (std::find(absent.begin(), absent.end(), r) != absent.end()) continue;
    threads.emplace_back(
        [&, r] { status[r] = ring.ranks[r]->Allreduce((*bufs)[r].data(), (*bufs)[r].size(), op); });
  }
  for (auto& t : threads) t.join();
  return status;
}

void ExpectSum(Ring& ring, size_t n, uint64_t op) {
  const int w = static_cast<int>(ring.ranks.size());
  std::vector<std::vector<float>> bufs;
  std::vector<double> want(n, 0);
  for (int r = 0; r < w; ++r) {
    bufs.push_back(Input(r, n, op));
    for (size_t i = 0; i < n; ++i) want[i] += bufs.back()[i];
  }
  for (const absl::Status& s : RunAll(ring, &bufs, op)) ASSERT_THAT(s, IsOk());
  double worst = 0;
  for (size_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::fabs(bufs[0][i] - want[i]) / (1 + std::fabs(want[i])));
  }
  EXPECT_LT(worst, 1e-6) << "ring of " << w << ", " << n << " floats";
  // Every rank holds the same bytes: the all-gather copies each sum.
  for (int r = 1; r < w; ++r) {
    EXPECT_EQ(0, std::memcmp(bufs[r].data(), bufs[0].data(), n * sizeof(float)))
        << "rank " << r << " of " << w << ", " << n << " floats";
  }
}

TEST(RingAllreduceTest, SumsEverySizeOnRingsOf2To4Ranks) {
  // Chunks of 1 float, of 7 (dividing nothing here) and of 64 KiB.
  for (size_t chunk_bytes : {size_t{4}, size_t{28}, size_t{64 << 10}}) {
    for (int w : {2, 3, 4}) {
      auto ring = MakeRing(w, chunk_bytes);
      ASSERT_NE(ring, nullptr);
      uint64_t op = 1;
      for (size_t n : {size_t{1}, size_t{3}, size_t{5}, size_t{1000}, size_t{70001}}) {
        if (chunk_bytes == 4 && n > 1000) continue;  // (70001 messages of a float: slow)
        ExpectSum(*ring, n, op++);
      }
    }
  }
}

TEST(RingAllreduceTest, LargeSegmentsGoInAtMostMaxChunksChunks) {
  // 4 chunks a segment at most: 300007 floats over 3 ranks are segments of
  // 100002-100003 floats, cut into chunks of 25001 (not the 1 KiB asked).
  auto ring = MakeRing(3, 1024, "inproc", absl::Seconds(30), /*max_chunks=*/4);
  ASSERT_NE(ring, nullptr);
  ExpectSum(*ring, 300007, 1);
  ExpectSum(*ring, 5, 2);  // (and a buffer smaller than a chunk)
  // The owner sees its segment's chunks: 4 of them.
  std::vector<std::vector<float>> bufs = {Input(0, 300007, 3), Input(1, 300007, 3),
                                          Input(2, 300007, 3)};
  std::vector<int> chunks(3, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      RingAllreduce::Hooks hooks;
      hooks.owned = [&, r](size_t, float*, size_t len) {
        EXPECT_LE(len, 25001u);
        ++chunks[r];
      };
      EXPECT_THAT(ring->ranks[r]->Allreduce(bufs[r].data(), bufs[r].size(), 3, hooks), IsOk());
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(chunks, std::vector<int>({4, 4, 4}));
}

TEST(RingAllreduceTest, SumsOverTcpOperationAfterOperation) {
  auto ring = MakeRing(3, 64 << 10, "tcp");
  ASSERT_NE(ring, nullptr);
  for (uint64_t op = 1; op <= 4; ++op) ExpectSum(*ring, 300007, op);
  // Each rank sent 2 (w - 1) / w of each buffer.
  const double per_op = 2.0 * 2 / 3 * 300007 * sizeof(float);
  EXPECT_NEAR(static_cast<double>(ring->ranks[0]->bytes_sent()), 4 * per_op, 4 * 2 * 4.0);
}

TEST(RingAllreduceTest, HooksChangeTheSumsOnTheirWayRound) {
  // The owner of a segment doubles its sum after sending it on; the next
  // rank adds 1 to what it receives: so the owner ends with 2 x the sum,
  // every other rank with the sum + 1.
  for (int w : {1, 2, 3, 4}) {
    auto ring = MakeRing(w, 28);
    ASSERT_NE(ring, nullptr);
    const size_t n = 103;
    std::vector<std::vector<float>> bufs;
    std::vector<double> want(n, 0);
    for (int r = 0; r < w; ++r) {
      bufs.push_back(Input(r, n, 1));
      for (size_t i = 0; i < n; ++i) want[i] += bufs.back()[i];
    }
    std::vector<absl::Status> status(w);
    std::vector<std::vector<size_t>> owned(w), gathered(w);
    std::vector<std::thread> threads;
    for (int r = 0; r < w; ++r) {
      threads.emplace_back([&, r] {
        RingAllreduce::Hooks hooks;
        hooks.owned = [&, r](size_t offset, float* chunk, size_t len) {
          for (size_t i = 0; i < len; ++i) chunk[i] *= 2;
          for (size_t i = 0; i < len; ++i) owned[r].push_back(offset + i);
        };
        hooks.first_gathered = [&, r](size_t offset, float* chunk, size_t len) {
          for (size_t i = 0; i < len; ++i) chunk[i] += 1;
          for (size_t i = 0; i < len; ++i) gathered[r].push_back(offset + i);
        };
        status[r] = ring->ranks[r]->Allreduce(bufs[r].data(), n, 1, hooks);
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < w; ++r) {
      ASSERT_THAT(status[r], IsOk());
      // Rank r owns segment r + 1 and holds the first copy of segment r.
      const size_t s = (r + 1) % w;
      ASSERT_EQ(owned[r].size(), n * (s + 1) / w - n * s / w) << "rank " << r << " of " << w;
      EXPECT_EQ(owned[r].front(), n * s / w);
      if (w > 1) EXPECT_EQ(gathered[r].front(), n * r / w);
      std::vector<bool> mine(n, false);
      for (size_t i : owned[r]) mine[i] = true;
      for (size_t i = 0; i < n; ++i) {
        const double expect = mine[i] ? 2 * want[i] : want[i] + 1;
        EXPECT_NEAR(bufs[r][i], expect, 1e-4 * (1 + std::fabs(expect)))
            << "rank " << r << " of " << w << ", float " << i;
      }
    }
  }
}

TEST(RingAllreduceTest, SegmentsOfTheCallersChoosingEmptyOnesAmongThem) {
  // A piece of a larger buffer whose owners' parts fall unevenly in it: a
  // rank may own all of it, some, or none (an empty segment). The sums are
  // right everywhere, and each rank's `owned` hook sees its segment only.
  struct Case {
    int w;
    size_t n;
    std::vector<size_t> bounds;
  };
  const std::vector<Case> cases = {
      {2, 50, {0, 0, 50}},        {2, 50, {0, 50, 50}},         {3, 61, {0, 0, 7, 61}},
      {3, 61, {0, 61, 61, 61}},   {4, 97, {0, 10, 10, 96, 97}}, {4, 1, {0, 0, 1, 1, 1}},
      {3, 200, {0, 20, 40, 200}},
  };
  for (const Case& c : cases) {
    auto ring = MakeRing(c.w, 12);
    ASSERT_NE(ring, nullptr);
    std::vector<std::vector<float>> bufs;
    std::vector<double> want(c.n, 0);
    for (int r = 0; r < c.w; ++r) {
      bufs.push_back(Input(r, c.n, 1));
      for (size_t i = 0; i < c.n; ++i) want[i] += bufs.back()[i];
    }
    std::vector<absl::Status> status(c.w);
    std::vector<std::vector<size_t>> owned(c.w);
    std::vector<std::thread> threads;
    for (int r = 0; r < c.w; ++r) {
      threads.emplace_back([&, r] {
        RingAllreduce::Hooks hooks;
        hooks.owned = [&, r](size_t offset, float*, size_t len) {
          for (size_t i = 0; i < len; ++i) owned[r].push_back(offset + i);
        };
        // (Unsettled: the next call's wait covers its sends.)
        status[r] = ring->ranks[r]->Allreduce(bufs[r].data(), c.n, 1, hooks,
                                              RingAllreduce::Cut{c.bounds, /*settle=*/false});
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < c.w; ++r) {
      ASSERT_THAT(status[r], IsOk()) << "ring of " << c.w << ", rank " << r;
      const size_t s = (r + 1) % c.w;
      std::vector<size_t> expect;
      for (size_t i = c.bounds[s]; i < c.bounds[s + 1]; ++i) expect.push_back(i);
      EXPECT_EQ(owned[r], expect) << "ring of " << c.w << ", rank " << r;
      for (size_t i = 0; i < c.n; ++i) {
        EXPECT_NEAR(bufs[r][i], want[i], 1e-5 * (1 + std::fabs(want[i])))
            << "ring of " << c.w << ", rank " << r << ", float " << i;
      }
    }
    // The ring goes on to the next call (nothing of this one left over).
    ExpectSum(*ring, c.n, 2);
  }
  // Bounds that are not a cut of the buffer.
  auto ring = MakeRing(2, 12);
  ASSERT_NE(ring, nullptr);
  std::vector<float> v(10, 1.f);
  for (const std::vector<size_t>& bad :
       std::vector<std::vector<size_t>>{{0, 10}, {0, 6, 5}, {1, 5, 10}, {0, 5, 9}}) {
    EXPECT_THAT(ring->ranks[0]->Allreduce(v.data(), v.size(), 1, {}, RingAllreduce::Cut{bad}),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("segment bounds")));
  }
}

TEST(RingAllreduceTest, OneRankIsNoExchange) {
  auto ring = MakeRing(1, 1024);
  ASSERT_NE(ring, nullptr);
  std::vector<float> v = {1.f, 2.f};
  EXPECT_THAT(ring->ranks[0]->Allreduce(v.data(), v.size(), 1), IsOk());
  EXPECT_EQ(v, (std::vector<float>{1.f, 2.f}));
}

TEST(RingAllreduceTest, ARankThatNeverComesIsNamedAndTheRingStaysBroken) {
  auto ring = MakeRing(3, 1024, "inproc", absl::Milliseconds(300));
  ASSERT_NE(ring, nullptr);
  std::vector<std::vector<float>> bufs = {Input(0, 100, 1), Input(1, 100, 1), Input(2, 100, 1)};
  const std::vector<absl::Status> status = RunAll(*ring, &bufs, 1, /*absent=*/{2});
  // Rank 0 waits for rank 2; rank 1 for rank 0, which cannot pass on
  // what it never had.
  EXPECT_THAT(status[0], StatusIs(absl::StatusCode::kDeadlineExceeded,
                                  AllOf(HasSubstr("rank 0 of 3"),
                                        HasSubstr("did not come from the previous rank (2)"))));
  EXPECT_THAT(status[1], StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("rank 1 of 3")));
  EXPECT_THAT(ring->ranks[0]->Allreduce(bufs[0].data(), 100, 2),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
}

TEST(RingAllreduceTest, RanksThatDisagreeOnTheBufferAreToldSo) {
  auto ring = MakeRing(2, 1 << 20, "inproc", absl::Seconds(5));
  ASSERT_NE(ring, nullptr);
  std::vector<std::vector<float>> bufs = {Input(0, 100, 1), Input(1, 120, 1)};
  const std::vector<absl::Status> status = RunAll(*ring, &bufs, 1);
  for (const absl::Status& s : status) {
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                            HasSubstr("reducing buffers of different sizes")));
  }
}

TEST(RingAllreduceTest, OneRankOfThreeWithAnotherBufferFailsEveryRank) {
  // Rank 2 disagrees: rank 0 (its receiver) and rank 2 (told by the error
  // answer) learn why; rank 1, between two ranks that stopped, learns it
  // from the timeout. Nobody hangs, nobody ends with a wrong sum.
  auto ring = MakeRing(3, 64, "inproc", absl::Seconds(2));
  ASSERT_NE(ring, nullptr);
  std::vector<std::vector<float>> bufs = {Input(0, 100, 1), Input(1, 100, 1), Input(2, 130, 1)};
  const std::vector<absl::Status> status = RunAll(*ring, &bufs, 1);
  for (int r = 0; r < 3; ++r) EXPECT_FALSE(status[r].ok()) << "rank " << r;
  for (int r : {0, 2}) {
    EXPECT_THAT(status[r], StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr("reducing buffers of different sizes")))
        << "rank " << r;
  }
  // A ring that failed stays failed.
  EXPECT_FALSE(ring->ranks[0]->Allreduce(bufs[0].data(), 100, 2).ok());
}

TEST(RingAllreduceTest, AMalformedMessageIsRefusedNamingItsSender) {
  auto ring = MakeRing(2, 1024);
  ASSERT_NE(ring, nullptr);
  auto conn = ring->transports[0]->Connect(ring->transports[1]->listen_address());
  ASSERT_THAT(conn, IsOk());
  Message m;
  m.header.type = MessageType::kCollective;
  m.header.count = 3;  // 3 floats said, 2 sent
  m.payload.assign(8, '\0');
  auto r = (*conn)->CallSync(std::move(m), absl::Seconds(5));
  ASSERT_THAT(r, IsOk());
  EXPECT_THAT(ResponseStatus(*r), StatusIs(absl::StatusCode::kInvalidArgument,
                                           AllOf(HasSubstr("malformed collective message"),
                                                 HasSubstr("8 bytes for 3"))));
}

TEST(RingAllreduceTest, BadOptionsAreRefused) {
  TransportOptions to;
  to.kind = "inproc";
  to.inproc_network = NewInProcNetwork();
  auto t = CreateTransport(to);
  ASSERT_THAT(t, IsOk());
  RingAllreduce::Options o;
  o.rank = 3;
  o.size = 3;
  EXPECT_THAT(RingAllreduce::Create(t->get(), o), StatusIs(absl::StatusCode::kInvalidArgument));
  o.rank = 0;
  o.chunk_bytes = 6;
  EXPECT_THAT(RingAllreduce::Create(t->get(), o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("multiple of 4")));
}

}  // namespace
}  // namespace strata::transport
