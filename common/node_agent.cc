#include "common/node_agent.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/error_reason.h"
#include "common/grpc_status.h"
#include "glog/logging.h"
#include "transport/data_plane_auth.h"

namespace strata {

NodeAgent::NodeAgent(Options options)
    : options_(std::move(options)),
      channel_(options_.master_address, options_.credentials, options_.control_connect_ms) {}

NodeAgent::Options NodeAgent::DaemonOptions(const ClusterSection& cluster,
                                            std::string master_address,
                                            std::shared_ptr<grpc::ChannelCredentials> credentials,
                                            std::string name,
                                            std::shared_ptr<transport::MembershipKeys> membership) {
  Options o;
  o.master_address = std::move(master_address);
  o.credentials = std::move(credentials);
  o.control_connect_ms = cluster.control_connect_ms;
  o.name = std::move(name);
  o.request_timeout = absl::Milliseconds(cluster.request_timeout_ms);
  o.membership = std::move(membership);
  return o;
}

absl::Status NodeAgent::Done(const grpc::Status& s) {
  absl::Status st = FromGrpcStatus(s, "master " + channel_.address());
  channel_.Report(st);
  return st;
}

void NodeAgent::TakeDataKey(const proto::DataPlaneKey& k) {
  if (options_.membership != nullptr && !k.key().empty()) {
    options_.membership->Update(node_id_.load(), k.epoch(), k.key(), k.secret());
  }
}

absl::StatusOr<proto::RegisterResponse> NodeAgent::Register(const proto::RegisterRequest& req,
                                                            absl::Duration timeout,
                                                            const absl::Notification& stop) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    proto::RegisterResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    absl::Status s = Done(master()->Register(&ctx, req, &resp));
    if (s.ok()) {
      node_id_ = resp.node_id();
      TakeDataKey(resp.data_key());
      return resp;
    }
    if (HasReason(s, proto::REASON_WRONG_JOB)) {
      return absl::FailedPreconditionError(absl::StrCat(options_.name, ": ", s.message()));
    }
    if (absl::Now() > deadline || stop.HasBeenNotified()) {
      return absl::UnavailableError(
          absl::StrCat(options_.name, ": cannot register: ", s.message()));
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
}

absl::Status NodeAgent::Heartbeat(proto::HeartbeatRequest req, absl::Duration deadline,
                                  proto::HeartbeatResponse* resp) {
  req.set_node_id(node_id_.load());
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  absl::Status s = Done(master()->Heartbeat(&ctx, req, resp));
  if (s.ok()) TakeDataKey(resp->data_key());
  return s;
}

absl::Status NodeAgent::ReportSuspect(uint32_t suspect, const std::string& reason,
                                      absl::Duration deadline) {
  proto::ReportSuspectRequest req;
  req.set_node_id(node_id_.load());
  req.set_suspect(suspect);
  req.set_reason(reason);
  proto::ReportSuspectResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  return Done(master()->ReportSuspect(&ctx, req, &resp));
}

absl::Status NodeAgent::FetchView(absl::Duration deadline, proto::ClusterView* view) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  return Done(master()->GetClusterView(&ctx, proto::GetClusterViewRequest(), view));
}

absl::Status NodeAgent::Call(const std::function<grpc::Status(grpc::ClientContext*)>& call,
                             const absl::Notification* stop) {
  const absl::Time deadline = absl::Now() + options_.request_timeout;
  absl::Duration backoff = absl::Milliseconds(100);
  while (true) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    absl::Status s = Done(call(&ctx));
    const bool transient = absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s);
    const bool stopping = stop != nullptr && stop->HasBeenNotified();
    if (!transient || absl::Now() + backoff > deadline || stopping) return s;
    LOG_EVERY_N(WARNING, 5) << s << "; retrying";
    if (stop != nullptr) {
      stop->WaitForNotificationWithTimeout(backoff);
    } else {
      absl::SleepFor(backoff);
    }
    backoff = std::min(backoff * 2, absl::Seconds(2));
  }
}

}  // namespace strata
