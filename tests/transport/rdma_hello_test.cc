// The rdma connection hello: a ready hello round-trips, a declining one
// needs only its version, and every malformed field of a peer's hello is an
// error naming the peer and the field (nothing reaches verbs unchecked).
#include "transport/rdma/rdma_hello.h"

#include <functional>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace strata::transport::rdma {
namespace {

using ::strata::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

HelloQp SomeQp() {
  HelloQp qp;
  qp.qpn = 0x11;
  qp.psn = 0xabcdef;
  for (int i = 0; i < 16; ++i) qp.gid[i] = static_cast<uint8_t>(i * 7);
  qp.lid = 3;
  qp.mtu = 1024;
  qp.recv_slots = 64;
  qp.slot_bytes = 65536;
  return qp;
}

TEST(RdmaHelloTest, ReadyHelloRoundTrips) {
  const HelloQp qp = SomeQp();
  const std::string wire = ReadyHello(qp).SerializeAsString();
  STRATA_ASSERT_OK_AND_ASSIGN(proto::RdmaHello h, ParsePeerHello(wire, "10.0.0.2:7200"));
  EXPECT_TRUE(h.rdma_ready());
  const HelloQp back = HelloQpOf(h);
  EXPECT_EQ(back.qpn, qp.qpn);
  EXPECT_EQ(back.psn, qp.psn);
  EXPECT_EQ(back.gid, qp.gid);
  EXPECT_EQ(back.lid, qp.lid);
  EXPECT_EQ(back.mtu, qp.mtu);
  EXPECT_EQ(back.recv_slots, qp.recv_slots);
  EXPECT_EQ(back.slot_bytes, qp.slot_bytes);
}

TEST(RdmaHelloTest, NotReadyHelloCarriesItsReason) {
  const std::string wire = NotReadyHello("no RDMA device on this host").SerializeAsString();
  STRATA_ASSERT_OK_AND_ASSIGN(proto::RdmaHello h, ParsePeerHello(wire, "peer"));
  EXPECT_FALSE(h.rdma_ready());
  EXPECT_EQ(h.not_ready_reason(), "no RDMA device on this host");
}

TEST(RdmaHelloTest, BytesThatAreNoHelloAreDataLoss) {
  EXPECT_THAT(ParsePeerHello("\xff\xff\xff garbage", "10.0.0.9:1"),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("10.0.0.9:1"), HasSubstr("not an RdmaHello"))));
  EXPECT_THAT(ParsePeerHello(std::string(kMaxRdmaHelloBytes + 1, 'x'), "p"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("at most")));
}

TEST(RdmaHelloTest, EveryBadFieldIsNamed) {
  struct Case {
    const char* field;
    std::function<void(proto::RdmaHello*)> spoil;
  };
  const Case cases[] = {
      {"version", [](proto::RdmaHello* h) { h->set_version(9); }},
      {"qpn", [](proto::RdmaHello* h) { h->set_qpn(0); }},
      {"qpn", [](proto::RdmaHello* h) { h->set_qpn(1u << 24); }},
      {"psn", [](proto::RdmaHello* h) { h->set_psn(1u << 24); }},
      {"gid", [](proto::RdmaHello* h) { h->set_gid("short"); }},
      {"lid", [](proto::RdmaHello* h) { h->set_lid(1u << 16); }},
      {"mtu", [](proto::RdmaHello* h) { h->set_mtu(1500); }},
      {"recv_slots", [](proto::RdmaHello* h) { h->set_recv_slots(0); }},
      {"slot_bytes", [](proto::RdmaHello* h) { h->set_slot_bytes(100); }},
      {"slot_bytes", [](proto::RdmaHello* h) { h->set_slot_bytes(1u << 30); }},
  };
  for (const Case& c : cases) {
    proto::RdmaHello h = ReadyHello(SomeQp());
    c.spoil(&h);
    EXPECT_THAT(
        ParsePeerHello(h.SerializeAsString(), "10.0.0.2:7200"),
        StatusIs(absl::StatusCode::kInvalidArgument,
                 AllOf(HasSubstr("10.0.0.2:7200"), HasSubstr(std::string("field ") + c.field))))
        << c.field;
  }
}

// A destination region announced on the bootstrap (its key never rides
// the queue pair): checked like the rest of a hello.
TEST(RdmaHelloTest, ARegionAnnouncementIsChecked) {
  const proto::RdmaHello ok = RegionHello(3, 0x7f0000001000, 1 << 20, 0xabcd);
  STRATA_ASSERT_OK_AND_ASSIGN(proto::RdmaHello back, ParsePeerHello(ok.SerializeAsString(), "p"));
  ASSERT_TRUE(back.has_region());
  EXPECT_EQ(back.region().handle(), 3u);
  EXPECT_EQ(back.region().addr(), 0x7f0000001000u);
  EXPECT_EQ(back.region().length(), 1u << 20);
  EXPECT_EQ(back.region().rkey(), 0xabcdu);
  struct Case {
    const char* field;
    std::function<void(proto::RdmaHello*)> spoil;
  };
  const Case cases[] = {
      {"region.handle", [](proto::RdmaHello* h) { h->mutable_region()->set_handle(0); }},
      {"region.length", [](proto::RdmaHello* h) { h->mutable_region()->set_length(0); }},
      {"region.length", [](proto::RdmaHello* h) { h->mutable_region()->set_addr(~0ull - 10); }},
      {"region", [](proto::RdmaHello* h) { h->set_rdma_ready(true); }},
      {"version", [](proto::RdmaHello* h) { h->set_version(2); }},
  };
  for (const Case& c : cases) {
    proto::RdmaHello h = ok;
    c.spoil(&h);
    EXPECT_THAT(
        ParsePeerHello(h.SerializeAsString(), "10.0.0.2:7200"),
        StatusIs(absl::StatusCode::kInvalidArgument,
                 AllOf(HasSubstr("10.0.0.2:7200"), HasSubstr(std::string("field ") + c.field))))
        << c.field;
  }
}

TEST(RdmaHelloTest, ANotReadyHelloOfAnotherVersionIsStillRefused) {
  proto::RdmaHello h = NotReadyHello("none");
  h.set_version(2);
  EXPECT_THAT(ParsePeerHello(h.SerializeAsString(), "p"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("field version")));
}

}  // namespace
}  // namespace strata::transport::rdma
