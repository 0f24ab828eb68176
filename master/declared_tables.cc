#include "master/declared_tables.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace strata::master {
namespace {

std::string Describe(const proto::TableInfo& t) {
  if (t.sparse()) return absl::StrCat("sparse of dim ", t.dim());
  return absl::StrCat("dense [", absl::StrJoin(t.shape(), ", "), "]");
}

}  // namespace

absl::StatusOr<std::vector<proto::TableInfo>> MakeDeclaredTables(
    const google::protobuf::RepeatedPtrField<proto::TableInfo>& declared,
    uint32_t sparse_partitions, const std::string& who) {
  if (declared.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, " declared no tables (a model without parameters?)"));
  }
  if (declared.size() > kMaxDeclaredTables) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, " declared ", declared.size(), " tables; at most ", kMaxDeclaredTables));
  }
  std::vector<proto::TableInfo> out;
  std::set<std::string> names;
  for (int i = 0; i < declared.size(); ++i) {
    const proto::TableInfo& d = declared[i];
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": table ", i,
                       d.name().empty() ? "" : absl::StrCat(" (", d.name(), ")"), ": ", why));
    };
    if (d.name().empty()) return bad("has no name");
    if (!names.insert(d.name()).second) return bad("declared twice");
    proto::TableInfo t;
    t.set_id(static_cast<uint32_t>(i));
    t.set_name(d.name());
    if (d.sparse()) {
      if (d.dim() == 0 || d.dim() > kMaxDeclaredDim) {
        return bad(
            absl::StrCat("a sparse table needs a dim in 1..", kMaxDeclaredDim, ", got ", d.dim()));
      }
      if (!d.shape().empty()) return bad("a sparse table has a dim, not a shape");
      t.set_sparse(true);
      t.set_dim(d.dim());
      t.set_partitions(sparse_partitions);
    } else {
      if (d.shape().empty()) return bad("a dense table needs a shape");
      uint64_t n = 1;
      for (uint64_t e : d.shape()) {
        if (e == 0 || e > kMaxDeclaredElements || n > kMaxDeclaredElements / e) {
          return bad(absl::StrCat("shape [", absl::StrJoin(d.shape(), ", "),
                                  "] is empty or over 2^40 values"));
        }
        n *= e;
        t.add_shape(e);
      }
      t.set_num_elements(n);
      t.set_init("worker");
    }
    out.push_back(std::move(t));
  }
  return out;
}

absl::Status CompareDeclaredTables(
    const google::protobuf::RepeatedPtrField<proto::TableInfo>& tables,
    const std::vector<proto::TableInfo>& declared, const std::string& whose,
    const std::string& who) {
  const size_t n = std::max<size_t>(tables.size(), declared.size());
  for (size_t i = 0; i < n; ++i) {
    if (i >= declared.size()) {
      return absl::FailedPreconditionError(
          absl::StrCat("table ", tables[i].name(), " (", Describe(tables[i]), ") of ", whose,
                       " is not declared by ", who, ", which declares ", declared.size(),
                       " table(s), the job ", tables.size()));
    }
    const proto::TableInfo& d = declared[i];
    if (i >= static_cast<size_t>(tables.size())) {
      return absl::FailedPreconditionError(
          absl::StrCat("table ", d.name(), " (", Describe(d), ") declared by ", who,
                       " is not a table of the job (", whose, ": ", tables.size(), " table(s))"));
    }
    const proto::TableInfo& t = tables[i];
    const bool same_shape = t.sparse()
                                ? d.sparse() && d.dim() == t.dim()
                                : !d.sparse() && std::equal(t.shape().begin(), t.shape().end(),
                                                            d.shape().begin(), d.shape().end());
    if (t.name() != d.name() || !same_shape) {
      return absl::FailedPreconditionError(
          absl::StrCat("table ", i, " is ", d.name(), " (", Describe(d), ") in the model of ", who,
                       ", ", t.name(), " (", Describe(t), ") in ", whose,
                       ": every worker of the job must declare the same tables"));
    }
  }
  return absl::OkStatus();
}

}  // namespace strata::master
