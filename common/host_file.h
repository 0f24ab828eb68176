// Host file: which hosts run which daemons, in the spirit of MPI host files.
//
//   # comment
//   127.0.0.1   master pserver=2 worker=2
//   node-a      pserver          # "pserver" alone means pserver=1
//   node-b      worker=4
//
// One host a line; the host (name or IPv4/IPv6 address) first, then
// role[=count] items with role in {master, pserver, worker}; counts are
// integers >= 1 (master only 1). Comments (#...) and blank lines allowed.
// Each host appears once; exactly one master in the file; at least one
// pserver and one worker in total. Errors are InvalidArgument with a message
// "file:line: ..." naming the bad item.
#ifndef STRATA_COMMON_HOST_FILE_H_
#define STRATA_COMMON_HOST_FILE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata {

struct HostEntry {
  std::string host;
  int line = 0;     // 1-based line in the host file
  int masters = 0;  // 0 or 1
  int pservers = 0;
  int workers = 0;
};

struct HostFile {
  std::string source;
  std::vector<HostEntry> hosts;  // in file order

  int total_pservers() const;
  int total_workers() const;
  // The host that runs the master (exactly one exists after a successful parse).
  const HostEntry& master_host() const;
};

absl::StatusOr<HostFile> ParseHostFile(const std::string& text, const std::string& filename);
absl::StatusOr<HostFile> LoadHostFile(const std::string& path);

// True for hosts the launcher runs as local processes: "localhost",
// any 127.x.y.z address and "::1".
bool IsLocalHost(const std::string& host);

}  // namespace strata

#endif  // STRATA_COMMON_HOST_FILE_H_
