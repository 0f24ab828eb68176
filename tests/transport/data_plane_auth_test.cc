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
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/transport/raw_socket.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/transport.h"

namespace strata::transport {
namespace {

using ::strata::testing::IsOk;
using ::strata::testing::StatusIs;
using ::strata::transport::testing::RawConnect;
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
  static std::unique_ptr<Transport> New(std::shared_ptr<MembershipKeys> keys,
                                        absl::Duration connect_timeout = absl::Seconds(10)) {
    TransportOptions o;
    o.kind = "tcp";
    o.membership = std::move(keys);
    o.tcp_connect_timeout = connect_timeout;
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
  absl::StatusOr<Message> Ping(Connection* conn, uint32_t sender = 5) {
    Message ping;
    ping.header.type = MessageType::kPing;
    ping.header.sender_id = sender;
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
  // (Tried again for a second: the keys could have come meanwhile.)
  auto client = New(client_keys, absl::Seconds(1));
  const absl::Status stale = client->Connect(address_).status();
  EXPECT_THAT(
      stale, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("key epoch 6 is not the current")));
  EXPECT_TRUE(IsKeyEpochRefusal(stale)) << stale;
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

// The master moved the key epoch on; one side has the new keys, the other
// gets them with its next heartbeat. Connect waits for that (within its
// timeout) rather than failing, which the caller would take for a dead
// peer.
TEST_F(DataPlaneAuthTest, AKeyEpochRefusalIsTriedAgainUntilBothSidesHaveTheNewKeys) {
  const std::string next = RandomBytes(32);
  // The client ahead: the server's heartbeat brings epoch 8 a little later.
  auto ahead_keys = std::make_shared<MembershipKeys>();
  ahead_keys->Update(5, 8, DeriveNodeKey(next, 5), "");
  auto ahead = New(ahead_keys);
  std::thread server_heartbeat([&] {
    absl::SleepFor(absl::Milliseconds(400));
    server_keys_->Update(1, 8, DeriveNodeKey(next, 1), next);
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<std::shared_ptr<Connection>> conn = ahead->Connect(address_);
  server_heartbeat.join();
  ASSERT_THAT(conn.status(), IsOk());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(300));
  EXPECT_THAT(Ping(conn->get()).status(), IsOk());
  // The client behind: its own heartbeat brings epoch 9.
  const std::string after = RandomBytes(32);
  server_keys_->Update(1, 9, DeriveNodeKey(after, 1), after);
  std::thread client_heartbeat([&] {
    absl::SleepFor(absl::Milliseconds(400));
    ahead_keys->Update(5, 9, DeriveNodeKey(after, 5), "");
  });
  conn = ahead->Connect(address_);
  client_heartbeat.join();
  ASSERT_THAT(conn.status(), IsOk());
  EXPECT_THAT(Ping(conn->get()).status(), IsOk());
  EXPECT_EQ(served_.load(), 2);
  // A wrong key is no key-epoch matter: refused at once.
  auto stranger = Client(6, 9, RandomBytes(32));
  const absl::Status refused = stranger->Connect(address_).status();
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_FALSE(IsKeyEpochRefusal(refused));
}

// A node that left loses its open connections at once (the pserver calls
// DisconnectNode when its view says so), not only its key for new ones;
// the other members' connections stay.
TEST_F(DataPlaneAuthTest, ANodeThatLeftLosesItsOpenConnections) {
  auto leaving = Client(5, 7, secret_);
  auto staying = Client(6, 7, secret_);
  STRATA_ASSERT_OK_AND_ASSIGN(auto gone, leaving->Connect(address_));
  STRATA_ASSERT_OK_AND_ASSIGN(auto kept, staying->Connect(address_));
  ASSERT_THAT(Ping(gone.get(), 5).status(), IsOk());
  ASSERT_THAT(Ping(kept.get(), 6).status(), IsOk());
  EXPECT_EQ(server_->DisconnectNode(5), 1);
  EXPECT_EQ(server_->DisconnectNode(9), 0);
  // (The close is the server's epoll thread's; the client sees it soon.)
  const absl::Time deadline = absl::Now() + kWait;
  while (gone->healthy() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_FALSE(gone->healthy());
  EXPECT_FALSE(Ping(gone.get(), 5).ok());
  EXPECT_THAT(Ping(kept.get(), 6).status(), IsOk());
  EXPECT_EQ(served_.load(), 3);
}

TEST_F(DataPlaneAuthTest, AClientWithoutKeysCannotConnect) {
  auto client = New(std::make_shared<MembershipKeys>());
  EXPECT_THAT(client->Connect(address_).status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("no data-plane key yet")));
}

TEST_F(DataPlaneAuthTest, AServerWithoutTheHandshakeSaysSo) {
  auto plain = New(nullptr);
  ASSERT_THAT(plain->Listen("127.0.0.1", 0,
                            [](Message, std::shared_ptr<Responder> r) { r->Respond(Message()); }),
              IsOk());
  auto client = Client(5, 7, secret_);
  EXPECT_THAT(
      client->Connect(plain->listen_address()).status(),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("runs no data-plane handshake")));
}

// --- Raw sockets: what an outsider can send. ------------------------------

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
  for (MessageType type : {MessageType::kPushRequest, MessageType::kPullRequest, MessageType::kPing,
                           MessageType::kReplicate, MessageType::kRdmaHello}) {
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

// Whether the server closed `fd` (end of file) within `wait`.
bool ClosedWithin(int fd, absl::Duration wait) {
  pollfd pf{fd, POLLIN, 0};
  if (::poll(&pf, 1, static_cast<int>(absl::ToInt64Milliseconds(wait))) <= 0) return false;
  char c;
  return ::recv(fd, &c, 1, MSG_DONTWAIT) == 0;
}

TEST(DataPlaneLimitsTest, AConnectionThatNeverHandshakesIsClosed) {
  auto keys = std::make_shared<MembershipKeys>();
  const std::string secret = RandomBytes(32);
  keys->Update(1, 7, DeriveNodeKey(secret, 1), secret);
  TransportOptions o;
  o.kind = "tcp";
  o.membership = keys;
  o.handshake_timeout = absl::Seconds(1);
  STRATA_ASSERT_OK_AND_ASSIGN(auto server, CreateTransport(o));
  ASSERT_THAT(server->Listen("127.0.0.1", 0, [](Message, std::shared_ptr<Responder>) {}), IsOk());
  const int fd = RawConnect(server->listen_address());
  const absl::Time start = absl::Now();
  EXPECT_TRUE(ClosedWithin(fd, absl::Seconds(10))) << "a silent connection was held";
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(900));  // (not at once)
  ::close(fd);
}

TEST_F(DataPlaneAuthTest, PendingHandshakesAreCappedPerHost) {
  // 16 connections that say nothing hold the host's quota of handshakes;
  // the 17th is closed at once.
  std::vector<int> silent;
  for (int i = 0; i < 16; ++i) silent.push_back(RawConnect(address_));
  absl::SleepFor(absl::Milliseconds(200));  // (all accepted)
  const int one_more = RawConnect(address_);
  EXPECT_TRUE(ClosedWithin(one_more, absl::Seconds(3)));
  ::close(one_more);
  for (int fd : silent) EXPECT_FALSE(ClosedWithin(fd, absl::ZeroDuration()));
  for (int fd : silent) ::close(fd);
  absl::SleepFor(absl::Milliseconds(200));  // (their closes seen)
  // Once they are gone, a member is served.
  auto client = Client(5, 7, secret_);
  STRATA_ASSERT_OK_AND_ASSIGN(auto conn, client->Connect(address_));
  EXPECT_THAT(Ping(conn.get()).status(), IsOk());
  EXPECT_EQ(served_.load(), 1);
}

TEST_F(DataPlaneAuthTest, AConnectionSpeaksForItsNodeOnly) {
  auto client = Client(5, 7, secret_);
  STRATA_ASSERT_OK_AND_ASSIGN(auto conn, client->Connect(address_));
  EXPECT_THAT(Ping(conn.get(), 5).status(), IsOk());
  // The same connection claiming to be node 6: closed, not served.
  EXPECT_FALSE(Ping(conn.get(), 6).ok());
  EXPECT_FALSE(conn->healthy());
  EXPECT_EQ(served_.load(), 1);
}

TEST_F(DataPlaneAuthTest, AHugeFrameBeforeTheHandshakeIsNotBuffered) {
  const int fd = RawConnect(address_);
  // A push claiming 1 GiB, then a little of it: closed at the header.
  MessageHeader h;
  h.type = MessageType::kPushRequest;
  char head[tcp::kFrameHeaderBytes];
  tcp::EncodeFrameHeader(h, 1ull << 30, head);
  CHECK_EQ(::write(fd, head, sizeof(head)), static_cast<ssize_t>(sizeof(head)));
  const std::string some(64 << 10, 'x');
  (void)!::write(fd, some.data(), some.size());
  EXPECT_FALSE(ReadFrame(fd).has_value());
  ::close(fd);
  // A hello claiming a large nonce: closed too.
  const int fd2 = RawConnect(address_);
  h.type = MessageType::kAuthHello;
  tcp::EncodeFrameHeader(h, 1 << 20, head);
  CHECK_EQ(::write(fd2, head, sizeof(head)), static_cast<ssize_t>(sizeof(head)));
  EXPECT_FALSE(ReadFrame(fd2).has_value());
  ::close(fd2);
  EXPECT_EQ(served_.load(), 0);
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

// --- Encryption. -------------------------------------------------------------

std::unique_ptr<Transport> NewSealed(std::shared_ptr<MembershipKeys> keys, bool encrypt) {
  TransportOptions o;
  o.kind = "tcp";
  o.membership = std::move(keys);
  o.encrypt_data_plane = encrypt;
  auto t = CreateTransport(o);
  CHECK(t.ok()) << t.status();
  return std::move(t).value();
}

TEST(DataPlaneEncryptionTest, SealedFramesCarryEveryPayloadBothWays) {
  const std::string secret = RandomBytes(32);
  auto server_keys = std::make_shared<MembershipKeys>();
  server_keys->Update(1, 3, DeriveNodeKey(secret, 1), secret);
  auto server = NewSealed(server_keys, true);
  ASSERT_THAT(server->Listen("127.0.0.1", 0,
                             [](Message req, std::shared_ptr<Responder> r) {
                               Message resp;
                               resp.header.type = ResponseTypeFor(req.header.type);
                               resp.header.version = req.header.version + 1;
                               resp.payload = req.payload;
                               r->Respond(std::move(resp));
                             }),
              IsOk());
  auto client_keys = std::make_shared<MembershipKeys>();
  client_keys->Update(9, 3, DeriveNodeKey(secret, 9), "");
  auto client = NewSealed(client_keys, true);
  STRATA_ASSERT_OK_AND_ASSIGN(auto conn, client->Connect(server->listen_address()));
  for (size_t size : {size_t{0}, size_t{1}, size_t{4096}, size_t{3} << 20}) {
    SCOPED_TRACE(size);
    Message ping;
    ping.header.type = MessageType::kPing;
    ping.header.sender_id = 9;
    ping.header.version = size;
    ping.payload = RandomBytes(size);
    STRATA_ASSERT_OK_AND_ASSIGN(Message pong, conn->CallSync(ping, kWait));
    EXPECT_EQ(pong.payload, ping.payload);
    EXPECT_EQ(pong.header.version, size + 1);
    // Into a caller's destination, as pulls are.
    std::string dest(size, '\0');
    absl::Notification done;
    absl::StatusOr<Message> got;
    conn->CallInto(ping, dest.data(), dest.size(), [&](absl::StatusOr<Message> r) {
      got = std::move(r);
      done.Notify();
    });
    ASSERT_TRUE(done.WaitForNotificationWithTimeout(kWait));
    ASSERT_THAT(got.status(), IsOk());
    // Opened straight into the destination.
    EXPECT_TRUE(got->payload_in_destination);
    EXPECT_EQ(dest, ping.payload);
  }
}

TEST(DataPlaneEncryptionTest, BothEndsMustAgree) {
  const std::string secret = RandomBytes(32);
  auto server_keys = std::make_shared<MembershipKeys>();
  server_keys->Update(1, 3, DeriveNodeKey(secret, 1), secret);
  auto server = NewSealed(server_keys, true);
  ASSERT_THAT(server->Listen("127.0.0.1", 0,
                             [](Message, std::shared_ptr<Responder> r) { r->Respond(Message()); }),
              IsOk());
  auto client_keys = std::make_shared<MembershipKeys>();
  client_keys->Update(9, 3, DeriveNodeKey(secret, 9), "");
  auto plain_client = NewSealed(client_keys, false);
  EXPECT_THAT(plain_client->Connect(server->listen_address()).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("data-plane encryption is on here and off")));
}

TEST(DataPlaneEncryptionTest, AChangedOrReplayedFrameFailsToOpen) {
  const std::string key(32, 'k');
  FrameCipher seal(key), open(key);
  const std::string header(72, 'h');
  std::string a(100 + kFrameTagBytes, '\0'), b(100 + kFrameTagBytes, '\0');
  const std::string text = RandomBytes(100);
  seal.Seal(header, text.data(), text.size(), a.data());
  seal.Seal(header, text.data(), text.size(), b.data());
  EXPECT_NE(a, b);  // a new nonce each frame
  std::string a2 = a;
  ASSERT_TRUE(open.Open(header, a2.data(), a2.size()));
  EXPECT_EQ(a2.substr(0, 100), text);
  // Frame a again where b is due: a replay.
  std::string replay = a;
  EXPECT_FALSE(open.Open(header, replay.data(), replay.size()));
  // A changed header or payload.
  FrameCipher open2(key);
  std::string changed = a;
  changed[5] ^= 1;
  EXPECT_FALSE(open2.Open(header, changed.data(), changed.size()));
  FrameCipher open3(key);
  std::string other_header = header;
  other_header[70] = 'x';
  std::string a3 = a;
  EXPECT_FALSE(open3.Open(other_header, a3.data(), a3.size()));
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
