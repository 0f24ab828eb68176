#include "transport/rdma/rdma_device.h"

#include <sys/resource.h>

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace strata::transport::rdma {
namespace {

std::string Bytes(uint64_t b) {
  if (b == UINT64_MAX) return "unlimited";
  if (b >= (1ull << 30)) return absl::StrFormat("%.1f GiB", b / double(1ull << 30));
  if (b >= (1ull << 20)) return absl::StrFormat("%.1f MiB", b / double(1ull << 20));
  return absl::StrCat(b / 1024, " KiB");
}

const PortInfo* FindPort(const DeviceInfo& d, int port) {
  for (const PortInfo& p : d.ports) {
    if (p.port == port) return &p;
  }
  return nullptr;
}

std::string DeviceNames(const std::vector<DeviceInfo>& devices) {
  std::string names;
  for (const DeviceInfo& d : devices) absl::StrAppend(&names, names.empty() ? "" : ", ", d.name);
  return names;
}

// The GID the transport uses on `port` when the config names none.
int AutoGid(const PortInfo& port) {
  if (port.link_layer != "Ethernet") return port.gids.empty() ? 0 : port.gids.front().index;
  const GidEntry* v2 = nullptr;
  for (const GidEntry& g : port.gids) {
    if (g.type != GidType::kRoceV2) continue;
    if (absl::StartsWith(g.gid, "::ffff:")) return g.index;  // IPv4: routable
    if (v2 == nullptr) v2 = &g;
  }
  if (v2 != nullptr) return v2->index;
  return port.gids.empty() ? 0 : port.gids.front().index;
}

constexpr char kNoDeviceFix[] =
    "load a driver for the RDMA NIC (mlx5_ib, ...) or, for Soft-RoCE, "
    "`modprobe rdma_rxe && rdma link add rxe0 type rxe netdev <interface>`; "
    "or set cluster.transport: tcp";

}  // namespace

const char* GidTypeName(GidType t) {
  switch (t) {
    case GidType::kIb:
      return "IB";
    case GidType::kRoceV1:
      return "RoCE v1";
    case GidType::kRoceV2:
      return "RoCE v2";
  }
  return "?";
}

absl::StatusOr<RdmaSelection> SelectRdmaDevice(const std::vector<DeviceInfo>& devices,
                                               const RdmaSettings& s) {
  if (devices.empty()) {
    return absl::NotFoundError(absl::StrCat("no RDMA device on this host; fix: ", kNoDeviceFix));
  }
  const DeviceInfo* dev = nullptr;
  const PortInfo* port = nullptr;
  if (!s.device.empty()) {
    for (const DeviceInfo& d : devices) {
      if (d.name == s.device) dev = &d;
    }
    if (dev == nullptr) {
      return absl::NotFoundError(absl::StrCat(
          "cluster.rdma.device '", s.device, "' is not on this host (devices: ",
          DeviceNames(devices), "); fix: name one of those, or leave it empty to choose"));
    }
  }
  for (const DeviceInfo& d : devices) {
    if (dev != nullptr && &d != dev) continue;
    for (const PortInfo& p : d.ports) {
      if (s.port != 0 && p.port != s.port) continue;
      if (p.active) {
        dev = &d;
        port = &p;
        break;
      }
    }
    if (port != nullptr) break;
  }
  if (port == nullptr) {
    // Say what the ports are instead.
    std::string states;
    for (const DeviceInfo& d : devices) {
      if (dev != nullptr && &d != dev) continue;
      for (const PortInfo& p : d.ports) {
        if (s.port != 0 && p.port != s.port) continue;
        absl::StrAppend(&states, states.empty() ? "" : ", ", d.name, " port ", p.port, " ",
                        p.state);
      }
    }
    if (states.empty()) {
      return absl::NotFoundError(
          absl::StrCat("cluster.rdma.port ", s.port, " does not exist on ",
                       dev != nullptr ? dev->name : DeviceNames(devices),
                       "; fix: set it to an existing port (1-based) or 0 to choose"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("no ACTIVE RDMA port (", states,
                     "); fix: bring the link up (`ip link set <netdev> up`, "
                     "cable, subnet manager for InfiniBand) and check `ibv_devinfo`"));
  }
  RdmaSelection sel;
  sel.device = dev->name;
  sel.port = port->port;
  sel.active_mtu = port->active_mtu;
  sel.gid_index = s.gid_index >= 0 ? s.gid_index : AutoGid(*port);
  const GidEntry* gid = nullptr;
  for (const GidEntry& g : port->gids) {
    if (g.index == sel.gid_index) gid = &g;
  }
  if (gid == nullptr) {
    if (port->link_layer == "Ethernet" || s.gid_index >= 0) {
      return absl::NotFoundError(
          absl::StrCat(dev->name, " port ", port->port, " has no GID at index ", sel.gid_index,
                       port->gids.empty() ? " (its GID table is empty)" : "",
                       "; fix: give the RoCE netdev an IP address (`ip addr add ... dev "
                       "<netdev>`) "
                       "or set cluster.rdma.gid_index to an entry of `ibv_devinfo -v`"));
    }
  } else {
    sel.gid = gid->gid;
    sel.gid_type = gid->type;
  }
  return sel;
}

bool PreflightReport::ok() const {
  return std::all_of(findings.begin(), findings.end(),
                     [](const PreflightFinding& f) { return f.ok; });
}

std::string PreflightReport::ToString() const {
  std::string out;
  for (const PreflightFinding& f : findings) {
    absl::StrAppend(&out, f.ok ? "ok    " : "FAIL  ", f.check, ": ", f.detail);
    if (!f.fix.empty()) absl::StrAppend(&out, "\n        fix: ", f.fix);
    out += "\n";
  }
  return out;
}

PreflightReport RdmaPreflight(const std::vector<DeviceInfo>& devices, const RdmaSettings& settings,
                              uint64_t memlock_limit_bytes, uint64_t register_bytes) {
  PreflightReport r;
  if (devices.empty()) {
    r.findings.push_back({false, "devices", "no RDMA device on this host", kNoDeviceFix});
  } else {
    r.findings.push_back({true, "devices", DeviceNames(devices), ""});
    absl::StatusOr<RdmaSelection> sel = SelectRdmaDevice(devices, settings);
    if (!sel.ok()) {
      const std::string msg(sel.status().message());
      const size_t fix = msg.find("; fix: ");
      r.findings.push_back({false, absl::IsNotFound(sel.status()) ? "selection" : "port",
                            msg.substr(0, fix),
                            fix == std::string::npos ? "" : msg.substr(fix + 7)});
    } else {
      r.findings.push_back({true, "port",
                            absl::StrCat(sel->device, " port ", sel->port, " ACTIVE, ",
                                         FindPort(*std::find_if(devices.begin(), devices.end(),
                                                                [&](const DeviceInfo& d) {
                                                                  return d.name == sel->device;
                                                                }),
                                                  sel->port)
                                             ->link_layer),
                            ""});
      r.findings.push_back(
          {true, "gid",
           sel->gid.empty() ? absl::StrCat("index ", sel->gid_index, " (InfiniBand: LID routing)")
                            : absl::StrCat("index ", sel->gid_index, " ", sel->gid, " (",
                                           GidTypeName(sel->gid_type), ")"),
           ""});
      const bool mtu_ok = sel->active_mtu >= 1024;
      r.findings.push_back({mtu_ok, "mtu", absl::StrCat("active MTU ", sel->active_mtu, " bytes"),
                            mtu_ok ? ""
                                   : "raise the netdev's MTU (RoCE uses the largest of "
                                     "256..4096 that fits "
                                     "the Ethernet MTU minus headers; `ip link set <netdev> mtu "
                                     "9000` or 1500)"});
    }
  }
  const bool mem_ok = memlock_limit_bytes >= register_bytes;
  r.findings.push_back({mem_ok, "memlock",
                        absl::StrCat("locked-memory limit ", Bytes(memlock_limit_bytes),
                                     ", this process will "
                                     "register ",
                                     Bytes(register_bytes)),
                        mem_ok ? ""
                               : "raise it: `ulimit -l unlimited` in the launching shell, "
                                 "LimitMEMLOCK=infinity in the systemd unit, or a memlock line in "
                                 "/etc/security/limits.conf"});
  return r;
}

uint64_t MemlockLimitBytes() {
  rlimit rl{};
  if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0) return 0;
  return rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : static_cast<uint64_t>(rl.rlim_cur);
}

std::string FormatRdmaDoctorReport(const std::vector<DeviceInfo>& devices,
                                   const PreflightReport& report) {
  std::string out = absl::StrCat("RDMA devices: ", devices.size(), "\n");
  for (const DeviceInfo& d : devices) {
    absl::StrAppend(&out, "  ", d.name, " (node GUID ", d.node_guid, ")\n");
    for (const PortInfo& p : d.ports) {
      absl::StrAppend(&out, "    port ", p.port, ": ", p.state, ", ", p.link_layer, ", MTU ",
                      p.active_mtu, " (max ", p.max_mtu, ")");
      if (p.link_layer == "InfiniBand") absl::StrAppend(&out, ", LID ", p.lid);
      out += "\n";
      for (const GidEntry& g : p.gids) {
        absl::StrAppend(&out, "      gid[", g.index, "] ", g.gid, " ", GidTypeName(g.type), "\n");
      }
    }
  }
  absl::StrAppend(&out, "\npreflight:\n", report.ToString());
  absl::StrAppend(&out, report.ok() ? "RDMA: ready\n" : "RDMA: NOT ready (see FAIL lines)\n");
  return out;
}

}  // namespace strata::transport::rdma
