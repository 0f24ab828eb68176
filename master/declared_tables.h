// Tables declared by a training script (model.type script without
// model.tables; docs/python.md): what the master checks in a declaration
// (proto::Master.DeclareTables) and how it compares two of them. The
// first worker's declaration becomes the job's tables; every later one
// must be the same, and the first table that differs is named.
#ifndef STRATA_MASTER_DECLARED_TABLES_H_
#define STRATA_MASTER_DECLARED_TABLES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "google/protobuf/repeated_field.h"
#include "proto/strata.pb.h"

namespace strata::master {

// At most this many tables, each of at most kMaxDeclaredElements values
// (2^40, as model.tables allows) and sparse rows of at most kMaxDeclaredDim.
inline constexpr int kMaxDeclaredTables = 100000;
inline constexpr uint64_t kMaxDeclaredElements = uint64_t{1} << 40;
inline constexpr uint32_t kMaxDeclaredDim = 65536;

// The job's tables made from `declared` (`who` declared them: "worker 0
// (node 3)"): ids in order, element counts, init "worker" for dense ones
// (their values come from the declaring worker) and "" for sparse ones
// (the config's sparse.init), `sparse_partitions` virtual partitions each.
// InvalidArgument naming the table and `who` when one is malformed: no
// name or a name twice, a dense table without a shape or with a 0 or
// oversized extent, a sparse one without a dim; or none at all.
absl::StatusOr<std::vector<proto::TableInfo>> MakeDeclaredTables(
    const google::protobuf::RepeatedPtrField<proto::TableInfo>& declared,
    uint32_t sparse_partitions, const std::string& who);

// FailedPrecondition naming the first table where `declared` (by `who`)
// differs from the job's `tables` (which `whose` describes: "the tables
// declared by worker 0 (node 3)", "the config's model.tables"), or OK.
absl::Status CompareDeclaredTables(
    const google::protobuf::RepeatedPtrField<proto::TableInfo>& tables,
    const std::vector<proto::TableInfo>& declared, const std::string& whose,
    const std::string& who);

}  // namespace strata::master

#endif  // STRATA_MASTER_DECLARED_TABLES_H_
