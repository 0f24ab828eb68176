#include "common/model_spec.h"

#include "absl/strings/str_cat.h"

namespace strata {

uint64_t TableSpec::num_elements() const {
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
  for (size_t i = 0; i + 1 < model.layers.size(); ++i) {
    const uint64_t in = model.layers[i];
    const uint64_t out = model.layers[i + 1];
    tables.push_back({absl::StrCat("fc", i, ".weight"), {in, out},
                      "glorot_uniform", in, out});
    tables.push_back({absl::StrCat("fc", i, ".bias"), {out}, "zeros", in, out});
  }
  return tables;
}

}  // namespace strata
