// A pserver's or worker's membership with the master (docs/reliability.md),
// the part the two daemons share: registering (retried until a deadline),
// a heartbeat (the daemon's own loop decides when, and what else it
// carries), the data-plane keys the master hands out with both answers,
// reports of peers it cannot reach, and calls to the master retried while
// the master is unavailable. The Python worker of issue 25 is a worker to
// the master through the same agent.
#ifndef STRATA_COMMON_NODE_AGENT_H_
#define STRATA_COMMON_NODE_AGENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/config.h"
#include "common/grpc_channel.h"
#include "grpcpp/grpcpp.h"
#include "proto/strata.grpc.pb.h"

namespace strata {

namespace transport {
class MembershipKeys;
}

// Thread-safe: the heartbeat thread, the training thread and the RPC
// handlers use it at once.
class NodeAgent {
 public:
  struct Options {
    std::string master_address;
    std::shared_ptr<grpc::ChannelCredentials> credentials;
    int control_connect_ms = kDefaultControlConnectMs;
    // What errors call this node ("pserver 0").
    std::string name;
    // How long Call retries a master that is unavailable.
    absl::Duration request_timeout = absl::Seconds(30);
    // This node's data-plane keys (mtls clusters; null in plain text):
    // updated from every answer that carries a key.
    std::shared_ptr<transport::MembershipKeys> membership;
  };
  // A daemon's agent: the cluster section's connect and request timeouts.
  static Options DaemonOptions(const ClusterSection& cluster, std::string master_address,
                               std::shared_ptr<grpc::ChannelCredentials> credentials,
                               std::string name,
                               std::shared_ptr<transport::MembershipKeys> membership);
  explicit NodeAgent(Options options);
  NodeAgent(const NodeAgent&) = delete;
  NodeAgent& operator=(const NodeAgent&) = delete;

  // Registers, every 200 ms until `timeout` has passed or `stop` is
  // notified; takes the node's id and key from the answer. UNAVAILABLE
  // "NAME: cannot register: why" when it gives up.
  absl::StatusOr<proto::RegisterResponse> Register(const proto::RegisterRequest& req,
                                                   absl::Duration timeout,
                                                   const absl::Notification& stop);
  // One heartbeat (its node_id set here) with `deadline`; the key taken
  // from an OK answer. The error names the master.
  absl::Status Heartbeat(proto::HeartbeatRequest req, absl::Duration deadline,
                         proto::HeartbeatResponse* resp);
  // Tells the master that node `suspect` cannot be reached, and why.
  absl::Status ReportSuspect(uint32_t suspect, const std::string& reason, absl::Duration deadline);
  // One try at the cluster view.
  absl::Status FetchView(absl::Duration deadline, proto::ClusterView* view);
  // `call` (which uses master()), retried with back-off while the master
  // answers UNAVAILABLE or DEADLINE_EXCEEDED, for up to request_timeout or
  // until `stop` (may be null) is notified. The error names the master.
  absl::Status Call(const std::function<grpc::Status(grpc::ClientContext*)>& call,
                    const absl::Notification* stop);

  // A stub on the channel now (cheap to make; the channel is made anew
  // after failures in a row).
  std::unique_ptr<proto::Master::Stub> master() const {
    return proto::Master::NewStub(channel_.Get());
  }
  // The node's id once registered (0 before).
  uint32_t node_id() const { return node_id_.load(); }
  const std::string& master_address() const { return options_.master_address; }

 private:
  void TakeDataKey(const proto::DataPlaneKey& k);
  absl::Status Done(const grpc::Status& s);  // reported to the channel, and named

  const Options options_;
  mutable ReconnectingChannel channel_;
  std::atomic<uint32_t> node_id_{0};
};

}  // namespace strata

#endif  // STRATA_COMMON_NODE_AGENT_H_
