// Scaling a running job (`strata scale`; docs/operations.md, "Scaling"):
// the shape the job is being taken to, the scale in progress, and the
// provider command that starts the daemons a scale adds (and is told of
// those it removed, to release their nodes).
//
// A scale is planned against the view (Prepare: the instances to start,
// the workers to drain, or why it is refused), begun (Begin: the provider
// runs for what it adds; the master drains the others), and followed on
// the master's ticks (Check: done once every added worker trains and every
// drained one has left, and for pservers once the partitions moved; given
// up at elastic.scale_timeout_seconds or when the provider fails). One
// scale at a time.
//
// What it owns: the targets and the scale in progress, guarded by the
// master's lock (MasterServer::mu_ is held for every call); the provider's
// runs, each on a thread of its own, their outcomes under a leaf lock
// (runs_mu_) taken in by Check.
#ifndef STRATA_MASTER_SCALER_H_
#define STRATA_MASTER_SCALER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/host_file.h"
#include "master/autoscaler.h"
#include "proto/strata.pb.h"

namespace strata::master {

// The provider command's arguments with {action}, {role}, {count} and
// {indices} (comma-separated) replaced.
std::vector<std::string> ProviderArgs(const std::vector<std::string>& command,
                                      const std::string& action, const std::string& role,
                                      const std::vector<int32_t>& indices);

class Scaler {
 public:
  struct Options {
    ElasticSection elastic;
    // The host file's instances: those started with the job and its room
    // to scale (HostFile::Slots).
    std::vector<HostSlot> slots;
    // What starts and releases daemons: elastic.provider, else the
    // launcher's (strata-master --provider); empty: the operator does.
    std::vector<std::string> provider;
    Clock* clock = nullptr;  // borrowed, required
  };
  explicit Scaler(Options options);
  // Ends the provider runs still going (killed) and joins them.
  ~Scaler();
  Scaler(const Scaler&) = delete;
  Scaler& operator=(const Scaler&) = delete;

  // A scale planned against `view`: the role it changes, its target, the
  // instances to start (indices) and the nodes to drain (workers) or to
  // empty and then drain (pservers: their partitions move first), and
  // what it does in words ("workers 1 -> 3: starting worker 1, 2").
  // Nothing to do: empty add and drain, `what` says so. Refused
  // (FailedPrecondition, saying why): the job is not running, a scale is
  // in progress, beyond elastic's min/max or the host file's room;
  // InvalidArgument for a malformed request (both roles at once).
  struct Plan {
    proto::Role role = proto::WORKER;
    int from = 0;
    int target = 0;
    std::vector<int32_t> add;
    std::vector<uint32_t> drain;
    std::string what;
  };
  absl::StatusOr<Plan> Prepare(const proto::ScaleRequest& req, const proto::ClusterView& view,
                               proto::JobState state) const;
  // The plan goes ahead (the master drains plan.drain): the provider is
  // started for what it adds, when there is one.
  void Begin(const Plan& plan);

  // Where the scale in progress stands against `view`: nullopt while it
  // goes on (or none is); else how it ended, for an event (a scale given
  // up leaves the autoscaler nothing to measure). Provider runs that failed
  // outside a scale (a "remove") come back as well.
  struct Ended {
    bool ok = false;
    std::string kind;  // the event's: "scale_done", "scale_failed", "provider_failed"
    std::string message;
  };
  // `moves`: partition moves under way or waiting (a pserver scale is done
  // once there are none).
  std::vector<Ended> Check(const proto::ClusterView& view, int moves = 0);

  // Its part of the state (docs/reliability.md) and of JobStatus.
  void Save(proto::MasterState* st) const;
  void Restore(const proto::MasterState& st);
  void FillStatus(const proto::ClusterView& view, proto::JobStatus* js) const;
  bool in_progress() const { return op_.has_value(); }
  // A pserver scale is in progress: partitions are to be balanced.
  bool scaling_pservers() const { return op_.has_value() && op_->role() == proto::PSERVER; }
  // Live migration's pace (elastic.move_rate_mb_per_s): the bytes of
  // partition copies that may start now (a second's worth at most; below
  // zero after a big one), and those started.
  double MoveCredit();
  void MovesStarted(uint64_t bytes) { move_credit_ -= static_cast<double>(bytes); }
  // The autoscaler (its on/off kept in the state with the scale's).
  Autoscaler& autoscaler() { return autoscaler_; }
  // Turns it on or off (`strata scale --autoscale`).
  void SetAutoscale(proto::ScaleRequest::Autoscale a);
  bool has_provider() const { return !options_.provider.empty(); }
  // The most workers the job may have: elastic.max_workers, and the host
  // file's room.
  int most_workers() const;
  // The autoscaler's tick (master/autoscaler.h) with the job's shape
  // counted from `view`, the data tasks `pending` and the `samples`
  // trained so far: its decision, if any.
  std::optional<Autoscaler::Decision> Autoscale(const proto::ClusterView& view,
                                                proto::JobState state, uint64_t pending,
                                                uint64_t samples);

 private:
  struct Run;
  // Runs the provider for (action, role, indices) on a thread of its own,
  // killed at `deadline`; its outcome goes to runs_.
  void StartProvider(const std::string& action, proto::Role role,
                     const std::vector<int32_t>& indices, absl::Time deadline);
  void RunProvider(Run* run);
  int Room(proto::Role role) const;  // the host file's instances, started and room
  // Ends the scale in progress unfinished: the target is what there is.
  void GiveUp(const proto::ClusterView& view);

  const Options options_;
  Clock* const clock_;
  int workers_target_ = 0;  // 0: none set yet
  int pservers_target_ = 0;
  std::optional<proto::ScaleState> op_;  // the scale in progress
  Autoscaler autoscaler_;
  proto::ScaleRequest::Autoscale autoscale_ = proto::ScaleRequest::AUTOSCALE_UNCHANGED;
  double move_credit_ = 0;
  absl::Time move_credit_at_ = absl::InfinitePast();

  absl::Mutex runs_mu_;
  std::vector<std::unique_ptr<Run>> runs_ ABSL_GUARDED_BY(runs_mu_);
  absl::Notification stop_;
};

}  // namespace strata::master

#endif  // STRATA_MASTER_SCALER_H_
