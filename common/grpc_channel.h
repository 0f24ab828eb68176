// Control-plane channels to the master and between daemons.
#ifndef STRATA_COMMON_GRPC_CHANNEL_H_
#define STRATA_COMMON_GRPC_CHANNEL_H_

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/error_reason.h"
#include "grpcpp/grpcpp.h"

namespace strata {

// A channel that reconnects within a second after its peer comes back
// (gRPC's default backoff grows to minutes): a restarted master must hear
// the nodes' heartbeats again before it takes them for dead
// (docs/reliability.md). `creds`: TLS (common/security.h) or insecure.
// `connect_ms`: the least time a connection attempt gets
// (cluster.control_connect_ms), which gRPC 1.51 ties to the pause between
// attempts.
inline constexpr int kDefaultControlConnectMs = 1000;
inline std::shared_ptr<grpc::Channel> NewControlChannel(
    const std::string& address, const std::shared_ptr<grpc::ChannelCredentials>& creds,
    int connect_ms = kDefaultControlConnectMs) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  // (Also the shortest time a connection attempt, TLS handshake included,
  // is given.)
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, connect_ms);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, connect_ms);
  // Its own connections: a new channel is a new connection attempt.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(address, creds, args);
}

// A control channel made anew after a few failures in a row (Unavailable,
// DeadlineExceeded): a restarted peer must hear from us within its grace
// period, whatever state an old channel's connection attempts are in. A
// channel is kept for `connect_ms` at least, so that its first connection
// attempt can finish: calls with deadlines shorter than a TLS handshake on
// a loaded machine (heartbeats, every heartbeat interval) would otherwise
// throw each new channel away before it connects, and never get through
// (a pserver in the Soft-RoCE guest missed its heartbeats for 20 s so).
//
// Several masters (docs/reliability.md, "Master high availability"):
// `addresses` may list them, comma-separated. The channel follows the
// leader: a standby's answer (REASON_NOT_LEADER) that names it moves the
// channel there at once, and failures in a row move it to the next master
// in the list (a dead one is skipped).
// Thread-safe.
class ReconnectingChannel {
 public:
  ReconnectingChannel(const std::string& addresses, std::shared_ptr<grpc::ChannelCredentials> creds,
                      int connect_ms = kDefaultControlConnectMs)
      : addresses_(absl::StrSplit(addresses, ',', absl::SkipWhitespace())),
        creds_(std::move(creds)),
        connect_ms_(connect_ms) {
    if (addresses_.empty()) addresses_.push_back(addresses);
    address_ = addresses_[0];
    channel_ = NewControlChannel(address_, creds_, connect_ms_);
    made_ = absl::Now();
  }
  // The master asked now.
  std::string address() const {
    std::lock_guard<std::mutex> l(mu_);
    return address_;
  }
  // The channel to use now.
  std::shared_ptr<grpc::Channel> Get() {
    std::lock_guard<std::mutex> l(mu_);
    if (failures_ >= 3 && absl::Now() - made_ >= absl::Milliseconds(connect_ms_)) {
      if (addresses_.size() > 1) {
        // The next master in the list (from where the current one is).
        const auto it = std::find(addresses_.begin(), addresses_.end(), address_);
        const size_t i = it == addresses_.end() ? 0 : (it - addresses_.begin() + 1);
        address_ = addresses_[i % addresses_.size()];
      }
      Renew();
    }
    return channel_;
  }
  // The outcome of a call on it.
  void Report(const absl::Status& s) {
    std::lock_guard<std::mutex> l(mu_);
    const std::string leader = LeaderOf(s);
    if (!leader.empty() && leader != address_) {
      address_ = leader;  // (followed even when not in the list: it was elected)
      Renew();
      return;
    }
    failures_ = absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) ? failures_ + 1 : 0;
  }

 private:
  void Renew() {  // (mu_ held)
    channel_ = NewControlChannel(address_, creds_, connect_ms_);
    made_ = absl::Now();
    failures_ = 0;
  }

  std::vector<std::string> addresses_;
  const std::shared_ptr<grpc::ChannelCredentials> creds_;
  const int connect_ms_;
  mutable std::mutex mu_;
  std::string address_;                     // guarded by mu_: the one asked now
  std::shared_ptr<grpc::Channel> channel_;  // guarded by mu_
  absl::Time made_;                         // guarded by mu_: channel_'s
  int failures_ = 0;                        // guarded by mu_
};

}  // namespace strata

#endif  // STRATA_COMMON_GRPC_CHANNEL_H_
