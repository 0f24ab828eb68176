// Host file: which hosts run which daemons, in the spirit of MPI host files.
//
//   # comment
//   127.0.0.1   master pserver=2 worker=2
//   node-a      pserver          # "pserver" alone means pserver=1
//   node-b      worker=4
//   node-c      worker=0..4 pserver=1..2   # room to scale (strata scale)
//
// One host a line; the host (name or IPv4/IPv6 address) first, then
// role[=count] items with role in {master, pserver, worker}; counts are
// integers >= 1 (master only 1), or a range N..M: N started with the job
// (N >= 0), room for up to M there (M >= 1, M >= N) when the job scales
// out (docs/operations.md, "Scaling"). Comments (#...) and blank lines
// allowed. Each host appears once; one to three hosts run a master (more
// than one: a leader and standbys, which need cluster.etcd, see
// CheckMasterHosts); at least one pserver and one worker started with
// the job. Errors are
// InvalidArgument with a message "file:line: ..." naming the bad item.
//
// Instances are numbered per role in host file order: first those started
// with the job (0..N-1 over all hosts), then the room to scale (N..M-1),
// so a job's indices do not depend on its hosts' maxima.
#ifndef STRATA_COMMON_HOST_FILE_H_
#define STRATA_COMMON_HOST_FILE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata {

struct HostEntry {
  std::string host;
  int line = 0;      // 1-based line in the host file
  int masters = 0;   // 0 or 1
  int pservers = 0;  // started with the job
  int workers = 0;
  int max_pservers = 0;  // room on this host (>= the started ones)
  int max_workers = 0;
};

// One instance a host file has room for (HostFile::Slots).
struct HostSlot {
  std::string role;  // "pserver" or "worker"
  int index = 0;
  std::string host;
  bool initial = false;  // started with the job (else room to scale)
};

struct HostFile {
  std::string source;            // the file (ParseHostFile: its filename)
  std::vector<HostEntry> hosts;  // in file order

  // Started with the job.
  int total_pservers() const;
  int total_workers() const;
  // Room for, when the job scales out.
  int max_pservers() const;
  int max_workers() const;
  // Every pserver and worker instance, numbered as above: pservers first.
  std::vector<HostSlot> Slots() const;
  // The first host that runs a master (one exists after a successful parse).
  const HostEntry& master_host() const;
  // Every host that runs a master, in file order.
  std::vector<HostEntry> master_hosts() const;
};

inline constexpr size_t kMaxMasters = 3;

// More than one master needs etcd (docs/reliability.md, "Master high
// availability"): InvalidArgument naming the host file's master lines
// otherwise.
absl::Status CheckMasterHosts(const HostFile& hosts, bool etcd_configured);

absl::StatusOr<HostFile> ParseHostFile(const std::string& text, const std::string& filename);
absl::StatusOr<HostFile> LoadHostFile(const std::string& path);

// True for hosts the launcher runs as local processes: "localhost",
// any 127.x.y.z address and "::1".
bool IsLocalHost(const std::string& host);

}  // namespace strata

#endif  // STRATA_COMMON_HOST_FILE_H_
