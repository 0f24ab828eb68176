// The data plane's gauges on a daemon's /metrics (docs/operations.md):
// <prefix>_rdma_connections, <prefix>_tcp_fallbacks, <prefix>_rdma_failures.
#ifndef STRATA_TRANSPORT_TRANSPORT_METRICS_H_
#define STRATA_TRANSPORT_TRANSPORT_METRICS_H_

#include <functional>
#include <memory>
#include <string>

#include "common/metrics.h"
#include "transport/transport.h"

namespace strata::transport {

// `transport` is read at each scrape (the daemon creates it after
// registering its metrics); nullptr counts as zero.
inline void AddTransportGauges(MetricsRegistry* metrics, const std::string& prefix,
                               std::function<const Transport*()> transport) {
  auto stat = [transport](uint64_t TransportStats::*field) {
    return [transport, field]() -> double {
      const Transport* t = transport();
      return t != nullptr ? static_cast<double>(t->stats().*field) : 0.0;
    };
  };
  metrics->AddCallbackGauge(prefix + "_rdma_connections",
                            "Data connections over rdma now (transport rdma|auto)",
                            stat(&TransportStats::rdma_connections));
  metrics->AddCallbackGauge(prefix + "_tcp_fallbacks",
                            "Data connections an rdma transport made over TCP instead",
                            stat(&TransportStats::tcp_fallbacks));
  metrics->AddCallbackGauge(prefix + "_rdma_failures",
                            "Rdma connections broken by a verbs error or a bad frame",
                            stat(&TransportStats::rdma_failures));
}

}  // namespace strata::transport

#endif  // STRATA_TRANSPORT_TRANSPORT_METRICS_H_
