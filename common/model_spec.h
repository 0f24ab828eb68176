// The parameter tables a model declares. Shared by the master (placement),
// the pservers (initialisation) and the workers (layout), so all three agree
// on names, shapes and order without talking. Tables a training script
// declares (ScriptDeclaresTables) are not here: the master takes them from
// the script's first worker (master/declared_tables.h) and the cluster view
// carries them to everyone.
#ifndef STRATA_COMMON_MODEL_SPEC_H_
#define STRATA_COMMON_MODEL_SPEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/config.h"

namespace strata {

struct TableSpec {
  std::string name;             // "fc0.weight", "fc0.bias", ...
  std::vector<uint64_t> shape;  // weight: {in, out} row-major; bias: {out}
  std::string init;             // dense: "glorot_uniform" | "torch_default" | "zeros";
                                // sparse: "zeros" | "" (the config's sparse.init)
  uint64_t fan_in = 0;
  uint64_t fan_out = 0;
  // A sparse table: uint64 key -> row of `dim` floats (docs/sparse.md);
  // shape is empty and num_elements() 0.
  bool sparse = false;
  int dim = 0;
  // A dense table kept in step by allreduce among the workers
  // (model.dense_sync: allreduce): no pserver holds it.
  bool allreduce = false;

  uint64_t num_elements() const;
};

// The width of a CTR example (the Criteo format, docs/ctr-data.md).
inline constexpr int kCtrDenseFeatures = 13;
inline constexpr int kCtrFields = 26;

// Tables of an MLP with model.layers = [d0, d1, ..., dn]: for each layer i,
// "fc<i>.weight" of shape {d_i, d_{i+1}} and "fc<i>.bias" of shape {d_{i+1}}.
// For model.type "dense": "dense<i>" of shape {dense_tables[i]}, zeros.
// For model.type "wide_deep" (in this order): "wide" (sparse, dim 1, zeros:
// the wide part's weight of each categorical feature), "embedding" (sparse,
// dim embedding_dim, sparse.init), "wide.dense" {13} zeros (the wide part's
// dense weights), then the deep MLP's "deep.fc<i>.weight" / "deep.fc<i>.bias"
// over widths [26 * embedding_dim + 13, hidden..., 1].
// For model.type "script": model.tables as the config gives them (init and
// fans resolved by the config reader).
// With model.dense_sync allreduce the dense tables are marked `allreduce`.
std::vector<TableSpec> ModelTables(const ModelSection& model);
// model.type script without model.tables: the training script declares
// its tables when it starts (docs/python.md) and ModelTables is empty.
inline bool ScriptDeclaresTables(const ModelSection& model) {
  return model.type == "script" && model.tables.empty();
}
// The deep part's layer widths of a wide_deep model.
std::vector<int> DeepLayers(const ModelSection& model);

// The virtual partition (0..partitions-1) of a sparse table that holds
// `key`. Workers route by it and pservers are placed by it: it never
// changes (checkpoints depend on it).
uint32_t SparsePartitionOf(uint64_t key, uint32_t partitions);

}  // namespace strata

#endif  // STRATA_COMMON_MODEL_SPEC_H_
