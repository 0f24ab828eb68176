// ListRdmaDevices through libibverbs (built when STRATA_WITH_RDMA is on).
#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "glog/logging.h"
#include "transport/rdma/rdma_device.h"

namespace strata::transport::rdma {
namespace {

std::string FormatGid(const ibv_gid& gid) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (inet_ntop(AF_INET6, gid.raw, buf, sizeof(buf)) == nullptr) return "?";
  return buf;
}

int MtuBytes(ibv_mtu mtu) {
  switch (mtu) {
    case IBV_MTU_256:
      return 256;
    case IBV_MTU_512:
      return 512;
    case IBV_MTU_1024:
      return 1024;
    case IBV_MTU_2048:
      return 2048;
    case IBV_MTU_4096:
      return 4096;
  }
  return 0;
}

std::string PortState(ibv_port_state s) {
  switch (s) {
    case IBV_PORT_ACTIVE:
      return "ACTIVE";
    case IBV_PORT_DOWN:
      return "DOWN";
    case IBV_PORT_INIT:
      return "INIT";
    case IBV_PORT_ARMED:
      return "ARMED";
    case IBV_PORT_ACTIVE_DEFER:
      return "ACTIVE_DEFER";
    default:
      return "NOP";
  }
}

}  // namespace

absl::StatusOr<std::vector<DeviceInfo>> ListRdmaDevices() {
  int n = 0;
  errno = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr) {
    // ENOSYS: the kernel has no RDMA support at all; that is "no device".
    if (errno == ENOSYS || errno == 0) return std::vector<DeviceInfo>();
    return absl::UnavailableError(absl::StrCat("ibv_get_device_list: ", std::strerror(errno)));
  }
  std::unique_ptr<ibv_device*, void (*)(ibv_device**)> owner(list, ibv_free_device_list);
  std::vector<DeviceInfo> out;
  for (int i = 0; i < n; ++i) {
    DeviceInfo d;
    d.name = ibv_get_device_name(list[i]);
    d.node_guid = absl::StrFormat("%016x", be64toh(ibv_get_device_guid(list[i])));
    ibv_context* ctx = ibv_open_device(list[i]);
    if (ctx == nullptr) {
      // One device we cannot open must not hide the others.
      LOG(WARNING) << "ibv_open_device(" << d.name << "): " << std::strerror(errno)
                   << (errno == EACCES || errno == EPERM
                           ? " (no access to /dev/infiniband/uverbs*: run as a user in "
                             "the rdma group)"
                           : "")
                   << "; leaving it out";
      continue;
    }
    std::unique_ptr<ibv_context, int (*)(ibv_context*)> ctx_owner(ctx, ibv_close_device);
    ibv_device_attr attr{};
    if (int rc = ibv_query_device(ctx, &attr); rc != 0) {
      return absl::UnavailableError(
          absl::StrCat("ibv_query_device(", d.name, "): ", std::strerror(rc)));
    }
    for (int p = 1; p <= attr.phys_port_cnt; ++p) {
      ibv_port_attr pa{};
      if (int rc = ibv_query_port(ctx, static_cast<uint8_t>(p), &pa); rc != 0) {
        return absl::UnavailableError(
            absl::StrCat("ibv_query_port(", d.name, ", ", p, "): ", std::strerror(rc)));
      }
      PortInfo port;
      port.port = p;
      port.state = PortState(pa.state);
      port.active = pa.state == IBV_PORT_ACTIVE;
      port.link_layer = pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "InfiniBand";
      port.active_mtu = MtuBytes(pa.active_mtu);
      port.max_mtu = MtuBytes(pa.max_mtu);
      port.lid = pa.lid;
      for (int g = 0; g < pa.gid_tbl_len; ++g) {
        ibv_gid_entry entry{};
        if (ibv_query_gid_ex(ctx, static_cast<uint32_t>(p), static_cast<uint32_t>(g), &entry, 0) !=
            0) {
          continue;  // an empty slot
        }
        static const ibv_gid kZero{};
        if (std::memcmp(entry.gid.raw, kZero.raw, sizeof(kZero.raw)) == 0) continue;
        GidEntry ge;
        ge.index = g;
        ge.gid = FormatGid(entry.gid);
        ge.type = entry.gid_type == IBV_GID_TYPE_ROCE_V2   ? GidType::kRoceV2
                  : entry.gid_type == IBV_GID_TYPE_ROCE_V1 ? GidType::kRoceV1
                                                           : GidType::kIb;
        port.gids.push_back(std::move(ge));
      }
      d.ports.push_back(std::move(port));
    }
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace strata::transport::rdma
