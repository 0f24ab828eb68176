#include "common/host_file.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/config.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace strata {

int HostFile::total_pservers() const {
  int n = 0;
  for (const HostEntry& h : hosts) n += h.pservers;
  return n;
}

int HostFile::total_workers() const {
  int n = 0;
  for (const HostEntry& h : hosts) n += h.workers;
  return n;
}

int HostFile::max_pservers() const {
  int n = 0;
  for (const HostEntry& h : hosts) n += h.max_pservers;
  return n;
}

int HostFile::max_workers() const {
  int n = 0;
  for (const HostEntry& h : hosts) n += h.max_workers;
  return n;
}

std::vector<HostSlot> HostFile::Slots() const {
  std::vector<HostSlot> slots;
  for (const char* role : {"pserver", "worker"}) {
    const bool ps = role[0] == 'p';
    int index = 0;
    for (const HostEntry& h : hosts) {
      for (int i = 0; i < (ps ? h.pservers : h.workers); ++i) {
        slots.push_back({role, index++, h.host, true});
      }
    }
    for (const HostEntry& h : hosts) {
      const int room = ps ? h.max_pservers - h.pservers : h.max_workers - h.workers;
      for (int i = 0; i < room; ++i) slots.push_back({role, index++, h.host, false});
    }
  }
  return slots;
}

std::vector<HostEntry> HostFile::master_hosts() const {
  std::vector<HostEntry> out;
  for (const HostEntry& h : hosts) {
    if (h.masters == 1) out.push_back(h);
  }
  return out;
}

absl::Status CheckMasterHosts(const HostFile& hosts, bool etcd_configured) {
  const std::vector<HostEntry> masters = hosts.master_hosts();
  if (masters.size() > 1 && !etcd_configured) {
    std::vector<int> lines;
    for (const HostEntry& m : masters) lines.push_back(m.line);
    return absl::InvalidArgumentError(absl::StrCat(
        hosts.source, ": ", masters.size(), " masters (lines ", absl::StrJoin(lines, ", "),
        ") but the config has no cluster.etcd.endpoints: standby masters elect their leader "
        "and keep the job's state in etcd (docs/reliability.md); list one master or add "
        "cluster.etcd"));
  }
  return absl::OkStatus();
}

const HostEntry& HostFile::master_host() const {
  for (const HostEntry& h : hosts) {
    if (h.masters == 1) return h;
  }
  LOG(FATAL) << "host file " << source
             << " has no master; master_host() requires a parsed host file";
  return hosts.front();  // Not reached.
}

namespace {

constexpr char kRoles[] = "master, pserver[=N|=N..M] or worker[=N|=N..M]";

// Host names and addresses: letters, digits and . - _ (names, IPv4) and :
// (IPv6). Anything else (=, quotes, brackets...) is a typo.
bool IsValidHost(absl::string_view host) {
  for (char c : host) {
    if (!absl::ascii_isalnum(c) && c != '.' && c != '-' && c != '_' && c != ':') {
      return false;
    }
  }
  return !host.empty();
}

// Parses an unsigned decimal count; false on anything else or overflow.
bool ParseCount(absl::string_view text, int* out) {
  if (text.empty() || text.size() > 9) return false;
  for (char c : text) {
    if (!absl::ascii_isdigit(c)) return false;
  }
  return absl::SimpleAtoi(text, out);
}

// One role[=count|=N..M] item of a host's line into `entry`; the error's
// message (without the file and line) otherwise.
absl::Status ParseRoleItem(absl::string_view item, std::map<std::string, bool>* roles_seen,
                           HostEntry* entry) {
  const auto error = [](absl::string_view message) { return absl::InvalidArgumentError(message); };
  const std::size_t eq = item.find('=');
  const absl::string_view role = item.substr(0, eq);
  int* count = nullptr;
  int* max = nullptr;
  if (role == "master") {
    count = &entry->masters;
  } else if (role == "pserver") {
    count = &entry->pservers;
    max = &entry->max_pservers;
  } else if (role == "worker") {
    count = &entry->workers;
    max = &entry->max_workers;
  } else {
    return error(absl::StrCat("unknown role '", role, "' in '", item, "' (expected ", kRoles, ")"));
  }
  if ((*roles_seen)[std::string(role)]) {
    return error(absl::StrCat("role '", role, "' given twice for host '", entry->host, "'"));
  }
  (*roles_seen)[std::string(role)] = true;
  int n = 1;
  int most = 1;
  if (eq != absl::string_view::npos) {
    const absl::string_view value = item.substr(eq + 1);
    const std::size_t dots = value.find("..");
    if (dots != absl::string_view::npos) {
      if (max == nullptr) {
        return error(absl::StrCat("bad count in '", item, "' (a host runs one master: no range)"));
      }
      if (!ParseCount(value.substr(0, dots), &n) || !ParseCount(value.substr(dots + 2), &most) ||
          most < 1 || most < n) {
        return error(absl::StrCat("bad range in '", item,
                                  "' (expected N..M: N started with the job, "
                                  "room for M, 0 <= N <= M, M >= 1)"));
      }
    } else if (!ParseCount(value, &n) || n < 1) {
      return error(
          absl::StrCat("bad count in '", item, "' (expected an integer >= 1, or a range N..M)"));
    } else {
      most = n;
    }
  }
  if (count == &entry->masters && n != 1) {
    return error(absl::StrCat("bad count in '", item, "' (a host runs one master)"));
  }
  *count = n;
  if (max != nullptr) *max = most;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<HostFile> ParseHostFile(const std::string& text, const std::string& filename) {
  const auto error = [&filename](int line, absl::string_view message) {
    return absl::InvalidArgumentError(absl::StrCat(filename, ":", line, ": ", message));
  };
  HostFile file;
  file.source = filename;
  std::map<std::string, int> host_lines;  // host -> line of first appearance
  std::vector<int> master_lines;

  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    const std::size_t hash = line.find('#');
    if (hash != absl::string_view::npos) line = line.substr(0, hash);
    std::vector<absl::string_view> tokens =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r\f\v"), absl::SkipEmpty());
    if (tokens.empty()) continue;

    HostEntry entry;
    entry.host = std::string(tokens[0]);
    entry.line = line_no;
    if (absl::StrContains(tokens[0], '=')) {
      return error(line_no, absl::StrCat("'", tokens[0],
                                         "' is not a host name (each line "
                                         "starts with a host, then its roles)"));
    }
    if (!IsValidHost(tokens[0])) {
      return error(line_no,
                   absl::StrCat("bad host '", tokens[0], "' (expected a host name or IP address)"));
    }
    if (tokens.size() == 1) {
      return error(line_no, absl::StrCat("host '", tokens[0], "' has no roles (expected ", kRoles,
                                         " after the host)"));
    }
    std::map<std::string, bool> roles_seen;
    for (std::size_t i = 1; i < tokens.size(); ++i) {
      if (absl::Status st = ParseRoleItem(tokens[i], &roles_seen, &entry); !st.ok()) {
        return error(line_no, st.message());
      }
    }

    auto [it, inserted] = host_lines.emplace(entry.host, line_no);
    if (!inserted) {
      return error(line_no, absl::StrCat("duplicate host '", entry.host, "' (first on line ",
                                         it->second, ")"));
    }
    if (entry.masters > 0) {
      master_lines.push_back(line_no);
      if (master_lines.size() > kMaxMasters) {
        return error(line_no, absl::StrCat("more than ", kMaxMasters, " masters (lines ",
                                           absl::StrJoin(master_lines, ", "),
                                           "); one leads and at most two are standbys"));
      }
    }
    file.hosts.push_back(std::move(entry));
  }

  const auto file_error = [&filename](absl::string_view message) {
    return absl::InvalidArgumentError(absl::StrCat(filename, ": ", message));
  };
  if (file.hosts.empty()) {
    return file_error(
        "no hosts (expected lines like '127.0.0.1 master "
        "pserver=1 worker=1')");
  }
  if (master_lines.empty()) {
    return file_error("no master (one host must run master; two or three with etcd)");
  }
  if (file.total_pservers() == 0) {
    return file_error(
        "no pserver started with the job (at least one host must run pserver, e.g. "
        "pserver=1 or pserver=1..4)");
  }
  if (file.total_workers() == 0) {
    return file_error(
        "no worker started with the job (at least one host must run worker, e.g. "
        "worker=1 or worker=1..4)");
  }
  return file;
}

absl::StatusOr<HostFile> LoadHostFile(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(std::string text, ReadLocalFile(path));
  STRATA_ASSIGN_OR_RETURN(HostFile file, ParseHostFile(text, path));
  file.source = path;
  return file;
}

bool IsLocalHost(const std::string& host) {
  if (absl::EqualsIgnoreCase(host, "localhost")) return true;
  in_addr v4;
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) {
    // s_addr is in network byte order: the first byte is the first octet.
    unsigned char first = 0;
    std::memcpy(&first, &v4.s_addr, 1);
    return first == 127;
  }
  in6_addr v6;
  if (::inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    return std::memcmp(&v6, &in6addr_loopback, sizeof(v6)) == 0;
  }
  return false;
}

}  // namespace strata
