#include "common/daemon_env.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/error_reason.h"
#include "common/grpc_status.h"
#include "glog/logging.h"
#include "storage/s3_file_system.h"

namespace strata {

absl::StatusOr<DaemonEnv> LoadDaemonEnv(const DaemonEnvOptions& o, int* exit_code) {
  *exit_code = 2;
  DaemonEnv env;
  absl::StatusOr<JobConfig> config = LoadJobConfig(o.config_path);
  if (!config.ok()) return config.status();
  env.config = *std::move(config);
  absl::StatusOr<std::unique_ptr<Failpoints>> failpoints = Failpoints::Parse(o.failpoints);
  if (!failpoints.ok()) return failpoints.status();
  env.failpoints = *std::move(failpoints);
  if (o.security) {
    // Refuses a key readable by others or a missing certificate.
    absl::StatusOr<ControlPlaneSecurity> security =
        DaemonSecurity(env.config.security, o.tls_dir, o.role, o.index);
    if (!security.ok()) return security.status();
    env.security = *std::move(security);
  }
  const auto getenv = o.getenv ? o.getenv : [](const char*) -> const char* { return nullptr; };
  std::string note;
  absl::StatusOr<std::unique_ptr<storage::FileSystem>> fs =
      storage::NewFileSystemForConfig(env.config.s3, getenv, &note);
  if (!fs.ok()) return fs.status();
  env.fs = *std::move(fs);
  if (!note.empty()) LOG(INFO) << note;
  if (o.check_checkpoint_root) {
    if (absl::Status s = storage::CheckCheckpointRoot(env.fs.get(), env.config.checkpoint);
        !s.ok()) {
      *exit_code = 1;
      return s;
    }
  }
  *exit_code = 0;
  return env;
}

int StartFailed(const std::string& role, const absl::Status& s, int exit_code) {
  LOG(ERROR) << "cannot start " << role << ": " << s.message();
  return exit_code;
}

absl::Status AskMasterToCheckpointAndStop(proto::Master::StubInterface* master,
                                          const std::string& master_address, const std::string& who,
                                          absl::Duration grace) {
  proto::CheckpointRequest req;
  req.set_reason(absl::StrCat("sigterm on ", who));
  req.set_stop_after(true);
  proto::CheckpointResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + grace));
  return FromGrpcStatus(master->Checkpoint(&ctx, req, &resp), "master " + master_address);
}

void CheckpointBeforeStopping(const JobConfig& config,
                              const std::function<absl::Status(absl::Duration grace)>& request) {
  LOG(INFO) << "SIGTERM: asking the master for a checkpoint and a clean stop (grace "
            << config.checkpoint.grace_seconds << " s)";
  const absl::Status s = request(absl::Seconds(config.checkpoint.grace_seconds));
  if (HasReason(s, proto::REASON_JOB_NOT_RUNNING)) {
    LOG(INFO) << "no checkpoint before stopping: " << s.message();  // the job is over
  } else if (!s.ok()) {
    LOG(WARNING) << "no checkpoint before stopping: " << s;
  }
}

}  // namespace strata
