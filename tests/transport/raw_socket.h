// A plain blocking IPv4 socket connected to "host:port", for tests that
// speak raw bytes to a transport.
#ifndef STRATA_TESTS_TRANSPORT_RAW_SOCKET_H_
#define STRATA_TESTS_TRANSPORT_RAW_SOCKET_H_

#include <arpa/inet.h>
#include <glog/logging.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "transport/tcp/tcp_transport.h"

namespace strata::transport::testing {

inline int RawConnect(const std::string& address) {
  std::string host;
  int port = 0;
  CHECK(tcp::SplitHostPort(address, &host, &port).ok());
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_port = htons(static_cast<uint16_t>(port));
  CHECK_EQ(::inet_pton(AF_INET, host.c_str(), &sin.sin_addr), 1);
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  CHECK_GE(fd, 0);
  CHECK_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&sin), sizeof(sin)), 0)
      << std::strerror(errno);
  return fd;
}

}  // namespace strata::transport::testing

#endif  // STRATA_TESTS_TRANSPORT_RAW_SOCKET_H_
