// ListRdmaDevices when Strata is built without libibverbs.
#include "absl/status/status.h"
#include "transport/rdma/rdma_device.h"

namespace strata::transport::rdma {

absl::StatusOr<std::vector<DeviceInfo>> ListRdmaDevices() {
  return absl::UnimplementedError(
      "this build has no RDMA support (libibverbs-dev was missing at configure "
      "time: "
      "install it and rebuild, or set cluster.transport: tcp)");
}

}  // namespace strata::transport::rdma
