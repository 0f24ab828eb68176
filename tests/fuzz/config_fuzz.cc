// Fuzz target: the job configuration parser (common/config.h). The input is
// a YAML file; ParseJobConfig must answer with a Status, whatever it is.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/config.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  strata::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = strata::fuzz::AsString(data, size);
  absl::StatusOr<strata::JobConfig> config = strata::ParseJobConfig(text, "fuzz.yaml");
  if (config.ok()) {
    // A config that parsed is used: its names are printed, its sizes read.
    (void)strata::ConsistencyName(config->job.consistency);
  }
  return 0;
}
