// A master of several (docs/reliability.md, "Master high availability"):
// connects to etcd, serves a standby's redirect on the master's port until
// it is elected, then hands the master its state in etcd. Used by
// master_main.cc; one per process.
#ifndef STRATA_MASTER_HIGH_AVAILABILITY_H_
#define STRATA_MASTER_HIGH_AVAILABILITY_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "master/etcd_client.h"
#include "master/etcd_state.h"
#include "master/leadership.h"
#include "master/master_server.h"

namespace strata::master {

// The credentials for etcd: null (plain text) unless cluster.etcd.tls, then
// mTLS with the master's own certificate and the cluster's CA (its
// security's cert_file, key_file, ca_file). InvalidArgument naming the key
// when the cluster is not mTLS or a file cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> EtcdCredentials(const MasterOptions& o);

class HighAvailability {
 public:
  // Connects to opts->config.cluster.etcd (none of its members answering is
  // an error, *exit_code 2), then serves the redirect on opts->host and
  // opts->port and campaigns until this master leads or SIGTERM/SIGINT
  // comes (then null: the caller exits 0). Elected, it renews its lease
  // from then on (pausing the attached master while it cannot; losing the
  // lead ends the process at once, exit code 3: the supervisor's restart
  // makes it a standby), and sets opts->port to the
  // port served and opts->state_store and state_replayed to the job's
  // state in etcd.
  // `instance`: the bring-up's id ("" = none): the keys are
  // PREFIX/JOB/[INSTANCE/].
  static absl::StatusOr<std::unique_ptr<HighAvailability>> AwaitLead(MasterOptions* opts,
                                                                     const std::string& instance,
                                                                     int* exit_code);
  // The master that acts as the leader (null: none now): paused while the
  // lease cannot be renewed, resumed when it is again (leadership.h).
  void Attach(MasterServer* master) ABSL_LOCKS_EXCLUDED(mu_);
  // Gives the lead up at once (a clean exit).
  void Resign() { leadership_->Resign(); }
  // (The keep-alive threads stop first: their callbacks use this.)
  ~HighAvailability() { leadership_.reset(); }

 private:
  HighAvailability() = default;
  void Pause() ABSL_LOCKS_EXCLUDED(mu_);
  void Resume() ABSL_LOCKS_EXCLUDED(mu_);
  // Elected: the job's state in etcd brought up from what `follower` read
  // as a standby, opened as opts->state_store (opts->state_replayed).
  absl::Status TakeUpState(MasterOptions* opts, const std::string& keys, EtcdStateReader* follower);

  std::unique_ptr<EtcdClient> etcd_;
  std::unique_ptr<MasterLeadership> leadership_;
  absl::Mutex mu_;
  MasterServer* master_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace strata::master

#endif  // STRATA_MASTER_HIGH_AVAILABILITY_H_
