// The node manager's part of live partition migration (NodeManager::Migrate,
// MarkLeaving; docs/reliability.md, "Moving partitions"): moves recorded in
// the view's partitions (move_to, move_from), cut over when their target
// holds the copy in sync, and pservers that leave drained once empty.
#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/proto_names.h"
#include "glog/logging.h"
#include "master/node_manager.h"
#include "master/placement.h"

namespace strata::master {
namespace {

bool Holds(const proto::PartitionInfo& p, uint32_t node) {
  return p.owner() == node ||
         std::find(p.backups().begin(), p.backups().end(), node) != p.backups().end();
}

void EraseBackup(proto::PartitionInfo* p, uint32_t node) {
  auto* b = p->mutable_backups();
  b->erase(std::remove(b->begin(), b->end(), node), b->end());
}

std::string Name(const proto::NodeInfo& n) {
  return absl::StrCat(NodeRoleName(n.role()), " ", n.index(), " (node ", n.id(), ")");
}

std::string Mib(uint64_t bytes) {
  return absl::StrFormat("%.1f MiB", static_cast<double>(bytes) / (1 << 20));
}

// The first items of a list, for an event: a move of thousands of slices
// reads as its first 16 and a count.
template <typename T>
std::string Some(const std::vector<T>& items) {
  constexpr size_t kShown = 16;
  if (items.size() <= kShown) return absl::StrJoin(items, ", ");
  return absl::StrCat(absl::StrJoin(items.begin(), items.begin() + kShown, ", "), " and ",
                      items.size() - kShown, " more");
}

}  // namespace

std::vector<PServerTarget> NodeManager::LivePServers(const std::set<uint32_t>& ids) const {
  absl::MutexLock l(&mu_);
  std::vector<PServerTarget> out;
  for (uint32_t id : ids) {
    const proto::NodeInfo* n = FindLocked(id);
    auto stub = pserver_stubs_.find(id);
    if (n == nullptr || n->state() != proto::ALIVE || stub == pserver_stubs_.end()) continue;
    out.emplace_back(id, stub->second.get());
  }
  return out;
}

std::vector<uint32_t> NodeManager::StayingPServersLocked() const {
  std::vector<uint32_t> ids;
  for (const auto& n : view_.members()) {
    if (n.role() == proto::PSERVER && n.state() == proto::ALIVE && !n.draining()) {
      ids.push_back(n.id());
    }
  }
  return ids;
}

void NodeManager::MarkLeaving(const std::vector<uint32_t>& ids, const std::string& why) {
  absl::MutexLock l(&mu_);
  for (uint32_t id : ids) {
    proto::NodeInfo* n = FindLocked(id);
    if (n == nullptr || n->role() != proto::PSERVER || Gone(*n) || n->draining()) continue;
    n->set_draining(true);
    job_->Event(absl::StrCat("pserver ", n->index(), " (node ", n->id(), ") leaving (", why,
                             "): its partitions move to the others, then it exits"),
                "node_draining", n);
  }
  BumpEpochLocked();
}

NodeManager::Migration NodeManager::Migrate(const MigrateOptions& o) {
  absl::MutexLock l(&mu_);
  Migration out;
  if (!placed_) return out;
  const uint64_t epoch = view_.epoch();
  out.in_progress = FinishMovesLocked(o.hold_cutover, &out);
  DrainEmptiedLocked(&out);
  bool leaving = false;
  for (const auto& n : view_.members()) {
    leaving = leaving || (n.role() == proto::PSERVER && n.state() == proto::ALIVE && n.draining());
  }
  moves_waiting_ = 0;
  if (o.rebalance || leaving) StartMovesLocked(o, !CutOverSettlingLocked(), &out);
  out.waiting = moves_waiting_;
  if (out.changed) {
    TopUpBackupsLocked();
    if (view_.epoch() == epoch) BumpEpochLocked();
  }
  return out;
}

void NodeManager::ViewApplied(const std::vector<uint32_t>& ids, uint64_t epoch) {
  absl::MutexLock l(&mu_);
  // (Not beat_epoch_: a cut-over needs a heartbeat's replicas of that
  // epoch, which a pushed view's answer does not carry.)
  for (uint32_t id : ids) {
    uint64_t& e = applied_epoch_[id];
    e = std::max(e, epoch);
  }
}

bool NodeManager::CutOverSettlingLocked() {
  for (auto it = cutover_wait_.begin(); it != cutover_wait_.end();) {
    const proto::NodeInfo* n = FindLocked(it->first);
    const bool settled = n == nullptr || n->state() != proto::ALIVE ||
                         std::max(beat_epoch_[it->first], applied_epoch_[it->first]) >= it->second;
    it = settled ? cutover_wait_.erase(it) : std::next(it);
  }
  return !cutover_wait_.empty();
}

int NodeManager::FinishMovesLocked(bool hold_cutover, Migration* out) {
  int under_way = 0;
  std::vector<std::string> done;
  for (proto::PartitionInfo& p : *view_.mutable_partitions()) {
    if (p.move_to() == 0) continue;
    const uint32_t to = p.move_to();
    const uint32_t from = p.move_from();
    const proto::NodeInfo* target = FindLocked(to);
    std::string ended;
    if (!Holds(p, from)) {
      // The source left (failed over, perhaps to the target itself).
      ended = absl::StrCat("node ", from, " left");
    } else if (target == nullptr || target->state() != proto::ALIVE || !Holds(p, to)) {
      ended = absl::StrCat("node ", to, " left");
    }
    if (!ended.empty()) {
      job_->Event(absl::StrCat("move of partition ", p.id(), " from node ", from, " to node ", to,
                               " abandoned: ", ended),
                  "move_abandoned");
      out->touched.insert({from, to});
      if (p.owner() != to) EraseBackup(&p, to);
      p.clear_move_to();
      p.clear_move_from();
      move_epoch_.erase(p.id());
      out->changed = true;
      continue;
    }
    auto held = synced_replicas_.find(to);
    const bool synced = held != synced_replicas_.end() && held->second.count(p.id()) > 0 &&
                        beat_epoch_[to] >= move_epoch_[p.id()];
    if (!synced || hold_cutover) {
      ++under_way;
      continue;
    }
    // Cut over: the target takes the source's place (as owner: it is no
    // backup any more; as backup: the source's goes).
    if (p.owner() == from) {
      EraseBackup(&p, to);
      p.set_owner(to);
      cutover_wait_[to] = view_.epoch() + 1;  // (the view that shows it)
    } else {
      EraseBackup(&p, from);
    }
    p.clear_move_to();
    p.clear_move_from();
    move_epoch_.erase(p.id());
    out->touched.insert({from, to});
    ++moves_done_;
    moved_bytes_ += PartitionWeight(p, sparse_bytes_);
    done.push_back(absl::StrCat(p.id(), " node ", from, " -> ", to));
    out->changed = true;
  }
  if (!done.empty()) {
    job_->Event(absl::StrCat(done.size(), " partition(s) moved (", Some(done), "); ", moves_done_,
                             " moved so far, ", Mib(moved_bytes_)),
                "moved");
  }
  return under_way;
}

void NodeManager::DrainEmptiedLocked(Migration* out) {
  const std::vector<uint32_t> stay = StayingPServersLocked();
  for (proto::NodeInfo& n : *view_.mutable_members()) {
    if (n.role() != proto::PSERVER || n.state() != proto::ALIVE || !n.draining()) continue;
    // What it holds: partitions it owns or that move, which keep it; and
    // backups no staying pserver could take (each holds the partition
    // already), which go with it: the replication the job started with
    // on fewer pservers.
    bool holds = false;
    std::vector<proto::PartitionInfo*> stranded;
    for (proto::PartitionInfo& p : *view_.mutable_partitions()) {
      if (p.owner() == n.id() || p.move_to() == n.id() || p.move_from() == n.id()) {
        holds = true;
      } else if (Holds(p, n.id())) {
        const bool room =
            std::any_of(stay.begin(), stay.end(), [&](uint32_t s) { return !Holds(p, s); });
        holds = holds || room;
        stranded.push_back(&p);
      }
    }
    if (holds) continue;
    if (!stranded.empty()) {
      std::vector<uint32_t> ids;
      for (proto::PartitionInfo* p : stranded) {
        EraseBackup(p, n.id());
        ids.push_back(p->id());
      }
      job_->Event(absl::StrCat(Name(n), ": its backups of partition(s) ", Some(ids),
                               " dropped, no other pserver left to hold them (", stay.size(),
                               " pserver(s) staying)"),
                  "backups_dropped", &n);
    }
    n.set_state(proto::DRAINED);
    RotateDataKeyLocked();  // its key stops working
    synced_replicas_.erase(n.id());
    suspects_.erase(n.id());
    job_->Event(absl::StrCat(Name(n), " drained: its partitions moved to the others; it exits"),
                "node_drained", &n);
    Departure d;
    d.node = n;
    out->departed.push_back(std::move(d));
    out->changed = true;
  }
}

void NodeManager::StartMovesLocked(const MigrateOptions& o, bool start, Migration* out) {
  std::set<uint32_t> leaving;
  for (const auto& n : view_.members()) {
    if (n.role() == proto::PSERVER && n.state() == proto::ALIVE && n.draining()) {
      leaving.insert(n.id());
    }
  }
  const std::vector<Move> plan =
      PlanMoves(view_.partitions(), StayingPServersLocked(), leaving, sparse_bytes_);
  double credit = o.credit;
  std::vector<std::string> started;
  uint64_t bytes = 0;
  std::map<uint32_t, proto::PartitionInfo*> by_id;
  for (proto::PartitionInfo& p : *view_.mutable_partitions()) by_id[p.id()] = &p;
  for (const Move& m : plan) {
    if (!start || out->in_progress >= o.max_moves || credit <= 0) {
      ++moves_waiting_;
      continue;
    }
    proto::PartitionInfo* p = by_id[m.partition];
    p->set_move_to(m.to);
    p->set_move_from(m.from);
    if (!Holds(*p, m.to)) p->add_backups(m.to);
    move_epoch_[p->id()] = view_.epoch() + 1;  // (the view that shows it)
    out->touched.insert({m.from, m.to});
    credit -= static_cast<double>(m.bytes);
    bytes += m.bytes;
    ++out->in_progress;
    started.push_back(
        absl::StrCat(m.partition, m.primary ? "" : " (backup)", " node ", m.from, " -> ", m.to));
  }
  if (started.empty()) return;
  out->started_bytes = bytes;
  out->changed = true;
  job_->Event(
      absl::StrCat("moving ", started.size(), " partition(s), ", Mib(bytes), " (", Some(started),
                   ")",
                   moves_waiting_ > 0 ? absl::StrCat("; ", moves_waiting_, " more planned") : ""),
      "moving");
}

}  // namespace strata::master
