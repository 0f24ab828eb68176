#include "common/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/daemon.h"
#include "common/metrics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace strata {
namespace {

using ::strata::testing::IsOk;
using ::strata::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// Sends `raw` to 127.0.0.1:port and returns everything the server answers.
std::string RawExchange(int port, const std::string& raw) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    ADD_FAILURE() << "connect failed";
    return "";
  }
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  send(fd, raw.data(), raw.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, n);
  close(fd);
  return out;
}

// Returns a port nothing listens on (bound once, then released).
int UnusedPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

class HttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_.Handle("/healthz", [](const HttpRequest&) {
      HttpResponse r;
      r.body = "ok\n";
      return r;
    });
    server_.Handle("/echo", [](const HttpRequest& req) {
      HttpResponse r;
      r.content_type = "application/json";
      r.body = absl::StrCat("{\"method\":\"", req.method, "\",\"path\":\"", req.path,
                            "\",\"query\":\"", req.query, "\"}");
      return r;
    });
    server_.Handle("/broken", [](const HttpRequest&) {
      HttpResponse r;
      r.status = 500;
      r.body = "boom";
      return r;
    });
    ASSERT_THAT(server_.Start("127.0.0.1", 0), IsOk());
    ASSERT_GT(server_.port(), 0);
  }

  HttpServer server_;
};

TEST_F(HttpServerTest, GetsRegisteredPath) {
  auto body = HttpGet("127.0.0.1", server_.port(), "/healthz");
  ASSERT_THAT(body, IsOk());
  EXPECT_EQ(*body, "ok\n");
}

TEST_F(HttpServerTest, PassesPathAndQueryToHandler) {
  auto body = HttpGet("127.0.0.1", server_.port(), "/echo?a=1&b=2");
  ASSERT_THAT(body, IsOk());
  EXPECT_EQ(*body, "{\"method\":\"GET\",\"path\":\"/echo\",\"query\":\"a=1&b=2\"}");
}

TEST_F(HttpServerTest, UnknownPathIs404) {
  auto body = HttpGet("127.0.0.1", server_.port(), "/nope");
  EXPECT_THAT(body, StatusIs(absl::StatusCode::kInternal, HasSubstr("404")));
  EXPECT_THAT(body, StatusIs(absl::StatusCode::kInternal,
                             HasSubstr(absl::StrCat("127.0.0.1:", server_.port()))));
}

TEST_F(HttpServerTest, HandlerErrorStatusIsInternal) {
  EXPECT_THAT(HttpGet("127.0.0.1", server_.port(), "/broken"),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("500")));
}

TEST_F(HttpServerTest, ResponseCarriesHeaders) {
  std::string response = RawExchange(server_.port(), "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_THAT(response, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(response, HasSubstr("Content-Type: application/json\r\n"));
  EXPECT_THAT(response, HasSubstr("Content-Length: 42\r\n"));
  EXPECT_THAT(response, HasSubstr("Connection: close\r\n"));
}

TEST_F(HttpServerTest, HeadSendsHeadersOnly) {
  std::string response = RawExchange(server_.port(), "HEAD /healthz HTTP/1.1\r\n\r\n");
  EXPECT_THAT(response, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(response, HasSubstr("Content-Length: 3\r\n"));
  EXPECT_THAT(response, ::testing::EndsWith("\r\n\r\n"));
}

TEST_F(HttpServerTest, OtherMethodsAre405) {
  std::string response = RawExchange(server_.port(), "POST /healthz HTTP/1.1\r\n\r\n");
  EXPECT_THAT(response, StartsWith("HTTP/1.1 405 "));
  EXPECT_THAT(response, HasSubstr("Allow: GET, HEAD\r\n"));
}

TEST_F(HttpServerTest, MalformedRequestLineIs400) {
  EXPECT_THAT(RawExchange(server_.port(), "garbage\r\n\r\n"), StartsWith("HTTP/1.1 400 "));
}

TEST_F(HttpServerTest, OversizedRequestIsRejected) {
  std::string raw = "GET /healthz HTTP/1.1\r\nX-Big: ";
  raw += std::string(20 * 1024, 'a');
  raw += "\r\n\r\n";
  EXPECT_THAT(RawExchange(server_.port(), raw), StartsWith("HTTP/1.1 431 "));
  // The server is still serving.
  EXPECT_THAT(HttpGet("127.0.0.1", server_.port(), "/healthz"), IsOk());
}

TEST_F(HttpServerTest, IncompleteRequestTimesOutAndServerRecovers) {
  // Connect and send half a request; the server gives up after ~2 s.
  std::thread slow([port = server_.port()] {
    std::string response = RawExchange(port, "GET /healthz HTTP/1.1\r\n");
    EXPECT_THAT(response, StartsWith("HTTP/1.1 408 "));
  });
  auto body = HttpGet("127.0.0.1", server_.port(), "/healthz", absl::Seconds(10));
  EXPECT_THAT(body, IsOk());
  slow.join();
}

TEST_F(HttpServerTest, ConcurrentGets) {
  constexpr int kThreads = 8;
  constexpr int kPerThread = 10;
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        auto body = HttpGet("127.0.0.1", server_.port(), absl::StrCat("/echo?t=", t, "&i=", i));
        if (body.ok() && *body == absl::StrCat("{\"method\":\"GET\",\"path\":\"/echo\","
                                               "\"query\":\"t=",
                                               t, "&i=", i, "\"}")) {
          ++ok;
        } else {
          ADD_FAILURE() << body.status();
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok.load(), kThreads * kPerThread);
}

TEST_F(HttpServerTest, ShutdownIsIdempotentAndStopsServing) {
  const int port = server_.port();
  server_.Shutdown();
  server_.Shutdown();
  EXPECT_THAT(HttpGet("127.0.0.1", port, "/healthz", absl::Seconds(2)),
              StatusIs(absl::StatusCode::kUnavailable));
}

TEST_F(HttpServerTest, SecondStartFails) {
  EXPECT_THAT(server_.Start("127.0.0.1", 0), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(HttpServerStandaloneTest, ShutdownWithoutStartIsFine) {
  HttpServer server;
  server.Shutdown();
  server.Shutdown();
}

TEST(HttpServerStandaloneTest, BindingABusyPortFailsNamingTheAddress) {
  HttpServer first;
  ASSERT_THAT(first.Start("127.0.0.1", 0), IsOk());
  HttpServer second;
  EXPECT_THAT(second.Start("127.0.0.1", first.port()),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr(absl::StrCat("127.0.0.1:", first.port()))));
}

TEST(HttpGetTest, ClosedPortIsUnavailableNamingTheAddress) {
  const int port = UnusedPort();
  EXPECT_THAT(
      HttpGet("127.0.0.1", port, "/metrics", absl::Seconds(2)),
      StatusIs(absl::StatusCode::kUnavailable, HasSubstr(absl::StrCat("127.0.0.1:", port))));
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// The endpoints every daemon serves, from one function (common/daemon.h).
TEST(StandardEndpointsTest, MetricsHealthStatusAndLogs) {
  MetricsRegistry metrics;
  metrics.GetCounter("strata_test_things_total", "Things")->Increment();
  HttpServer http;
  ServeStandardEndpoints(&http, &metrics, [] {
    return HttpResponse{200, "application/json", "{\"node_id\": 7}\n"};
  });
  ASSERT_THAT(http.Start("127.0.0.1", 0), ::strata::testing::IsOk());
  auto get = [&](const std::string& path) {
    return RawExchange(http.port(), "GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n");
  };
  EXPECT_THAT(get("/metrics"), AllOf(HasSubstr("200 OK"), HasSubstr("strata_test_things_total 1")));
  EXPECT_THAT(get("/healthz"), AllOf(HasSubstr("200 OK"), HasSubstr("\r\n\r\nok\n")));
  EXPECT_THAT(get("/status"), AllOf(HasSubstr("application/json"), HasSubstr("{\"node_id\": 7}")));
  EXPECT_THAT(get("/logs?lines=bad"), HasSubstr("400"));
  http.Shutdown();
}

}  // namespace
}  // namespace strata
