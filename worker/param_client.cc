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
  // Pulls land straight in the tensors: a route outside its table would
  // write out of bounds, so such a view is refused.
  view_error_ = absl::OkStatus();
  for (const Route& r : routes_) {
    if (r.table >= table_sizes_.size() || r.offset + r.length > table_sizes_[r.table]) {
      view_error_ = absl::DataLossError(absl::StrCat(
          "cluster view epoch ", view.epoch(), ": partition ", r.partition,
          " lies outside table ", r.table));
      LOG(ERROR) << view_error_;
      break;
    }
  }
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

namespace {

// Results of one round of requests. Shared with the transport callbacks, so
// a callback arriving after the round gave up writes here, not into a dead
// stack frame.
struct Round {
  explicit Round(size_t n) : results(n), outstanding(static_cast<int>(n)) {}
  absl::Mutex mu;
  std::vector<absl::StatusOr<Message>> results ABSL_GUARDED_BY(mu);
  int outstanding ABSL_GUARDED_BY(mu);
};

}  // namespace

absl::Status ParamClient::CallAll(
    const std::function<Message(const Route&)>& make_request,
    const std::function<absl::Status(const Route&, const Message&)>& on_response,
    const std::function<std::pair<char*, size_t>(const Route&)>& destination) {
  const absl::Time deadline = absl::Now() + request_timeout_;
  std::map<uint32_t, Route> routes;  // by partition id
  uint64_t epoch;
  absl::Status view_error;
  auto load_routes = [&]() {
    absl::MutexLock l(&mu_);
    view_error = view_error_;
    routes.clear();
    for (const Route& r : routes_) routes[r.partition] = r;
    epoch = epoch_;
  };
  load_routes();
  STRATA_RETURN_IF_ERROR(view_error);
  if (routes.empty()) return absl::FailedPreconditionError("no partitions in the cluster view");
  std::vector<uint32_t> pending;  // partition ids
  for (const auto& [id, r] : routes) pending.push_back(id);

  for (int attempt = 0; !pending.empty(); ++attempt) {
    if (cancelled_) return absl::CancelledError("parameter client cancelled");
    if (absl::Now() > deadline) {
      const Route& r = routes[pending[0]];
      return absl::DeadlineExceededError(absl::StrCat(
          pending.size(), " partition request(s) unanswered after ",
          absl::FormatDuration(request_timeout_), "; first: partition ",
          r.partition, " at ", r.address));
    }
    auto round = std::make_shared<Round>(pending.size());
    for (size_t j = 0; j < pending.size(); ++j) {
      const Route& r = routes[pending[j]];
      Message req = make_request(r);
      req.header.sender_id = node_id_;
      req.header.epoch = epoch;
      req.header.partition = r.partition;
      auto finish = [round, j](absl::StatusOr<Message> resp) {
        absl::MutexLock l(&round->mu);
        round->results[j] = std::move(resp);
        --round->outstanding;
      };
      auto conn = ConnectionTo(r.address);
      if (!conn.ok()) {
        finish(conn.status());
        continue;
      }
      if (destination) {
        auto [dest, size] = destination(r);
        (*conn)->CallInto(std::move(req), dest, size, finish);
      } else {
        (*conn)->Call(std::move(req), finish);
      }
    }
    std::vector<absl::StatusOr<Message>> results;
    {
      absl::MutexLock l(&round->mu);
      auto all_done = [&round]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(round->mu) {
        return round->outstanding == 0;
      };
      // Wake up now and then to notice Cancel().
      while (!round->mu.AwaitWithDeadline(
          absl::Condition(&all_done), std::min(deadline, absl::Now() + absl::Milliseconds(200)))) {
        if (cancelled_) return absl::CancelledError("parameter client cancelled");
        if (absl::Now() > deadline) {
          return absl::DeadlineExceededError(absl::StrCat(
              round->outstanding, " partition request(s) unanswered after ",
              absl::FormatDuration(request_timeout_), " (first: partition ",
              routes[pending[0]].partition, " at ", routes[pending[0]].address, ")"));
        }
      }
      results = std::move(round->results);
    }
    std::vector<uint32_t> retry;
    bool refresh = false;
    for (size_t j = 0; j < pending.size(); ++j) {
      const Route& r = routes[pending[j]];
      const absl::StatusOr<Message>& o = results[j];
      if (!o.ok()) {  // connection-level failure: reconnect and retry
        LOG_EVERY_N(WARNING, 20) << "partition " << r.partition << " at " << r.address
                                 << ": " << o.status() << "; retrying";
        retry.push_back(pending[j]);
        continue;
      }
      absl::Status s = transport::ResponseStatus(*o);
      if (s.ok()) {
        STRATA_RETURN_IF_ERROR(on_response(r, *o));
      } else if (absl::IsFailedPrecondition(s) && o->header.epoch > epoch) {
        refresh = true;  // our view is stale
        retry.push_back(pending[j]);
      } else if (absl::IsUnavailable(s)) {
        retry.push_back(pending[j]);  // pserver behind on the view, or not ready
      } else {
        STRATA_RETURN_IF_ERROR(on_response(r, *o));
      }
    }
    pending.swap(retry);
    if (pending.empty()) break;
    if (refresh) {
      STRATA_ASSIGN_OR_RETURN(proto::ClusterView view, refresh_view_());
      SetView(view);
      load_routes();  // owners may have moved
      STRATA_RETURN_IF_ERROR(view_error);
      for (uint32_t id : pending) {
        if (routes.count(id) == 0) {
          return absl::FailedPreconditionError(absl::StrCat(
              "partition ", id, " is no longer in the cluster view"));
        }
      }
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
        if (!resp.payload_in_destination) {  // a response of the wrong size
          return absl::DataLossError(absl::StrCat(
              "pull of partition ", r.partition, " from ", r.address, ": expected ",
              r.length * sizeof(float), " bytes, got ", resp.payload.size()));
        }
        absl::MutexLock l(&mu);
        lowest = std::min(lowest, resp.header.version);
        return absl::OkStatus();
      },
      [&](const Route& r) -> std::pair<char*, size_t> {
        // Responses land straight in the tensor (checked against the view).
        return {reinterpret_cast<char*>((*tables)[r.table].data() + r.offset),
                r.length * sizeof(float)};
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
        // Sent straight from the gradient tensor: no copy.
        m.payload_ref = reinterpret_cast<const char*>(grads[r.table].data() + r.offset);
        m.payload_ref_size = r.length * sizeof(float);
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
