// Which master leads (docs/reliability.md, "Master high availability"):
// the masters of one job campaign for a key in etcd held by a lease; the
// one that creates it leads while it renews the lease, and the others are
// standbys that answer with its address.
//
// Safety: the leader stops acting (it pauses, Callbacks::pause) once a
// renewal has not been answered within the lease, measured from when the
// renewal was sent: etcd ends the lease no earlier than that, so the next
// leader cannot have been elected before. It acts again only when a later
// renewal shows the lease and the key are still its own; else it has lost
// the lead (the process exits, master_main.cc). Every state write checks, in the
// same etcd transaction, that the key is still the one this leader created
// (its create revision, the fencing token), so a leader that is late to
// notice cannot write either.
#ifndef STRATA_MASTER_LEADERSHIP_H_
#define STRATA_MASTER_LEADERSHIP_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "etcd/etcdserver/etcdserverpb/rpc.pb.h"
#include "master/etcd_client.h"

namespace strata::master {

// The leader key's value: the leader's gRPC address, then, when it serves
// HTTP, a line "http HOST:PORT"; and the two read back from it.
std::string LeaderValue(const std::string& address, const std::string& http_address);
struct LeaderAddresses {
  std::string address;
  std::string http;
};
LeaderAddresses ParseLeaderValue(const std::string& value);

// Owns: the keep-alive threads (joined by the destructor), the lease, what
// it knows of the leader (under mu_). Thread-safe.
class MasterLeadership {
 public:
  struct Options {
    EtcdClient* etcd = nullptr;  // borrowed; outlives this
    // The job's keys: PREFIX/JOB/ (ends in "/"); the leader key is
    // KEYS + "leader".
    std::string keys;
    // This master's gRPC address, what standbys redirect to; and its
    // HTTP one ("" when it serves none), where standbys send browsers.
    std::string address;
    std::string http_address;
    int lease_seconds = 3;
    // How often a standby looks at the leader key.
    absl::Duration poll = absl::Milliseconds(200);
  };
  explicit MasterLeadership(Options options);
  ~MasterLeadership();
  MasterLeadership(const MasterLeadership&) = delete;
  MasterLeadership& operator=(const MasterLeadership&) = delete;

  // Blocks until this master leads (OK) or `stopped()` returns true
  // (CANCELLED). etcd being unreachable meanwhile is logged and tried
  // again. Call once.
  // `while_standby` (may be empty) is called at each look while another
  // master leads (a standby follows the state so).
  absl::Status Campaign(const std::function<bool()>& stopped,
                        const std::function<void()>& while_standby = {}) ABSL_LOCKS_EXCLUDED(mu_);
  // What the leader is told, from the keep-alive threads.
  struct Callbacks {
    // No renewal was answered within the lease (etcd unreachable, or
    // without a quorum): the leader must stop acting now, before another
    // master can be elected. Called once per pause.
    std::function<void(const std::string&)> pause;
    // A renewal was answered again and the leader key is still this
    // master's (nobody was elected meanwhile): it may act again.
    std::function<void()> resume;
    // This master leads no more (its lease ended, another master holds
    // the key, or Deposed()): called once, and nothing after it.
    std::function<void(const std::string&)> lost;
  };
  // Once leading: renews the lease from a thread of its own (and a
  // watchdog thread pauses the leader when the lease may have run out).
  void KeepLeading(Callbacks callbacks) ABSL_LOCKS_EXCLUDED(mu_);
  // A fenced write found the key is no longer ours.
  void Deposed(const std::string& why) ABSL_LOCKS_EXCLUDED(mu_);
  // A state write of this leader landed at etcd revision `revision` (the
  // messages of a pause and of a lost lead name the last one: no write of
  // this master is newer than the next leader's election).
  void Wrote(int64_t revision) { last_write_ = std::max(last_write_.load(), revision); }
  // Hands leadership over at once (the lease revoked): a clean shutdown.
  void Resign() ABSL_LOCKS_EXCLUDED(mu_);

  // The leader's address as last seen ("" when none is known); this
  // master's own while it leads.
  std::string leader() const ABSL_LOCKS_EXCLUDED(mu_);
  // The leader's HTTP address as last seen ("" when none is known or it
  // serves none).
  std::string leader_http() const ABSL_LOCKS_EXCLUDED(mu_);
  bool leading() const { return leading_.load(); }
  // Leading: the leader key's create revision (the fencing token).
  int64_t revision() const { return revision_.load(); }
  const std::string& leader_key() const { return leader_key_; }
  // A compare that holds while this master leads (its key, its revision):
  // every state write carries it.
  etcdserverpb::Compare StillLeading() const;

 private:
  void RenewLoop();
  void WatchdogLoop();
  // After a renewal answered while paused: acts again when the key is
  // still ours.
  void MaybeResume(absl::Time valid_until) ABSL_LOCKS_EXCLUDED(mu_, transitions_mu_);
  void Lose(const std::string& why) ABSL_LOCKS_EXCLUDED(mu_, transitions_mu_);

  const Options options_;
  const std::string leader_key_;
  // Held while a pause, a resume or the loss is decided and its callback
  // runs: callbacks come in the order of the transitions.
  absl::Mutex transitions_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  std::string leader_ ABSL_GUARDED_BY(mu_);
  std::string leader_http_ ABSL_GUARDED_BY(mu_);
  // What a leader key's value names (LeaderValue) taken as the leader.
  void SawLeaderLocked(const std::string& value) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t lease_ ABSL_GUARDED_BY(mu_) = 0;
  // The lease runs at least until this (renewal sent + TTL - margin).
  absl::Time valid_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  Callbacks callbacks_ ABSL_GUARDED_BY(mu_);
  bool lost_called_ ABSL_GUARDED_BY(mu_) = false;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> leading_{false};
  std::atomic<int64_t> revision_{0};
  std::atomic<int64_t> last_write_{0};
  absl::Notification stop_;
  std::thread renew_;
  std::thread watchdog_;
};

}  // namespace strata::master

#endif  // STRATA_MASTER_LEADERSHIP_H_
