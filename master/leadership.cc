#include "master/leadership.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "glog/logging.h"

namespace strata::master {

std::string LeaderValue(const std::string& address, const std::string& http_address) {
  return http_address.empty() ? address : absl::StrCat(address, "\nhttp ", http_address);
}

LeaderAddresses ParseLeaderValue(const std::string& value) {
  LeaderAddresses out;
  std::vector<std::string> lines = absl::StrSplit(value, '\n');
  out.address = lines.empty() ? "" : lines[0];
  for (size_t i = 1; i < lines.size(); ++i) {
    if (absl::StartsWith(lines[i], "http ")) out.http = lines[i].substr(5);
  }
  return out;
}

MasterLeadership::MasterLeadership(Options options)
    : options_(std::move(options)), leader_key_(options_.keys + "leader") {}

MasterLeadership::~MasterLeadership() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (renew_.joinable()) renew_.join();
  if (watchdog_.joinable()) watchdog_.join();
}

std::string MasterLeadership::leader() const {
  absl::MutexLock l(&mu_);
  return leader_;
}

std::string MasterLeadership::leader_http() const {
  absl::MutexLock l(&mu_);
  return leader_http_;
}

void MasterLeadership::SawLeaderLocked(const std::string& value) {
  LeaderAddresses seen = ParseLeaderValue(value);
  leader_ = std::move(seen.address);
  leader_http_ = std::move(seen.http);
}

etcdserverpb::Compare MasterLeadership::StillLeading() const {
  etcdserverpb::Compare c;
  c.set_key(leader_key_);
  c.set_target(etcdserverpb::Compare::CREATE);
  c.set_result(etcdserverpb::Compare::EQUAL);
  c.set_create_revision(revision_.load());
  return c;
}

absl::Status MasterLeadership::Campaign(const std::function<bool()>& stopped,
                                        const std::function<void()>& while_standby) {
  EtcdClient* etcd = options_.etcd;
  std::string last_error;
  while (!stopped()) {
    absl::Status s = [&]() -> absl::Status {
      auto seen = etcd->Get(leader_key_);
      if (!seen.ok()) return seen.status();
      if (seen->found) {
        absl::MutexLock l(&mu_);
        const std::string before = leader_;
        SawLeaderLocked(seen->value);
        if (leader_ != before) {
          LOG(INFO) << "standby: the leading master is " << leader_
                    << (leader_http_.empty() ? "" : absl::StrCat(" (http ", leader_http_, ")"))
                    << " (" << leader_key_ << ", revision " << seen->create_revision << ")";
        }
        return absl::OkStatus();
      }
      // No leader: try to become it, with a lease of our own.
      // (The lease counts from before it was asked for: etcd's runs from
      // when etcd granted it.)
      const absl::Time granted = absl::Now();
      auto lease = etcd->GrantLease(options_.lease_seconds);
      if (!lease.ok()) return lease.status();
      etcdserverpb::TxnRequest txn;
      etcdserverpb::Compare* c = txn.add_compare();
      c->set_key(leader_key_);
      c->set_target(etcdserverpb::Compare::CREATE);
      c->set_result(etcdserverpb::Compare::EQUAL);
      c->set_create_revision(0);  // absent
      etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
      put->set_key(leader_key_);
      put->set_value(LeaderValue(options_.address, options_.http_address));
      put->set_lease(*lease);
      txn.add_failure()->mutable_request_range()->set_key(leader_key_);
      auto resp = etcd->Txn(txn);
      if (!resp.ok() || !resp->succeeded()) {
        etcd->RevokeLease(*lease).IgnoreError();  // (it ends on its own otherwise)
        if (!resp.ok()) return resp.status();
        const auto& r = resp->responses(0).response_range();
        if (r.kvs_size() > 0) {
          absl::MutexLock l(&mu_);
          SawLeaderLocked(r.kvs(0).value());
        }
        return absl::OkStatus();
      }
      revision_ = resp->header().revision();
      absl::MutexLock l(&mu_);
      lease_ = *lease;
      valid_until_ = granted + absl::Seconds(options_.lease_seconds) -
                     std::min(absl::Milliseconds(500), absl::Seconds(options_.lease_seconds) / 4);
      leader_ = options_.address;
      leader_http_ = options_.http_address;
      leading_ = true;
      return absl::OkStatus();
    }();
    if (leading_.load()) {
      LOG(INFO) << "this master leads: " << leader_key_ << " = " << options_.address
                << " (revision " << revision_.load() << ", lease " << options_.lease_seconds
                << " s)";
      return absl::OkStatus();
    }
    if (!s.ok() && s.ToString() != last_error) {
      LOG(WARNING) << "standby: cannot campaign for the master's lead: " << s << "; trying again";
    }
    last_error = s.ok() ? "" : s.ToString();
    if (s.ok() && while_standby) while_standby();
    stop_.WaitForNotificationWithTimeout(options_.poll);
  }
  return absl::CancelledError("stopped while a standby");
}

void MasterLeadership::KeepLeading(Callbacks callbacks) {
  {
    absl::MutexLock l(&mu_);
    callbacks_ = std::move(callbacks);
  }
  renew_ = std::thread([this] { RenewLoop(); });
  watchdog_ = std::thread([this] { WatchdogLoop(); });
}

void MasterLeadership::RenewLoop() {
  const absl::Duration every = absl::Seconds(options_.lease_seconds) / 3;
  const absl::Duration margin =
      std::min(absl::Milliseconds(500), absl::Seconds(options_.lease_seconds) / 4);
  while (!stop_.WaitForNotificationWithTimeout(every)) {
    int64_t lease;
    bool paused;
    {
      absl::MutexLock l(&mu_);
      if (lost_called_) return;
      lease = lease_;
      paused = paused_;
    }
    const absl::Time sent = absl::Now();
    absl::StatusOr<int64_t> ttl = options_.etcd->KeepAlive(lease);
    if (absl::IsNotFound(ttl.status())) {
      Lose(absl::StrCat("the lease of ", leader_key_, " has ended: ", ttl.status().message()));
      return;
    }
    if (!ttl.ok()) {
      LOG_EVERY_N(WARNING, 5) << "leader: renewing the lease of " << leader_key_
                              << " failed: " << ttl.status() << "; trying again";
      continue;
    }
    const absl::Time until = sent + absl::Seconds(*ttl) - margin;
    if (paused) {
      MaybeResume(until);
      continue;
    }
    absl::MutexLock l(&mu_);
    valid_until_ = std::max(valid_until_, until);
  }
}

void MasterLeadership::MaybeResume(absl::Time valid_until) {
  auto seen = options_.etcd->Get(leader_key_);
  if (!seen.ok()) return;  // (the next renewal tries again)
  if (!seen->found || seen->create_revision != revision_.load()) {
    Lose(absl::StrCat(
        leader_key_, " is no longer this master's (revision ", revision_.load(),
        seen->found ? absl::StrCat("; ", ParseLeaderValue(seen->value).address, " leads") : "",
        ")"));
    return;
  }
  // (Transitions and their callbacks in one order: a pause decided before
  // this resume is told before it.)
  absl::MutexLock t(&transitions_mu_);
  std::function<void()> resume;
  {
    absl::MutexLock l(&mu_);
    if (lost_called_ || !paused_) return;
    valid_until_ = valid_until;
    paused_ = false;
    leading_ = true;
    resume = callbacks_.resume;
  }
  LOG(WARNING) << "etcd answers again and " << leader_key_
               << " is still this master's: acting as the leader again";
  if (resume) resume();
}

void MasterLeadership::WatchdogLoop() {
  while (!stop_.WaitForNotificationWithTimeout(absl::Milliseconds(50))) {
    absl::MutexLock t(&transitions_mu_);
    std::function<void(const std::string&)> pause;
    {
      absl::MutexLock l(&mu_);
      if (lost_called_) return;
      if (paused_ || absl::Now() <= valid_until_) continue;
      paused_ = true;
      leading_ = false;
      pause = callbacks_.pause;
    }
    const std::string why = absl::StrCat(
        "the lease of ", leader_key_,
        " was not renewed in time (etcd did not answer): another master may be elected");
    LOG(ERROR) << "this master stops acting as the leader: " << why
               << " (its last state write: etcd revision " << last_write_.load() << ")";
    if (pause) pause(why);
  }
}

void MasterLeadership::Deposed(const std::string& why) { Lose(why); }

void MasterLeadership::Lose(const std::string& why) {
  absl::MutexLock t(&transitions_mu_);
  std::function<void(const std::string&)> lost;
  {
    absl::MutexLock l(&mu_);
    if (lost_called_ || (!leading_.load() && !paused_)) return;
    lost_called_ = true;
    leading_ = false;
    leader_.clear();
    leader_http_.clear();
    lost = callbacks_.lost;
  }
  LOG(ERROR) << "this master no longer leads: " << why << " (its last state write: etcd revision "
             << last_write_.load() << ")";
  if (lost) lost(why);
}

void MasterLeadership::Resign() {
  int64_t lease;
  {
    absl::MutexLock t(&transitions_mu_);
    absl::MutexLock l(&mu_);
    // (Paused too: the threads stop, and the lease is given back if etcd
    // answers.)
    if (lost_called_ || (!leading_.load() && !paused_)) return;
    lost_called_ = true;  // (no lost() for a resignation)
    leading_ = false;
    lease = lease_;
  }
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (absl::Status s = options_.etcd->RevokeLease(lease); !s.ok()) {
    LOG(WARNING) << "resigning the lead: " << s << " (the lease ends on its own)";
  } else {
    LOG(INFO) << "resigned the lead (" << leader_key_ << " released)";
  }
}

}  // namespace strata::master
