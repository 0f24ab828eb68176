#include "master/standby.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/error_reason.h"
#include "common/grpc_status.h"
#include "proto/strata.grpc.pb.h"

namespace strata::master {
namespace {

class StandbyService final : public proto::Master::Service {
 public:
  StandbyService(std::string self, std::function<std::string()> leader)
      : self_(std::move(self)), leader_(std::move(leader)) {}

#define STRATA_STANDBY_REFUSES(Method, Request, Response)                                       \
  grpc::Status Method(grpc::ServerContext*, const proto::Request*, proto::Response*) override { \
    return Refuse();                                                                            \
  }
  STRATA_STANDBY_REFUSES(Register, RegisterRequest, RegisterResponse)
  STRATA_STANDBY_REFUSES(Heartbeat, HeartbeatRequest, HeartbeatResponse)
  STRATA_STANDBY_REFUSES(GetClusterView, GetClusterViewRequest, ClusterView)
  STRATA_STANDBY_REFUSES(LeaseTask, LeaseTaskRequest, LeaseTaskResponse)
  STRATA_STANDBY_REFUSES(CompleteTask, CompleteTaskRequest, CompleteTaskResponse)
  STRATA_STANDBY_REFUSES(ReportProgress, ReportProgressRequest, ReportProgressResponse)
  STRATA_STANDBY_REFUSES(GetStatus, GetStatusRequest, GetStatusResponse)
  STRATA_STANDBY_REFUSES(Checkpoint, CheckpointRequest, CheckpointResponse)
  STRATA_STANDBY_REFUSES(Stop, StopRequest, StopResponse)
  STRATA_STANDBY_REFUSES(Drain, DrainRequest, DrainResponse)
  STRATA_STANDBY_REFUSES(ReportSuspect, ReportSuspectRequest, ReportSuspectResponse)
  STRATA_STANDBY_REFUSES(DeclareTables, DeclareTablesRequest, DeclareTablesResponse)
  STRATA_STANDBY_REFUSES(Scale, ScaleRequest, ScaleResponse)
#undef STRATA_STANDBY_REFUSES

 private:
  grpc::Status Refuse() const { return ToGrpcStatus(NotLeaderError("master " + self_, leader_())); }

  const std::string self_;
  const std::function<std::string()> leader_;
};

}  // namespace

std::unique_ptr<grpc::Service> NewStandbyService(std::string self,
                                                 std::function<std::string()> leader) {
  return std::make_unique<StandbyService>(std::move(self), std::move(leader));
}

void AddLeaderMetric(MetricsRegistry* metrics, std::function<bool()> acting) {
  metrics->AddCallbackGauge("strata_master_leader",
                            "1 while this master acts as the leader (0: a standby, or a leader "
                            "paused while etcd does not answer)",
                            [acting = std::move(acting)] { return acting() ? 1.0 : 0.0; });
}

void ServeStandbyHttp(HttpServer* http, MetricsRegistry* metrics,
                      std::function<LeaderAddresses()> leader, bool https) {
  AddLeaderMetric(metrics, [] { return false; });
  http->Handle("/metrics", [metrics](const HttpRequest&) {
    return HttpResponse{200, "text/plain; version=0.0.4", metrics->RenderPrometheus()};
  });
  http->Handle("/healthz", [leader](const HttpRequest&) {
    const LeaderAddresses l = leader();
    return HttpResponse{
        200, "text/plain",
        l.address.empty()
            ? "standby; no leading master known yet\n"
            : absl::StrCat("standby; the leading master is ", l.address,
                           l.http.empty() ? "" : absl::StrCat(" (http ", l.http, ")"), "\n")};
  });
  auto redirect = [leader, https](const HttpRequest& req) {
    const LeaderAddresses l = leader();
    if (l.http.empty()) {
      return HttpResponse{503, "text/plain",
                          l.address.empty()
                              ? "a standby master: no leading master is known yet; try again\n"
                              : absl::StrCat("a standby master: the leading master ", l.address,
                                             " serves no HTTP\n")};
    }
    HttpResponse r;
    r.status = 307;
    r.location = absl::StrCat(https ? "https://" : "http://", l.http, req.path,
                              req.query.empty() ? "" : "?", req.query);
    r.body = absl::StrCat("a standby master: the leader's page is ", r.location, "\n");
    return r;
  };
  http->Handle("/", redirect);
  http->Handle("/status", redirect);
}

}  // namespace strata::master
