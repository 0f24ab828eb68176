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
#include "absl/time/clock.h"

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
  // Every address the name has: a daemon binds the first, but one in use
  // (127.0.0.1 of localhost, say) is in use whatever the others.
  int err = 0;
  bool bound_any = false;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      if (err == 0) err = errno;
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0) {
      bound_any = true;
    } else if (errno == EADDRINUSE || err == 0) {
      err = errno;
    }
    close(fd);
  }
  if (bound_any && err != EADDRINUSE) err = 0;
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
    args.insert(args.end(),
                {"--rdma", "true", "--register-bytes", std::to_string(req.register_bytes),
                 "--rdma-port", std::to_string(req.rdma_settings.port), "--gid-index",
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
  if (argv.empty()) return r;
  // Everything the child needs, made before fork.
  std::vector<char*> cargv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  const std::string exec_failed = absl::StrCat(argv[0], ": cannot run it\n");
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0) {
    r.output = absl::StrCat("pipe: ", std::strerror(errno));
    return r;
  }
  const int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
  const pid_t pid = fork();
  if (pid < 0) {
    r.output = absl::StrCat("fork: ", std::strerror(errno));
    close(pipefd[0]);
    close(pipefd[1]);
    if (devnull >= 0) close(devnull);
    return r;
  }
  if (pid == 0) {
    setpgid(0, 0);  // its own group: killed with its children at the timeout
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    dup2(pipefd[1], STDOUT_FILENO);
    dup2(pipefd[1], STDERR_FILENO);
    execvp(cargv[0], cargv.data());
    (void)!write(STDOUT_FILENO, exec_failed.data(), exec_failed.size());
    _exit(127);
  }
  setpgid(pid, pid);  // (either side may run first)
  close(pipefd[1]);
  if (devnull >= 0) close(devnull);
  const absl::Time deadline = absl::Now() + timeout;
  // Read until the output ends, but stop waiting for it shortly after the
  // child has exited: something it started (an ssh control master) may
  // keep the pipe open long after.
  absl::Time exited_at = absl::InfiniteFuture();
  int status = 0;
  bool reaped = false;
  char buf[4096];
  while (true) {
    if (!reaped && waitpid(pid, &status, WNOHANG) == pid) {
      reaped = true;
      exited_at = absl::Now();
    }
    const absl::Time now = absl::Now();
    if (now >= deadline && !reaped) {
      r.timed_out = true;
      kill(-pid, SIGKILL);
      break;
    }
    if (reaped && now - exited_at > absl::Milliseconds(200)) break;
    pollfd p{pipefd[0], POLLIN, 0};
    const int n = poll(&p, 1, 20);
    if (n < 0 && errno != EINTR) break;
    if (n <= 0) continue;
    const ssize_t got = read(pipefd[0], buf, sizeof(buf));
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got <= 0) {
      if (reaped) break;
      // The output ended: wait for the exit itself (to the deadline).
      while (!reaped && absl::Now() < deadline) {
        if (waitpid(pid, &status, WNOHANG) == pid) {
          reaped = true;
        } else {
          absl::SleepFor(absl::Milliseconds(10));
        }
      }
      if (!reaped) {
        r.timed_out = true;
        kill(-pid, SIGKILL);
      }
      break;
    }
    r.output.append(buf, static_cast<size_t>(got));
  }
  close(pipefd[0]);
  if (!reaped) {
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
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
