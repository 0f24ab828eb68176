#include "transport/tcp/tcp_transport.h"

#include <arpa/inet.h>
#include <glog/logging.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/transport/raw_socket.h"
#include "tests/transport/transport_contract_tests.h"
#include "transport/transport.h"

namespace strata::transport::tcp {
namespace {

using ::strata::testing::IsOk;
using ::strata::testing::StatusIs;
using ::strata::transport::testing::CallResult;
using ::strata::transport::testing::Capture;
using ::strata::transport::testing::EchoHandler;
using ::strata::transport::testing::FullHeader;
using ::strata::transport::testing::kWait;
using ::strata::transport::testing::Pattern;
using ::strata::transport::testing::RawConnect;
using ::strata::transport::testing::TransportContractTest;
using ::testing::HasSubstr;

INSTANTIATE_TEST_SUITE_P(Tcp, TransportContractTest, ::testing::Values("tcp"));

std::unique_ptr<Transport> NewTcp(uint64_t max_payload_bytes = 1ull << 31) {
  TransportOptions options;
  options.kind = "tcp";
  options.max_payload_bytes = max_payload_bytes;
  auto transport = CreateTransport(options);
  CHECK(transport.ok()) << transport.status();
  return std::move(transport).value();
}

uint64_t ReadLe(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) {
    v = (v << 8) | static_cast<unsigned char>(p[i]);
  }
  return v;
}

// True when the peer closes `fd` (EOF or reset) within `timeout`.
bool WaitForClose(int fd, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  char buf[4096];
  while (absl::Now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    const int rc = ::poll(&p, 1, 100);
    if (rc <= 0) continue;
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n == 0) return true;
    if (n < 0 && errno != EINTR && errno != EAGAIN) return true;
  }
  return false;
}

TEST(FrameHeaderTest, EncodesDocumentedLayout) {
  MessageHeader h = FullHeader(MessageType::kPushRequest);
  h.status = 5;
  h.request_id = 0x4142434445464748ull;
  char buf[kFrameHeaderBytes];
  EncodeFrameHeader(h, 0x0000000012345678ull, buf);
  EXPECT_EQ(std::string(buf, 4), "STR1");
  EXPECT_EQ(ReadLe(buf + 0, 4), 0x31525453u);
  EXPECT_EQ(ReadLe(buf + 4, 2), 1u);
  EXPECT_EQ(ReadLe(buf + 6, 2), 3u);  // kPushRequest
  EXPECT_EQ(ReadLe(buf + 8, 2), 5u);
  EXPECT_EQ(ReadLe(buf + 10, 2), 0u);
  EXPECT_EQ(ReadLe(buf + 12, 4), h.sender_id);
  EXPECT_EQ(static_cast<unsigned char>(buf[12]), 0xD4);  // little-endian
  EXPECT_EQ(ReadLe(buf + 16, 8), h.epoch);
  EXPECT_EQ(ReadLe(buf + 24, 8), h.request_id);
  EXPECT_EQ(ReadLe(buf + 32, 8), h.seq);
  EXPECT_EQ(ReadLe(buf + 40, 4), h.partition);
  EXPECT_EQ(ReadLe(buf + 44, 4), h.flags);
  EXPECT_EQ(ReadLe(buf + 48, 8), h.version);
  EXPECT_EQ(ReadLe(buf + 56, 8), h.count);
  EXPECT_EQ(ReadLe(buf + 64, 8), 0x12345678u);

  MessageHeader decoded;
  uint64_t payload_bytes = 0;
  ASSERT_THAT(DecodeFrameHeader(buf, 1ull << 31, &decoded, &payload_bytes), IsOk());
  EXPECT_EQ(payload_bytes, 0x12345678u);
  EXPECT_EQ(decoded.type, h.type);
  EXPECT_EQ(decoded.status, h.status);
  EXPECT_EQ(decoded.sender_id, h.sender_id);
  EXPECT_EQ(decoded.epoch, h.epoch);
  EXPECT_EQ(decoded.request_id, h.request_id);
  EXPECT_EQ(decoded.seq, h.seq);
  EXPECT_EQ(decoded.partition, h.partition);
  EXPECT_EQ(decoded.flags, h.flags);
  EXPECT_EQ(decoded.version, h.version);
  EXPECT_EQ(decoded.count, h.count);
}

TEST(FrameHeaderTest, RejectsMalformedHeaders) {
  char good[kFrameHeaderBytes];
  EncodeFrameHeader(FullHeader(MessageType::kPing), 100, good);
  MessageHeader h;
  uint64_t n;

  char bad[kFrameHeaderBytes];
  std::memcpy(bad, good, sizeof(bad));
  bad[0] = 'X';
  EXPECT_THAT(DecodeFrameHeader(bad, 1000, &h, &n),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("magic")));

  std::memcpy(bad, good, sizeof(bad));
  bad[4] = 2;
  EXPECT_THAT(DecodeFrameHeader(bad, 1000, &h, &n),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("version 2")));

  std::memcpy(bad, good, sizeof(bad));
  bad[6] = 99;
  EXPECT_THAT(DecodeFrameHeader(bad, 1000, &h, &n),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("type 99")));

  std::memcpy(bad, good, sizeof(bad));
  bad[6] = 0;  // kInvalid
  EXPECT_THAT(DecodeFrameHeader(bad, 1000, &h, &n),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("type 0")));

  EXPECT_THAT(DecodeFrameHeader(good, 99, &h, &n),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("exceeds max_payload_bytes 99")));
  EXPECT_THAT(DecodeFrameHeader(good, 100, &h, &n), IsOk());
}

TEST(TcpTransportTest, BadFramesCloseOnlyTheOffendingConnection) {
  auto server = NewTcp();
  auto client = NewTcp();
  ASSERT_THAT(server->Listen("127.0.0.1", 0, EchoHandler), IsOk());
  const std::string address = server->listen_address();
  STRATA_ASSERT_OK_AND_ASSIGN(auto conn, client->Connect(address));

  char valid[kFrameHeaderBytes];
  EncodeFrameHeader(FullHeader(MessageType::kPing), 0, valid);
  struct Case {
    const char* name;
    std::string bytes;
  };
  std::vector<Case> cases;
  cases.push_back({"garbage", std::string(200, 'x')});
  std::string bad_magic(valid, kFrameHeaderBytes);
  bad_magic[3] = '2';
  cases.push_back({"bad magic", bad_magic});
  std::string bad_version(valid, kFrameHeaderBytes);
  bad_version[4] = 7;
  cases.push_back({"bad version", bad_version});
  std::string bad_type(valid, kFrameHeaderBytes);
  bad_type[6] = 42;
  cases.push_back({"unknown type", bad_type});
  // A valid frame followed by garbage: the first is answered, then closed.
  cases.push_back(
      {"valid then garbage", std::string(valid, kFrameHeaderBytes) + std::string(72, 0)});

  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const int fd = RawConnect(address);
    ASSERT_EQ(::write(fd, c.bytes.data(), c.bytes.size()), static_cast<ssize_t>(c.bytes.size()));
    EXPECT_TRUE(WaitForClose(fd, absl::Seconds(10)));
    ::close(fd);

    // Everyone else is still served.
    Message ping;
    ping.header.type = MessageType::kPing;
    ping.payload = "still there?";
    STRATA_ASSERT_OK_AND_ASSIGN(Message pong, conn->CallSync(ping, kWait));
    EXPECT_EQ(pong.payload, "still there?");
    EXPECT_TRUE(conn->healthy());
  }
}

// Resident memory of this process in bytes.
uint64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

// Frames that claim a huge payload (within the limit) and then send little
// or stop mid-payload: the connection is closed when the peer goes, memory
// grows only with what was sent, and the server keeps serving.
TEST(TcpTransportTest, ClaimedPayloadIsNotAllocatedUpFront) {
  auto server = NewTcp(/*max_payload_bytes=*/3ull << 30);
  auto client = NewTcp();
  ASSERT_THAT(server->Listen("127.0.0.1", 0, EchoHandler), IsOk());
  const std::string address = server->listen_address();
  const uint64_t before = ResidentBytes();
  std::vector<int> fds;
  for (int i = 0; i < 4; ++i) {  // 4 x 2.5 GiB claimed, 100 KiB sent each
    char head[kFrameHeaderBytes];
    EncodeFrameHeader(FullHeader(MessageType::kPushRequest), 5ull << 29, head);
    const int fd = RawConnect(address);
    ASSERT_EQ(::write(fd, head, sizeof(head)), static_cast<ssize_t>(sizeof(head)));
    const std::string part(100 << 10, 'p');
    ASSERT_EQ(::write(fd, part.data(), part.size()), static_cast<ssize_t>(part.size()));
    fds.push_back(fd);
  }
  // Still served meanwhile.
  STRATA_ASSERT_OK_AND_ASSIGN(auto conn, client->Connect(address));
  Message ping;
  ping.header.type = MessageType::kPing;
  ping.payload = "alive";
  STRATA_ASSERT_OK_AND_ASSIGN(Message pong, conn->CallSync(ping, kWait));
  EXPECT_EQ(pong.payload, "alive");
  const uint64_t during = ResidentBytes();
  EXPECT_LT(during, before + (64ull << 20))
      << "resident memory grew by " << (during - before) << " bytes for 400 KiB sent";
  // The peers close mid-payload: each connection goes, the server stays.
  for (int fd : fds) ::close(fd);
  STRATA_ASSERT_OK_AND_ASSIGN(pong, conn->CallSync(ping, kWait));
  EXPECT_EQ(pong.payload, "alive");
}

// A raw server socket on 127.0.0.1 that answers the first request of one
// connection with `answer(request header)` (raw bytes), then closes it.
class OneShotRawServer {
 public:
  explicit OneShotRawServer(std::function<std::string(const MessageHeader&)> answer) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK_GE(listen_fd_, 0);
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK_EQ(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&sin), sizeof(sin)), 0);
    CHECK_EQ(::listen(listen_fd_, 4), 0);
    socklen_t len = sizeof(sin);
    CHECK_EQ(::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&sin), &len), 0);
    address_ = absl::StrCat("127.0.0.1:", ntohs(sin.sin_port));
    thread_ = std::thread([this, answer = std::move(answer)] {
      const int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) return;
      char head[kFrameHeaderBytes];
      size_t got = 0;
      while (got < sizeof(head)) {
        const ssize_t n = ::read(fd, head + got, sizeof(head) - got);
        if (n <= 0) break;
        got += static_cast<size_t>(n);
      }
      MessageHeader h;
      uint64_t payload = 0;
      if (got == sizeof(head) && DecodeFrameHeader(head, 1ull << 31, &h, &payload).ok()) {
        std::string skip(payload, '\0');  // the request's payload, if any
        size_t read_payload = 0;
        while (read_payload < payload) {
          const ssize_t n = ::read(fd, skip.data(), payload - read_payload);
          if (n <= 0) break;
          read_payload += static_cast<size_t>(n);
        }
        const std::string bytes = answer(h);
        (void)!::write(fd, bytes.data(), bytes.size());
      }
      ::close(fd);
    });
  }
  ~OneShotRawServer() {
    ::shutdown(listen_fd_, SHUT_RDWR);
    thread_.join();
    ::close(listen_fd_);
  }
  const std::string& address() const { return address_; }

 private:
  int listen_fd_ = -1;
  std::string address_;
  std::thread thread_;
};

// The peer closes in the middle of a response (inside the header, or
// inside a payload that was to land in the caller's tensor): the call fails
// Unavailable naming the peer, once, and the transport serves on.
TEST(TcpTransportTest, PeerClosingMidResponseFailsTheCallNamingThePeer) {
  auto client = NewTcp();
  auto server = NewTcp();
  ASSERT_THAT(server->Listen("127.0.0.1", 0, EchoHandler), IsOk());
  struct Case {
    const char* name;
    bool into;             // CallInto a destination, or Call
    size_t header_bytes;   // how much of the response header is sent
    size_t payload_bytes;  // how much of the claimed 1 MiB payload is sent
  };
  const Case cases[] = {
      {"inside the header", false, 30, 0},
      {"inside the payload", false, kFrameHeaderBytes, 100 << 10},
      {"inside the payload, into a destination", true, kFrameHeaderBytes, 100 << 10},
      {"after the header, into a destination", true, kFrameHeaderBytes, 0},
  };
  constexpr size_t kClaimed = 1 << 20;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    OneShotRawServer raw([&c](const MessageHeader& request) {
      MessageHeader h = request;
      h.type = ResponseTypeFor(request.type);
      char head[kFrameHeaderBytes];
      EncodeFrameHeader(h, kClaimed, head);
      return std::string(head, c.header_bytes) + std::string(c.payload_bytes, 'v');
    });
    STRATA_ASSERT_OK_AND_ASSIGN(auto conn, client->Connect(raw.address()));
    Message pull;
    pull.header.type = MessageType::kPullRequest;
    pull.header.partition = 3;
    auto result = std::make_shared<CallResult>();
    std::vector<char> dest(kClaimed, 0);
    if (c.into) {
      conn->CallInto(pull, dest.data(), dest.size(), Capture(result));
    } else {
      conn->Call(pull, Capture(result));
    }
    ASSERT_TRUE(result->Wait());
    EXPECT_THAT(result->result, StatusIs(absl::StatusCode::kUnavailable, HasSubstr(raw.address())));
    EXPECT_FALSE(conn->healthy());
    // A later call on the broken connection fails at once, the same way.
    auto again = std::make_shared<CallResult>();
    conn->Call(pull, Capture(again));
    ASSERT_TRUE(again->Wait());
    EXPECT_THAT(again->result, StatusIs(absl::StatusCode::kUnavailable));
    // The client transport still reaches everyone else.
    STRATA_ASSERT_OK_AND_ASSIGN(auto good, client->Connect(server->listen_address()));
    Message ping;
    ping.header.type = MessageType::kPing;
    ping.payload = "still here";
    STRATA_ASSERT_OK_AND_ASSIGN(Message pong, good->CallSync(ping, kWait));
    EXPECT_EQ(pong.payload, "still here");
  }
}

// A payload arriving in many small writes (partial reads on the server,
// growing buffer) is reassembled exactly.
TEST(TcpTransportTest, PayloadInSmallPiecesIsReassembled) {
  auto server = NewTcp();
  ASSERT_THAT(server->Listen("127.0.0.1", 0, EchoHandler), IsOk());
  const std::string payload = Pattern((3 << 20) + 7, 5);
  char head[kFrameHeaderBytes];
  MessageHeader h = FullHeader(MessageType::kPushRequest);
  h.request_id = 77;
  EncodeFrameHeader(h, payload.size(), head);
  const std::string frame = std::string(head, sizeof(head)) + payload;
  const int fd = RawConnect(server->listen_address());
  for (size_t off = 0; off < frame.size();) {
    const size_t n = std::min<size_t>(frame.size() - off, 1 + (off * 7919) % 70000);
    ASSERT_EQ(::write(fd, frame.data() + off, n), static_cast<ssize_t>(n));
    off += n;
  }
  std::string back(kFrameHeaderBytes + payload.size(), '\0');
  size_t got = 0;
  while (got < back.size()) {
    const ssize_t n = ::read(fd, back.data() + got, back.size() - got);
    ASSERT_GT(n, 0);
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  EXPECT_EQ(ReadLe(back.data() + 24, 8), 77u);  // request_id echoed
  EXPECT_TRUE(back.substr(kFrameHeaderBytes) == payload);
}

// TransportOptions::lend_request_payloads (the pserver's): a push's or a
// replication record's payload up to 16 MiB arrives in the connection's
// buffer, lent for the handler's call (the same buffer each time, its bytes
// those sent); other requests and larger payloads arrive owned as before.
TEST(TcpTransportTest, LentRequestPayloadsArriveInTheConnectionsBuffer) {
  TransportOptions options;
  options.kind = "tcp";
  options.lend_request_payloads = true;
  auto server = std::move(CreateTransport(options)).value();
  struct Seen {
    MessageType type;
    const char* lent;  // payload_ref, or null when owned
    std::string bytes;
  };
  absl::Mutex mu;
  std::vector<Seen> seen;
  ASSERT_THAT(server->Listen("127.0.0.1", 0,
                             [&](Message m, std::shared_ptr<Responder> r) {
                               {
                                 absl::MutexLock l(&mu);
                                 seen.push_back({m.header.type, m.payload_ref,
                                                 std::string(m.payload_data(), m.payload_size())});
                               }
                               Message ack;
                               ack.header.type = ResponseTypeFor(m.header.type);
                               r->Respond(std::move(ack));
                             }),
              IsOk());
  auto client = NewTcp();
  STRATA_ASSERT_OK_AND_ASSIGN(auto conn, client->Connect(server->listen_address()));
  const std::vector<std::pair<MessageType, size_t>> sent = {
      {MessageType::kPushRequest, 300 << 10}, {MessageType::kPushRequest, 1000},
      {MessageType::kReplicate, 5000},        {MessageType::kPullRequest, 800},
      {MessageType::kPushRequest, 17 << 20},  {MessageType::kPushRequest, 0}};
  for (size_t i = 0; i < sent.size(); ++i) {
    Message m;
    m.header.type = sent[i].first;
    m.payload = Pattern(sent[i].second, static_cast<uint32_t>(i));
    ASSERT_THAT(conn->CallSync(std::move(m), kWait).status(), IsOk());
  }
  absl::MutexLock l(&mu);
  ASSERT_EQ(seen.size(), sent.size());
  for (size_t i = 0; i < sent.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(seen[i].type, sent[i].first);
    EXPECT_TRUE(seen[i].bytes == Pattern(sent[i].second, static_cast<uint32_t>(i)));
  }
  ASSERT_NE(seen[0].lent, nullptr);
  EXPECT_EQ(seen[1].lent, seen[0].lent);  // one buffer, reused
  EXPECT_EQ(seen[2].lent, seen[0].lent);
  EXPECT_EQ(seen[3].lent, nullptr);  // a pull: owned
  EXPECT_EQ(seen[4].lent, nullptr);  // over 16 MiB: owned
}

TEST(TcpTransportTest, OversizedRequestIsRejectedByServer) {
  auto server = NewTcp(/*max_payload_bytes=*/1024);
  auto client = NewTcp();
  ASSERT_THAT(server->Listen("127.0.0.1", 0, EchoHandler), IsOk());
  const std::string address = server->listen_address();

  STRATA_ASSERT_OK_AND_ASSIGN(auto conn, client->Connect(address));
  Message big;
  big.header.type = MessageType::kPushRequest;
  big.payload = Pattern(2048);
  EXPECT_THAT(conn->CallSync(big, kWait),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr(address)));
  EXPECT_FALSE(conn->healthy());

  // At the limit is fine, on a new connection.
  STRATA_ASSERT_OK_AND_ASSIGN(auto conn2, client->Connect(address));
  Message ok;
  ok.header.type = MessageType::kPushRequest;
  ok.payload = Pattern(1024);
  STRATA_ASSERT_OK_AND_ASSIGN(Message response, conn2->CallSync(ok, kWait));
  EXPECT_EQ(response.payload, ok.payload);
}

TEST(TcpTransportTest, OversizedResponseFailsCallsWithDataLoss) {
  auto server = NewTcp();
  auto client = NewTcp(/*max_payload_bytes=*/1024);
  ASSERT_THAT(server->Listen("127.0.0.1", 0, EchoHandler), IsOk());
  const std::string address = server->listen_address();
  STRATA_ASSERT_OK_AND_ASSIGN(auto conn, client->Connect(address));
  Message big;
  big.header.type = MessageType::kPullRequest;
  big.payload = Pattern(4096);
  EXPECT_THAT(
      conn->CallSync(big, kWait),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr(absl::StrCat("bad frame from ", address))));
  EXPECT_FALSE(conn->healthy());
}

TEST(TcpTransportTest, ConnectToClosedPortIsUnavailableNamingAddress) {
  // Hold a bound but not listening socket so that the port stays closed.
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&sin), sizeof(sin)), 0);
  socklen_t len = sizeof(sin);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&sin), &len), 0);
  const std::string address = absl::StrCat("127.0.0.1:", ntohs(sin.sin_port));

  auto client = NewTcp();
  EXPECT_THAT(client->Connect(address),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr(address)));
  ::close(fd);
}

TEST(TcpTransportTest, MalformedAddressIsInvalidArgument) {
  auto client = NewTcp();
  EXPECT_THAT(client->Connect("no-port-here"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no-port-here")));
  EXPECT_THAT(client->Connect("127.0.0.1:99999"), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(TcpTransportTest, ListensAndConnectsByHostname) {
  auto server = NewTcp();
  auto client = NewTcp();
  ASSERT_THAT(server->Listen("localhost", 0, EchoHandler), IsOk());
  std::string host;
  int port = 0;
  ASSERT_THAT(SplitHostPort(server->listen_address(), &host, &port), IsOk());
  ASSERT_GT(port, 0);
  STRATA_ASSERT_OK_AND_ASSIGN(auto conn, client->Connect(absl::StrCat("localhost:", port)));
  Message ping;
  ping.header.type = MessageType::kPing;
  STRATA_ASSERT_OK_AND_ASSIGN(Message pong, conn->CallSync(ping, kWait));
  EXPECT_EQ(pong.header.type, MessageType::kPong);
}

TEST(TcpTransportTest, ShutdownIsIdempotentAndRefusesNewWork) {
  auto server = NewTcp();
  ASSERT_THAT(server->Listen("127.0.0.1", 0, EchoHandler), IsOk());
  const std::string address = server->listen_address();
  server->Shutdown();
  server->Shutdown();
  auto client = NewTcp();
  EXPECT_THAT(client->Connect(address),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr(address)));
  EXPECT_THAT(server->Connect(address), StatusIs(absl::StatusCode::kUnavailable));
}

TEST(TransportFactoryTest, UnknownKindIsInvalidArgumentNamingIt) {
  TransportOptions options;
  options.kind = "carrier-pigeon";
  EXPECT_THAT(CreateTransport(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("carrier-pigeon")));
}

TEST(MessageTest, HelpersBehave) {
  EXPECT_STREQ(MessageTypeName(MessageType::kPing), "PING");
  EXPECT_STREQ(MessageTypeName(MessageType::kPushResponse), "PUSH_RESPONSE");
  EXPECT_STREQ(MessageTypeName(static_cast<MessageType>(77)), "UNKNOWN");
  EXPECT_EQ(ResponseTypeFor(MessageType::kPullRequest), MessageType::kPullResponse);
  EXPECT_FALSE(IsValidMessageType(MessageType::kInvalid));
  EXPECT_TRUE(IsValidMessageType(MessageType::kPong));

  Message ok;
  EXPECT_THAT(ResponseStatus(ok), IsOk());
  Message error = MakeErrorResponse(FullHeader(MessageType::kPullRequest),
                                    MessageType::kPullResponse, absl::UnavailableError("busy"));
  EXPECT_EQ(error.header.type, MessageType::kPullResponse);
  EXPECT_THAT(ResponseStatus(error), StatusIs(absl::StatusCode::kUnavailable, "busy"));
  Message odd = MakeErrorResponse(MessageHeader(), MessageType::kPong, absl::OkStatus());
  EXPECT_THAT(ResponseStatus(odd), StatusIs(absl::StatusCode::kInternal));
  Message bogus;
  bogus.header.status = 1000;
  EXPECT_THAT(ResponseStatus(bogus), StatusIs(absl::StatusCode::kUnknown));
}

}  // namespace
}  // namespace strata::transport::tcp
