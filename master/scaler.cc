#include "master/scaler.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <map>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/clock.h"
#include "common/proto_names.h"
#include "glog/logging.h"

extern char** environ;

namespace strata::master {
namespace {

const char* RoleWord(proto::Role role) { return role == proto::PSERVER ? "pserver" : "worker"; }

// A member that counts for the job's shape: not gone, not leaving.
bool Counts(const proto::NodeInfo& n) {
  return (n.state() == proto::ALIVE || n.state() == proto::JOINING ||
          n.state() == proto::FINISHED) &&
         !n.draining();
}

int Live(const proto::ClusterView& view, proto::Role role) {
  int c = 0;
  for (const auto& n : view.members()) c += n.role() == role && Counts(n);
  return c;
}

std::string Instances(proto::Role role, const std::vector<int32_t>& indices) {
  return absl::StrCat(RoleWord(role), indices.size() > 1 ? "s " : " ",
                      absl::StrJoin(indices, ", "));
}

// The number a ScaleCount asks for from `now`; InvalidArgument when unset
// to something below zero.
absl::StatusOr<int> Wanted(const proto::ScaleCount& c, int now, const char* role) {
  const int64_t want = c.has_to() ? c.to() : static_cast<int64_t>(now) + c.by();
  if (want < 0 || want > INT_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("strata scale: ", want, " ", role, " asked for (the job has ", now, ")"));
  }
  return static_cast<int>(want);
}

}  // namespace

std::vector<std::string> ProviderArgs(const std::vector<std::string>& command,
                                      const std::string& action, const std::string& role,
                                      const std::vector<int32_t>& indices) {
  std::vector<std::string> out;
  const std::string count = absl::StrCat(indices.size());
  const std::string list = absl::StrJoin(indices, ",");
  for (const std::string& a : command) {
    out.push_back(absl::StrReplaceAll(
        a, {{"{action}", action}, {"{role}", role}, {"{count}", count}, {"{indices}", list}}));
  }
  return out;
}

struct Scaler::Run {
  std::string action;
  proto::Role role = proto::WORKER;
  std::vector<int32_t> indices;
  std::vector<std::string> args;
  absl::Time deadline;
  uint64_t op_started = 0;  // the scale it belongs to (its start, ms), 0: none
  std::thread thread;
  // Set by its thread under runs_mu_.
  bool done = false;
  std::string failure;  // "" when it exited 0
};

Scaler::Scaler(Options options)
    : options_(std::move(options)), clock_(options_.clock), autoscaler_(options_.elastic) {}

void Scaler::SetAutoscale(proto::ScaleRequest::Autoscale a) {
  if (a == proto::ScaleRequest::AUTOSCALE_UNCHANGED) return;
  autoscale_ = a;
  autoscaler_.SetEnabled(a == proto::ScaleRequest::AUTOSCALE_ON);
}

Scaler::~Scaler() {
  stop_.Notify();
  std::vector<std::unique_ptr<Run>> runs;
  {
    absl::MutexLock l(&runs_mu_);
    runs.swap(runs_);
  }
  for (auto& r : runs) {
    if (r->thread.joinable()) r->thread.join();
  }
}

absl::StatusOr<Scaler::Plan> Scaler::Prepare(const proto::ScaleRequest& req,
                                             const proto::ClusterView& view,
                                             proto::JobState state) const {
  if (!req.has_workers() && !req.has_pservers()) {
    if (req.autoscale() != proto::ScaleRequest::AUTOSCALE_UNCHANGED) {
      Plan plan;
      plan.what = absl::StrCat("autoscale ",
                               req.autoscale() == proto::ScaleRequest::AUTOSCALE_ON ? "on" : "off");
      return plan;
    }
    return absl::InvalidArgumentError(
        "strata scale: give --workers N|+k|-k, --pservers N|+k|-k or --autoscale on|off");
  }
  if (state != proto::JOB_RUNNING) {
    return absl::FailedPreconditionError(
        absl::StrCat("the job is ", JobStateName(state), ": only a running job scales"));
  }
  if (op_.has_value()) {
    const int64_t secs = (absl::ToUnixMillis(clock_->Now()) - op_->started_unix_ms()) / 1000;
    return absl::FailedPreconditionError(
        absl::StrCat("a scale is in progress (", op_->what(), ", for ", secs,
                     " s): one at a time; `strata status` shows it"));
  }
  if (req.has_workers() && req.has_pservers()) {
    return absl::InvalidArgumentError(
        "strata scale: one role at a time (--workers or --pservers); scale the other next");
  }
  const ElasticSection& e = options_.elastic;
  Plan plan;
  plan.role = req.has_pservers() ? proto::PSERVER : proto::WORKER;
  const char* role = RoleWord(plan.role);
  const std::string roles = absl::StrCat(role, "s");
  const int now = Live(view, plan.role);
  plan.from = now;
  plan.target = now;
  auto want = Wanted(req.has_pservers() ? req.pservers() : req.workers(), now, roles.c_str());
  if (!want.ok()) return want.status();
  plan.target = *want;
  const int lo = plan.role == proto::PSERVER ? e.min_pservers : e.min_workers;
  const int hi = plan.role == proto::PSERVER ? e.max_pservers : e.max_workers;
  const int room = Room(plan.role);
  if (plan.target < lo) {
    return absl::FailedPreconditionError(absl::StrCat(
        "scaling to ", plan.target, " ", role, "(s) is below elastic.min_", roles, " (", lo, ")"));
  }
  if (hi != 0 && plan.target > hi) {
    return absl::FailedPreconditionError(absl::StrCat(
        "scaling to ", plan.target, " ", roles, " is beyond elastic.max_", roles, " (", hi, ")"));
  }
  if (plan.target > room) {
    return absl::FailedPreconditionError(
        absl::StrCat("scaling to ", plan.target, " ", roles, " is beyond the host file's room for ",
                     room, " (a range on a host's line makes room, e.g. ", role, "=1..4)"));
  }
  if (plan.target == now) {
    plan.what = absl::StrCat("the job has ", now, " ", role, "(s) already: nothing to do");
    return plan;
  }
  if (plan.target > now) {
    // The lowest free instances: none of this role and index in the job
    // (a dead one may be restarted by its supervisor: taken too).
    std::map<int32_t, bool> taken;
    for (const auto& n : view.members()) {
      if (n.role() == plan.role && n.state() != proto::DRAINED && !n.draining()) {
        taken[n.index()] = true;
      }
    }
    for (const HostSlot& s : options_.slots) {
      if (s.role != role || taken.count(s.index) > 0) continue;
      if (static_cast<int>(plan.add.size()) == plan.target - now) break;
      plan.add.push_back(s.index);
    }
    if (static_cast<int>(plan.add.size()) < plan.target - now) {
      return absl::FailedPreconditionError(
          absl::StrCat("the host file has room for ", room, " ", roles, " and ", taken.size(),
                       " of them are taken (a dead one waits for its restart): no room for ",
                       plan.target - now, " more"));
    }
    plan.what = absl::StrCat(roles, " ", now, " -> ", plan.target, ": starting ",
                             Instances(plan.role, plan.add));
    if (plan.role == proto::PSERVER) absl::StrAppend(&plan.what, ", then moving partitions");
    return plan;
  }
  // Removing: workers idle first (finished: no data task left for them),
  // then those still joining; then the highest indices.
  std::vector<const proto::NodeInfo*> live;
  for (const auto& n : view.members()) {
    if (n.role() == plan.role && Counts(n)) live.push_back(&n);
  }
  const auto order = [](const proto::NodeInfo* n) {
    return n->state() == proto::FINISHED ? 0 : n->state() == proto::JOINING ? 1 : 2;
  };
  std::sort(live.begin(), live.end(), [&](const proto::NodeInfo* a, const proto::NodeInfo* b) {
    if (order(a) != order(b)) return order(a) < order(b);
    return a->index() > b->index();
  });
  std::vector<int32_t> indices;
  for (int i = 0; i < now - plan.target; ++i) {
    plan.drain.push_back(live[i]->id());
    indices.push_back(live[i]->index());
  }
  plan.what = absl::StrCat(roles, " ", now, " -> ", plan.target, ": draining ",
                           Instances(plan.role, indices));
  if (plan.role == proto::PSERVER) {
    absl::StrAppend(&plan.what, " once their partitions moved to the others");
  }
  return plan;
}

int Scaler::Room(proto::Role role) const {
  int room = 0;
  for (const HostSlot& s : options_.slots) room += s.role == RoleWord(role);
  return room;
}

double Scaler::MoveCredit() {
  const absl::Time now = clock_->Now();
  const double rate = options_.elastic.move_rate_mb_per_s * (1 << 20);
  // At most a second's worth saved up, so a burst stays a second's.
  move_credit_ =
      move_credit_at_ == absl::InfinitePast()
          ? rate
          : std::min(rate, move_credit_ + rate * absl::ToDoubleSeconds(now - move_credit_at_));
  move_credit_at_ = now;
  return move_credit_;
}

int Scaler::most_workers() const {
  const int room = Room(proto::WORKER);
  return options_.elastic.max_workers != 0 ? std::min(room, options_.elastic.max_workers) : room;
}

std::optional<Autoscaler::Decision> Scaler::Autoscale(const proto::ClusterView& view,
                                                      proto::JobState state, uint64_t pending,
                                                      uint64_t samples) {
  Autoscaler::Input in;
  in.now = clock_->Now();
  in.state = state;
  in.scaling = op_.has_value();
  in.most = most_workers();
  in.pending = pending;
  in.samples = samples;
  in.least_pservers = options_.elastic.min_pservers;
  const int room = Room(proto::PSERVER);
  in.most_pservers =
      options_.elastic.max_pservers != 0 ? std::min(room, options_.elastic.max_pservers) : room;
  for (const auto& n : view.members()) {
    if (!Counts(n)) continue;
    if (n.role() == proto::PSERVER) in.pservers.push_back(n.id());
    if (n.role() != proto::WORKER) continue;
    ++in.workers;
    in.idle += n.state() == proto::FINISHED;
  }
  return autoscaler_.Tick(in);
}

void Scaler::Begin(const Plan& plan) {
  if (plan.add.empty() && plan.drain.empty()) return;
  const absl::Time now = clock_->Now();
  proto::ScaleState op;
  op.set_role(plan.role);
  for (int32_t i : plan.add) op.add_adding(i);
  for (uint32_t id : plan.drain) op.add_draining(id);
  op.set_started_unix_ms(absl::ToUnixMillis(now));
  const absl::Time deadline = now + absl::Seconds(options_.elastic.scale_timeout_seconds);
  op.set_deadline_unix_ms(absl::ToUnixMillis(deadline));
  op.set_what(plan.what);
  op_ = std::move(op);
  if (plan.role == proto::WORKER) {
    workers_target_ = plan.target;
  } else {
    pservers_target_ = plan.target;
  }
  if (!plan.add.empty() && !options_.provider.empty()) {
    StartProvider("add", plan.role, plan.add, deadline);
  }
}

void Scaler::StartProvider(const std::string& action, proto::Role role,
                           const std::vector<int32_t>& indices, absl::Time deadline) {
  auto run = std::make_unique<Run>();
  run->action = action;
  run->role = role;
  run->indices = indices;
  run->args = ProviderArgs(options_.provider, action, RoleWord(role), indices);
  run->deadline = deadline;
  run->op_started = op_.has_value() ? op_->started_unix_ms() : 0;
  LOG(INFO) << "scale: running the provider: " << absl::StrJoin(run->args, " ");
  Run* r = run.get();
  absl::MutexLock l(&runs_mu_);
  runs_.push_back(std::move(run));
  r->thread = std::thread([this, r] { RunProvider(r); });
}

void Scaler::RunProvider(Run* run) {
  std::vector<char*> argv;
  for (std::string& a : run->args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  pid_t pid = 0;
  const int err = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  std::string failure;
  if (err != 0) {
    failure = absl::StrCat("cannot run ", run->args[0], ": ", std::strerror(err));
  } else {
    int status = 0;
    while (true) {
      const pid_t w = ::waitpid(pid, &status, WNOHANG);
      if (w == pid) break;
      if (w < 0 && errno != EINTR) {
        failure = absl::StrCat("waitpid: ", std::strerror(errno));
        break;
      }
      const bool late = clock_->Now() > run->deadline;
      if (late || stop_.WaitForNotificationWithTimeout(absl::Milliseconds(50))) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        failure = late ? "it did not end within elastic.scale_timeout_seconds (killed)"
                       : "the master shut down while it ran (killed)";
        break;
      }
    }
    if (failure.empty() && WIFEXITED(status) && WEXITSTATUS(status) != 0) {
      failure = absl::StrCat("it exited with status ", WEXITSTATUS(status));
    } else if (failure.empty() && WIFSIGNALED(status)) {
      failure = absl::StrCat("it was killed by signal ", WTERMSIG(status));
    }
  }
  LOG_IF(WARNING, !failure.empty())
      << "scale: the provider " << absl::StrJoin(run->args, " ") << " failed: " << failure;
  absl::MutexLock l(&runs_mu_);
  run->failure = std::move(failure);
  run->done = true;
}

std::vector<Scaler::Ended> Scaler::Check(const proto::ClusterView& view, int moves) {
  std::vector<Ended> out;
  std::vector<std::unique_ptr<Run>> finished;
  {
    absl::MutexLock l(&runs_mu_);
    for (auto it = runs_.begin(); it != runs_.end();) {
      if ((*it)->done) {
        finished.push_back(std::move(*it));
        it = runs_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& r : finished) {
    r->thread.join();
    if (r->failure.empty()) continue;
    const std::string what =
        absl::StrCat("the provider (", absl::StrJoin(r->args, " "), ") for ", r->action, " ",
                     Instances(r->role, r->indices), " failed: ", r->failure);
    if (op_.has_value() && r->action == "add" &&
        static_cast<int64_t>(r->op_started) == op_->started_unix_ms()) {
      out.push_back(
          {false, "scale_failed", absl::StrCat("scale given up (", op_->what(), "): ", what)});
      GiveUp(view);
    } else {
      out.push_back({false, "provider_failed", what});
    }
  }
  if (!op_.has_value()) return out;
  const proto::Role role = op_->role();
  std::vector<int32_t> waiting, joining, released;
  for (int32_t index : op_->adding()) {
    const proto::NodeInfo* found = nullptr;
    for (const auto& n : view.members()) {
      if (n.role() == role && n.index() == index &&
          n.registered_unix_ms() >= op_->started_unix_ms() && n.state() != proto::DEAD &&
          n.state() != proto::DRAINED) {
        found = &n;
      }
    }
    if (found == nullptr) {
      waiting.push_back(index);
    } else if (found->state() == proto::JOINING) {
      joining.push_back(index);
    }
  }
  bool left = true;
  for (uint32_t id : op_->draining()) {
    for (const auto& n : view.members()) {
      if (n.id() != id) continue;
      if (n.state() == proto::DRAINED || n.state() == proto::DEAD) {
        released.push_back(n.index());
      } else {
        left = false;
      }
    }
  }
  // (Pservers added take their partitions, those removed hand theirs on:
  // the moves are part of the scale.)
  const bool moved = role != proto::PSERVER || moves == 0;
  const absl::Time now = clock_->Now();
  const double secs =
      static_cast<double>(absl::ToUnixMillis(now) - op_->started_unix_ms()) / 1000.0;
  if (waiting.empty() && joining.empty() && left && moved) {
    const char* result = role == proto::PSERVER   ? ": the partitions are balanced"
                         : op_->adding_size() > 0 ? ": the new workers train"
                                                  : "";
    out.push_back({true, "scale_done",
                   absl::StrCat("scale done (", op_->what(), ") in ", absl::StrFormat("%.1f", secs),
                                " s", result)});
    op_.reset();
    if (!released.empty() && !options_.provider.empty()) {
      StartProvider("remove", role, released,
                    now + absl::Seconds(options_.elastic.scale_timeout_seconds));
    }
    return out;
  }
  if (now > absl::FromUnixMillis(op_->deadline_unix_ms())) {
    std::string why;
    if (!waiting.empty()) {
      absl::StrAppend(&why, Instances(role, waiting), " did not register");
      if (options_.provider.empty()) absl::StrAppend(&why, " (no provider: start them by hand)");
    }
    if (!joining.empty()) {
      absl::StrAppend(&why, why.empty() ? "" : "; ", Instances(role, joining),
                      " registered but took no data task");
    }
    if (!left) {
      absl::StrAppend(&why, why.empty() ? "" : "; ", "a drained ", RoleWord(role),
                      " did not leave");
    }
    if (!moved) {
      absl::StrAppend(&why, why.empty() ? "" : "; ", moves,
                      " partition move(s) not done (they go on; `strata status`)");
    }
    out.push_back({false, "scale_failed",
                   absl::StrCat("scale given up after ", options_.elastic.scale_timeout_seconds,
                                " s (", op_->what(), "): ", why)});
    GiveUp(view);
  }
  return out;
}

void Scaler::GiveUp(const proto::ClusterView& view) {
  const proto::Role role = op_->role();
  op_.reset();
  (role == proto::PSERVER ? pservers_target_ : workers_target_) = Live(view, role);
  autoscaler_.Refused();
}

void Scaler::Save(proto::MasterState* st) const {
  proto::ScaleState* s = st->mutable_scale();
  if (op_.has_value()) *s = *op_;
  s->set_workers_target(workers_target_);
  s->set_pservers_target(pservers_target_);
  s->set_autoscale(autoscale_);
}

void Scaler::Restore(const proto::MasterState& st) {
  workers_target_ = st.scale().workers_target();
  pservers_target_ = st.scale().pservers_target();
  SetAutoscale(st.scale().autoscale());
  op_.reset();
  if (st.scale().started_unix_ms() != 0) {
    op_ = st.scale();
    op_->clear_workers_target();
    op_->clear_pservers_target();
    op_->clear_autoscale();
  }
}

void Scaler::FillStatus(const proto::ClusterView& view, proto::JobStatus* js) const {
  js->set_workers_target(workers_target_ != 0 ? workers_target_ : Live(view, proto::WORKER));
  js->set_pservers_target(pservers_target_ != 0 ? pservers_target_ : Live(view, proto::PSERVER));
  if (op_.has_value()) {
    const int64_t secs = (absl::ToUnixMillis(clock_->Now()) - op_->started_unix_ms()) / 1000;
    js->set_scaling(absl::StrCat(op_->what(), " (", secs, " s)"));
  }
  js->set_autoscale(autoscaler_.Describe());
}

}  // namespace strata::master
