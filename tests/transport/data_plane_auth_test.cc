// The data-plane membership handshake (transport/data_plane_auth.h) on real
// TCP sockets: members are served; a connection without the handshake, a
// wrong key, a stale key epoch and a replayed handshake are refused and
// never reach the request handler.
#include "transport/data_plane_auth.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/transport.h"

namespace strata::transport {
namespace {

using ::strata::testing::IsOk;
using ::strata::testing::StatusIs;
using ::testing::HasSubstr;

constexpr absl::Duration kWait = absl::Seconds(20);

class DataPlaneAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    secret_ = RandomBytes(32);
    server_keys_ = std::make_shared<MembershipKeys>();
    server_keys_->Update(/*node_id=*/1, /*epoch=*/7, DeriveNodeKey(secret_, 1), secret_);
    server_ = New(server_keys_);
    ASSERT_THAT(server_->Listen("127.0.0.1", 0,
                                [this](Message req, std::shared_ptr<Responder> r) {
                                  ++served_;
                                  Message resp;
                                  resp.header.type = ResponseTypeFor(req.header.type);
                                  resp.payload = req.payload;
                                  r->Respond(std::move(resp));
                                }),
                IsOk());
    address_ = server_->listen_address();
  }
  static std::unique_ptr<Transport> New(std::shared_ptr<MembershipKeys> keys) {
    TransportOptions o;
    o.kind = "tcp";
    o.membership = std::move(keys);
    auto t = CreateTransport(o);
    CHECK(t.ok()) << t.status();
    return std::move(t).value();
  }
  // A client transport holding node `node`'s key of `epoch` from `secret`.
  std::unique_ptr<Transport> Client(uint32_t node, uint64_t epoch, const std::string& secret) {
    auto keys = std::make_shared<MembershipKeys>();
    keys->Update(node, epoch, DeriveNodeKey(secret, node), "");
    clients_keys_.push_back(keys);
    return New(keys);
  }
  absl::StatusOr<Message> Ping(Connection* conn) {
    Message ping;
    ping.header.type = MessageType::kPing;
    ping.payload = "member?";
    return conn->CallSync(ping, kWait);
  }

  std::string secret_;
  std::shared_ptr<MembershipKeys> server_keys_;
  std::vector<std::shared_ptr<MembershipKeys>> clients_keys_;
  std::unique_ptr<Transport> server_;
  std::string address_;
  std::atomic<int> served_{0};
};

TEST_F(DataPlaneAuthTest, AMemberIsServed) {
  auto client = Client(5, 7, secret_);
  STRATA_ASSERT_OK_AND_ASSIGN(auto conn, client->Connect(address_));
  STRATA_ASSERT_OK_AND_ASSIGN(Message pong, Ping(conn.get()));
  EXPECT_EQ(pong.payload, "member?");
  EXPECT_EQ(served_.load(), 1);
}

TEST_F(DataPlaneAuthTest, AWrongKeyIsRefused) {
  auto client = Client(5, 7, RandomBytes(32));  // another cluster's secret
  EXPECT_THAT(client->Connect(address_).status(),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("does not verify")));
  EXPECT_EQ(served_.load(), 0);
}

TEST_F(DataPlaneAuthTest, AStaleKeyEpochIsRefusedUntilTheClientHasTheNewKey) {
  auto client_keys = std::make_shared<MembershipKeys>();
  client_keys->Update(5, 6, DeriveNodeKey(secret_, 5), "");
  auto client = New(client_keys);
  EXPECT_THAT(client->Connect(address_).status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("key epoch 6 is not the current")));
  // A node left: the server's keys move to epoch 8 with a new secret; the
  // epoch-7 key of a member stops working too.
  const std::string next = RandomBytes(32);
  server_keys_->Update(1, 8, DeriveNodeKey(next, 1), next);
  client_keys->Update(5, 7, DeriveNodeKey(secret_, 5), "");
  EXPECT_THAT(client->Connect(address_).status(), StatusIs(absl::StatusCode::kUnavailable));
  client_keys->Update(5, 8, DeriveNodeKey(next, 5), "");
  STRATA_ASSERT_OK_AND_ASSIGN(auto conn, client->Connect(address_));
  EXPECT_THAT(Ping(conn.get()).status(), IsOk());
  EXPECT_EQ(served_.load(), 1);
}

TEST_F(DataPlaneAuthTest, AClientWithoutKeysCannotConnect) {
  auto client = New(std::make_shared<MembershipKeys>());
  EXPECT_THAT(client->Connect(address_).status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("no data-plane key yet")));
}

TEST_F(DataPlaneAuthTest, AServerWithoutTheHandshakeSaysSo) {
  auto plain = New(nullptr);
  ASSERT_THAT(plain->Listen("127.0.0.1", 0,
                            [](Message, std::shared_ptr<Responder> r) {
                              r->Respond(Message());
                            }),
              IsOk());
  auto client = Client(5, 7, secret_);
  EXPECT_THAT(client->Connect(plain->listen_address()).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("runs no data-plane handshake")));
}

// --- Raw sockets: what an outsider can send. ------------------------------

int RawConnect(const std::string& address) {
  std::string host;
  int port = 0;
  CHECK(tcp::SplitHostPort(address, &host, &port).ok());
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_port = htons(static_cast<uint16_t>(port));
  CHECK_EQ(::inet_pton(AF_INET, host.c_str(), &sin.sin_addr), 1);
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  CHECK_GE(fd, 0);
  CHECK_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&sin), sizeof(sin)), 0);
  return fd;
}

void SendFrame(int fd, MessageType type, uint32_t sender, uint64_t epoch, uint64_t request_id,
               const std::string& payload) {
  MessageHeader h;
  h.type = type;
  h.sender_id = sender;
  h.epoch = epoch;
  h.request_id = request_id;
  char head[tcp::kFrameHeaderBytes];
  tcp::EncodeFrameHeader(h, payload.size(), head);
  std::string bytes(head, sizeof(head));
  bytes += payload;
  CHECK_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
}

// The next frame from `fd`, or nothing when the peer closed first.
std::optional<Message> ReadFrame(int fd) {
  auto read_n = [fd](char* p, size_t n) {
    size_t got = 0;
    while (got < n) {
      pollfd pf{fd, POLLIN, 0};
      if (::poll(&pf, 1, 10000) <= 0) return false;
      const ssize_t r = ::read(fd, p + got, n - got);
      if (r <= 0) return false;
      got += r;
    }
    return true;
  };
  char head[tcp::kFrameHeaderBytes];
  if (!read_n(head, sizeof(head))) return std::nullopt;
  Message m;
  uint64_t size = 0;
  CHECK(tcp::DecodeFrameHeader(head, 1 << 20, &m.header, &size).ok());
  m.payload.resize(size);
  if (size > 0 && !read_n(m.payload.data(), size)) return std::nullopt;
  return m;
}

TEST_F(DataPlaneAuthTest, AnUnauthenticatedRequestIsDroppedWithoutEffect) {
  for (MessageType type : {MessageType::kPushRequest, MessageType::kPullRequest,
                           MessageType::kPing, MessageType::kReplicate,
                           MessageType::kRdmaHello}) {
    SCOPED_TRACE(MessageTypeName(type));
    const int fd = RawConnect(address_);
    SendFrame(fd, type, 5, 7, 1, std::string(64, 'g'));
    EXPECT_FALSE(ReadFrame(fd).has_value()) << "answered before the handshake";
    ::close(fd);
  }
  // A proof without a hello first, too.
  const int fd = RawConnect(address_);
  SendFrame(fd, MessageType::kAuthProof, 5, 7, 1, std::string(kAuthMacBytes, 'p'));
  EXPECT_FALSE(ReadFrame(fd).has_value());
  ::close(fd);
  EXPECT_EQ(served_.load(), 0);
  // Members are still served.
  auto client = Client(5, 7, secret_);
  STRATA_ASSERT_OK_AND_ASSIGN(auto conn, client->Connect(address_));
  EXPECT_THAT(Ping(conn.get()).status(), IsOk());
}

TEST_F(DataPlaneAuthTest, AReplayedHandshakeIsRefused) {
  const std::string key = DeriveNodeKey(secret_, 5);
  const std::string client_nonce(kAuthNonceBytes, 'c');
  // A member's handshake, recorded.
  const int a = RawConnect(address_);
  SendFrame(a, MessageType::kAuthHello, 5, 7, 1, client_nonce);
  std::optional<Message> hello = ReadFrame(a);
  ASSERT_TRUE(hello.has_value());
  ASSERT_EQ(hello->payload.size(), kAuthNonceBytes);
  const std::string proof = HandshakeMac(key, false, 5, 7, hello->payload, client_nonce);
  SendFrame(a, MessageType::kAuthProof, 5, 7, 2, proof);
  std::optional<Message> ok = ReadFrame(a);
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(ok->header.status, 0);
  EXPECT_EQ(ok->payload, HandshakeMac(key, true, 5, 7, hello->payload, client_nonce));
  SendFrame(a, MessageType::kPing, 5, 7, 3, "served");
  std::optional<Message> pong = ReadFrame(a);
  ASSERT_TRUE(pong.has_value());
  EXPECT_EQ(pong->payload, "served");
  ::close(a);
  // The same bytes again on a new connection: the server's nonce differs.
  const int b = RawConnect(address_);
  SendFrame(b, MessageType::kAuthHello, 5, 7, 1, client_nonce);
  std::optional<Message> hello2 = ReadFrame(b);
  ASSERT_TRUE(hello2.has_value());
  EXPECT_NE(hello2->payload, hello->payload);
  SendFrame(b, MessageType::kAuthProof, 5, 7, 2, proof);
  std::optional<Message> refused = ReadFrame(b);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->header.status, static_cast<uint16_t>(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(refused->payload, HasSubstr("replayed"));
  SendFrame(b, MessageType::kPing, 5, 7, 3, "not served");
  EXPECT_FALSE(ReadFrame(b).has_value());
  ::close(b);
  EXPECT_EQ(served_.load(), 1);
}

TEST(MembershipKeysTest, KeysAreBoundToTheNodeAndTheEpoch) {
  const std::string s = RandomBytes(32);
  EXPECT_EQ(DeriveNodeKey(s, 3), DeriveNodeKey(s, 3));
  EXPECT_NE(DeriveNodeKey(s, 3), DeriveNodeKey(s, 4));
  EXPECT_NE(DeriveNodeKey(s, 3), DeriveNodeKey(RandomBytes(32), 3));
  const std::string sn(32, 's'), cn(32, 'c');
  EXPECT_NE(HandshakeMac("k", false, 3, 1, sn, cn), HandshakeMac("k", false, 3, 2, sn, cn));
  EXPECT_NE(HandshakeMac("k", false, 3, 1, sn, cn), HandshakeMac("k", false, 4, 1, sn, cn));
  EXPECT_NE(HandshakeMac("k", false, 3, 1, sn, cn), HandshakeMac("k", true, 3, 1, sn, cn));
  MembershipKeys worker;
  EXPECT_THAT(worker.OwnKey().status(), StatusIs(absl::StatusCode::kFailedPrecondition));
  worker.Update(3, 1, DeriveNodeKey(s, 3), "");
  EXPECT_THAT(worker.KeyOf(4, 1).status(), StatusIs(absl::StatusCode::kFailedPrecondition));
}

}  // namespace
}  // namespace strata::transport
