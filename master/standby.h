// A standby master's gRPC service (docs/reliability.md, "Master high
// availability"): it serves nothing but a redirect. Every call is answered
// UNAVAILABLE with REASON_NOT_LEADER and the leading master's address, so
// that nodes, the CLI and the Python package retry there
// (common/grpc_channel.h). And its HTTP endpoints: its own health and
// metrics, and a redirect to the leader's pages.
#ifndef STRATA_MASTER_STANDBY_H_
#define STRATA_MASTER_STANDBY_H_

#include <functional>
#include <memory>
#include <string>

#include "common/http_server.h"
#include "common/metrics.h"
#include "grpcpp/grpcpp.h"
#include "master/leadership.h"

namespace strata::master {

// `leader()`: the leader's address now ("" when none is known); `self`:
// this master's, for messages. Thread-safe (as `leader` is).
std::unique_ptr<grpc::Service> NewStandbyService(std::string self,
                                                 std::function<std::string()> leader);

// strata_master_leader on `metrics`: 1 while `acting()` (a leader not
// paused), else 0 (a standby serves 0).
void AddLeaderMetric(MetricsRegistry* metrics, std::function<bool()> acting);

// A standby's HTTP endpoints, registered on `http` (before its Start):
// /healthz answers 200 for this process, naming the leader; /metrics its
// own (`metrics`, where strata_master_leader is 0); the leader's pages (/
// and /status) answer 307 to the same page and query at the leader's HTTP
// address (https when `https`), or 503 while none is known. `leader()`:
// the leader's addresses now. Thread-safe (as `leader` is).
void ServeStandbyHttp(HttpServer* http, MetricsRegistry* metrics,
                      std::function<LeaderAddresses()> leader, bool https);

}  // namespace strata::master

#endif  // STRATA_MASTER_STANDBY_H_
