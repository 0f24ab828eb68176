// The worker's view of the parameter servers: pulls every partition of the
// model into per-table tensors and pushes per-table gradients back, all
// partitions in parallel, following the cluster view (epochs, owners).
#ifndef STRATA_WORKER_PARAM_CLIENT_H_
#define STRATA_WORKER_PARAM_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/strata.pb.h"
#include "transport/transport.h"

namespace strata::worker {

struct PushResult {
  int stale_partitions = 0;  // partitions that dropped the gradient as stale
};

// Thread-safe: SetView may run on the heartbeat thread while the training
// thread pulls and pushes. The transport is borrowed and must outlive this.
class ParamClient {
 public:
  // `refresh_view` fetches the current view from the master; it is called
  // when a pserver says our epoch is stale.
  ParamClient(transport::Transport* transport, uint32_t node_id,
              std::function<absl::StatusOr<proto::ClusterView>()> refresh_view,
              absl::Duration request_timeout);
  ParamClient(const ParamClient&) = delete;
  ParamClient& operator=(const ParamClient&) = delete;

  // Installs a view (ignored when older than the one held).
  void SetView(const proto::ClusterView& view);
  uint64_t epoch() const;
  // Makes every current and later PullAll/PushAll return Cancelled at its
  // next retry. Thread-safe.
  void Cancel() { cancelled_ = true; }

  // Pulls every partition at version >= min_version into (*tables)[t],
  // resized to the table sizes. Returns the lowest version received.
  absl::StatusOr<uint64_t> PullAll(uint64_t min_version,
                                   std::vector<std::vector<float>>* tables);
  // Pushes gradients summed over `count` samples for `step`. Each call uses
  // a new sequence number; retries reuse it, so a retried push is applied
  // at most once.
  absl::StatusOr<PushResult> PushAll(const std::vector<std::vector<float>>& grads,
                                     uint64_t step, uint64_t count);

 private:
  struct Route {
    uint32_t partition;
    uint32_t table;
    uint64_t offset;
    uint64_t length;
    std::string address;
  };
  // Sends one request per route (built by make_request) with retries on
  // stale epochs, lagging pservers and broken connections.
  // `destination` (may be empty) names where a route's successful response
  // payload should land (CallInto).
  absl::Status CallAll(
      const std::function<transport::Message(const Route&)>& make_request,
      const std::function<absl::Status(const Route&, const transport::Message&)>& on_response,
      const std::function<std::pair<char*, size_t>(const Route&)>& destination = {});
  absl::StatusOr<std::shared_ptr<transport::Connection>> ConnectionTo(
      const std::string& address);

  transport::Transport* const transport_;
  const uint32_t node_id_;
  const std::function<absl::StatusOr<proto::ClusterView>()> refresh_view_;
  const absl::Duration request_timeout_;
  std::atomic<bool> cancelled_{false};

  mutable absl::Mutex mu_;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Route> routes_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> table_sizes_ ABSL_GUARDED_BY(mu_);
  absl::Status view_error_ ABSL_GUARDED_BY(mu_);  // a view we cannot use
  std::map<std::string, std::shared_ptr<transport::Connection>> conns_
      ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace strata::worker

#endif  // STRATA_WORKER_PARAM_CLIENT_H_
