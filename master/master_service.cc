// The master's gRPC service: each call's caller identified and checked
// against the policy (docs/security.md), then handed to MasterServer; admin
// actions and refusals audited.
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/error_reason.h"
#include "common/grpc_status.h"
#include "common/security.h"
#include "master/master_server.h"

namespace strata::master {

absl::StatusOr<proto::DeclareTablesResponse> MasterServer::DeclareTables(
    const proto::DeclareTablesRequest& req) {
  return Durably([&](uint64_t* ticket) -> absl::StatusOr<proto::DeclareTablesResponse> {
    absl::MutexLock l(&mu_);
    if (job_.over()) return absl::FailedPreconditionError("the job is over");
    bool changed = false;
    auto r = nodes_.DeclareTables(req, &changed);
    if (changed) *ticket = PersistLocked();
    return r;
  });
}

// gRPC front end: converts between proto calls and MasterServer methods.
class MasterServer::Service final : public proto::Master::Service {
 public:
  explicit Service(MasterServer* m) : m_(m) {}

  const ControlPlaneSecurity& security() const { return m_->options_.security; }

  // The audit log (docs/security.md): every refused request, and every
  // admin action whatever its result, with its caller.
  // (The same refusal of the same caller is recorded at most once a
  // second, with how many were left out before it: a node retrying in a
  // loop does not flood the log.)
  grpc::Status Answer(grpc::ServerContext* ctx, const std::string& who, const char* method,
                      const absl::Status& s) {
    if (!s.ok()) m_->sink_->AuditRefusal(who, ctx->peer(), method, s);
    return ToGrpcStatus(s);
  }
  template <typename Response>
  grpc::Status Answer(grpc::ServerContext* ctx, const std::string& who, const char* method,
                      absl::StatusOr<Response> r, Response* resp) {
    if (!r.ok()) return Answer(ctx, who, method, r.status());
    *resp = std::move(*r);
    return grpc::Status::OK;
  }

// Who calls (refused unless authenticated), and whether the policy lets
// them call `method` of the Master service (docs/security.md): the caller
// as `who`, or the refusal answered and audited.
#define STRATA_CALLER(who, ctx, method, name)                                              \
  if (m_->paused()) return ToGrpcStatus(NotLeaderError("master " + m_->address(), ""));    \
  auto who##_slot = calls_.Enter(ctx->peer());                                             \
  if (!who##_slot.ok()) return Answer(ctx, "", name, who##_slot.status());                 \
  auto who##_or = security().Identify(*ctx);                                               \
  if (!who##_or.ok()) return Answer(ctx, "", name, who##_or.status());                     \
  const Identity who = *std::move(who##_or);                                               \
  if (absl::Status s = security().Permits(who, "/strata.proto.Master/" method); !s.ok()) { \
    return Answer(ctx, who.ToString(), name, s);                                           \
  }                                                                                        \
  (void)who

  grpc::Status Register(grpc::ServerContext* ctx, const proto::RegisterRequest* req,
                        proto::RegisterResponse* resp) override {
    STRATA_CALLER(who, ctx, "Register", "register");
    return Answer(ctx, who.ToString(), "register", m_->Register(*req, ctx->peer(), who), resp);
  }
  grpc::Status Heartbeat(grpc::ServerContext* ctx, const proto::HeartbeatRequest* req,
                         proto::HeartbeatResponse* resp) override {
    STRATA_CALLER(who, ctx, "Heartbeat", "heartbeat");
    if (absl::Status s = m_->CheckNodeCaller(req->node_id(), who); !s.ok()) {
      return Answer(ctx, who.ToString(), "heartbeat", s);
    }
    return Answer(ctx, who.ToString(), "heartbeat", m_->Heartbeat(*req), resp);
  }
  grpc::Status GetClusterView(grpc::ServerContext* ctx, const proto::GetClusterViewRequest*,
                              proto::ClusterView* resp) override {
    STRATA_CALLER(who, ctx, "GetClusterView", "get_cluster_view");
    *resp = m_->View();
    return grpc::Status::OK;
  }
  grpc::Status LeaseTask(grpc::ServerContext* ctx, const proto::LeaseTaskRequest* req,
                         proto::LeaseTaskResponse* resp) override {
    STRATA_CALLER(who, ctx, "LeaseTask", "lease_task");
    if (absl::Status s = m_->CheckNodeCaller(req->node_id(), who); !s.ok()) {
      return Answer(ctx, who.ToString(), "lease_task", s);
    }
    return Answer(ctx, who.ToString(), "lease_task", m_->LeaseTask(*req), resp);
  }
  grpc::Status CompleteTask(grpc::ServerContext* ctx, const proto::CompleteTaskRequest* req,
                            proto::CompleteTaskResponse*) override {
    STRATA_CALLER(who, ctx, "CompleteTask", "complete_task");
    absl::Status s = m_->CheckNodeCaller(req->node_id(), who);
    return Answer(ctx, who.ToString(), "complete_task", s.ok() ? m_->CompleteTask(*req) : s);
  }
  grpc::Status ReportProgress(grpc::ServerContext* ctx, const proto::ReportProgressRequest* req,
                              proto::ReportProgressResponse*) override {
    STRATA_CALLER(who, ctx, "ReportProgress", "report_progress");
    absl::Status s = m_->CheckNodeCaller(req->node_id(), who);
    return Answer(ctx, who.ToString(), "report_progress", s.ok() ? m_->ReportProgress(*req) : s);
  }
  grpc::Status GetStatus(grpc::ServerContext* ctx, const proto::GetStatusRequest*,
                         proto::GetStatusResponse* resp) override {
    STRATA_CALLER(who, ctx, "GetStatus", "get_status");
    *resp = m_->GetStatus();
    return grpc::Status::OK;
  }
  grpc::Status DeclareTables(grpc::ServerContext* ctx, const proto::DeclareTablesRequest* req,
                             proto::DeclareTablesResponse* resp) override {
    STRATA_CALLER(who, ctx, "DeclareTables", "declare_tables");
    if (absl::Status s = m_->CheckNodeCaller(req->node_id(), who); !s.ok()) {
      return Answer(ctx, who.ToString(), "declare_tables", s);
    }
    return Answer(ctx, who.ToString(), "declare_tables", m_->DeclareTables(*req), resp);
  }
  grpc::Status ReportSuspect(grpc::ServerContext* ctx, const proto::ReportSuspectRequest* req,
                             proto::ReportSuspectResponse* resp) override {
    STRATA_CALLER(who, ctx, "ReportSuspect", "report_suspect");
    if (absl::Status s = m_->CheckNodeCaller(req->node_id(), who); !s.ok()) {
      return Answer(ctx, who.ToString(), "report_suspect", s);
    }
    return Answer(ctx, who.ToString(), "report_suspect", m_->ReportSuspect(*req), resp);
  }
  // The admin actions: recorded before they are answered.
  grpc::Status Stop(grpc::ServerContext* ctx, const proto::StopRequest* req,
                    proto::StopResponse* resp) override {
    STRATA_CALLER(who, ctx, "Stop", "stop");
    const std::string reason = req->reason().empty() ? "request" : req->reason();
    auto r = m_->Stop(reason, req->no_checkpoint());
    Audit(who.ToString(), ctx->peer(), "stop", "job", ResultOf(r.status()),
          absl::StrCat("reason: ", reason, req->no_checkpoint() ? ", no checkpoint" : "",
                       r.ok() && r->checkpointed()
                           ? absl::StrCat(", after checkpoint ", r->checkpoint().seq())
                           : ""));
    return Reply(r, resp);
  }
  grpc::Status Drain(grpc::ServerContext* ctx, const proto::DrainRequest* req,
                     proto::DrainResponse* resp) override {
    STRATA_CALLER(who, ctx, "Drain", "drain");
    auto r = m_->Drain(*req);
    Audit(who.ToString(), ctx->peer(), "drain", absl::StrCat("node ", req->node_id()),
          ResultOf(r.status()), r.ok() ? r->message() : absl::StrCat("reason: ", req->reason()));
    return Reply(r, resp);
  }
  grpc::Status Scale(grpc::ServerContext* ctx, const proto::ScaleRequest* req,
                     proto::ScaleResponse* resp) override {
    STRATA_CALLER(who, ctx, "Scale", "scale");
    auto r = m_->Scale(*req);
    Audit(who.ToString(), ctx->peer(), "scale", "job", ResultOf(r.status()),
          r.ok() ? r->message() : absl::StrCat("reason: ", req->reason()));
    return Reply(r, resp);
  }
  grpc::Status Checkpoint(grpc::ServerContext* ctx, const proto::CheckpointRequest* req,
                          proto::CheckpointResponse* resp) override {
    STRATA_CALLER(who, ctx, "Checkpoint", "checkpoint");
    const std::string reason = req->reason().empty() ? "request" : req->reason();
    auto r = m_->Checkpoint(reason, req->stop_after());
    Audit(who.ToString(), ctx->peer(), req->stop_after() ? "checkpoint_and_stop" : "checkpoint",
          "job", ResultOf(r.status()),
          r.ok() ? absl::StrFormat("checkpoint %d (%s) at step %d, %d bytes: %s", r->seq(),
                                   r->incremental() ? "incremental" : "full", r->step(),
                                   r->bytes_written(), r->dir())
                 : absl::StrCat("reason: ", reason));
    return Reply(r, resp);
  }
#undef STRATA_CALLER

 private:
  // An admin action, recorded (synced) before it is answered.
  void Audit(const std::string& who, const std::string& from, const std::string& action,
             const std::string& target, const std::string& result, const std::string& detail) {
    m_->sink_->AuditAction({who, from, action, target, result, detail});
  }

  // Calls in progress per peer host (docs/security.md).
  PeerCallLimiter calls_{kMaxCallsPerPeerHost};

  static std::string ResultOf(const absl::Status& s) {
    return s.ok() ? "ok"
                  : absl::StrCat("failed: ", absl::StatusCodeToString(s.code()), ": ", s.message());
  }
  // An admin action's answer (already audited).
  template <typename Response>
  static grpc::Status Reply(absl::StatusOr<Response>& r, Response* resp) {
    if (!r.ok()) return ToGrpcStatus(r.status());
    *resp = std::move(*r);
    return grpc::Status::OK;
  }

  MasterServer* const m_;  // owns this service
};

std::unique_ptr<grpc::Service> MasterServer::NewService() {
  return std::make_unique<Service>(this);
}

}  // namespace strata::master
