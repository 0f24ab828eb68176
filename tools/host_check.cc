#include "tools/host_check.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace strata::tools {
namespace {

using transport::rdma::PreflightFinding;
using transport::rdma::PreflightReport;

// Binds host:port as a daemon would (SO_REUSEADDR, as gRPC and the data
// plane do) and lets go at once.
PreflightFinding CheckPort(const std::string& host, int port) {
  PreflightFinding f;
  f.check = absl::StrCat("port ", port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const int gai = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (gai != 0) {
    f.ok = false;
    f.detail = absl::StrCat("cannot resolve ", host, ": ", gai_strerror(gai));
    f.fix = "use an address or a name this host resolves";
    return f;
  }
  int err = 0;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    const bool bound = bind(fd, a->ai_addr, a->ai_addrlen) == 0;
    err = bound ? 0 : errno;
    close(fd);
    if (bound) break;
  }
  freeaddrinfo(res);
  if (err == 0) {
    f.detail = absl::StrCat(host, ":", port, " is free");
  } else if (err == EADDRINUSE) {
    f.ok = false;
    f.detail = absl::StrCat(host, ":", port, " is in use");
    f.fix = absl::StrCat("stop what listens there (ss -ltnp 'sport = :", port,
                         "') or move cluster.ports in the config");
  } else if (err == EADDRNOTAVAIL) {
    f.ok = false;
    f.detail = absl::StrCat(host, " is not an address of this host");
    f.fix = "the host file must name each host by an address it has";
  } else {
    f.ok = false;
    f.detail = absl::StrCat("cannot bind ", host, ":", port, ": ", std::strerror(err));
  }
  return f;
}

}  // namespace

PreflightReport CheckThisHost(const HostCheckRequest& req) {
  PreflightReport report;
  for (int port : req.ports) report.findings.push_back(CheckPort(req.host, port));
  if (req.rdma) {
    auto devices = transport::rdma::ListRdmaDevices();
    if (!devices.ok()) {
      report.findings.push_back(
          {false, "devices", std::string(devices.status().message()), "build with rdma-core"});
    } else {
      PreflightReport r = transport::rdma::RdmaPreflight(
          *devices, req.rdma_settings, transport::rdma::MemlockLimitBytes(), req.register_bytes);
      report.findings.insert(report.findings.end(), r.findings.begin(), r.findings.end());
    }
  }
  return report;
}

std::vector<std::string> HostCheckArgs(const HostCheckRequest& req) {
  std::vector<std::string> args = {"host-check", "--bind", req.host, "--ports",
                                   absl::StrJoin(req.ports, ",")};
  if (req.rdma) {
    args.insert(args.end(), {"--rdma", "true", "--register-bytes",
                             std::to_string(req.register_bytes), "--rdma-port",
                             std::to_string(req.rdma_settings.port), "--gid-index",
                             std::to_string(req.rdma_settings.gid_index)});
    if (!req.rdma_settings.device.empty()) {
      args.insert(args.end(), {"--rdma-device", req.rdma_settings.device});
    }
  }
  return args;
}

absl::StatusOr<HostCheckRequest> ParseHostCheckArgs(const std::vector<std::string>& args) {
  HostCheckRequest req;
  for (size_t i = 1; i + 1 < args.size(); i += 2) {
    const std::string& k = args[i];
    const std::string& v = args[i + 1];
    bool ok = true;
    if (k == "--bind") {
      req.host = v;
    } else if (k == "--ports") {
      for (absl::string_view p : absl::StrSplit(v, ',', absl::SkipEmpty())) {
        int port;
        ok = ok && absl::SimpleAtoi(p, &port) && port > 0 && port < 65536;
        req.ports.push_back(port);
      }
    } else if (k == "--rdma") {
      req.rdma = v == "true";
    } else if (k == "--register-bytes") {
      ok = absl::SimpleAtoi(v, &req.register_bytes);
    } else if (k == "--rdma-port") {
      ok = absl::SimpleAtoi(v, &req.rdma_settings.port);
    } else if (k == "--gid-index") {
      ok = absl::SimpleAtoi(v, &req.rdma_settings.gid_index);
    } else if (k == "--rdma-device") {
      req.rdma_settings.device = v;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", k));
    }
    if (!ok) return absl::InvalidArgumentError(absl::StrCat(k, " ", v, ": not a valid value"));
  }
  if ((args.size() - 1) % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(args.back(), " needs a value"));
  }
  if (req.host.empty()) return absl::InvalidArgumentError("--bind HOST is required");
  return req;
}

bool IsLocalHost(const std::string& host) {
  return host == "localhost" || host == "LOCALHOST" || host == "::1" ||
         absl::StartsWith(host, "127.");
}

CommandResult RunCommand(const std::vector<std::string>& argv, absl::Duration timeout) {
  CommandResult r;
  int pipefd[2];
  if (argv.empty() || pipe2(pipefd, O_CLOEXEC) != 0) return r;
  const pid_t pid = fork();
  if (pid < 0) {
    close(pipefd[0]);
    close(pipefd[1]);
    r.output = absl::StrCat("fork: ", std::strerror(errno));
    return r;
  }
  if (pid == 0) {
    const int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    dup2(pipefd[1], STDOUT_FILENO);
    dup2(pipefd[1], STDERR_FILENO);
    setpgid(0, 0);  // killed with its children at the timeout
    std::vector<char*> cargv;
    for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
    cargv.push_back(nullptr);
    execvp(cargv[0], cargv.data());
    const std::string msg = absl::StrCat(argv[0], ": ", std::strerror(errno), "\n");
    (void)!write(STDOUT_FILENO, msg.data(), msg.size());
    _exit(127);
  }
  close(pipefd[1]);
  const absl::Time deadline = absl::Now() + timeout;
  char buf[4096];
  while (true) {
    const int left = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    if (left <= 0) {
      r.timed_out = true;
      kill(-pid, SIGKILL);
      break;
    }
    pollfd p{pipefd[0], POLLIN, 0};
    const int n = poll(&p, 1, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;
    const ssize_t got = read(pipefd[0], buf, sizeof(buf));
    if (got <= 0) break;
    r.output.append(buf, static_cast<size_t>(got));
  }
  close(pipefd[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!r.timed_out) {
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  return r;
}

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

}  // namespace strata::tools
