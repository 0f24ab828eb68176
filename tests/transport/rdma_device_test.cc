// Device selection and preflight on synthetic device lists (no RDMA
// hardware needed); the real list is checked inside the Soft-RoCE guest
// (tests/rdma).
#include "transport/rdma/rdma_device.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace strata::transport::rdma {
namespace {

using ::strata::testing::StatusIs;
using ::testing::HasSubstr;

// An rxe-like device: RoCE, port 1, link-local GID 0 and IPv4 GID 1.
DeviceInfo Rxe(const std::string& name, bool active = true) {
  DeviceInfo d;
  d.name = name;
  d.node_guid = "505400fffe123456";
  PortInfo p;
  p.port = 1;
  p.active = active;
  p.state = active ? "ACTIVE" : "DOWN";
  p.link_layer = "Ethernet";
  p.active_mtu = 1024;
  p.max_mtu = 4096;
  p.gids = {{0, "fe80::5054:ff:fe12:3456", GidType::kRoceV2},
            {1, "::ffff:10.0.0.1", GidType::kRoceV2}};
  d.ports.push_back(p);
  return d;
}

DeviceInfo Ib(const std::string& name) {
  DeviceInfo d;
  d.name = name;
  PortInfo p;
  p.port = 1;
  p.active = true;
  p.state = "ACTIVE";
  p.link_layer = "InfiniBand";
  p.active_mtu = 4096;
  p.max_mtu = 4096;
  p.lid = 7;
  p.gids = {{0, "fe80::1", GidType::kIb}};
  d.ports.push_back(p);
  return d;
}

TEST(SelectRdmaDeviceTest, NoDeviceSaysHowToGetOne) {
  EXPECT_THAT(SelectRdmaDevice({}, {}),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("no RDMA device"), HasSubstr("rdma link add"),
                             HasSubstr("transport: tcp"))));
}

TEST(SelectRdmaDeviceTest, AutoPicksTheFirstActivePortAndTheIpv4RoceV2Gid) {
  STRATA_ASSERT_OK_AND_ASSIGN(auto sel, SelectRdmaDevice({Rxe("rxe0", false), Rxe("rxe1")}, {}));
  EXPECT_EQ(sel.device, "rxe1");
  EXPECT_EQ(sel.port, 1);
  EXPECT_EQ(sel.gid_index, 1);
  EXPECT_EQ(sel.gid, "::ffff:10.0.0.1");
  EXPECT_EQ(sel.gid_type, GidType::kRoceV2);
  EXPECT_EQ(sel.active_mtu, 1024);
}

TEST(SelectRdmaDeviceTest, WithoutAnIpv4GidAnyRoceV2WillDo) {
  DeviceInfo d = Rxe("rxe0");
  d.ports[0].gids.pop_back();
  STRATA_ASSERT_OK_AND_ASSIGN(auto sel, SelectRdmaDevice({d}, {}));
  EXPECT_EQ(sel.gid_index, 0);
}

TEST(SelectRdmaDeviceTest, InfiniBandUsesGidZero) {
  STRATA_ASSERT_OK_AND_ASSIGN(auto sel, SelectRdmaDevice({Ib("mlx5_0")}, {}));
  EXPECT_EQ(sel.device, "mlx5_0");
  EXPECT_EQ(sel.gid_index, 0);
  EXPECT_EQ(sel.gid_type, GidType::kIb);
}

TEST(SelectRdmaDeviceTest, ConfiguredChoicesAreHonouredOrRefusedByName) {
  STRATA_ASSERT_OK_AND_ASSIGN(auto sel,
                              SelectRdmaDevice({Rxe("rxe0"), Rxe("rxe1")}, {"rxe1", 1, 0}));
  EXPECT_EQ(sel.device, "rxe1");
  EXPECT_EQ(sel.gid_index, 0);
  EXPECT_THAT(SelectRdmaDevice({Rxe("rxe0")}, {"mlx5_9", 0, -1}),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("'mlx5_9'"), HasSubstr("devices: rxe0"))));
  EXPECT_THAT(SelectRdmaDevice({Rxe("rxe0")}, {"", 2, -1}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("port 2 does not exist")));
  EXPECT_THAT(SelectRdmaDevice({Rxe("rxe0")}, {"", 0, 5}),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("no GID at index 5"), HasSubstr("gid_index"))));
}

TEST(SelectRdmaDeviceTest, DownPortsAreListedWithTheFix) {
  EXPECT_THAT(SelectRdmaDevice({Rxe("rxe0", false)}, {}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("rxe0 port 1 DOWN"), HasSubstr("ip link set"))));
}

TEST(SelectRdmaDeviceTest, RoceWithoutAnyGidAsksForAnAddress) {
  DeviceInfo d = Rxe("rxe0");
  d.ports[0].gids.clear();
  EXPECT_THAT(SelectRdmaDevice({d}, {}),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("GID table is empty"), HasSubstr("ip addr add"))));
}

TEST(RdmaPreflightTest, ReadyHostPassesEveryCheck) {
  PreflightReport r = RdmaPreflight({Rxe("rxe0")}, {}, UINT64_MAX, 1ull << 30);
  EXPECT_TRUE(r.ok()) << r.ToString();
  EXPECT_THAT(r.ToString(),
              AllOf(HasSubstr("ok    devices: rxe0"), HasSubstr("rxe0 port 1 ACTIVE, Ethernet"),
                    HasSubstr("::ffff:10.0.0.1 (RoCE v2)"), HasSubstr("active MTU 1024"),
                    HasSubstr("limit unlimited")));
}

TEST(RdmaPreflightTest, LowMemlockIsAFailureWithItsFix) {
  // The usual default of 8 MiB against a 1 GiB registration.
  PreflightReport r = RdmaPreflight({Rxe("rxe0")}, {}, 8ull << 20, 1ull << 30);
  EXPECT_FALSE(r.ok());
  EXPECT_THAT(r.ToString(),
              AllOf(HasSubstr("FAIL  memlock: locked-memory limit 8.0 MiB, this process will "
                              "register 1.0 GiB"),
                    HasSubstr("ulimit -l unlimited"), HasSubstr("LimitMEMLOCK=infinity")));
}

TEST(RdmaPreflightTest, NoDeviceAndSmallMtuAreFailures) {
  PreflightReport none = RdmaPreflight({}, {}, UINT64_MAX, 0);
  EXPECT_FALSE(none.ok());
  EXPECT_THAT(none.ToString(), AllOf(HasSubstr("FAIL  devices"), HasSubstr("rdma link add")));
  DeviceInfo d = Rxe("rxe0");
  d.ports[0].active_mtu = 256;
  PreflightReport mtu = RdmaPreflight({d}, {}, UINT64_MAX, 0);
  EXPECT_FALSE(mtu.ok());
  EXPECT_THAT(mtu.ToString(),
              AllOf(HasSubstr("FAIL  mtu: active MTU 256"), HasSubstr("ip link set <netdev> mtu")));
}

TEST(RdmaPreflightTest, DoctorReportListsPortsAndGids) {
  const std::vector<DeviceInfo> devices = {Rxe("rxe0"), Ib("mlx5_0")};
  const std::string text =
      FormatRdmaDoctorReport(devices, RdmaPreflight(devices, {}, UINT64_MAX, 0));
  EXPECT_THAT(text, AllOf(HasSubstr("RDMA devices: 2"), HasSubstr("rxe0 (node GUID"),
                          HasSubstr("port 1: ACTIVE, Ethernet, MTU 1024 (max 4096)"),
                          HasSubstr("gid[1] ::ffff:10.0.0.1 RoCE v2"), HasSubstr("LID 7"),
                          HasSubstr("RDMA: ready")));
}

TEST(ListRdmaDevicesTest, ThisHostAnswersWithoutCrashing) {
  // CI machines have no RDMA device and no kernel RDMA support: the list is
  // empty (or the build lacks verbs). A Soft-RoCE guest lists rxe0
  // (tests/rdma).
  auto devices = ListRdmaDevices();
  if (!devices.ok()) {
    EXPECT_THAT(devices.status(), StatusIs(absl::StatusCode::kUnimplemented));
    return;
  }
  for (const DeviceInfo& d : *devices) {
    EXPECT_FALSE(d.name.empty());
    EXPECT_FALSE(d.ports.empty()) << d.name;
  }
}

}  // namespace
}  // namespace strata::transport::rdma
