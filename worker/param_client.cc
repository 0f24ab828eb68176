#include "worker/param_client.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace strata::worker {

using transport::Message;
using transport::MessageType;

ParamClient::ParamClient(
    transport::Transport* transport, uint32_t node_id,
    std::function<absl::StatusOr<proto::ClusterView>()> refresh_view,
    absl::Duration request_timeout)
    : transport_(transport),
      node_id_(node_id),
      refresh_view_(std::move(refresh_view)),
      request_timeout_(request_timeout) {}

void ParamClient::SetView(const proto::ClusterView& view) {
  absl::MutexLock l(&mu_);
  if (view.epoch() < epoch_) return;
  epoch_ = view.epoch();
  std::map<uint32_t, std::string> data_address;
  for (const auto& m : view.members()) data_address[m.id()] = m.data_address();
  routes_.clear();
  for (const auto& p : view.partitions()) {
    routes_.push_back(Route{p.id(), p.table_id(), p.offset(), p.length(),
                            data_address[p.owner()]});
  }
  table_sizes_.clear();
  for (const auto& t : view.tables()) table_sizes_.push_back(t.num_elements());
}

uint64_t ParamClient::epoch() const {
  absl::MutexLock l(&mu_);
  return epoch_;
}

absl::StatusOr<std::shared_ptr<transport::Connection>> ParamClient::ConnectionTo(
    const std::string& address) {
  {
    absl::MutexLock l(&mu_);
    auto it = conns_.find(address);
    if (it != conns_.end() && it->second->healthy()) return it->second;
  }
  STRATA_ASSIGN_OR_RETURN(auto conn, transport_->Connect(address));
  absl::MutexLock l(&mu_);
  conns_[address] = conn;
  return conn;
}

absl::Status ParamClient::CallAll(
    const std::function<Message(const Route&)>& make_request,
    const std::function<absl::Status(const Route&, const Message&)>& on_response) {
  const absl::Time deadline = absl::Now() + request_timeout_;
  std::vector<Route> routes;
  uint64_t epoch;
  {
    absl::MutexLock l(&mu_);
    routes = routes_;
    epoch = epoch_;
  }
  if (routes.empty()) return absl::FailedPreconditionError("no partitions in the cluster view");
  std::vector<uint32_t> pending;  // indices into routes
  for (uint32_t i = 0; i < routes.size(); ++i) pending.push_back(i);

  for (int attempt = 0; !pending.empty(); ++attempt) {
    if (cancelled_) return absl::CancelledError("parameter client cancelled");
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          pending.size(), " partition request(s) unanswered after ",
          absl::FormatDuration(request_timeout_), "; first: partition ",
          routes[pending[0]].partition, " at ", routes[pending[0]].address));
    }
    absl::Mutex done_mu;
    int outstanding = static_cast<int>(pending.size());
    std::vector<Outcome> outcomes(pending.size());
    for (size_t j = 0; j < pending.size(); ++j) {
      const Route& r = routes[pending[j]];
      Message req = make_request(r);
      req.header.sender_id = node_id_;
      req.header.epoch = epoch;
      req.header.partition = r.partition;
      auto finish = [&, j](absl::StatusOr<Message> resp) {
        absl::MutexLock l(&done_mu);
        if (resp.ok()) {
          outcomes[j].response = std::move(*resp);
        } else {
          outcomes[j].status = resp.status();
        }
        --outstanding;
      };
      auto conn = ConnectionTo(r.address);
      if (!conn.ok()) {
        finish(conn.status());
        continue;
      }
      (*conn)->Call(std::move(req), finish);
    }
    {
      absl::MutexLock l(&done_mu);
      auto all_done = [&]() { return outstanding == 0; };
      if (!done_mu.AwaitWithDeadline(absl::Condition(&all_done), deadline)) {
        // Callbacks still reference locals: wait for them before leaving.
        // Transports fail pending calls on their own timeouts/shutdown.
        done_mu.Await(absl::Condition(&all_done));
      }
    }
    std::vector<uint32_t> retry;
    bool refresh = false;
    for (size_t j = 0; j < pending.size(); ++j) {
      const Route& r = routes[pending[j]];
      Outcome& o = outcomes[j];
      if (!o.status.ok()) {  // connection-level failure: reconnect and retry
        LOG_EVERY_N(WARNING, 20) << "partition " << r.partition << " at " << r.address
                                 << ": " << o.status << "; retrying";
        retry.push_back(pending[j]);
        continue;
      }
      absl::Status s = transport::ResponseStatus(o.response);
      if (s.ok()) {
        STRATA_RETURN_IF_ERROR(on_response(r, o.response));
      } else if (absl::IsFailedPrecondition(s) && o.response.header.epoch > epoch) {
        refresh = true;  // our view is stale
        retry.push_back(pending[j]);
      } else if (absl::IsUnavailable(s)) {
        retry.push_back(pending[j]);  // pserver behind on the view, or not ready
      } else {
        STRATA_RETURN_IF_ERROR(on_response(r, o.response));
      }
    }
    pending.swap(retry);
    if (pending.empty()) break;
    if (refresh) {
      STRATA_ASSIGN_OR_RETURN(proto::ClusterView view, refresh_view_());
      SetView(view);
      absl::MutexLock l(&mu_);
      routes = routes_;  // owners may have moved
      epoch = epoch_;
    } else {
      absl::SleepFor(absl::Milliseconds(std::min(200, 10 * (attempt + 1))));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ParamClient::PullAll(
    uint64_t min_version, std::vector<std::vector<float>>* tables) {
  {
    absl::MutexLock l(&mu_);
    tables->resize(table_sizes_.size());
    for (size_t t = 0; t < table_sizes_.size(); ++t) (*tables)[t].resize(table_sizes_[t]);
  }
  absl::Mutex mu;
  uint64_t lowest = UINT64_MAX;
  STRATA_RETURN_IF_ERROR(CallAll(
      [&](const Route&) {
        Message m;
        m.header.type = MessageType::kPullRequest;
        m.header.version = min_version;
        return m;
      },
      [&](const Route& r, const Message& resp) -> absl::Status {
        STRATA_RETURN_IF_ERROR(transport::ResponseStatus(resp));
        if (resp.payload.size() != r.length * sizeof(float) ||
            r.table >= tables->size() || r.offset + r.length > (*tables)[r.table].size()) {
          return absl::DataLossError(absl::StrCat(
              "pull of partition ", r.partition, " from ", r.address, ": expected ",
              r.length * sizeof(float), " bytes, got ", resp.payload.size()));
        }
        std::memcpy((*tables)[r.table].data() + r.offset, resp.payload.data(),
                    resp.payload.size());
        absl::MutexLock l(&mu);
        lowest = std::min(lowest, resp.header.version);
        return absl::OkStatus();
      }));
  return lowest;
}

absl::StatusOr<PushResult> ParamClient::PushAll(
    const std::vector<std::vector<float>>& grads, uint64_t step, uint64_t count) {
  uint64_t seq;
  {
    absl::MutexLock l(&mu_);
    seq = next_seq_++;
  }
  PushResult result;
  STRATA_RETURN_IF_ERROR(CallAll(
      [&](const Route& r) {
        Message m;
        m.header.type = MessageType::kPushRequest;
        m.header.seq = seq;
        m.header.version = step;
        m.header.count = count;
        const float* src = grads[r.table].data() + r.offset;
        m.payload.assign(reinterpret_cast<const char*>(src), r.length * sizeof(float));
        return m;
      },
      [&](const Route& r, const Message& resp) -> absl::Status {
        absl::Status s = transport::ResponseStatus(resp);
        if (absl::IsFailedPrecondition(s)) {  // stale gradient: dropped by design
          ++result.stale_partitions;
          VLOG(1) << s;
          return absl::OkStatus();
        }
        if (!s.ok()) {
          return absl::Status(s.code(), absl::StrCat("push to ", r.address, ": ", s.message()));
        }
        return absl::OkStatus();
      }));
  return result;
}

}  // namespace strata::worker
