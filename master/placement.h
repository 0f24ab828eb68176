// Partitioning of dense tables and placement of partitions on pservers.
#ifndef STRATA_MASTER_PLACEMENT_H_
#define STRATA_MASTER_PLACEMENT_H_

#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_spec.h"
#include "proto/strata.pb.h"

namespace strata::master {

// Table descriptors with ids 0..n-1 in the given order; a sparse table is
// hashed into `sparse_partitions` virtual partitions.
std::vector<proto::TableInfo> MakeTableInfos(const std::vector<TableSpec>& specs,
                                             uint32_t sparse_partitions = 16);

// Cuts every dense table into partitions of at most `slice_bytes` (fp32
// elements) and every sparse table into its virtual partitions (offset =
// the index, length 0), numbered 0.. in table order. Dense partitions are
// placed on `pserver_ids` balancing bytes: largest partition first onto the
// least-loaded pserver (ties: the lower id). A sparse table's rows are not
// known in advance: its virtual partitions are dealt out in turn, so each
// pserver gets the same share of every sparse table.
// InvalidArgument when there is no pserver or slice_bytes < 4.
absl::StatusOr<std::vector<proto::PartitionInfo>> PlacePartitions(
    const std::vector<proto::TableInfo>& tables, int64_t slice_bytes,
    const std::vector<uint32_t>& pserver_ids);

// The bytes sparse partitions take, measured by their owners (partition
// id -> bytes; their heartbeats' partition_bytes).
using MeasuredBytes = std::map<uint32_t, uint64_t>;

// Gives every partition up to `k` backups among the pservers `live`: keeps
// the live ones it has, drops the others, and adds for each missing one the
// least-loaded live pserver (bytes held as primary or backup, as
// PartitionWeight says) that is neither its owner nor already a backup.
// Fewer when there are not enough pservers. Pservers `leaving` (live,
// about to go) keep the backups they hold but get no new one. Returns how
// many backups were added or dropped.
inline constexpr uint64_t kSparsePartitionWeight = 1 << 16;
int TopUpBackups(google::protobuf::RepeatedPtrField<proto::PartitionInfo>* parts,
                 const std::vector<uint32_t>& live, int k, const std::set<uint32_t>& leaving = {},
                 const MeasuredBytes& measured = {});

// The bytes a partition weighs in placement: a dense slice its values; a
// sparse virtual partition the bytes its owner measured (`measured`),
// else kSparsePartitionWeight (before any heartbeat told: its rows are
// dealt out by hash, so the virtual partitions of a table weigh alike).
uint64_t PartitionWeight(const proto::PartitionInfo& p, const MeasuredBytes& measured = {});

// A live move (docs/reliability.md, "Moving partitions"): `to` receives a
// copy of the partition as an extra backup, then takes `from`'s place, as
// its owner (`primary`) or as one of its backups.
struct Move {
  uint32_t partition = 0;
  uint32_t from = 0;
  uint32_t to = 0;
  bool primary = false;
  uint64_t bytes = 0;
};

// The moves that take every partition off the pservers `leaving` and then
// balance the bytes among `stay` (the pservers that keep serving): first
// the primaries' bytes per pserver, then the bytes held as primary or
// backup. Each move goes from the most to the least loaded pserver and
// only when it narrows the gap (so the plan ends); a partition leaving a
// pserver goes preferably to a backup that holds it already (nothing to
// copy) when that one is about as loaded as the least. Partitions already
// moving (move_to set) count where they go and are not moved again. Empty
// when `stay` is.
// `measured`: sparse partitions' bytes (PartitionWeight).
std::vector<Move> PlanMoves(const google::protobuf::RepeatedPtrField<proto::PartitionInfo>& parts,
                            const std::vector<uint32_t>& stay, const std::set<uint32_t>& leaving,
                            const MeasuredBytes& measured = {});

}  // namespace strata::master

#endif  // STRATA_MASTER_PLACEMENT_H_
