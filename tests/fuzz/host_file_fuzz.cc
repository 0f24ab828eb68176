// Fuzz target: the host file parser (common/host_file.h). The input is a host
// file; ParseHostFile must answer with a Status, and what it accepts must
// hold what launch.sh relies on: one master, at least one pserver and one
// worker.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/host_file.h"
#include "glog/logging.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  strata::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = strata::fuzz::AsString(data, size);
  absl::StatusOr<strata::HostFile> file = strata::ParseHostFile(text, "fuzz.hosts");
  if (!file.ok()) return 0;
  CHECK_GE(file->total_pservers(), 1);
  CHECK_GE(file->total_workers(), 1);
  const strata::HostEntry& master = file->master_host();
  CHECK_EQ(master.masters, 1);
  for (const strata::HostEntry& h : file->hosts) {
    CHECK(!h.host.empty());
    (void)strata::IsLocalHost(h.host);
  }
  return 0;
}
