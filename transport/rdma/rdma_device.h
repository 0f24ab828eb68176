// RDMA bring-up without guesswork: what verbs devices this host has, which
// device, port and GID the rdma transport will use, and whether everything
// it needs is in place (port state, GID, MTU, locked-memory limit), each
// problem with its fix. `strata doctor` prints this report; the rdma
// transport runs the same checks before it opens a device.
//
// The selection and the checks are pure functions of a device list, so they
// are tested without RDMA hardware; ListRdmaDevices() reads the real list
// through libibverbs.
#ifndef STRATA_TRANSPORT_RDMA_RDMA_DEVICE_H_
#define STRATA_TRANSPORT_RDMA_RDMA_DEVICE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::transport::rdma {

enum class GidType { kIb, kRoceV1, kRoceV2 };
const char* GidTypeName(GidType t);

struct GidEntry {
  int index = 0;
  std::string gid;  // "fe80::...:1" or "::ffff:10.0.0.1"
  GidType type = GidType::kRoceV2;
};

struct PortInfo {
  int port = 1;       // 1-based, as in verbs
  std::string state;  // "ACTIVE", "DOWN", "INIT", ...
  bool active = false;
  std::string link_layer;  // "Ethernet" (RoCE) or "InfiniBand"
  int active_mtu = 0;      // bytes: 256 .. 4096
  int max_mtu = 0;
  uint16_t lid = 0;            // InfiniBand only
  std::vector<GidEntry> gids;  // non-empty entries only
};

struct DeviceInfo {
  std::string name;  // "mlx5_0", "rxe0"
  std::string node_guid;
  std::vector<PortInfo> ports;
};

// What the config asks for (cluster.rdma); empty / 0 / -1 choose
// automatically.
struct RdmaSettings {
  std::string device;
  int port = 0;
  int gid_index = -1;
};

struct RdmaSelection {
  std::string device;
  int port = 0;
  int gid_index = 0;
  std::string gid;
  GidType gid_type = GidType::kRoceV2;
  int active_mtu = 0;
};

// The device, port and GID to use. Automatic choice: the first device (in
// list order) with an ACTIVE port; on Ethernet (RoCE) the RoCE v2 GID of
// an IPv4 address if there is one, else any RoCE v2 GID, else index 0; on
// InfiniBand index 0. Errors say what is missing and how to fix it.
absl::StatusOr<RdmaSelection> SelectRdmaDevice(const std::vector<DeviceInfo>& devices,
                                               const RdmaSettings& settings);

struct PreflightFinding {
  bool ok = true;      // false: the rdma transport cannot run like this
  std::string check;   // "devices", "port", "gid", "mtu", "memlock"
  std::string detail;  // what was found
  std::string fix;     // what to do (empty when ok)
};

struct PreflightReport {
  std::vector<PreflightFinding> findings;
  bool ok() const;
  // One line per finding: "ok   memlock: ..." / "FAIL port: ... fix: ...".
  std::string ToString() const;
};

// `memlock_limit_bytes`: RLIMIT_MEMLOCK's soft limit (UINT64_MAX for
// unlimited); `register_bytes`: what the process will register (its share
// of the model's tensors plus buffer pools).
PreflightReport RdmaPreflight(const std::vector<DeviceInfo>& devices, const RdmaSettings& settings,
                              uint64_t memlock_limit_bytes, uint64_t register_bytes);

// The devices of this host, read through libibverbs. An empty list when
// there are none (no RDMA hardware, no rxe/siw link, or the kernel lacks
// RDMA support); Unimplemented when Strata was built without libibverbs;
// other errors name the verbs call that failed.
absl::StatusOr<std::vector<DeviceInfo>> ListRdmaDevices();

// This process's RLIMIT_MEMLOCK soft limit in bytes (UINT64_MAX: unlimited).
uint64_t MemlockLimitBytes();

// The human report of `strata doctor`: the device list with each port's
// state, MTU and GID table, the selection, then the preflight findings.
std::string FormatRdmaDoctorReport(const std::vector<DeviceInfo>& devices,
                                   const PreflightReport& report);

}  // namespace strata::transport::rdma

#endif  // STRATA_TRANSPORT_RDMA_RDMA_DEVICE_H_
