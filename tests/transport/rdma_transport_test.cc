// The rdma backend (transport/rdma/rdma_transport.h): the transport
// contract over "auto" (TCP fallback here, rdma in the Soft-RoCE guest) and
// "rdma", then what only rdma has: size classes across the frame size with
// checksums, credits under many calls in flight, responses RDMA-written
// into a registered tensor, a QP forced into error, a peer dying
// mid-transfer, a locked-memory limit too low, fallback to TCP.
//
// Tests that need a verbs device skip without one, unless
// STRATA_REQUIRE_RDMA is set (the guest sets it).
#include "transport/rdma/rdma_transport.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/testing/low_memlock.h"
#include "tests/transport/transport_contract_tests.h"
#include "transport/data_plane_auth.h"
#include "transport/rdma/rdma_hello.h"

namespace strata::transport::testing {

INSTANTIATE_TEST_SUITE_P(RdmaAuto, TransportContractTest, ::testing::Values("auto"));
INSTANTIATE_TEST_SUITE_P(Rdma, TransportContractTest, ::testing::Values("rdma"));

namespace {

using rdma::ConnectionState;
using rdma::StateOf;
using rdma::StatsOf;
using ::testing::AllOf;
using ::testing::StartsWith;

bool HaveDevice() {
  auto devices = rdma::ListRdmaDevices();
  return devices.ok() && !devices->empty();
}

uint64_t Fnv(const char* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<unsigned char>(p[i])) * 1099511628211ull;
  return h;
}

TransportOptions Opts(const std::string& kind) {
  TransportOptions o;
  o.kind = kind;
  return o;
}

// Answers a push by echoing its payload (so both directions carry it) and
// a pull with `count` bytes of Pattern(count, partition).
void SizedHandler(Message request, std::shared_ptr<Responder> responder) {
  Message response;
  response.header = request.header;
  response.header.type = ResponseTypeFor(request.header.type);
  if (request.header.type == MessageType::kPullRequest) {
    response.payload = Pattern(request.header.count, request.header.partition);
  } else {
    response.payload = std::move(request.payload);
  }
  responder->Respond(std::move(response));
}

// --- Without a usable device (runs everywhere) -----------------------------

TEST(RdmaFallbackTest, AutoWithoutAUsableDeviceCarriesCallsOverTcp) {
  TransportOptions o = Opts("auto");
  o.rdma.device = "no-such-device";  // as on a host without RDMA
  STRATA_ASSERT_OK_AND_ASSIGN(auto server, CreateTransport(o));
  STRATA_ASSERT_OK_AND_ASSIGN(auto client, CreateTransport(o));
  STRATA_ASSERT_OK(server->Listen("127.0.0.1", 0, SizedHandler));
  STRATA_ASSERT_OK_AND_ASSIGN(auto conn, client->Connect(server->listen_address()));
  EXPECT_EQ(StateOf(*conn), ConnectionState::kFallbackTcp);
  EXPECT_THAT(conn->kind(), StartsWith("tcp"));
  EXPECT_EQ(client->stats().tcp_fallbacks, 1u);
  EXPECT_EQ(client->stats().rdma_connections, 0u);
  Message request;
  request.header.type = MessageType::kPushRequest;
  request.payload = Pattern(100000, 3);
  STRATA_ASSERT_OK_AND_ASSIGN(Message response, conn->CallSync(request, kWait));
  EXPECT_TRUE(response.payload == request.payload);
  client->Shutdown();
  server->Shutdown();
}

TEST(RdmaFallbackTest, RdmaWithoutAUsableDeviceFailsNamingTheProblem) {
  TransportOptions o = Opts("rdma");
  o.rdma.device = "no-such-device";
  EXPECT_THAT(CreateTransport(o),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("transport rdma")));
}

TEST(RdmaFallbackTest, BadSlotSettingsAreRefused) {
  TransportOptions o = Opts("auto");
  o.rdma.slot_bytes = 1000;
  EXPECT_THAT(CreateTransport(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("slot_bytes")));
}

// A plain tcp server answers the rdma hello with a refusal, never with a
// crash or a call to its handler.
TEST(RdmaFallbackTest, TcpServerDeclinesTheHelloWithoutCallingItsHandler) {
  std::atomic<int> handled{0};
  STRATA_ASSERT_OK_AND_ASSIGN(auto server, CreateTransport(Opts("tcp")));
  STRATA_ASSERT_OK(server->Listen("127.0.0.1", 0, [&](Message m, std::shared_ptr<Responder> r) {
    ++handled;
    EchoHandler(std::move(m), std::move(r));
  }));
  STRATA_ASSERT_OK_AND_ASSIGN(auto client, CreateTransport(Opts("tcp")));
  STRATA_ASSERT_OK_AND_ASSIGN(auto conn, client->Connect(server->listen_address()));
  Message hello;
  hello.header.type = MessageType::kRdmaHello;
  hello.payload = "not even a hello";
  STRATA_ASSERT_OK_AND_ASSIGN(Message reply, conn->CallSync(hello, kWait));
  EXPECT_EQ(reply.header.type, MessageType::kRdmaHelloReply);
  EXPECT_THAT(ResponseStatus(reply),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("transport tcp")));
  EXPECT_EQ(handled.load(), 0);
  EXPECT_TRUE(conn->healthy());
}

// A hello from the wire is untrusted: garbage, or a field out of range, is
// refused with the peer and the field named; the server carries on.
TEST(RdmaFallbackTest, MalformedHellosAreRefusedNamingTheField) {
  if (rdma::ListRdmaDevices().status().code() == absl::StatusCode::kUnimplemented) {
    GTEST_SKIP() << "built without RDMA support: auto is plain tcp";
  }
  STRATA_ASSERT_OK_AND_ASSIGN(auto server, CreateTransport(Opts("auto")));
  STRATA_ASSERT_OK(server->Listen("127.0.0.1", 0, SizedHandler));
  STRATA_ASSERT_OK_AND_ASSIGN(auto client, CreateTransport(Opts("tcp")));
  STRATA_ASSERT_OK_AND_ASSIGN(auto conn, client->Connect(server->listen_address()));
  Message garbage;
  garbage.header.type = MessageType::kRdmaHello;
  garbage.payload = std::string("\xff\xff\xff", 3);
  STRATA_ASSERT_OK_AND_ASSIGN(Message reply, conn->CallSync(garbage, kWait));
  EXPECT_THAT(ResponseStatus(reply),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("rdma hello")));
  rdma::HelloQp qp;
  qp.qpn = 1 << 25;  // not 24 bits
  qp.psn = 1;
  qp.recv_slots = 8;
  qp.slot_bytes = 4096;
  Message bad_field;
  bad_field.header.type = MessageType::kRdmaHello;
  bad_field.payload = rdma::ReadyHello(qp).SerializeAsString();
  STRATA_ASSERT_OK_AND_ASSIGN(reply, conn->CallSync(bad_field, kWait));
  EXPECT_THAT(ResponseStatus(reply),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("qpn")));
  // The same connection still carries ordinary frames.
  Message push;
  push.header.type = MessageType::kPushRequest;
  push.payload = "after the bad hellos";
  STRATA_ASSERT_OK_AND_ASSIGN(Message echo, conn->CallSync(push, kWait));
  EXPECT_EQ(echo.payload, "after the bad hellos");
}

// --- On a verbs device -------------------------------------------------------

class RdmaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveDevice()) {
      if (std::getenv("STRATA_REQUIRE_RDMA") != nullptr) {
        FAIL() << "STRATA_REQUIRE_RDMA is set but there is no RDMA device";
      }
      GTEST_SKIP() << "no RDMA device here; tests/rdma runs this on Soft-RoCE";
    }
  }

  std::unique_ptr<Transport> Make(const TransportOptions& o) {
    auto t = CreateTransport(o);
    EXPECT_THAT(t, IsOk());
    return t.ok() ? std::move(t).value() : nullptr;
  }

  // A server and a client of `o`, the server answering with `handler`, the
  // client connected to it: server_, client_, conn_, address_.
  void Join(const TransportOptions& o, RequestHandler handler) {
    server_ = Make(o);
    client_ = Make(o);
    ASSERT_NE(server_, nullptr);
    ASSERT_NE(client_, nullptr);
    STRATA_ASSERT_OK(server_->Listen("127.0.0.1", 0, std::move(handler)));
    address_ = server_->listen_address();
    STRATA_ASSERT_OK_AND_ASSIGN(conn_, client_->Connect(address_));
  }

  std::unique_ptr<Transport> server_;
  std::unique_ptr<Transport> client_;
  std::shared_ptr<Connection> conn_;  // released before the transports go
  std::string address_;
};

// Payloads at and around every boundary of the framing (one frame, one
// byte more, several frames), each way and by each receive path: into a
// fresh buffer, copied into an unregistered destination, written by RDMA
// WRITE into a registered one.
TEST_F(RdmaDeviceTest, EverySizeClassArrivesIntactByEveryPath) {
  TransportOptions o = Opts("rdma");
  o.rdma.slot_bytes = 4096;  // small frames: many fragments per message
  ASSERT_NO_FATAL_FAILURE(Join(o, SizedHandler));
  Transport* server = server_.get();
  Transport* client = client_.get();
  Connection* conn = conn_.get();
  ASSERT_EQ(StateOf(*conn), ConnectionState::kReady);
  EXPECT_EQ(conn->kind(), "rdma");
  EXPECT_EQ(client->stats().rdma_connections, 1u);
  EXPECT_EQ(server->stats().rdma_connections, 1u);
  EXPECT_EQ(client->stats().tcp_fallbacks, 0u);
  const size_t first = 4096 - 48 - 72;  // payload room of a message frame
  const size_t more = 4096 - 48;        // of a continuation frame
  std::vector<size_t> sizes = {0,
                               1,
                               first - 1,
                               first,
                               first + 1,
                               first + more,
                               first + more + 1,
                               3 * more + 17,
                               (1 << 20) + 3};
  std::string registered((1 << 20) + 64, '\0');
  // Both uses: pulls land in it, pushes are sent from it.
  STRATA_ASSERT_OK(client->RegisterMemory(registered.data(), registered.size(),
                                          Transport::MemoryUse::kReceiveDestination));
  STRATA_ASSERT_OK(client->RegisterMemory(registered.data(), registered.size(),
                                          Transport::MemoryUse::kSendSource));
  uint64_t written = 0;
  for (size_t size : sizes) {
    SCOPED_TRACE(absl::StrCat("payload bytes ", size));
    Message push;
    push.header = FullHeader(MessageType::kPushRequest);
    push.payload = Pattern(size, 5);
    STRATA_ASSERT_OK_AND_ASSIGN(Message echo, conn->CallSync(push, kWait));
    ASSERT_EQ(echo.payload.size(), size);
    EXPECT_EQ(Fnv(echo.payload.data(), size), Fnv(push.payload.data(), size));
    EXPECT_EQ(echo.header.version, push.header.version);
    EXPECT_EQ(echo.header.count, push.header.count);

    // The same payload sent straight from registered memory (zero copy),
    // overwritten as soon as the call returns.
    std::memcpy(registered.data() + 3, push.payload.data(), size);
    Message borrowed;
    borrowed.header = FullHeader(MessageType::kPushRequest);
    borrowed.payload_ref = registered.data() + 3;
    borrowed.payload_ref_size = size;
    auto zc = std::make_shared<CallResult>();
    conn->Call(std::move(borrowed), Capture(zc));
    std::memset(registered.data(), 'z', registered.size());
    ASSERT_TRUE(zc->Wait());
    STRATA_ASSERT_OK(zc->result);
    ASSERT_EQ(zc->result->payload.size(), size);
    EXPECT_EQ(Fnv(zc->result->payload.data(), size), Fnv(push.payload.data(), size));

    // Borrowed until the answer (as the worker's pushes): Call does not
    // wait for the SENDs; the bytes stay put until the callback ran.
    std::memcpy(registered.data() + 5, push.payload.data(), size);
    Message until_answer;
    until_answer.header = FullHeader(MessageType::kPushRequest);
    until_answer.payload_ref = registered.data() + 5;
    until_answer.payload_ref_size = size;
    until_answer.payload_ref_until_response = true;
    auto ua = std::make_shared<CallResult>();
    conn->Call(std::move(until_answer), Capture(ua));
    ASSERT_TRUE(ua->Wait());
    STRATA_ASSERT_OK(ua->result);
    ASSERT_EQ(ua->result->payload.size(), size);
    EXPECT_EQ(Fnv(ua->result->payload.data(), size), Fnv(push.payload.data(), size));

    const std::string want = Pattern(size, 9);
    for (bool use_registered : {false, true}) {
      std::string plain(size, '\0');
      char* dest = use_registered ? registered.data() + 7 : plain.data();
      Message pull;
      pull.header.type = MessageType::kPullRequest;
      pull.header.partition = 9;
      pull.header.count = size;
      auto r = std::make_shared<CallResult>();
      conn->CallInto(std::move(pull), dest, size, Capture(r));
      ASSERT_TRUE(r->Wait());
      STRATA_ASSERT_OK(r->result);
      if (size > 0) {
        EXPECT_TRUE(r->result->payload_in_destination);
        EXPECT_EQ(Fnv(dest, size), Fnv(want.data(), size)) << "registered " << use_registered;
        if (use_registered) ++written;
      }
    }
  }
  EXPECT_EQ(StatsOf(*conn).responses_written, written);
  EXPECT_GT(StatsOf(*conn).zero_copy_sends, 0u);
}

// Two receive slots a side and 8 threads calling at once: credits keep
// every SEND matched with a posted receive (a QP error would fail calls).
TEST_F(RdmaDeviceTest, ManyCallsInFlightWithTwoCreditsAllComplete) {
  TransportOptions o = Opts("rdma");
  o.rdma.recv_slots = 2;
  o.rdma.send_slots = 2;
  o.rdma.slot_bytes = 4096;
  ASSERT_NO_FATAL_FAILURE(Join(o, SizedHandler));
  Connection* conn = conn_.get();
  constexpr int kThreads = 8, kCalls = 60;
  std::atomic<int> ok{0}, bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kCalls; ++i) {
        Message m;
        m.header.type = MessageType::kPushRequest;
        m.header.seq = t * 1000 + i;
        m.payload = Pattern((i * 977 + t * 131) % 20000, t + i);
        const uint64_t sum = Fnv(m.payload.data(), m.payload.size());
        const uint64_t seq = m.header.seq;
        conn->Call(std::move(m), [&, sum, seq](absl::StatusOr<Message> r) {
          if (r.ok() && r->header.seq == seq && Fnv(r->payload.data(), r->payload.size()) == sum) {
            ++ok;
          } else {
            ++bad;
          }
        });
      }
    });
  }
  for (auto& th : threads) th.join();
  const absl::Time deadline = absl::Now() + kWait;
  while (ok + bad < kThreads * kCalls && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(ok.load(), kThreads * kCalls);
  EXPECT_EQ(bad.load(), 0);
  EXPECT_TRUE(conn->healthy());
  EXPECT_GT(StatsOf(*conn).sends, static_cast<uint64_t>(kThreads * kCalls));
}

TEST_F(RdmaDeviceTest, QpForcedIntoErrorFailsPendingCallsNamingThePeer) {
  HeldRequests held;
  ASSERT_NO_FATAL_FAILURE(Join(Opts("rdma"), held.Handler()));
  Transport* client = client_.get();
  Connection* conn = conn_.get();
  const std::string address = address_;
  auto pending = std::make_shared<CallResult>();
  Message m;
  m.header.type = MessageType::kPullRequest;
  conn->Call(m, Capture(pending));
  ASSERT_TRUE(held.WaitForCount(1));
  STRATA_ASSERT_OK(rdma::ForceQpErrorForTesting(conn));
  ASSERT_TRUE(pending->Wait());
  EXPECT_THAT(pending->result, StatusIs(absl::StatusCode::kUnavailable, HasSubstr(address)));
  EXPECT_FALSE(conn->healthy());
  EXPECT_EQ(StateOf(*conn), ConnectionState::kFailed);
  EXPECT_EQ(client->stats().rdma_failures, 1u);
  // The late response goes nowhere; a new connection works.
  held.Take(0).second->Respond(Message());
  STRATA_ASSERT_OK_AND_ASSIGN(auto again, client->Connect(address));
  auto r = std::make_shared<CallResult>();
  again->Call(m, Capture(r));
  ASSERT_TRUE(held.WaitForCount(2));
  held.Take(1).second->Respond(Message());
  ASSERT_TRUE(r->Wait());
  STRATA_EXPECT_OK(r->result);
}

// A server process killed by SIGKILL while a large push is on its way: the
// pending call fails Unavailable naming the peer; this process goes on.
TEST_F(RdmaDeviceTest, PeerKilledMidTransferFailsThePendingCall) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(fds[0]);
    auto t = CreateTransport(Opts("rdma"));
    if (!t.ok() || !(*t)->Listen("127.0.0.1", 0,
                                 [](Message, std::shared_ptr<Responder> r) {
                                   // Never answers (the responder is kept alive).
                                   static std::vector<std::shared_ptr<Responder>> keep;
                                   keep.push_back(std::move(r));
                                 })
                        .ok()) {
      _exit(1);
    }
    const std::string a = (*t)->listen_address() + "\n";
    if (write(fds[1], a.data(), a.size()) < 0) _exit(1);
    pause();
    _exit(0);
  }
  close(fds[1]);
  char buf[128] = {};
  ssize_t n = read(fds[0], buf, sizeof(buf) - 1);
  close(fds[0]);
  ASSERT_GT(n, 1);
  const std::string address(buf, n - 1);
  auto client = Make(Opts("rdma"));
  ASSERT_NE(client, nullptr);
  STRATA_ASSERT_OK_AND_ASSIGN(auto conn, client->Connect(address));
  ASSERT_EQ(StateOf(*conn), ConnectionState::kReady);
  auto big = std::make_shared<CallResult>();
  Message m;
  m.header.type = MessageType::kPushRequest;
  m.payload = Pattern(32 << 20, 1);
  conn->Call(std::move(m), Capture(big));
  absl::SleepFor(absl::Milliseconds(100));
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(big->Wait());
  EXPECT_THAT(big->result, StatusIs(absl::StatusCode::kUnavailable, HasSubstr(address)));
  EXPECT_FALSE(conn->healthy());
  EXPECT_THAT(client->Connect(address), StatusIs(absl::StatusCode::kUnavailable));
}

// The other way round: a client killed mid-push leaves the server serving.
TEST_F(RdmaDeviceTest, ServerOutlivesAClientKilledMidTransfer) {
  auto server = Make(Opts("rdma"));
  ASSERT_NE(server, nullptr);
  STRATA_ASSERT_OK(server->Listen("127.0.0.1", 0, SizedHandler));
  const std::string address = server->listen_address();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto t = CreateTransport(Opts("rdma"));
    if (!t.ok()) _exit(1);
    auto c = (*t)->Connect(address);
    if (!c.ok()) _exit(1);
    for (;;) {
      Message m;
      m.header.type = MessageType::kPushRequest;
      m.payload = Pattern(8 << 20, 2);
      (*c)->Call(std::move(m), [](absl::StatusOr<Message>) {});
      absl::SleepFor(absl::Milliseconds(50));
    }
  }
  absl::SleepFor(absl::Milliseconds(400));
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  auto client = Make(Opts("rdma"));
  ASSERT_NE(client, nullptr);
  STRATA_ASSERT_OK_AND_ASSIGN(auto conn, client->Connect(address));
  Message m;
  m.header.type = MessageType::kPushRequest;
  m.payload = Pattern(300000, 4);
  STRATA_ASSERT_OK_AND_ASSIGN(Message echo, conn->CallSync(m, kWait));
  EXPECT_TRUE(echo.payload == m.payload);
}

TEST_F(RdmaDeviceTest, PlainTcpPeerMakesAutoFallBackAndRdmaFail) {
  auto server = Make(Opts("tcp"));
  ASSERT_NE(server, nullptr);
  STRATA_ASSERT_OK(server->Listen("127.0.0.1", 0, SizedHandler));
  const std::string address = server->listen_address();
  auto automatic = Make(Opts("auto"));
  ASSERT_NE(automatic, nullptr);
  STRATA_ASSERT_OK_AND_ASSIGN(auto conn, automatic->Connect(address));
  EXPECT_EQ(StateOf(*conn), ConnectionState::kFallbackTcp);
  EXPECT_THAT(conn->kind(), HasSubstr("transport tcp"));
  Message m;
  m.header.type = MessageType::kPushRequest;
  m.payload = Pattern(70000, 1);
  STRATA_ASSERT_OK_AND_ASSIGN(Message echo, conn->CallSync(m, kWait));
  EXPECT_TRUE(echo.payload == m.payload);
  auto required = Make(Opts("rdma"));
  ASSERT_NE(required, nullptr);
  EXPECT_THAT(required->Connect(address), StatusIs(absl::StatusCode::kFailedPrecondition,
                                                   AllOf(HasSubstr(address), HasSubstr("FAILED"))));
}

// A handler answering with a type that is no message type: the caller gets
// an Internal error (as on tcp), the connection stays up.
TEST_F(RdmaDeviceTest, InvalidResponseTypeBecomesAnInternalError) {
  ASSERT_NO_FATAL_FAILURE(Join(Opts("rdma"), [](Message m, std::shared_ptr<Responder> r) {
    Message bad;
    bad.header.type = static_cast<MessageType>(77);
    r->Respond(std::move(bad));
  }));
  Connection* conn = conn_.get();
  Message m;
  m.header.type = MessageType::kPing;
  STRATA_ASSERT_OK_AND_ASSIGN(Message reply, conn->CallSync(m, kWait));
  EXPECT_EQ(reply.header.type, MessageType::kPong);
  EXPECT_THAT(ResponseStatus(reply),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("invalid message type")));
  EXPECT_TRUE(conn->healthy());
}

// RLIMIT_MEMLOCK too low for what a connection registers: "rdma" refuses
// with the preflight's memlock finding and its fix; "auto" falls back to
// TCP; a registration on a transport made before the limit dropped fails
// naming ibv_reg_mr and the fix. Nothing aborts.
// docs/security.md, "RDMA": with the membership handshake (an mtls
// cluster) each connection registers the caller's memory in a protection
// domain of its own, so the remote key one peer gets is no use to another;
// once the key epoch moves on (a node left) the region is registered again
// and the old key dies with the last call that carried it. The bootstrap
// (the hello with the queue pair's details) is sealed.
TEST_F(RdmaDeviceTest, EachPeerGetsItsOwnKeysAndANewKeyEpochRetiresThem) {
  const std::string secret = RandomBytes(32);
  auto server_keys = std::make_shared<MembershipKeys>();
  server_keys->Update(1, 7, DeriveNodeKey(secret, 1), secret);
  auto client_keys = std::make_shared<MembershipKeys>();
  client_keys->Update(5, 7, DeriveNodeKey(secret, 5), "");
  TransportOptions so = Opts("rdma");
  so.membership = server_keys;
  TransportOptions co = Opts("rdma");
  co.membership = client_keys;
  auto a = Make(so), b = Make(so), client = Make(co);
  ASSERT_TRUE(a && b && client);
  STRATA_ASSERT_OK(a->Listen("127.0.0.1", 0, SizedHandler));
  STRATA_ASSERT_OK(b->Listen("127.0.0.1", 0, SizedHandler));
  STRATA_ASSERT_OK_AND_ASSIGN(auto to_a, client->Connect(a->listen_address()));
  STRATA_ASSERT_OK_AND_ASSIGN(auto to_b, client->Connect(b->listen_address()));
  ASSERT_EQ(StateOf(*to_a), ConnectionState::kReady);
  ASSERT_EQ(StateOf(*to_b), ConnectionState::kReady);
  const size_t size = 256 << 10;
  std::string dest(size, '\0');
  STRATA_ASSERT_OK(
      client->RegisterMemory(dest.data(), dest.size(), Transport::MemoryUse::kReceiveDestination));
  EXPECT_EQ(rdma::DestinationKeyForTesting(*to_a, dest.data()), 0u) << "registered before use";
  auto pull = [&](Connection* conn, uint32_t partition) {
    std::memset(dest.data(), 0, size);
    Message m;
    m.header.type = MessageType::kPullRequest;
    m.header.sender_id = 5;  // the node whose key passed the handshake
    m.header.partition = partition;
    m.header.count = size;
    auto r = std::make_shared<CallResult>();
    conn->CallInto(std::move(m), dest.data(), size, Capture(r));
    ASSERT_TRUE(r->Wait());
    STRATA_ASSERT_OK(r->result);
    EXPECT_TRUE(r->result->payload_in_destination);
    const std::string want = Pattern(size, partition);
    EXPECT_EQ(Fnv(dest.data(), size), Fnv(want.data(), size));
  };
  ASSERT_NO_FATAL_FAILURE(pull(to_a.get(), 3));
  ASSERT_NO_FATAL_FAILURE(pull(to_b.get(), 4));
  const uint32_t key_a = rdma::DestinationKeyForTesting(*to_a, dest.data());
  const uint32_t key_b = rdma::DestinationKeyForTesting(*to_b, dest.data());
  EXPECT_NE(key_a, 0u);
  EXPECT_NE(key_b, 0u);
  EXPECT_NE(key_a, key_b) << "two peers were handed the same key";
  EXPECT_EQ(StatsOf(*to_a).responses_written, 1u);
  EXPECT_EQ(StatsOf(*to_a).peer_regions, 1u);
  // Its key went to the server on the sealed bootstrap, not in the request.
  EXPECT_EQ(StatsOf(*to_a).regions_announced, 1u);
  // The same epoch: the same key.
  ASSERT_NO_FATAL_FAILURE(pull(to_a.get(), 5));
  EXPECT_EQ(rdma::DestinationKeyForTesting(*to_a, dest.data()), key_a);
  EXPECT_EQ(StatsOf(*to_a).region_rotations, 0u);
  // A node left: key epoch 8, a new secret. The open connections carry on
  // with new keys for the region.
  const std::string next = RandomBytes(32);
  server_keys->Update(1, 8, DeriveNodeKey(next, 1), next);
  client_keys->Update(5, 8, DeriveNodeKey(next, 5), "");
  ASSERT_NO_FATAL_FAILURE(pull(to_a.get(), 6));
  const uint32_t key_a8 = rdma::DestinationKeyForTesting(*to_a, dest.data());
  EXPECT_NE(key_a8, 0u);
  EXPECT_NE(key_a8, key_a) << "the old epoch's key is still the one in use";
  EXPECT_EQ(StatsOf(*to_a).region_rotations, 1u);
  EXPECT_EQ(StatsOf(*to_a).peer_regions, 1u);
  EXPECT_EQ(StatsOf(*to_a).responses_written, 3u);
  EXPECT_EQ(StatsOf(*to_a).regions_announced, 2u) << "the new key was not announced";
  // A queue pair speaks for the node of its bootstrap's handshake only:
  // a request claiming another node closes the connection, unserved.
  Message forged;
  forged.header.type = MessageType::kPushRequest;
  forged.header.sender_id = 6;
  forged.payload = "as node 6";
  EXPECT_FALSE(to_b->CallSync(forged, kWait).ok());
  EXPECT_FALSE(to_b->healthy());
  to_a.reset();
  to_b.reset();
}

TEST_F(RdmaDeviceTest, MemlockLimitTooLowGivesThePreflightMessage) {
  auto server = Make(Opts("auto"));
  ASSERT_NE(server, nullptr);
  STRATA_ASSERT_OK(server->Listen("127.0.0.1", 0, SizedHandler));
  auto before = Make(Opts("rdma"));
  ASSERT_NE(before, nullptr);
  std::string tensor(16 << 20, 'x');
  absl::StatusOr<std::unique_ptr<Transport>> refused, automatic;
  absl::Status reg;
  absl::StatusOr<std::shared_ptr<Connection>> late;
  {
    ::strata::testing::LowMemlockLimit low(64 << 10);
    ASSERT_TRUE(low.ok());
    refused = CreateTransport(Opts("rdma"));
    automatic = CreateTransport(Opts("auto"));
    reg = before->RegisterMemory(tensor.data(), tensor.size(),
                                 Transport::MemoryUse::kReceiveDestination);
    late = before->Connect(server->listen_address());
  }
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kFailedPrecondition,
                                AllOf(HasSubstr("memlock"), HasSubstr("ulimit -l"))));
  EXPECT_THAT(reg, StatusIs(absl::StatusCode::kResourceExhausted,
                            AllOf(HasSubstr("ibv_reg_mr"), HasSubstr("ulimit -l unlimited"))));
  EXPECT_THAT(late, StatusIs(absl::StatusCode::kFailedPrecondition,
                             AllOf(HasSubstr("FAILED"), HasSubstr("ulimit -l"))));
  ASSERT_THAT(automatic, IsOk());
  STRATA_ASSERT_OK_AND_ASSIGN(auto conn, (*automatic)->Connect(server->listen_address()));
  EXPECT_EQ(StateOf(*conn), ConnectionState::kFallbackTcp);
  Message m;
  m.header.type = MessageType::kPushRequest;
  m.payload = "still works";
  STRATA_ASSERT_OK_AND_ASSIGN(Message echo, conn->CallSync(m, kWait));
  EXPECT_EQ(echo.payload, "still works");
}

}  // namespace
}  // namespace strata::transport::testing
