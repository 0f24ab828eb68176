// The verbs layer on a real device: two RC queue pairs of one process joined
// to each other. Runs in the Soft-RoCE guest (tests/rdma); elsewhere it
// skips for want of a device, unless STRATA_REQUIRE_RDMA is set (the guest
// sets it, so a missing device fails there).
#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <set>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/low_memlock.h"
#include "tests/testing/status_matchers.h"
#include "transport/rdma/verbs.h"

namespace strata::transport::rdma {
namespace {

using ::strata::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int kAccessDst = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;

std::vector<char> Pattern(size_t n, int seed) {
  std::vector<char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<char>((i * 131 + seed * 7 + i / 4096) & 0xff);
  return v;
}

class RdmaVerbsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto devices = ListRdmaDevices();
    if (!devices.ok() || devices->empty()) {
      if (std::getenv("STRATA_REQUIRE_RDMA") != nullptr) {
        FAIL() << "STRATA_REQUIRE_RDMA is set but there is no RDMA device: "
               << (devices.ok() ? "empty list" : devices.status().ToString());
      }
      GTEST_SKIP() << "no RDMA device here; tests/rdma runs this on Soft-RoCE";
    }
    absl::StatusOr<RdmaSelection> sel = SelectRdmaDevice(*devices, {});
    if (!sel.ok() && std::getenv("STRATA_REQUIRE_RDMA") == nullptr) {
      GTEST_SKIP() << "no usable RDMA device here (" << sel.status() << ")";
    }
    ASSERT_TRUE(sel.ok()) << sel.status();
    STRATA_ASSERT_OK_AND_ASSIGN(device_, VerbsDevice::Open(*sel));
    for (auto* cq : {&cq_a_, &cq_b_}) {
      STRATA_ASSERT_OK_AND_ASSIGN(*cq, CompletionQueue::Create(device_.get(), 256));
    }
    STRATA_ASSERT_OK_AND_ASSIGN(
        qp_a_, RcQueuePair::Create(device_.get(), cq_a_.get(), cq_a_.get(), 128, 128, "peer-a"));
    STRATA_ASSERT_OK_AND_ASSIGN(
        qp_b_, RcQueuePair::Create(device_.get(), cq_b_.get(), cq_b_.get(), 128, 128, "peer-b"));
    ASSERT_THAT(qp_a_->Connect(qp_b_->local_info()), ::strata::testing::IsOk());
    ASSERT_THAT(qp_b_->Connect(qp_a_->local_info()), ::strata::testing::IsOk());
    EXPECT_EQ(qp_a_->StateName(), "RTS");
  }

  // Polls `cq` until `n` completions arrived (or 20 s passed).
  std::vector<ibv_wc> Drain(CompletionQueue* cq, int n) {
    std::vector<ibv_wc> out;
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (static_cast<int>(out.size()) < n && absl::Now() < deadline) {
      ibv_wc wc[16];
      auto got = cq->Poll(wc, 16);
      if (!got.ok()) {
        ADD_FAILURE() << got.status();
        break;
      }
      out.insert(out.end(), wc, wc + *got);
    }
    return out;
  }

  std::unique_ptr<VerbsDevice> device_;
  std::unique_ptr<CompletionQueue> cq_a_, cq_b_;
  std::unique_ptr<RcQueuePair> qp_a_, qp_b_;
};

TEST_F(RdmaVerbsTest, WriteWithImmLandsInTheRegisteredDestination) {
  const size_t n = 1 << 20;
  std::vector<char> src = Pattern(n, 1), dst(n, 0), recv_slot(64);
  STRATA_ASSERT_OK_AND_ASSIGN(
      auto src_mr, MemoryRegion::Register(device_.get(), src.data(), n, IBV_ACCESS_LOCAL_WRITE));
  STRATA_ASSERT_OK_AND_ASSIGN(auto dst_mr,
                              MemoryRegion::Register(device_.get(), dst.data(), n, kAccessDst));
  STRATA_ASSERT_OK_AND_ASSIGN(
      auto slot_mr, MemoryRegion::Register(device_.get(), recv_slot.data(), recv_slot.size(),
                                           IBV_ACCESS_LOCAL_WRITE));
  ASSERT_THAT(qp_b_->PostRecv(7, recv_slot.data(), 64, slot_mr->lkey()), ::strata::testing::IsOk());
  ASSERT_THAT(qp_a_->PostWriteWithImm(9, src.data(), n, src_mr->lkey(),
                                      reinterpret_cast<uint64_t>(dst.data()), dst_mr->rkey(),
                                      /*imm=*/42, /*signaled=*/true),
              ::strata::testing::IsOk());
  auto sent = Drain(cq_a_.get(), 1);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_THAT(CompletionStatus(sent[0], "peer-b"), ::strata::testing::IsOk());
  EXPECT_EQ(sent[0].wr_id, 9u);
  auto got = Drain(cq_b_.get(), 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_THAT(CompletionStatus(got[0], "peer-a"), ::strata::testing::IsOk());
  EXPECT_EQ(got[0].opcode, IBV_WC_RECV_RDMA_WITH_IMM);
  EXPECT_EQ(ntohl(got[0].imm_data), 42u);
  EXPECT_EQ(got[0].byte_len, n);
  EXPECT_EQ(got[0].wr_id, 7u);
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), n), 0) << "payload differs";
}

TEST_F(RdmaVerbsTest, ManyWritesInFlightEachLandWhereTheyWereSent) {
  const int k = 64;
  const size_t slice = 16 << 10;
  std::vector<char> src = Pattern(k * slice, 2), dst(k * slice, 0), slots(k * 16);
  STRATA_ASSERT_OK_AND_ASSIGN(
      auto src_mr,
      MemoryRegion::Register(device_.get(), src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE));
  STRATA_ASSERT_OK_AND_ASSIGN(
      auto dst_mr, MemoryRegion::Register(device_.get(), dst.data(), dst.size(), kAccessDst));
  STRATA_ASSERT_OK_AND_ASSIGN(
      auto slot_mr,
      MemoryRegion::Register(device_.get(), slots.data(), slots.size(), IBV_ACCESS_LOCAL_WRITE));
  for (int i = 0; i < k; ++i) {
    ASSERT_THAT(qp_b_->PostRecv(i, slots.data() + 16 * i, 16, slot_mr->lkey()),
                ::strata::testing::IsOk());
  }
  // Posted in reverse order, every one in flight at once.
  for (int i = k - 1; i >= 0; --i) {
    ASSERT_THAT(qp_a_->PostWriteWithImm(i, src.data() + i * slice, slice, src_mr->lkey(),
                                        reinterpret_cast<uint64_t>(dst.data() + i * slice),
                                        dst_mr->rkey(), 1000 + i, /*signaled=*/i == 0),
                ::strata::testing::IsOk());
  }
  auto got = Drain(cq_b_.get(), k);
  ASSERT_EQ(got.size(), static_cast<size_t>(k));
  std::set<uint32_t> imms;
  for (const ibv_wc& wc : got) {
    EXPECT_THAT(CompletionStatus(wc, "peer-a"), ::strata::testing::IsOk());
    imms.insert(ntohl(wc.imm_data));
  }
  EXPECT_EQ(imms.size(), static_cast<size_t>(k));
  EXPECT_EQ(*imms.begin(), 1000u);
  EXPECT_EQ(*imms.rbegin(), 1000u + k - 1);
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), src.size()), 0);
  EXPECT_EQ(Drain(cq_a_.get(), 1).size(), 1u);  // the one signaled send
}

// What per-peer registration rests on (docs/security.md, "RDMA"): a
// remote key works only on a queue pair of its region's protection domain,
// and not at all once the region is deregistered.
TEST_F(RdmaVerbsTest, AKeyWorksOnlyInItsProtectionDomainAndDiesWithItsRegion) {
  const size_t n = 64 << 10;
  std::vector<char> src = Pattern(n, 3), dst(n, 0);
  // A pair whose receiving side has a domain of its own.
  STRATA_ASSERT_OK_AND_ASSIGN(auto pd, ProtectionDomain::Allocate(device_.get()));
  STRATA_ASSERT_OK_AND_ASSIGN(auto cq_x, CompletionQueue::Create(device_.get(), 64));
  STRATA_ASSERT_OK_AND_ASSIGN(auto cq_y, CompletionQueue::Create(device_.get(), 64));
  STRATA_ASSERT_OK_AND_ASSIGN(auto qp_x, RcQueuePair::Create(device_.get(), cq_x.get(), cq_x.get(),
                                                             16, 16, "peer-x", pd->pd()));
  STRATA_ASSERT_OK_AND_ASSIGN(
      auto qp_y, RcQueuePair::Create(device_.get(), cq_y.get(), cq_y.get(), 16, 16, "peer-y"));
  ASSERT_THAT(qp_x->Connect(qp_y->local_info()), ::strata::testing::IsOk());
  ASSERT_THAT(qp_y->Connect(qp_x->local_info()), ::strata::testing::IsOk());
  STRATA_ASSERT_OK_AND_ASSIGN(
      auto src_mr, MemoryRegion::Register(device_.get(), src.data(), n, IBV_ACCESS_LOCAL_WRITE));
  STRATA_ASSERT_OK_AND_ASSIGN(
      auto dst_x, MemoryRegion::Register(device_.get(), dst.data(), n, kAccessDst, pd->pd()));
  const uint64_t to = reinterpret_cast<uint64_t>(dst.data());
  // Through the queue pair of the region's domain: it lands.
  ASSERT_THAT(qp_y->PostWrite(1, src.data(), n, src_mr->lkey(), to, dst_x->rkey(), true),
              ::strata::testing::IsOk());
  auto done = Drain(cq_y.get(), 1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_THAT(CompletionStatus(done[0], "peer-x"), ::strata::testing::IsOk());
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), n), 0);
  // The same key through another domain's queue pair (qp_a_, the device's):
  // refused, nothing written.
  std::fill(dst.begin(), dst.end(), 0);
  ASSERT_THAT(qp_b_->PostWrite(2, src.data(), n, src_mr->lkey(), to, dst_x->rkey(), true),
              ::strata::testing::IsOk());
  auto refused = Drain(cq_b_.get(), 1);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0].status, IBV_WC_REM_ACCESS_ERR) << ibv_wc_status_str(refused[0].status);
  EXPECT_EQ(std::count(dst.begin(), dst.end(), 0), static_cast<long>(n)) << "written anyway";
  // The region deregistered: its key refused on its own domain's pair too.
  const uint32_t old_key = dst_x->rkey();
  dst_x.reset();
  ASSERT_THAT(qp_y->PostWrite(3, src.data(), n, src_mr->lkey(), to, old_key, true),
              ::strata::testing::IsOk());
  auto dead = Drain(cq_y.get(), 1);
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].status, IBV_WC_REM_ACCESS_ERR) << ibv_wc_status_str(dead[0].status);
  EXPECT_EQ(std::count(dst.begin(), dst.end(), 0), static_cast<long>(n)) << "written anyway";
  qp_x.reset();
  qp_y.reset();
}

TEST_F(RdmaVerbsTest, SendLandsInThePostedReceive) {
  std::vector<char> msg = Pattern(100, 3), buf(4096, 0);
  STRATA_ASSERT_OK_AND_ASSIGN(
      auto msg_mr,
      MemoryRegion::Register(device_.get(), msg.data(), msg.size(), IBV_ACCESS_LOCAL_WRITE));
  STRATA_ASSERT_OK_AND_ASSIGN(
      auto buf_mr,
      MemoryRegion::Register(device_.get(), buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE));
  ASSERT_THAT(qp_b_->PostRecv(1, buf.data(), buf.size(), buf_mr->lkey()),
              ::strata::testing::IsOk());
  ASSERT_THAT(qp_a_->PostSend(2, msg.data(), msg.size(), msg_mr->lkey(), true),
              ::strata::testing::IsOk());
  auto got = Drain(cq_b_.get(), 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].opcode, IBV_WC_RECV);
  EXPECT_EQ(got[0].byte_len, 100u);
  EXPECT_EQ(std::memcmp(msg.data(), buf.data(), 100), 0);
  EXPECT_EQ(Drain(cq_a_.get(), 1).size(), 1u);
}

TEST_F(RdmaVerbsTest, AQueuePairInErrorReportsEveryOperationNamingThePeer) {
  std::vector<char> msg(64, 'x');
  STRATA_ASSERT_OK_AND_ASSIGN(auto mr, MemoryRegion::Register(device_.get(), msg.data(), msg.size(),
                                                              IBV_ACCESS_LOCAL_WRITE));
  ASSERT_THAT(qp_a_->ForceError(), ::strata::testing::IsOk());
  EXPECT_EQ(qp_a_->StateName(), "ERR");
  // Either the post is refused or its completion is flushed with an error:
  // both are a Status naming the peer, never an abort.
  absl::Status s = qp_a_->PostSend(5, msg.data(), msg.size(), mr->lkey(), true);
  if (s.ok()) {
    auto wcs = Drain(cq_a_.get(), 1);
    ASSERT_EQ(wcs.size(), 1u);
    s = CompletionStatus(wcs[0], qp_a_->peer());
  }
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("peer-a")));
}

TEST_F(RdmaVerbsTest, RegistrationBeyondTheMemlockLimitNamesTheFix) {
  std::vector<char> big(16 << 20, 1);
  absl::StatusOr<std::unique_ptr<MemoryRegion>> mr;
  {
    ::strata::testing::LowMemlockLimit low(64 << 10);
    ASSERT_TRUE(low.ok());
    mr = MemoryRegion::Register(device_.get(), big.data(), big.size(), kAccessDst);
  }
  EXPECT_THAT(mr.status(), StatusIs(absl::StatusCode::kResourceExhausted,
                                    AllOf(HasSubstr("ibv_reg_mr"), HasSubstr("65536 bytes"),
                                          HasSubstr("ulimit -l unlimited"))));
}

}  // namespace
}  // namespace strata::transport::rdma
