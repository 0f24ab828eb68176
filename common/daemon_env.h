// What every daemon's main() loads once before it builds its server: the
// job config, the file system the config names (local or an S3 store), the
// control plane's security, the failpoints; and the policy on SIGTERM that
// pservers and workers share. The mains hold only their flags and the
// server's own options.
//
// Thread safety: call from main() only.
#ifndef STRATA_COMMON_DAEMON_ENV_H_
#define STRATA_COMMON_DAEMON_ENV_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/config.h"
#include "common/failpoint.h"
#include "common/security.h"
#include "proto/strata.grpc.pb.h"
#include "storage/file_system.h"

namespace strata {

struct DaemonEnvOptions {
  DaemonEnvOptions() = default;
  DaemonEnvOptions(std::string role, int index, std::string config_path, std::string tls_dir,
                   std::function<const char*(const char*)> getenv)
      : role(std::move(role)),
        index(index),
        config_path(std::move(config_path)),
        tls_dir(std::move(tls_dir)),
        getenv(std::move(getenv)) {}

  std::string role;         // "master", "pserver", "worker": certificates and messages
  int index = -1;           // the instance index; -1 for the master
  std::string config_path;  // --config
  std::string tls_dir;      // --tls_dir: overrides security.tls_dir
  std::string failpoints;   // --failpoint ("" = none)
  // False where there is no control plane (a worker's --local): plain text.
  bool security = true;
  // Checks that checkpoint.dir can be written now, not at the first
  // checkpoint (a wrong key, a missing bucket, an unwritable directory).
  bool check_checkpoint_root = false;
  // The environment (main passes ::getenv): the object store's AWS_* keys
  // when the config names no credentials file.
  std::function<const char*(const char*)> getenv;
};

struct DaemonEnv {
  JobConfig config;
  std::unique_ptr<storage::FileSystem> fs;
  ControlPlaneSecurity security = ControlPlaneSecurity::Plaintext();
  std::unique_ptr<Failpoints> failpoints;  // null without any
};

// Loads it all, logging what the file system is. On error, *exit_code is
// the daemon's exit status (2: bad input: the config, the certificates, a
// flag; 1: the checkpoint root cannot be used now) and the message names
// the file or field.
absl::StatusOr<DaemonEnv> LoadDaemonEnv(const DaemonEnvOptions& options, int* exit_code);

// Logs "cannot start ROLE: MESSAGE" and returns `exit_code`: main's
// `return StartFailed(...)`.
int StartFailed(const std::string& role, const absl::Status& s, int exit_code = 1);

// Asks the master (`master`, at `master_address`) for a checkpoint and then
// a clean stop, answered within `grace`; `who` ("pserver 1") goes into the
// checkpoint's reason. The master's refusal carries its reason
// (REASON_JOB_NOT_RUNNING when the job is over).
absl::Status AskMasterToCheckpointAndStop(proto::Master::StubInterface* master,
                                          const std::string& master_address, const std::string& who,
                                          absl::Duration grace);

// A node's SIGTERM when checkpoints are on (a preemption notice): asks the
// master for a checkpoint and a clean stop within checkpoint.grace_seconds
// through `request`, and logs the outcome (a job that is not running any
// more needs none).
void CheckpointBeforeStopping(const JobConfig& config,
                              const std::function<absl::Status(absl::Duration grace)>& request);

}  // namespace strata

#endif  // STRATA_COMMON_DAEMON_ENV_H_
