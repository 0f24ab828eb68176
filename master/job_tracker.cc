#include "master/job_tracker.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/proto_names.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace strata::master {
namespace {

const proto::NodeInfo* FindMember(const proto::ClusterView& view, uint32_t id) {
  for (const auto& m : view.members()) {
    if (m.id() == id) return &m;
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<Planted> ReadPlanted(storage::FileSystem* fs, const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(std::string text, fs->ReadFile(path));
  google::protobuf::Struct json;
  auto parsed = google::protobuf::util::JsonStringToMessage(text, &json);
  const auto& f = json.fields();
  auto number = [&f](const char* key) -> const google::protobuf::Value* {
    auto it = f.find(key);
    return it != f.end() && it->second.has_number_value() ? &it->second : nullptr;
  };
  if (!parsed.ok() || number("planted_test_auc") == nullptr ||
      number("planted_test_logloss") == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(path,
                     " (data.planted): expected a JSON object with numbers "
                     "planted_test_auc and planted_test_logloss (strata-gen-ctr writes it)",
                     parsed.ok() ? "" : absl::StrCat(": ", parsed.ToString())));
  }
  return Planted{true, number("planted_test_auc")->number_value(),
                 number("planted_test_logloss")->number_value()};
}

std::string JobPhase(const proto::JobStatus& js, bool placed, int tables,
                     const std::string& restoring) {
  const proto::JobState state = js.job_state();
  if (state == proto::JOB_RUNNING) {
    return absl::StrFormat("training: epoch %d of %d, %d of %d data tasks",
                           std::min(js.epoch() + 1, js.epochs()), js.epochs(), js.tasks_done(),
                           js.tasks_total());
  }
  if (state != proto::JOB_WAITING) return JobStateName(state);
  if (js.pservers_registered() < js.pservers_expected()) {
    return absl::StrCat("waiting for pservers: ", js.pservers_registered(), " of ",
                        js.pservers_expected(), " registered");
  }
  if (placed) {
    return absl::StrCat("waiting for workers: ", js.workers_registered(), " of ",
                        js.workers_expected(), " registered");
  }
  if (!restoring.empty()) return restoring;
  if (tables == 0) return "waiting for a worker's training script to declare the tables";
  return absl::StrCat("placing ", tables, " table(s) on ", js.pservers_registered(), " pserver(s)");
}

std::string SummaryJson(const proto::JobSummary& summary) {
  google::protobuf::util::JsonPrintOptions o;
  o.always_print_primitive_fields = true;
  o.preserve_proto_field_names = true;
  o.add_whitespace = true;
  std::string json;
  auto s = google::protobuf::util::MessageToJsonString(summary, &json, o);
  // (A message of plain fields always prints.)
  if (!s.ok()) LOG(ERROR) << "cannot print the summary: " << s;
  return json;
}

JobTracker::JobTracker(Options options) : options_(std::move(options)), clock_(options_.clock) {}

proto::JobState JobTracker::state() const {
  absl::MutexLock l(&mu_);
  return state_;
}

bool JobTracker::over() const { return IsJobOver(state()); }

bool JobTracker::AwaitEnd(absl::Duration timeout) {
  absl::MutexLock l(&mu_);
  auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return IsJobOver(state_); };
  return mu_.AwaitWithTimeout(absl::Condition(&ended), timeout);
}

void JobTracker::Start(uint64_t epoch) {
  {
    absl::MutexLock l(&mu_);
    start_time_ = clock_->Now();
    state_ = proto::JOB_RUNNING;
  }
  LOG(INFO) << "cluster ready at epoch " << epoch << ": job '" << options_.name << "' running";
  options_.sink->Event("job_state", absl::StrCat("job running: cluster ready at epoch ", epoch));
}

void JobTracker::TrainingDone(uint64_t tasks) {
  {
    absl::MutexLock l(&mu_);
    state_ = proto::JOB_EVALUATING;
    train_end_time_ = clock_->Now();
  }
  LOG(INFO) << "all " << tasks << " data tasks done; evaluating";
  options_.sink->Event("job_state",
                       absl::StrCat("job evaluating: all ", tasks, " data tasks done"));
}

void JobTracker::Finish(proto::JobState state, const std::string& message) {
  {
    absl::MutexLock l(&mu_);
    state_ = state;
    message_ = message;
    end_time_ = clock_->Now();
  }
  options_.sink->Event(
      "job_state", absl::StrCat("job ", JobStateName(state), message.empty() ? "" : ": ", message));
  if (state == proto::JOB_FAILED) LOG(ERROR) << "job failed: " << message;
}

void JobTracker::Event(const std::string& what, const char* kind, const proto::NodeInfo* node) {
  {
    absl::MutexLock l(&mu_);
    const double t = start_time_ == absl::InfinitePast()
                         ? 0
                         : absl::ToDoubleSeconds(clock_->Now() - start_time_);
    events_.push_back(absl::StrFormat("%.1fs %s", t, what));
  }
  LOG(WARNING) << what;
  options_.sink->Event(kind, what, node);
}

size_t JobTracker::events_size() const {
  absl::MutexLock l(&mu_);
  return events_.size();
}

std::vector<std::string> JobTracker::EventsFrom(size_t from) const {
  absl::MutexLock l(&mu_);
  if (from >= events_.size()) return {};
  return std::vector<std::string>(events_.begin() + static_cast<ptrdiff_t>(from), events_.end());
}

void JobTracker::DeclineEvaluation(uint32_t node) {
  absl::MutexLock l(&mu_);
  if (!declined_.insert(node).second) return;
  LOG(WARNING) << "node " << node
               << " cannot evaluate the trained model (it holds no dense allreduce ring's "
                  "parameters)"
               << (evaluator_ == node ? "; the next worker that asks evaluates it" : "");
  if (evaluator_ == node) evaluator_ = 0;
}

bool JobTracker::AllDeclined(const std::vector<uint32_t>& workers) const {
  absl::MutexLock l(&mu_);
  for (uint32_t w : workers) {
    if (declined_.count(w) == 0) return false;
  }
  return !workers.empty();
}

uint32_t JobTracker::evaluator() const {
  absl::MutexLock l(&mu_);
  return evaluator_;
}

bool JobTracker::ReadyToEvaluateLocked() const {
  return ledger_taken_ || clock_->Now() - train_end_time_ > absl::Seconds(10);
}

void JobTracker::EvaluationStarted(uint32_t node) {
  absl::MutexLock l(&mu_);
  if (node == evaluator_) evaluating_ = node;
}

uint32_t JobTracker::evaluating() const {
  absl::MutexLock l(&mu_);
  return evaluating_;
}

std::optional<uint64_t> JobTracker::ClaimEvaluation(uint32_t node, bool evaluator_in_job) {
  absl::MutexLock l(&mu_);
  if (state_ != proto::JOB_EVALUATING || !ReadyToEvaluateLocked()) return std::nullopt;
  if (declined_.count(node) > 0) return std::nullopt;
  if (evaluator_ == 0 || !evaluator_in_job) {  // none yet, or it left
    LOG(INFO) << "node " << node << " evaluates the trained model"
              << (evaluator_ == 0 ? std::string()
                                  : absl::StrCat(" (node ", evaluator_, ", chosen before, left)"));
    evaluator_ = node;
  }
  if (evaluator_ != node) return std::nullopt;
  return options_.consistency == Consistency::kBsp ? max_last_step_ + 1 : 0;
}

void JobTracker::TaskCompleted(uint64_t last_step) {
  absl::MutexLock l(&mu_);
  max_last_step_ = std::max(max_last_step_, last_step);
}

uint64_t JobTracker::max_last_step() const {
  absl::MutexLock l(&mu_);
  return max_last_step_;
}

void JobTracker::RecordProgress(uint32_t node, const proto::ReportProgressRequest& report) {
  absl::MutexLock l(&mu_);
  workers_[node] = report;
}

void JobTracker::Evaluated(const proto::ReportProgressRequest& report) {
  absl::MutexLock l(&mu_);
  has_accuracy_ = true;
  test_accuracy_ = report.test_accuracy();
  test_loss_ = report.test_loss();
  has_auc_ = report.has_test_auc();
  test_auc_ = report.test_auc();
  const Planted& planted = options_.planted;
  if (has_auc_) {
    LOG(INFO) << absl::StrFormat("final test AUC %.4f, log-loss %.4f, accuracy %.4f%s", test_auc_,
                                 test_loss_, test_accuracy_,
                                 planted.present
                                     ? absl::StrFormat(" (planted model: AUC %.4f, log-loss %.4f)",
                                                       planted.auc, planted.logloss)
                                     : "");
  } else {
    LOG(INFO) << absl::StrFormat("final test accuracy %.4f (loss %.4f)", test_accuracy_,
                                 test_loss_);
  }
}

void JobTracker::RecordApplies(uint32_t node, uint64_t applies, double seconds) {
  absl::MutexLock l(&mu_);
  pserver_applies_[node] = {applies, seconds};
}

bool JobTracker::ledger_taken() const {
  absl::MutexLock l(&mu_);
  return ledger_taken_;
}

void JobTracker::SetLedger(std::map<uint32_t, std::map<uint32_t, uint64_t>> applied) {
  absl::MutexLock l(&mu_);
  ledger_applied_ = std::move(applied);
  ledger_taken_ = true;
}

void JobTracker::Resume(uint64_t seq, uint64_t samples, uint64_t max_last_step) {
  absl::MutexLock l(&mu_);
  resumed_from_seq_ = seq;
  samples_base_ = samples;
  max_last_step_ = max_last_step;
}

void JobTracker::RegisterMetrics(MetricsRegistry* metrics,
                                 std::function<proto::ClusterView()> view) {
  auto gauge = [this, view](double (*field)(const proto::JobStatus&)) {
    return [this, view, field] {
      proto::JobStatus js;
      FillStatus(view(), &js);
      return field(js);
    };
  };
  metrics->AddCallbackGauge("strata_job_samples_per_second", "Job training throughput",
                            gauge([](const proto::JobStatus& js) { return js.samples_per_sec(); }));
  metrics->AddCallbackGauge("strata_job_comm_share",
                            "Share of worker step time waiting on push/pull",
                            gauge([](const proto::JobStatus& js) { return js.comm_share(); }));
  metrics->AddCallbackGauge(
      "strata_job_samples", "Samples trained",
      gauge([](const proto::JobStatus& js) { return static_cast<double>(js.samples()); }));
}

void JobTracker::FillStatus(const proto::ClusterView& view, proto::JobStatus* js) const {
  absl::MutexLock l(&mu_);
  js->set_name(options_.name);
  js->set_job_state(state_);
  js->set_state(JobStateName(state_));
  js->set_message(message_);
  js->set_consistency(ConsistencyName(options_.consistency));
  js->set_epochs(options_.epochs);
  const WorkerTotals w = WorkerProgressLocked(view, js);
  // BSP: one optimizer step per synchronous step; ASP: one per push.
  js->set_steps(options_.consistency == Consistency::kBsp ? (w.steps > 0 ? max_last_step_ + 1 : 0)
                                                          : w.steps);
  js->set_samples(w.samples + samples_base_);
  js->set_loss(w.loss);
  js->set_train_accuracy(w.accuracy);
  for (const proto::JobSample& s : history_) *js->add_history() = s;
  const absl::Time end = IsJobOver(state_) ? end_time_ : clock_->Now();
  const double wall =
      start_time_ == absl::InfinitePast() ? 0 : absl::ToDoubleSeconds(end - start_time_);
  js->set_wall_seconds(wall);
  // Training throughput: the final evaluation is not training.
  const double train = start_time_ == absl::InfinitePast()
                           ? 0
                           : absl::ToDoubleSeconds(std::min(end, train_end_time_) - start_time_);
  js->set_train_seconds(train);
  js->set_samples_per_sec(IsJobOver(state_) || w.samples_per_sec == 0
                              ? (train > 0 ? w.samples / train : 0)
                              : w.samples_per_sec);
  js->set_comm_share(w.busy > 0 ? w.comm / w.busy : 0);
  js->set_has_test_accuracy(has_accuracy_);
  js->set_test_accuracy(test_accuracy_);
  js->set_has_test_auc(has_auc_);
  js->set_test_auc(test_auc_);
  js->set_test_loss(test_loss_);
  js->set_resumed_from_seq(resumed_from_seq_);
  for (const std::string& e : events_) js->add_events(e);
}

JobTracker::WorkerTotals JobTracker::WorkerProgressLocked(const proto::ClusterView& view,
                                                          proto::JobStatus* js) const {
  WorkerTotals t;
  double loss_sum = 0, acc_sum = 0, loss_all = 0, acc_all = 0;
  int n_loss = 0, n_all = 0;
  for (const auto& [id, p] : workers_) {
    t.steps += p.steps_done();
    t.samples += p.samples();
    t.busy += p.busy_seconds();
    t.comm += p.comm_seconds();
    const proto::NodeInfo* node = FindMember(view, id);
    // The loss and accuracy now: of the workers still in the job (a dead or
    // drained one's last report goes stale), or of all when none is.
    if (p.steps_done() > 0) {
      const bool in_job = node != nullptr && !Gone(*node);
      loss_all += p.loss();
      acc_all += p.train_accuracy();
      ++n_all;
      if (in_job) {
        loss_sum += p.loss();
        acc_sum += p.train_accuracy();
        ++n_loss;
      }
    }
    if (node && node->state() == proto::ALIVE) t.samples_per_sec += p.samples_per_sec();
    proto::WorkerProgress* wp = js->add_workers();
    wp->set_node_id(id);
    wp->set_index(node ? node->index() : -1);
    wp->set_epoch(p.epoch());
    wp->set_step(p.step());
    wp->set_steps_done(p.steps_done());
    wp->set_samples(p.samples());
    wp->set_loss(p.loss());
    wp->set_train_accuracy(p.train_accuracy());
    wp->set_samples_per_sec(p.samples_per_sec());
    wp->set_comm_share(p.busy_seconds() > 0 ? p.comm_seconds() / p.busy_seconds() : 0);
  }
  // The loss and accuracy now: of the workers in the job when some are.
  if (n_loss == 0) {
    loss_sum = loss_all;
    acc_sum = acc_all;
    n_loss = n_all;
  }
  t.loss = n_loss ? loss_sum / n_loss : 0;
  t.accuracy = n_loss ? acc_sum / n_loss : 0;
  return t;
}

bool JobTracker::HistoryDue(bool force) const {
  absl::MutexLock l(&mu_);
  if (start_time_ == absl::InfinitePast()) return false;
  if (!force && IsJobOver(state_)) return false;  // (the last point was taken at the end)
  return force || clock_->Now() - last_sample_ >= history_interval_;
}

void JobTracker::AddHistory(const proto::JobStatus& js) {
  constexpr size_t kMaxHistory = 600;
  if (js.steps() == 0) return;  // nothing to chart before the first report
  absl::MutexLock l(&mu_);
  const absl::Time now = clock_->Now();
  last_sample_ = now;
  if (history_.size() >= kMaxHistory) {
    size_t kept = 0;
    for (size_t i = 0; i < history_.size(); i += 2) history_[kept++] = history_[i];
    history_.resize(kept);
    history_interval_ *= 2;
  }
  proto::JobSample s;
  s.set_t(absl::ToDoubleSeconds(now - start_time_));
  s.set_loss(js.loss());
  s.set_train_accuracy(js.train_accuracy());
  s.set_samples_per_sec(js.samples_per_sec());
  s.set_steps(js.steps());
  history_.push_back(std::move(s));
}

proto::JobSummary JobTracker::Summary(const proto::JobStatus& js,
                                      const proto::ClusterView& view) const {
  proto::JobSummary s;
  s.set_job(js.name());
  s.set_state(js.state());
  s.set_message(js.message());
  s.set_consistency(js.consistency());
  s.set_epochs(js.epochs());
  s.set_final_test_accuracy(js.test_accuracy());
  s.set_final_test_loss(js.test_loss());
  s.set_steps(static_cast<double>(js.steps()));
  s.set_samples(static_cast<double>(js.samples()));
  s.set_samples_per_sec(js.samples_per_sec());
  s.set_comm_share(js.comm_share());
  s.set_wall_seconds(js.wall_seconds());
  s.set_train_seconds(js.train_seconds());
  s.set_tasks_total(static_cast<double>(js.tasks_total()));
  s.set_tasks_done(static_cast<double>(js.tasks_done()));
  if (js.has_test_auc()) {
    s.set_final_test_auc(js.test_auc());
    s.set_final_test_logloss(js.test_loss());
  }
  if (options_.planted.present) {
    s.set_planted_test_auc(options_.planted.auc);
    s.set_planted_test_logloss(options_.planted.logloss);
  }
  for (const std::string& e : js.events()) s.add_events(e);
  for (const auto& w : js.workers()) {
    proto::JobSummary::Worker* sw = s.add_workers();
    sw->set_node_id(w.node_id());
    sw->set_index(w.index());
    sw->set_steps(static_cast<double>(w.steps_done()));
    sw->set_samples(static_cast<double>(w.samples()));
    sw->set_comm_share(w.comm_share());
  }
  absl::MutexLock l(&mu_);
  if (ledger_taken_) LedgerLocked(view, &s);
  // Where a step's time goes, per step on average over the workers, and a
  // push's apply on the pservers.
  double busy = 0, comm = 0, apply_seconds = 0;
  uint64_t steps = 0, applies = 0;
  for (const auto& [id, w] : workers_) {
    busy += w.busy_seconds();
    comm += w.comm_seconds();
    steps += w.steps_done();
  }
  for (const auto& [id, a] : pserver_applies_) {
    applies += a.first;
    apply_seconds += a.second;
  }
  proto::JobSummary::StepPhases* p = s.mutable_step_phases();
  p->set_step_seconds(steps ? busy / steps : 0.0);
  p->set_compute_seconds(steps ? (busy - comm) / steps : 0.0);
  p->set_wait_seconds(steps ? comm / steps : 0.0);
  p->set_apply_seconds_per_push(applies ? apply_seconds / applies : 0.0);
  p->set_pushes_applied(static_cast<double>(applies));
  return s;
}

void JobTracker::LedgerLocked(const proto::ClusterView& view, proto::JobSummary* s) const {
  // What each worker had acknowledged against what the partitions hold
  // (docs/reliability.md).
  uint64_t acked = 0, held = 0, lost = 0, extra = 0;
  for (const auto& [id, w] : workers_) {
    // (A drained one's report is its last; a dead one's may be old.)
    const proto::NodeInfo* node = FindMember(view, id);
    if (node == nullptr || node->state() == proto::DEAD) continue;
    for (const auto& [partition, count] : w.acked_pushes()) {
      auto p = ledger_applied_.find(partition);
      uint64_t have = 0;
      if (p != ledger_applied_.end()) {
        auto it = p->second.find(id);
        if (it != p->second.end()) have = it->second;
      }
      acked += count;
      held += std::min(have, count);
      if (count > have) lost += count - have;
      if (have > count) extra += have - count;
    }
  }
  proto::JobSummary::Ledger* ledger = s->mutable_ledger();
  ledger->set_acked(static_cast<double>(acked));
  ledger->set_held(static_cast<double>(held));
  ledger->set_lost(static_cast<double>(lost));
  ledger->set_unacked_applied(static_cast<double>(extra));
}

void JobTracker::Save(proto::MasterState* st) const {
  absl::MutexLock l(&mu_);
  st->set_job_state(state_);
  st->set_job_message(message_);
  st->set_max_last_step(max_last_step_);
  st->set_resumed_from_seq(resumed_from_seq_);
  st->set_samples_base(samples_base_);
  if (start_time_ != absl::InfinitePast()) st->set_start_unix_ms(absl::ToUnixMillis(start_time_));
  st->set_restarts(restarts_);
}

uint32_t JobTracker::Restore(const proto::MasterState& st) {
  absl::MutexLock l(&mu_);
  // (A state directory of before JobState has the state's name only.)
  const proto::JobState recorded = st.job_state() != proto::JOB_STATE_UNSPECIFIED
                                       ? st.job_state()
                                       : ParseJobStateName(st.job_state_name());
  if (recorded != proto::JOB_STATE_UNSPECIFIED) state_ = recorded;
  message_ = st.job_message();
  max_last_step_ = st.max_last_step();
  events_.assign(st.events().begin(), st.events().end());
  resumed_from_seq_ = st.resumed_from_seq();
  samples_base_ = st.samples_base();
  if (st.start_unix_ms() != 0) start_time_ = absl::FromUnixMillis(st.start_unix_ms());
  if (IsJobOver(state_)) end_time_ = clock_->Now();
  restarts_ = st.restarts() + 1;
  return restarts_;
}

}  // namespace strata::master
