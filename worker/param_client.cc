#include "worker/param_client.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/aggregation.h"
#include "common/error_reason.h"
#include "common/model_spec.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "transport/data_plane_auth.h"

namespace strata::worker {

using transport::Message;
using transport::MessageType;

ParamClient::ParamClient(transport::Transport* transport, uint32_t node_id,
                         std::function<absl::StatusOr<proto::ClusterView>()> refresh_view,
                         absl::Duration request_timeout)
    : transport_(transport),
      node_id_(node_id),
      refresh_view_(std::move(refresh_view)),
      request_timeout_(request_timeout) {}

void ParamClient::SetView(const proto::ClusterView& view) {
  absl::MutexLock l(&mu_);
  if (view.epoch() < epoch_) return;
  epoch_ = view.epoch();
  members_.Clear();
  *members_.mutable_members() = view.members();
  members_.set_aggregation_key(view.aggregation_key());
  members_.set_epoch(view.epoch());
  std::map<uint32_t, std::string> data_address;
  for (const auto& m : view.members()) data_address[m.id()] = m.data_address();
  routes_.clear();
  sparse_routes_.clear();
  sparse_dims_.clear();
  sparse_partitions_ = 0;
  view_error_ = absl::OkStatus();
  chunk_floats_ = view.chunk_bytes() / sizeof(float);
  for (const auto& t : view.tables()) {
    if (!t.sparse()) continue;
    if (t.dim() == 0 || t.partitions() == 0) {
      view_error_ = absl::DataLossError(absl::StrCat(
          "cluster view epoch ", view.epoch(), ": sparse table ", t.id(), " (", t.name(),
          ") has dim ", t.dim(), " and ", t.partitions(), " virtual partitions"));
      continue;
    }
    sparse_dims_[t.id()] = static_cast<int>(t.dim());
    sparse_routes_[t.id()].resize(t.partitions(), Route{0, 0, 0, 0, "", 0});
    if (sparse_partitions_ != 0 && sparse_partitions_ != t.partitions()) {
      view_error_ = absl::DataLossError(
          absl::StrCat("cluster view epoch ", view.epoch(), ": sparse tables with ",
                       sparse_partitions_, " and ", t.partitions(), " virtual partitions"));
    }
    sparse_partitions_ = t.partitions();
  }
  for (const auto& p : view.partitions()) {
    const Route r{p.id(), p.table_id(), p.offset(), p.length(), data_address[p.owner()], p.owner()};
    auto sparse = sparse_routes_.find(p.table_id());
    if (sparse == sparse_routes_.end()) {
      routes_.push_back(r);
    } else if (p.offset() < sparse->second.size()) {
      sparse->second[p.offset()] = r;
    } else {
      view_error_ = absl::DataLossError(absl::StrCat(
          "cluster view epoch ", view.epoch(), ": partition ", p.id(), " is virtual partition ",
          p.offset(), " of sparse table ", p.table_id(), " which has ", sparse->second.size()));
    }
  }
  table_sizes_.clear();
  for (const auto& t : view.tables()) table_sizes_.push_back(t.num_elements());
  for (const auto& [table, routes] : sparse_routes_) {
    for (const Route& r : routes) {
      if (r.address.empty() && view_error_.ok()) {
        view_error_ = absl::DataLossError(absl::StrCat("cluster view epoch ", view.epoch(),
                                                       ": a virtual partition of sparse table ",
                                                       table, " has no owner"));
      }
    }
  }
  // (A view before the partitions are placed has sparse tables without
  // owners yet: nothing is wrong, and nothing is pulled before a ready one.)
  if (!view_error_.ok()) {
    if (view.ready() || !view.partitions().empty()) {
      LOG(ERROR) << view_error_;
    } else {
      VLOG(1) << view_error_ << " (the view is not ready yet)";
    }
  }
  // Pulls land straight in the tensors: a route outside its table would
  // write out of bounds, so such a view is refused.
  for (const Route& r : routes_) {
    if (!view_error_.ok()) break;  // the first problem found is the one reported
    if (r.table >= table_sizes_.size() || r.offset + r.length > table_sizes_[r.table]) {
      view_error_ =
          absl::DataLossError(absl::StrCat("cluster view epoch ", view.epoch(), ": partition ",
                                           r.partition, " lies outside table ", r.table));
      LOG(ERROR) << view_error_;
      break;
    }
  }
}

uint64_t ParamClient::aggregation_key() const {
  absl::MutexLock l(&mu_);
  return members_.aggregation_key();
}

std::vector<uint32_t> ParamClient::HostWorkers(const std::string& host) const {
  absl::MutexLock l(&mu_);
  return strata::HostWorkers(members_, host);
}

std::set<uint32_t> ParamClient::WorkersGone() const {
  absl::MutexLock l(&mu_);
  std::set<uint32_t> gone;
  for (const auto& m : members_.members()) {
    if (m.role() == proto::WORKER && (m.state() == proto::DEAD || m.state() == proto::DRAINED)) {
      gone.insert(m.id());
    }
  }
  return gone;
}

int ParamClient::WorkersInView() const {
  absl::MutexLock l(&mu_);
  int n = 0;
  for (const auto& m : members_.members()) n += m.role() == proto::WORKER;
  return n;
}

proto::ClusterView ParamClient::Members() const {
  absl::MutexLock l(&mu_);
  return members_;
}

void ParamClient::SetMetrics(MetricsRegistry* metrics) {
  push_seconds_ = metrics->GetHistogram("strata_worker_push_seconds",
                                        "Push request latency: gradient sent to its ack",
                                        Histogram::LatencyBounds());
  pull_seconds_ = metrics->GetHistogram(
      "strata_worker_pull_seconds",
      "Pull request latency: request sent to the parameters received (bsp: includes the "
      "pserver holding it until the step is applied)",
      Histogram::LatencyBounds());
  push_bytes_ = metrics->GetCounter("strata_worker_push_bytes_total", "Gradient bytes pushed");
  pull_bytes_ = metrics->GetCounter("strata_worker_pull_bytes_total", "Parameter bytes pulled");
}

std::map<uint32_t, uint64_t> ParamClient::AckedPushes() const {
  absl::MutexLock l(&mu_);
  return acked_pushes_;
}

uint64_t ParamClient::epoch() const {
  absl::MutexLock l(&mu_);
  return epoch_;
}

std::vector<uint64_t> ParamClient::PartitionStarts(uint32_t table) const {
  absl::MutexLock l(&mu_);
  std::vector<uint64_t> starts;
  for (const Route& r : routes_) {
    if (r.table == table) starts.push_back(r.offset);
  }
  std::sort(starts.begin(), starts.end());
  return starts;
}

absl::StatusOr<std::shared_ptr<transport::Connection>> ParamClient::ConnectionTo(
    const std::string& address) {
  {
    absl::MutexLock l(&mu_);
    auto it = conns_.find(address);
    if (it != conns_.end() && it->second->healthy()) return it->second;
  }
  STRATA_ASSIGN_OR_RETURN(auto conn, transport_->Connect(address));
  LOG(INFO) << "data connection to pserver " << address << ": " << conn->kind();
  absl::MutexLock l(&mu_);
  conns_[address] = conn;
  return conn;
}

void ParamClient::DropConnections(const std::set<std::string>& addresses) {
  std::vector<std::shared_ptr<transport::Connection>> dropped;
  {
    absl::MutexLock l(&mu_);
    for (const std::string& a : addresses) {
      auto it = conns_.find(a);
      if (it == conns_.end()) continue;
      dropped.push_back(std::move(it->second));
      conns_.erase(it);
      dropped_at_[a] = absl::Now();
    }
  }
  if (!dropped.empty()) {
    LOG(WARNING) << "dropping " << dropped.size()
                 << " pserver connection(s) with requests given up unanswered";
  }
  // Released here, outside mu_: that closes them.
}

bool ParamClient::DroppedRecently(const std::string& address) const {
  absl::MutexLock l(&mu_);
  auto it = dropped_at_.find(address);
  return it != dropped_at_.end() && absl::Now() - it->second < absl::Seconds(5);
}

// PushThenPull sends the pulls right behind the pushes up to this size.
constexpr uint64_t kPullBehindPushMaxBytes = 1 << 20;

// Exchanges up to this size spin briefly before sleeping on an answer.
constexpr uint64_t kSpinMaxBytes = 256 << 10;

// State shared with the transport callbacks of one round of requests, so a
// callback arriving after the caller gave up writes here, not into a dead
// stack frame.
namespace {

// An answer that needs no retry: the call went through and was not refused.
bool AnsweredOk(const absl::StatusOr<Message>& answer) {
  return answer.ok() && answer->header.status == 0;
}

}  // namespace

struct ParamClient::Round {
  absl::Mutex mu;
  std::map<RouteId, absl::StatusOr<Message>> results ABSL_GUARDED_BY(mu);
  int outstanding ABSL_GUARDED_BY(mu) = 0;
  // Per partition: the attempt whose answer counts (an abandoned one's
  // late answer is dropped), and those awaiting an answer.
  std::map<RouteId, uint64_t> attempt ABSL_GUARDED_BY(mu);
  std::set<RouteId> pending ABSL_GUARDED_BY(mu);
  std::map<RouteId, absl::Time> sent_at ABSL_GUARDED_BY(mu);   // of the pending attempt
  std::map<RouteId, uint64_t> sent_epoch ABSL_GUARDED_BY(mu);  // the view epoch it carried
  // Answers so far, readable without the lock (for a short spin).
  std::atomic<uint64_t> answered{0};
};

ParamClient::Exchange::Exchange(ParamClient* client, MakeRequest make_request,
                                OnResponse on_response, Destination destination, int sparse_table,
                                const SparseKeys* sparse, bool every_partition)
    : client_(client),
      sparse_table_(sparse_table),
      sparse_(sparse),
      every_partition_(every_partition),
      make_request_(std::move(make_request)),
      on_response_(std::move(on_response)),
      destination_(std::move(destination)),
      deadline_(absl::Now() + client->request_timeout_),
      round_(std::make_shared<Round>()) {
  LoadRoutes();
}

ParamClient::Exchange::~Exchange() {
  if (borrowing_.empty()) return;
  bool unanswered;
  {
    absl::MutexLock l(&round_->mu);
    unanswered = round_->outstanding > 0;
  }
  if (unanswered) client_->DropConnections(borrowing_);
}

void ParamClient::Exchange::OnlyTables(uint32_t begin, uint32_t end) {
  tables_begin_ = begin;
  tables_end_ = end;
  LoadRoutes();
}

void ParamClient::Exchange::LoadRoutes() {
  absl::MutexLock l(&client_->mu_);
  view_error_ = client_->view_error_;
  routes_.clear();
  total_bytes_ = 0;
  epoch_ = client_->epoch_;
  if (sparse_table_ < 0) {
    // Partitions larger than a chunk go chunk by chunk: the pserver applies
    // and answers each as it arrives (docs/performance.md).
    const uint64_t chunk = client_->chunk_floats_;
    for (const Route& r : client_->routes_) {
      if (r.table < tables_begin_ || r.table >= tables_end_) continue;
      total_bytes_ += r.length * sizeof(float);
      if (chunk == 0 || r.length <= chunk) {
        routes_[RouteId{r.partition} << 32] = r;
        continue;
      }
      Route c = r;
      c.chunks = static_cast<uint32_t>((r.length + chunk - 1) / chunk);
      for (c.chunk = 0; c.chunk < c.chunks; ++c.chunk) {
        c.offset = r.offset + c.chunk * chunk;
        c.length = std::min(chunk, r.offset + r.length - c.offset);
        routes_[RouteId{r.partition} << 32 | c.chunk] = c;
      }
    }
    return;
  }
  auto it = client_->sparse_routes_.find(static_cast<uint32_t>(sparse_table_));
  if (view_error_.ok() && it == client_->sparse_routes_.end()) {
    view_error_ = absl::FailedPreconditionError(
        absl::StrCat("table ", sparse_table_, " is not a sparse table in the cluster view"));
  }
  if (view_error_.ok() && sparse_->begin.size() != it->second.size() + 1) {
    view_error_ = absl::FailedPreconditionError(
        absl::StrCat("keys grouped for ", sparse_->begin.size() - 1, " virtual partitions, table ",
                     sparse_table_, " has ", it->second.size()));
  }
  if (!view_error_.ok()) return;
  const int dim = client_->sparse_dims_.at(static_cast<uint32_t>(sparse_table_));
  for (size_t v = 0; v < it->second.size(); ++v) {
    const uint64_t n = sparse_->begin[v + 1] - sparse_->begin[v];
    if (n == 0 && !every_partition_) continue;
    Route r = it->second[v];
    r.length = n * static_cast<uint64_t>(dim);
    routes_[RouteId{r.partition} << 32] = r;
    total_bytes_ += r.length * sizeof(float);
  }
}

void ParamClient::Exchange::Send(RouteId id) {
  const Route& r = routes_.at(id);
  Message req = make_request_(r);
  req.header.sender_id = client_->node_id_;
  req.header.epoch = epoch_;
  req.header.partition = r.partition;
  if (r.chunks > 1) req.header.flags |= transport::ChunkFlags(r.chunk);
  std::shared_ptr<Round> round = round_;
  uint64_t attempt;
  const absl::Time sent = absl::Now();  // (one reading: the round's and the metrics')
  {
    absl::MutexLock l(&round->mu);
    ++round->outstanding;
    attempt = ++round->attempt[id];
    round->pending.insert(id);
    round->sent_at[id] = sent;
    round->sent_epoch[id] = epoch_;
  }
  // Metrics of this request: its kind, size and when it left.
  const bool push = req.header.type == transport::MessageType::kPushRequest;
  Histogram* const seconds = push ? client_->push_seconds_ : client_->pull_seconds_;
  Counter* const bytes = push ? client_->push_bytes_ : client_->pull_bytes_;
  const size_t request_bytes = req.payload_size();
  const std::pair<char*, size_t> dest =
      destination_ ? destination_(r) : std::pair<char*, size_t>(nullptr, 0);
  const size_t destination_bytes = dest.second;
  TraceWriter* const trace = client_->trace_;
  const uint32_t partition = r.partition;
  auto finish = [round, id, partition, attempt, seconds, bytes, push, request_bytes,
                 destination_bytes, sent, trace](absl::StatusOr<Message> resp) {
    // Only answers that did the work: a refusal (a stale epoch, retried)
    // is neither a push's or pull's latency nor bytes moved.
    if (resp.ok() && resp->header.status == 0 && (seconds != nullptr || trace != nullptr)) {
      const absl::Time now = absl::Now();
      const size_t n = push                           ? request_bytes
                       : resp->payload_in_destination ? destination_bytes
                                                      : resp->payload_size();
      if (seconds != nullptr) {
        seconds->Observe(absl::ToDoubleSeconds(now - sent));
        bytes->Increment(n);
      }
      if (trace != nullptr) {
        trace->Span(push ? "push" : "pull", "comm", push ? 2 : 3, sent, now,
                    absl::StrCat("\"partition\": ", partition, ", \"bytes\": ", n));
      }
    }
    absl::MutexLock l(&round->mu);
    if (round->attempt[id] != attempt) return;  // abandoned
    round->results.insert_or_assign(id, std::move(resp));
    round->pending.erase(id);
    --round->outstanding;
    round->answered.fetch_add(1, std::memory_order_release);
  };
  auto conn = client_->ConnectionTo(r.address);
  // Calls that may still touch the caller's memory after a give-up: a push
  // sent in place until its answer, a pull written into its destination.
  if (req.payload_ref_until_response || destination_) borrowing_.insert(r.address);
  if (!conn.ok()) {
    finish(conn.status());
  } else if (destination_) {
    (*conn)->CallInto(std::move(req), dest.first, dest.second, finish);
  } else {
    (*conn)->Call(std::move(req), finish);
  }
}

void ParamClient::Exchange::IssueRange(uint32_t table, uint64_t end) {
  if (!view_error_.ok() || finished_) return;
  for (const auto& [id, r] : routes_) {
    if (r.table == table && r.offset + r.length <= end && issued_.insert(id).second) {
      Send(id);
    }
  }
}

void ParamClient::Exchange::IssueAll() {
  if (!view_error_.ok() || finished_) return;
  // Tables are numbered first layer first: ask in that order.
  std::vector<std::pair<const Route*, RouteId>> order;
  for (const auto& [id, r] : routes_) order.emplace_back(&r, id);
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a.first->table != b.first->table ? a.first->table < b.first->table
                                            : a.first->offset < b.first->offset;
  });
  for (const auto& [r, id] : order) {
    if (issued_.insert(id).second) Send(id);
  }
}

absl::Status ParamClient::Exchange::Await(const std::function<bool()>& done) {
  // A small exchange is answered in tens of microseconds: spin a little on
  // the answer count before sleeping, which saves a wake-up on the way back.
  // (Large ones would only burn a core the transport needs.)
  if (total_bytes_ <= kSpinMaxBytes) {
    // The count is read before the check, so an answer that lands in
    // between ends the spin; one that landed before needs no spin at all.
    const uint64_t seen = round_->answered.load(std::memory_order_acquire);
    {
      absl::MutexLock l(&round_->mu);
      if (done()) return absl::OkStatus();
    }
    const absl::Time spin_until = absl::Now() + absl::Microseconds(50);
    while (round_->answered.load(std::memory_order_acquire) == seen && absl::Now() < spin_until) {
      __builtin_ia32_pause();
    }
  }
  auto cond = [&done]() { return done(); };
  // Wake up now and then to notice Cancel() and view changes.
  while (true) {
    {
      absl::MutexLock l(&round_->mu);
      if (round_->mu.AwaitWithDeadline(
              absl::Condition(&cond), std::min(deadline_, absl::Now() + absl::Milliseconds(200)))) {
        return absl::OkStatus();
      }
      if (absl::Now() > deadline_) {
        std::string which;
        for (RouteId id : round_->pending) {
          const Route& r = routes_.at(id);
          absl::StrAppend(&which, which.empty() ? "" : ", ", "partition ", r.partition, " at ",
                          r.address, " (node ", r.owner, ")");
        }
        return absl::DeadlineExceededError(
            absl::StrCat(round_->outstanding, " partition request(s) unanswered after ",
                         absl::FormatDuration(client_->request_timeout_), ": ", which));
      }
    }
    if (client_->cancelled_) return absl::CancelledError("parameter client cancelled");
    ReportFailures();
    ProbeSlowOwners();
    AbandonMoved();
  }
}

void ParamClient::Exchange::ProbeSlowOwners() {
  if (!client_->report_suspect_ || client_->suspect_after_ == absl::InfiniteDuration()) return;
  const absl::Time now = absl::Now();
  std::map<uint32_t, std::string> slow;  // owner -> address
  {
    absl::MutexLock l(&round_->mu);
    for (RouteId id : round_->pending) {
      auto at = round_->sent_at.find(id);
      if (at == round_->sent_at.end() || now - at->second < client_->suspect_after_) continue;
      const Route& r = routes_.at(id);
      slow.emplace(r.owner, r.address);
    }
  }
  for (const auto& [owner, address] : slow) {
    absl::Time& last = pinged_[owner];
    if (now - last < client_->ping_timeout_ * 2) continue;
    last = now;
    // A new connection: the old one may be stuck behind what it waits for.
    absl::Status s;
    auto conn = client_->transport_->Connect(address);
    if (!conn.ok()) {
      s = conn.status();
    } else {
      Message ping;
      ping.header.type = MessageType::kPing;
      ping.header.sender_id = client_->node_id_;
      s = (*conn)->CallSync(std::move(ping), client_->ping_timeout_).status();
    }
    // Alive: only slow (a bsp pull waiting for its step), or refused for a
    // key epoch one side has not had yet (not a sign of a dead pserver).
    if (s.ok() || transport::IsKeyEpochRefusal(s)) continue;
    client_->report_suspect_(
        owner, absl::StrCat("no answer for ", absl::FormatDuration(client_->suspect_after_),
                            " and a ping on a new connection failed: ", s.message()));
  }
}

void ParamClient::Exchange::ReportFailures() {
  if (!client_->report_suspect_) return;
  std::vector<std::pair<uint32_t, std::string>> failed;
  {
    absl::MutexLock l(&round_->mu);
    for (const auto& [id, o] : round_->results) {
      if (o.ok() || transport::IsKeyEpochRefusal(o.status())) continue;
      const Route& r = routes_.at(id);
      if (HasReason(o.status(), proto::REASON_NOT_SERVED) || client_->DroppedRecently(r.address)) {
        continue;
      }
      if (reported_.insert(r.owner).second) {
        failed.emplace_back(r.owner, std::string(o.status().message()));
      }
    }
  }
  for (const auto& [owner, why] : failed) client_->report_suspect_(owner, why);
}

std::string ParamClient::CurrentAddressLocked(const Route& r, int sparse_table) const {
  if (sparse_table < 0) {
    for (const Route& x : routes_) {
      if (x.partition == r.partition) return x.address;
    }
    return "";
  }
  auto it = sparse_routes_.find(static_cast<uint32_t>(sparse_table));
  if (it == sparse_routes_.end() || r.offset >= it->second.size()) return "";
  return it->second[r.offset].address;
}

void ParamClient::Exchange::AbandonMoved() {
  std::map<RouteId, std::string> now_at;
  {
    absl::MutexLock l(&client_->mu_);
    if (client_->epoch_ == epoch_) return;
    for (const auto& [id, r] : routes_)
      now_at[id] = client_->CurrentAddressLocked(r, sparse_table_);
  }
  std::set<std::string> left;
  {
    absl::MutexLock l(&round_->mu);
    for (auto it = round_->pending.begin(); it != round_->pending.end();) {
      const Route& r = routes_.at(*it);
      if (now_at[*it] == r.address) {
        ++it;
        continue;
      }
      ++round_->attempt[*it];  // its answer, if one ever comes, is dropped
      // (Not a sign of a dead pserver: not reported as one.)
      round_->results.insert_or_assign(
          *it,
          WithReason(absl::UnavailableError(absl::StrCat("partition ", r.partition, " moved from ",
                                                         r.address, " in a newer view")),
                     proto::REASON_NOT_SERVED));
      --round_->outstanding;
      round_->answered.fetch_add(1, std::memory_order_release);
      left.insert(r.address);
      it = round_->pending.erase(it);
    }
  }
  // A request given up may still be writing into its destination: its
  // connection goes (a later request reconnects).
  if (!left.empty()) client_->DropConnections(left);
}

absl::Status ParamClient::Exchange::WaitRange(uint32_t table, uint64_t end) {
  STRATA_ASSIGN_OR_RETURN(bool good, AwaitRange(table, end));
  // Something here needs a retry: settle everything now.
  return good ? absl::OkStatus() : Finish();
}

void ParamClient::Exchange::RenewDeadline() { deadline_ = absl::Now() + client_->request_timeout_; }

absl::StatusOr<bool> ParamClient::Exchange::AwaitRange(uint32_t table, uint64_t end) {
  STRATA_RETURN_IF_ERROR(view_error_);
  if (finished_) {
    STRATA_RETURN_IF_ERROR(finish_status_);
    return true;
  }
  std::vector<RouteId> needed;
  for (const auto& [id, r] : routes_) {
    if (r.table != table || r.offset >= end) continue;
    needed.push_back(id);
    if (issued_.insert(id).second) Send(id);
  }
  std::shared_ptr<Round> round = round_;
  // Done when every partition read here is answered, or as soon as any
  // answer of the exchange needs a retry: the caller's Finish sends it
  // again at once (as FinishOnce does). In bsp with backups a chunk's ack
  // waits for its partition's whole step, so waiting for the other answers
  // first would wait for good when a view change refused one chunk of a
  // partition and let the others in.
  STRATA_RETURN_IF_ERROR(Await([round, &needed]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    for (const auto& [id, o] : round->results) {
      if (!AnsweredOk(o)) return true;
    }
    for (RouteId id : needed) {
      if (round->results.count(id) == 0) return false;
    }
    return true;
  }));
  bool all_good = true;
  {
    absl::MutexLock l(&round_->mu);
    for (RouteId id : needed) {
      auto it = round_->results.find(id);
      all_good = all_good && it != round_->results.end() && AnsweredOk(it->second) &&
                 (!destination_ || it->second->payload_in_destination);
    }
  }
  return all_good;
}

absl::Status ParamClient::Exchange::Finish() {
  if (!finished_) {
    finish_status_ = FinishOnce();
    finished_ = true;
  }
  return finish_status_;
}

absl::Status ParamClient::Exchange::FinishOnce() {
  STRATA_RETURN_IF_ERROR(view_error_);
  if (routes_.empty()) {
    // A sparse exchange of a batch whose keys are all cached has nothing to do.
    if (sparse_table_ >= 0) return absl::OkStatus();
    return absl::FailedPreconditionError("no partitions in the cluster view");
  }
  IssueAll();
  for (int attempt = 0;; ++attempt) {
    // A request that failed is sent again at once, not after the others are
    // answered: in bsp a push is acknowledged (with backups) and a pull
    // served only once the step is complete, which may wait for this very
    // retry, or for another worker that waits for us.
    std::shared_ptr<Round> round = round_;
    STRATA_RETURN_IF_ERROR(Await([round]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      if (round->outstanding == 0) return true;
      for (const auto& [id, o] : round->results) {
        if (!AnsweredOk(o)) return true;
      }
      return false;
    }));
    std::map<RouteId, absl::StatusOr<Message>> results;
    std::map<RouteId, uint64_t> sent_epoch;
    bool all_answered;
    {
      absl::MutexLock l(&round_->mu);
      results.swap(round_->results);
      sent_epoch = round_->sent_epoch;
      all_answered = round_->outstanding == 0;
    }
    std::vector<RouteId> retry;
    bool refresh = false;
    std::set<uint32_t> suspected;
    for (auto& [id, o] : results) {
      const Route& r = routes_.at(id);
      if (!o.ok()) {  // connection-level failure: reconnect and retry
        LOG_EVERY_N(WARNING, 20) << "partition " << r.partition << " at " << r.address << ": "
                                 << o.status().ToString(absl::StatusToStringMode::kWithNoExtraData)
                                 << "; retrying";
        retry.push_back(id);
        // Refused for a key epoch one side has not had yet: the owner is
        // alive and where the view says; its keys come with a heartbeat.
        if (transport::IsKeyEpochRefusal(o.status())) continue;
        // The owner may be gone: the master hears of it, and the next try
        // goes wherever the view then says. (Not when the connection was
        // closed by us: requests for a partition that moved were given up
        // on it, and the pserver lives on. A dead one fails the retry.)
        if (client_->report_suspect_ && !HasReason(o.status(), proto::REASON_NOT_SERVED) &&
            !client_->DroppedRecently(r.address) && suspected.insert(r.owner).second &&
            reported_.count(r.owner) == 0) {
          client_->report_suspect_(r.owner, std::string(o.status().message()));
        }
        refresh = true;
        continue;
      }
      absl::Status s = transport::ResponseStatus(*o);
      // Refused for the view epoch it was sent with (a newer view may have
      // come since, for the rest of the exchange): sent again, never taken
      // for a stale gradient.
      if (HasReason(s, proto::REASON_STALE_EPOCH)) {
        if (o->header.epoch > epoch_) refresh = true;  // our view is stale
        retry.push_back(id);
      } else if (absl::IsUnavailable(s)) {
        retry.push_back(id);               // pserver behind on the view, or not ready,
        if (attempt >= 2) refresh = true;  // or no longer serving it
      } else {
        STRATA_RETURN_IF_ERROR(on_response_(r, *o));
      }
    }
    if (retry.empty()) {
      if (all_answered) return absl::OkStatus();
      continue;  // the rest are still on their way
    }
    if (client_->cancelled_) return absl::CancelledError("parameter client cancelled");
    if (absl::Now() > deadline_) {
      const Route& r = routes_.at(retry[0]);
      return absl::DeadlineExceededError(
          absl::StrCat(retry.size(), " partition request(s) unanswered after ",
                       absl::FormatDuration(client_->request_timeout_), "; first: partition ",
                       r.partition, " at ", r.address));
    }
    if (refresh) {
      // Not at full speed while the master is still finding out.
      if (attempt > 0) absl::SleepFor(absl::Milliseconds(std::min(200, 20 * attempt)));
      STRATA_ASSIGN_OR_RETURN(proto::ClusterView view, client_->refresh_view_());
      client_->SetView(view);
      // Requests still on their way to an owner that moved are given up
      // (and sent again below or in the next round) before the routes change.
      AbandonMoved();
      LoadRoutes();  // owners may have moved
      STRATA_RETURN_IF_ERROR(view_error_);
      for (RouteId id : retry) {
        if (routes_.count(id) == 0) {
          return absl::FailedPreconditionError(
              absl::StrCat("partition ", id >> 32, " is no longer in the cluster view"));
        }
      }
    } else {
      absl::SleepFor(absl::Milliseconds(std::min(200, 10 * (attempt + 1))));
    }
    for (RouteId id : retry) Send(id);
  }
}

absl::Status ParamClient::CallAll(const MakeRequest& make_request, const OnResponse& on_response,
                                  const Destination& destination) {
  Exchange ex(this, make_request, on_response, destination);
  return ex.Finish();
}

std::unique_ptr<ParamClient::Exchange> ParamClient::StartPull(
    uint64_t min_version, std::vector<std::vector<float>>* tables, uint64_t* lowest) {
  {
    absl::MutexLock l(&mu_);
    tables->resize(table_sizes_.size());
    for (size_t t = 0; t < table_sizes_.size(); ++t) (*tables)[t].resize(table_sizes_[t]);
  }
  *lowest = UINT64_MAX;
  auto ex = std::make_unique<Exchange>(
      this,
      [min_version](const Route&) {
        Message m;
        m.header.type = MessageType::kPullRequest;
        m.header.version = min_version;
        return m;
      },
      [lowest](const Route& r, const Message& resp) -> absl::Status {
        STRATA_RETURN_IF_ERROR(transport::ResponseStatus(resp));
        if (!resp.payload_in_destination) {  // a response of the wrong size
          return absl::DataLossError(
              absl::StrCat("pull of partition ", r.partition, " from ", r.address, ": expected ",
                           r.length * sizeof(float), " bytes, got ", resp.payload.size()));
        }
        *lowest = std::min(*lowest, resp.header.version);
        return absl::OkStatus();
      },
      [tables](const Route& r) -> std::pair<char*, size_t> {
        // Responses land straight in the tensor (checked against the view).
        return {reinterpret_cast<char*>((*tables)[r.table].data() + r.offset),
                r.length * sizeof(float)};
      });
  return ex;
}

std::unique_ptr<ParamClient::Exchange> ParamClient::StartPush(
    const std::vector<std::vector<float>>* grads, uint64_t step, uint64_t count,
    PushResult* result) {
  uint64_t seq;
  {
    absl::MutexLock l(&mu_);
    seq = next_seq_++;
  }
  *result = PushResult();
  return std::make_unique<Exchange>(
      this,
      [grads, seq, step, count](const Route& r) {
        Message m;
        m.header.type = MessageType::kPushRequest;
        m.header.seq = seq;
        m.header.version = step;
        m.header.count = count;
        // Sent straight from the gradient tensor: no copy (tcp writes it
        // in Call; rdma sends it in place, registered, until the answer).
        m.payload_ref = reinterpret_cast<const char*>((*grads)[r.table].data() + r.offset);
        m.payload_ref_size = r.length * sizeof(float);
        m.payload_ref_until_response = true;
        return m;
      },
      [this, result](const Route& r, const Message& resp) { return OnPushAnswer(r, resp, result); },
      Destination());
}

absl::Status ParamClient::PushInitialValues(const std::vector<std::vector<float>>& values) {
  return CallAll(
      [&values](const Route& r) {
        Message m;
        m.header.type = MessageType::kPushRequest;
        m.header.flags = transport::kFlagInitialValues;
        m.header.count = 1;
        m.payload_ref = reinterpret_cast<const char*>(values[r.table].data() + r.offset);
        m.payload_ref_size = r.length * sizeof(float);
        return m;
      },
      [](const Route& r, const Message& resp) {
        absl::Status s = transport::ResponseStatus(resp);
        if (s.ok()) return s;
        return absl::Status(s.code(),
                            absl::StrCat("initial values to ", r.address, ": ", s.message()));
      });
}

int ParamClient::SparseDim(uint32_t table) const {
  absl::MutexLock l(&mu_);
  auto it = sparse_dims_.find(table);
  return it == sparse_dims_.end() ? 0 : it->second;
}

absl::Status ParamClient::GroupKeys(const std::vector<uint64_t>& unique_keys, SparseKeys* out,
                                    std::vector<uint32_t>* perm) const {
  uint32_t partitions;
  {
    absl::MutexLock l(&mu_);
    partitions = sparse_partitions_;
  }
  if (partitions == 0) return absl::FailedPreconditionError("the cluster view has no sparse table");
  // A counting sort by partition.
  std::vector<uint32_t> part(unique_keys.size());
  out->begin.assign(partitions + 1, 0);
  for (size_t i = 0; i < unique_keys.size(); ++i) {
    part[i] = SparsePartitionOf(unique_keys[i], partitions);
    ++out->begin[part[i] + 1];
  }
  for (uint32_t v = 0; v < partitions; ++v) out->begin[v + 1] += out->begin[v];
  std::vector<uint32_t> next(out->begin.begin(), out->begin.end() - 1);
  out->keys.resize(unique_keys.size());
  perm->resize(unique_keys.size());
  for (size_t i = 0; i < unique_keys.size(); ++i) {
    const uint32_t at = next[part[i]]++;
    out->keys[at] = unique_keys[i];
    (*perm)[i] = at;
  }
  return absl::OkStatus();
}

std::unique_ptr<ParamClient::Exchange> ParamClient::StartSparsePull(
    uint32_t table, const SparseKeys* keys, float* rows, uint64_t min_version, bool every_partition,
    uint64_t* lowest) {
  const int dim = SparseDim(table);
  if (lowest != nullptr) *lowest = UINT64_MAX;
  return std::make_unique<Exchange>(
      this,
      [keys, min_version](const Route& r) {
        Message m;
        m.header.type = MessageType::kPullRequest;
        m.header.flags = transport::kFlagSparse;
        m.header.version = min_version;
        const uint32_t b = keys->begin[r.offset], e = keys->begin[r.offset + 1];
        m.payload_ref = reinterpret_cast<const char*>(keys->keys.data() + b);
        m.payload_ref_size = (e - b) * sizeof(uint64_t);
        return m;
      },
      [lowest](const Route& r, const Message& resp) -> absl::Status {
        STRATA_RETURN_IF_ERROR(transport::ResponseStatus(resp));
        if (lowest != nullptr) *lowest = std::min(*lowest, resp.header.version);
        // A pull without keys (a bsp version barrier) has no rows to land.
        const bool empty = r.length == 0 && resp.payload.empty();
        if (!resp.payload_in_destination && !empty) {
          return absl::DataLossError(absl::StrCat(
              "sparse pull of partition ", r.partition, " from ", r.address, ": expected ",
              r.length * sizeof(float), " bytes of rows, got ", resp.payload.size()));
        }
        return absl::OkStatus();
      },
      [keys, rows, dim](const Route& r) -> std::pair<char*, size_t> {
        // The rows land in key order, straight in place.
        return {reinterpret_cast<char*>(rows + static_cast<size_t>(keys->begin[r.offset]) * dim),
                r.length * sizeof(float)};
      },
      static_cast<int>(table), keys, every_partition);
}

std::unique_ptr<ParamClient::Exchange> ParamClient::StartSparsePush(
    uint32_t table, const SparseKeys* keys, const float* grads, uint64_t step, uint64_t count,
    bool every_partition, PushResult* result) {
  const int dim = SparseDim(table);
  uint64_t seq;
  {
    absl::MutexLock l(&mu_);
    seq = next_seq_++;
  }
  *result = PushResult();
  // (Keys not grouped by GroupKeys: the exchange refuses them in LoadRoutes.)
  const size_t groups = keys->begin.empty() ? 0 : keys->begin.size() - 1;
  // The payloads are built now (keys, then their rows), so the caller's
  // gradient may change once this returns; a retry resends the same bytes.
  auto payloads = std::make_shared<std::vector<std::string>>(groups);
  for (size_t v = 0; v < groups; ++v) {
    const uint32_t b = keys->begin[v], e = keys->begin[v + 1];
    if (b == e && !every_partition) continue;
    std::string& p = (*payloads)[v];
    p.resize((e - b) * (sizeof(uint64_t) + sizeof(float) * dim));
    std::memcpy(p.data(), keys->keys.data() + b, (e - b) * sizeof(uint64_t));
    std::memcpy(p.data() + (e - b) * sizeof(uint64_t), grads + static_cast<size_t>(b) * dim,
                (e - b) * sizeof(float) * dim);
  }
  return std::make_unique<Exchange>(
      this,
      [payloads, seq, step, count](const Route& r) {
        Message m;
        m.header.type = MessageType::kPushRequest;
        m.header.flags = transport::kFlagSparse;
        m.header.seq = seq;
        m.header.version = step;
        m.header.count = count;
        m.payload = (*payloads)[r.offset];
        return m;
      },
      [this, result](const Route& r, const Message& resp) { return OnPushAnswer(r, resp, result); },
      Destination(), static_cast<int>(table), keys, every_partition);
}

absl::StatusOr<uint64_t> ParamClient::PullAll(uint64_t min_version,
                                              std::vector<std::vector<float>>* tables) {
  uint64_t lowest = 0;
  STRATA_RETURN_IF_ERROR(StartPull(min_version, tables, &lowest)->Finish());
  return lowest;
}

absl::Status ParamClient::OnPushAnswer(const Route& r, const Message& resp, PushResult* result) {
  absl::Status s = transport::ResponseStatus(resp);
  if (HasReason(s, proto::REASON_STALE_GRADIENT)) {  // dropped by design
    if (result->stale.insert(r.partition).second) ++result->stale_partitions;
    VLOG(1) << s;
    return absl::OkStatus();
  }
  if (!s.ok())
    return absl::Status(s.code(), absl::StrCat("push to ", r.address, ": ", s.message()));
  // A push is acknowledged once every chunk of it is.
  if (r.chunks > 1 && ++result->chunks_acked[r.partition] < r.chunks) return absl::OkStatus();
  absl::MutexLock l(&mu_);
  ++acked_pushes_[r.partition];
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ParamClient::PushThenPull(const std::vector<std::vector<float>>& grads,
                                                   uint64_t step, uint64_t count,
                                                   uint64_t min_version,
                                                   std::vector<std::vector<float>>* tables,
                                                   PushResult* result) {
  return PushPull(this, &grads, step, count, min_version, tables).Finish(result);
}

ParamClient::PushPull::PushPull(ParamClient* client, const std::vector<std::vector<float>>* grads,
                                uint64_t step, uint64_t count, uint64_t min_version,
                                std::vector<std::vector<float>>* tables)
    : push_(client->StartPush(grads, step, count, &pushed_)),
      pull_(client->StartPull(min_version, tables, &lowest_)),
      client_(client),
      grads_(grads) {
  // Small exchanges: every pull right behind its push, no round trip
  // between the two. Large ones: the pulls once the pushes are answered,
  // so that the pserver does not send large pulls while the pushes behind
  // them still arrive (three busy threads on two cores: on a shared-core
  // loopback that contention cost more than the overlap gained; a bsp pull
  // waits for the step anyway).
  pull_behind_ = push_->total_bytes() <= kPullBehindPushMaxBytes;
}

void ParamClient::PushPull::Issue(uint32_t table) {
  if (table >= grads_->size()) return;
  const uint64_t end = (*grads_)[table].size();
  push_->IssueRange(table, end);
  if (pull_behind_) pull_->IssueRange(table, end);
}

void ParamClient::PushPull::IssueInterleaved() {
  pull_behind_ = true;
  for (uint32_t t = 0; t < grads_->size(); ++t) {
    const std::vector<uint64_t> starts = client_->PartitionStarts(t);
    for (size_t i = 0; i < starts.size(); ++i) {
      const uint64_t end = i + 1 < starts.size() ? starts[i + 1] : (*grads_)[t].size();
      push_->IssueRange(t, end);
      pull_->IssueRange(t, end);
    }
  }
}

absl::StatusOr<uint64_t> ParamClient::PushPull::Finish(PushResult* result) {
  push_->IssueAll();
  if (pull_behind_) pull_->IssueAll();
  absl::Status pushed_status = push_->Finish();
  // Settled even when the push failed: the pulls write into *tables.
  absl::Status pulled_status = pull_->Finish();
  STRATA_RETURN_IF_ERROR(pushed_status);
  STRATA_RETURN_IF_ERROR(pulled_status);
  if (result != nullptr) *result = pushed_;
  return lowest_;
}

absl::Status ParamClient::PushPull::FinishPush(PushResult* result) {
  push_->IssueAll();
  if (pull_behind_) pull_->IssueAll();
  STRATA_RETURN_IF_ERROR(push_->Finish());
  pull_->IssueAll();  // (large exchanges: once the pushes are answered)
  if (result != nullptr) *result = pushed_;
  return absl::OkStatus();
}

absl::Status ParamClient::PushPull::WaitTable(uint32_t table) {
  if (table >= grads_->size()) return absl::OkStatus();
  return pull_->WaitRange(table, (*grads_)[table].size());
}

absl::StatusOr<uint64_t> ParamClient::PushPull::FinishPull() {
  STRATA_RETURN_IF_ERROR(pull_->Finish());
  return lowest_;
}

absl::StatusOr<PushResult> ParamClient::PushAll(const std::vector<std::vector<float>>& grads,
                                                uint64_t step, uint64_t count) {
  PushResult result;
  STRATA_RETURN_IF_ERROR(StartPush(&grads, step, count, &result)->Finish());
  return result;
}

absl::StatusOr<uint64_t> ParamClient::PullTables(uint64_t min_version, uint32_t begin, uint32_t end,
                                                 std::vector<std::vector<float>>* tables) {
  uint64_t lowest = 0;
  std::unique_ptr<Exchange> ex = StartPull(min_version, tables, &lowest);
  ex->OnlyTables(begin, end);
  STRATA_RETURN_IF_ERROR(ex->Finish());
  return lowest;
}

absl::StatusOr<PushResult> ParamClient::PushTables(const std::vector<std::vector<float>>& grads,
                                                   uint32_t begin, uint32_t end, uint64_t step,
                                                   uint64_t count) {
  PushResult result;
  std::unique_ptr<Exchange> ex = StartPush(&grads, step, count, &result);
  ex->OnlyTables(begin, end);
  STRATA_RETURN_IF_ERROR(ex->Finish());
  return result;
}

}  // namespace strata::worker
