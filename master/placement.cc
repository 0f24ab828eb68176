#include "master/placement.h"

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"

namespace strata::master {

std::vector<proto::TableInfo> MakeTableInfos(const std::vector<TableSpec>& specs,
                                             uint32_t sparse_partitions) {
  std::vector<proto::TableInfo> tables;
  for (size_t i = 0; i < specs.size(); ++i) {
    proto::TableInfo t;
    t.set_id(static_cast<uint32_t>(i));
    t.set_name(specs[i].name);
    for (uint64_t d : specs[i].shape) t.add_shape(d);
    t.set_num_elements(specs[i].num_elements());
    t.set_init(specs[i].init);
    t.set_fan_in(specs[i].fan_in);
    t.set_fan_out(specs[i].fan_out);
    if (specs[i].sparse) {
      t.set_sparse(true);
      t.set_dim(static_cast<uint32_t>(specs[i].dim));
      t.set_partitions(sparse_partitions);
    }
    if (specs[i].allreduce) t.set_allreduce(true);
    tables.push_back(std::move(t));
  }
  return tables;
}

absl::StatusOr<std::vector<proto::PartitionInfo>> PlacePartitions(
    const std::vector<proto::TableInfo>& tables, int64_t slice_bytes,
    const std::vector<uint32_t>& pserver_ids) {
  if (pserver_ids.empty()) {
    return absl::InvalidArgumentError("cannot place partitions: no pserver");
  }
  if (slice_bytes < 4) {
    return absl::InvalidArgumentError(absl::StrCat("slice_bytes must be >= 4, got ", slice_bytes));
  }
  const uint64_t max_elems = static_cast<uint64_t>(slice_bytes) / 4;
  std::vector<proto::PartitionInfo> parts;
  std::vector<size_t> sparse_parts;
  for (const proto::TableInfo& t : tables) {
    if (t.sparse()) {
      for (uint32_t v = 0; v < t.partitions(); ++v) {
        proto::PartitionInfo p;
        p.set_id(static_cast<uint32_t>(parts.size()));
        p.set_table_id(t.id());
        p.set_offset(v);
        p.set_length(0);
        sparse_parts.push_back(parts.size());
        parts.push_back(std::move(p));
      }
      continue;
    }
    if (t.allreduce()) continue;  // (the workers keep it)
    for (uint64_t off = 0; off < t.num_elements(); off += max_elems) {
      proto::PartitionInfo p;
      p.set_id(static_cast<uint32_t>(parts.size()));
      p.set_table_id(t.id());
      p.set_offset(off);
      p.set_length(std::min(max_elems, t.num_elements() - off));
      parts.push_back(std::move(p));
    }
  }
  std::vector<uint32_t> sorted_ids = pserver_ids;
  std::sort(sorted_ids.begin(), sorted_ids.end());
  for (size_t k = 0; k < sparse_parts.size(); ++k) {
    parts[sparse_parts[k]].set_owner(sorted_ids[k % sorted_ids.size()]);
  }
  std::vector<size_t> order;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].length() > 0) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return parts[a].length() > parts[b].length(); });
  std::map<uint32_t, uint64_t> load;
  for (uint32_t id : pserver_ids) load[id] = 0;
  for (size_t i : order) {
    uint32_t best = load.begin()->first;
    for (const auto& [id, bytes] : load) {
      if (bytes < load[best]) best = id;
    }
    parts[i].set_owner(best);
    load[best] += parts[i].length() * 4;
  }
  return parts;
}

int TopUpBackups(google::protobuf::RepeatedPtrField<proto::PartitionInfo>* parts,
                 const std::vector<uint32_t>& live, int k, const std::set<uint32_t>& leaving,
                 const MeasuredBytes& measured) {
  const std::set<uint32_t> alive(live.begin(), live.end());
  const auto weight = [&measured](const proto::PartitionInfo& p) {
    return PartitionWeight(p, measured);
  };
  std::map<uint32_t, uint64_t> load;
  for (uint32_t id : live) load[id] = 0;
  int changed = 0;
  for (proto::PartitionInfo& p : *parts) {
    auto* b = p.mutable_backups();
    for (int i = b->size() - 1; i >= 0; --i) {
      if (alive.count(b->Get(i)) == 0 || b->Get(i) == p.owner()) {
        b->erase(b->begin() + i);
        ++changed;
      }
    }
    if (alive.count(p.owner())) load[p.owner()] += weight(p);
    for (uint32_t id : *b) load[id] += weight(p);
  }
  for (proto::PartitionInfo& p : *parts) {
    while (p.backups_size() < k) {
      uint32_t best = 0;
      bool found = false;
      for (const auto& [id, bytes] : load) {
        if (id == p.owner() || leaving.count(id) ||
            std::find(p.backups().begin(), p.backups().end(), id) != p.backups().end()) {
          continue;
        }
        if (!found || bytes < load[best]) {
          best = id;
          found = true;
        }
      }
      if (!found) break;
      p.add_backups(best);
      load[best] += weight(p);
      ++changed;
    }
  }
  return changed;
}

uint64_t PartitionWeight(const proto::PartitionInfo& p, const MeasuredBytes& measured) {
  if (p.length() > 0) return p.length() * 4;
  auto it = measured.find(p.id());
  return it != measured.end() && it->second > 0 ? it->second : kSparsePartitionWeight;
}

namespace {

// PlanMoves' picture of the placement, with the moves planned so far done.
class MovePlanner {
 public:
  MovePlanner(const google::protobuf::RepeatedPtrField<proto::PartitionInfo>& parts,
              const std::vector<uint32_t>& stay, const MeasuredBytes& measured)
      : stay_(stay.begin(), stay.end()) {
    for (uint32_t id : stay) {
      primary_[id] = 0;
      held_[id] = 0;
    }
    for (const proto::PartitionInfo& p : parts) {
      Part x{p.id(), p.owner(), {}, PartitionWeight(p, measured), p.move_to() != 0};
      x.holders.insert(p.owner());
      x.holders.insert(p.backups().begin(), p.backups().end());
      if (x.moving) {  // counted where it goes
        x.holders.erase(p.move_from());
        x.holders.insert(p.move_to());
        if (p.move_from() == p.owner()) x.owner = p.move_to();
      }
      for (uint32_t h : x.holders) held_[h] += x.weight;
      primary_[x.owner] += x.weight;
      parts_.push_back(std::move(x));
    }
    std::stable_sort(parts_.begin(), parts_.end(),
                     [](const Part& a, const Part& b) { return a.weight > b.weight; });
  }

  void Evacuate(const std::set<uint32_t>& leaving) {
    for (Part& p : parts_) {
      if (p.moving || leaving.count(p.owner) == 0) continue;
      std::optional<uint32_t> to = Least(primary_, [&](uint32_t n) { return n != p.owner; });
      if (!to.has_value()) return;
      // A backup holding it already is a move with nothing to copy.
      const uint64_t least = primary_[*to];
      for (uint32_t h : p.holders) {
        if (stay_.count(h) && primary_[h] <= least + p.weight) to = h;
      }
      Do(&p, p.owner, *to, true);
    }
    for (Part& p : parts_) {
      if (p.moving) continue;
      for (uint32_t b : std::set<uint32_t>(p.holders)) {
        if (b == p.owner || leaving.count(b) == 0) continue;
        std::optional<uint32_t> to = Least(held_, [&](uint32_t n) { return !p.holders.count(n); });
        if (to.has_value()) Do(&p, b, *to, false);
        break;  // (one move per partition at a time)
      }
    }
  }

  // Moves from the most to the least loaded pserver while one narrows the
  // gap: of primaries (`primary`) or of backups.
  void Balance(bool primary) {
    std::map<uint32_t, uint64_t>& load = primary ? primary_ : held_;
    // Each pserver's partitions that may move (not moving yet), heaviest
    // first: those it owns, or backs.
    std::map<uint32_t, std::multimap<uint64_t, Part*, std::greater<>>> movable;
    for (Part& p : parts_) {
      if (p.moving) continue;
      if (primary) {
        movable[p.owner].emplace(p.weight, &p);
        continue;
      }
      for (uint32_t h : p.holders) {
        if (h != p.owner) movable[h].emplace(p.weight, &p);
      }
    }
    for (size_t round = 0; round < parts_.size(); ++round) {
      std::optional<uint32_t> lo = Least(load, [](uint32_t) { return true; });
      if (!lo.has_value()) return;
      uint32_t hi = *lo;
      for (uint32_t n : stay_) {
        if (load[n] > load[hi]) hi = n;
      }
      const uint64_t gap = load[hi] - load[*lo];
      auto& from = movable[hi];
      Part* best = nullptr;
      for (auto it = from.lower_bound(gap == 0 ? 0 : gap - 1); it != from.end(); ++it) {
        Part* p = it->second;
        if (p->moving || p->weight >= gap || (!primary && p->holders.count(*lo))) continue;
        best = p;
        from.erase(it);
        break;
      }
      if (best == nullptr) return;
      Do(best, hi, *lo, primary);
    }
  }

  std::vector<Move> moves() const { return moves_; }

 private:
  struct Part {
    uint32_t id;
    uint32_t owner;
    std::set<uint32_t> holders;  // the owner and the backups
    uint64_t weight;
    bool moving;
  };
  template <typename Ok>
  std::optional<uint32_t> Least(const std::map<uint32_t, uint64_t>& load, Ok ok) const {
    std::optional<uint32_t> best;
    for (uint32_t n : stay_) {
      if (ok(n) && (!best.has_value() || load.at(n) < load.at(*best))) best = n;
    }
    return best;
  }
  void Do(Part* p, uint32_t from, uint32_t to, bool primary) {
    moves_.push_back(Move{p->id, from, to, primary, p->weight});
    p->moving = true;
    if (primary) {
      primary_[from] -= p->weight;
      primary_[to] += p->weight;
      p->owner = to;
    }
    if (!p->holders.count(to)) held_[to] += p->weight;
    held_[from] -= p->weight;
    p->holders.erase(from);
    p->holders.insert(to);
  }

  const std::set<uint32_t> stay_;
  std::map<uint32_t, uint64_t> primary_, held_;
  std::vector<Part> parts_;
  std::vector<Move> moves_;
};

}  // namespace

std::vector<Move> PlanMoves(const google::protobuf::RepeatedPtrField<proto::PartitionInfo>& parts,
                            const std::vector<uint32_t>& stay, const std::set<uint32_t>& leaving,
                            const MeasuredBytes& measured) {
  if (stay.empty()) return {};
  MovePlanner planner(parts, stay, measured);
  planner.Evacuate(leaving);
  planner.Balance(/*primary=*/true);
  planner.Balance(/*primary=*/false);
  return planner.moves();
}

}  // namespace strata::master
