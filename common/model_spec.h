// The parameter tables a model declares. Shared by the master (placement),
// the pservers (initialisation) and the workers (layout), so all three agree
// on names, shapes and order without talking.
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
  std::string init;             // "glorot_uniform" | "zeros"
  uint64_t fan_in = 0;
  uint64_t fan_out = 0;

  uint64_t num_elements() const;
};

// Tables of an MLP with model.layers = [d0, d1, ..., dn]: for each layer i,
// "fc<i>.weight" of shape {d_i, d_{i+1}} and "fc<i>.bias" of shape {d_{i+1}}.
// For model.type "dense": "dense<i>" of shape {dense_tables[i]}, zeros.
std::vector<TableSpec> ModelTables(const ModelSection& model);

}  // namespace strata

#endif  // STRATA_COMMON_MODEL_SPEC_H_
