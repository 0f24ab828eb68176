// A real single-member etcd (Debian's etcd-server) for the tests of the
// master's high availability: started on free ports of 127.0.0.1 with a
// fresh data directory, killed and removed by the destructor.
#ifndef STRATA_TESTS_TESTING_ETCD_PROCESS_H_
#define STRATA_TESTS_TESTING_ETCD_PROCESS_H_

#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace strata::testing {

inline constexpr char kEtcdBinary[] = "/usr/bin/etcd";

// A port of 127.0.0.1 free now (bound and released).
inline int FreeLocalPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

class EtcdProcess {
 public:
  static bool Installed() { return access(kEtcdBinary, X_OK) == 0; }

  // TLS, when given: the server's certificate and key, and the CA its
  // clients' certificates must be signed by (client-cert-auth).
  struct Tls {
    std::string cert, key, ca;
  };
  explicit EtcdProcess(const Tls* tls = nullptr) {
    char tmpl[] = "/tmp/strata-etcd-test-XXXXXX";
    dir_ = mkdtemp(tmpl);
    client_port_ = FreeLocalPort();
    const int peer_port = FreeLocalPort();
    const std::string client =
        absl::StrCat(tls != nullptr ? "https" : "http", "://127.0.0.1:", client_port_);
    const std::string peer = absl::StrCat("http://127.0.0.1:", peer_port);
    std::vector<std::string> args = {kEtcdBinary,
                                     "--name=t",
                                     "--data-dir=" + dir_ + "/data",
                                     "--listen-client-urls=" + client,
                                     "--advertise-client-urls=" + client,
                                     "--listen-peer-urls=" + peer,
                                     "--initial-advertise-peer-urls=" + peer,
                                     "--initial-cluster=t=" + peer,
                                     "--log-outputs=" + dir_ + "/etcd.log",
                                     "--logger=zap"};
    if (tls != nullptr) {
      args.push_back("--cert-file=" + tls->cert);
      args.push_back("--key-file=" + tls->key);
      args.push_back("--trusted-ca-file=" + tls->ca);
      args.push_back("--client-cert-auth");
    }
    pid_ = fork();
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
  }
  ~EtcdProcess() {
    Kill();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  EtcdProcess(const EtcdProcess&) = delete;
  EtcdProcess& operator=(const EtcdProcess&) = delete;

  std::string endpoint() const { return absl::StrCat("127.0.0.1:", client_port_); }
  void Kill() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  // Stops (SIGSTOP) or resumes (SIGCONT) it: a member that does not answer.
  void Pause(bool paused) {
    if (pid_ > 0) kill(pid_, paused ? SIGSTOP : SIGCONT);
  }

 private:
  std::string dir_;
  int client_port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_ETCD_PROCESS_H_
