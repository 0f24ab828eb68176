// TransportOptions from a job's cluster section (cluster.transport,
// cluster.rdma; docs/config.md).
#ifndef STRATA_TRANSPORT_TRANSPORT_CONFIG_H_
#define STRATA_TRANSPORT_TRANSPORT_CONFIG_H_

#include "common/config.h"
#include "transport/transport.h"

namespace strata::transport {

inline TransportOptions TransportOptionsFor(const ClusterSection& cluster) {
  TransportOptions o;
  o.kind = cluster.transport;
  o.rdma.device = cluster.rdma.device;
  o.rdma.port = cluster.rdma.port;
  o.rdma.gid_index = cluster.rdma.gid_index;
  o.rdma.recv_slots = static_cast<uint32_t>(cluster.rdma.recv_slots);
  o.rdma.send_slots = static_cast<uint32_t>(cluster.rdma.send_slots);
  o.rdma.slot_bytes = static_cast<uint32_t>(cluster.rdma.slot_kib) << 10;
  o.rdma.busy_poll = absl::Microseconds(cluster.rdma.busy_poll_us);
  return o;
}

}  // namespace strata::transport

#endif  // STRATA_TRANSPORT_TRANSPORT_CONFIG_H_
