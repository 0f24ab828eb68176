#include "master/placement.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"

namespace strata::master {

std::vector<proto::TableInfo> MakeTableInfos(const std::vector<TableSpec>& specs) {
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
    return absl::InvalidArgumentError(
        absl::StrCat("slice_bytes must be >= 4, got ", slice_bytes));
  }
  const uint64_t max_elems = static_cast<uint64_t>(slice_bytes) / 4;
  std::vector<proto::PartitionInfo> parts;
  for (const proto::TableInfo& t : tables) {
    for (uint64_t off = 0; off < t.num_elements(); off += max_elems) {
      proto::PartitionInfo p;
      p.set_id(static_cast<uint32_t>(parts.size()));
      p.set_table_id(t.id());
      p.set_offset(off);
      p.set_length(std::min(max_elems, t.num_elements() - off));
      parts.push_back(std::move(p));
    }
  }
  std::vector<size_t> order(parts.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return parts[a].length() > parts[b].length();
  });
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

}  // namespace strata::master
