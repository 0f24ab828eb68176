#include "master/standby.h"

#include <utility>

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

}  // namespace strata::master
