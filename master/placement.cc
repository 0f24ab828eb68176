#include "master/placement.h"

#include <algorithm>
#include <map>
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
                 const std::vector<uint32_t>& live, int k) {
  const std::set<uint32_t> alive(live.begin(), live.end());
  auto weight = [](const proto::PartitionInfo& p) {
    return p.length() > 0 ? p.length() * 4 : kSparsePartitionWeight;
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
        if (id == p.owner() ||
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

}  // namespace strata::master
