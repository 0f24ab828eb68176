// Partitioning of dense tables and placement of partitions on pservers.
#ifndef STRATA_MASTER_PLACEMENT_H_
#define STRATA_MASTER_PLACEMENT_H_

#include <cstdint>
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

// Gives every partition up to `k` backups among the pservers `live`: keeps
// the live ones it has, drops the others, and adds for each missing one the
// least-loaded live pserver (bytes held as primary or backup; a sparse
// virtual partition counts as kSparsePartitionWeight) that is neither its
// owner nor already a backup. Fewer when there are not enough pservers.
// Returns how many backups were added or dropped.
inline constexpr uint64_t kSparsePartitionWeight = 1 << 16;
int TopUpBackups(google::protobuf::RepeatedPtrField<proto::PartitionInfo>* parts,
                 const std::vector<uint32_t>& live, int k);

}  // namespace strata::master

#endif  // STRATA_MASTER_PLACEMENT_H_
