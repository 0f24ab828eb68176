// A standby master's gRPC service (docs/reliability.md, "Master high
// availability"): it serves nothing but a redirect. Every call is answered
// UNAVAILABLE with REASON_NOT_LEADER and the leading master's address, so
// that nodes, the CLI and the Python package retry there
// (common/grpc_channel.h).
#ifndef STRATA_MASTER_STANDBY_H_
#define STRATA_MASTER_STANDBY_H_

#include <functional>
#include <memory>
#include <string>

#include "grpcpp/grpcpp.h"

namespace strata::master {

// `leader()`: the leader's address now ("" when none is known); `self`:
// this master's, for messages. Thread-safe (as `leader` is).
std::unique_ptr<grpc::Service> NewStandbyService(std::string self,
                                                 std::function<std::string()> leader);

}  // namespace strata::master

#endif  // STRATA_MASTER_STANDBY_H_
