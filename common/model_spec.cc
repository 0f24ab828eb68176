#include "common/model_spec.h"

#include "absl/strings/str_cat.h"
#include "common/hash.h"

namespace strata {

uint64_t TableSpec::num_elements() const {
  if (sparse) return 0;
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

std::vector<TableSpec> ModelTables(const ModelSection& model) {
  std::vector<TableSpec> tables;
  if (model.type == "dense") {
    for (size_t i = 0; i < model.dense_tables.size(); ++i) {
      tables.push_back({absl::StrCat("dense", i), {model.dense_tables[i]}, "zeros", 1, 1});
    }
    return tables;
  }
  if (model.type == "script") {
    for (const ScriptTableSection& t : model.tables) {
      TableSpec spec{t.name, t.shape, t.init, t.fan_in, t.fan_out};
      spec.sparse = t.dim > 0;
      spec.dim = t.dim;
      spec.allreduce = model.dense_sync == "allreduce" && !spec.sparse;
      tables.push_back(std::move(spec));
    }
    return tables;
  }
  std::vector<int> layers = model.layers;
  std::string prefix;
  if (model.type == "wide_deep") {
    TableSpec wide{"wide", {}, "zeros", 0, 0};
    wide.sparse = true;
    wide.dim = 1;
    TableSpec embedding{"embedding", {}, "", 0, 0};
    embedding.sparse = true;
    embedding.dim = model.embedding_dim;
    tables.push_back(wide);
    tables.push_back(embedding);
    tables.push_back({"wide.dense", {kCtrDenseFeatures}, "zeros", kCtrDenseFeatures, 1});
    layers = DeepLayers(model);
    prefix = "deep.";
  }
  for (size_t i = 0; i + 1 < layers.size(); ++i) {
    const uint64_t in = layers[i];
    const uint64_t out = layers[i + 1];
    tables.push_back(
        {absl::StrCat(prefix, "fc", i, ".weight"), {in, out}, "glorot_uniform", in, out});
    tables.push_back({absl::StrCat(prefix, "fc", i, ".bias"), {out}, "zeros", in, out});
  }
  if (model.dense_sync == "allreduce") {
    for (TableSpec& t : tables) t.allreduce = !t.sparse;
  }
  return tables;
}

std::vector<int> DeepLayers(const ModelSection& model) {
  std::vector<int> layers = {kCtrFields * model.embedding_dim + kCtrDenseFeatures};
  layers.insert(layers.end(), model.hidden.begin(), model.hidden.end());
  layers.push_back(1);
  return layers;
}

uint32_t SparsePartitionOf(uint64_t key, uint32_t partitions) {
  // splitmix64 over the key and a constant of its own, so the partition
  // does not correlate with a partition's index hash.
  return static_cast<uint32_t>(SplitMix64(key ^ 0x51ed270b27f5a6c3ull) % partitions);
}

}  // namespace strata
