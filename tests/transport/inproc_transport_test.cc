#include "transport/inproc/inproc_transport.h"

#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/transport/transport_contract_tests.h"
#include "transport/transport.h"

namespace strata::transport::inproc {
namespace {

using ::strata::testing::IsOk;
using ::strata::testing::StatusIs;
using ::strata::transport::testing::EchoHandler;
using ::strata::transport::testing::kWait;
using ::strata::transport::testing::TransportContractTest;
using ::testing::HasSubstr;
using ::testing::Not;

INSTANTIATE_TEST_SUITE_P(InProc, TransportContractTest, ::testing::Values("inproc"));

std::unique_ptr<Transport> NewInProc(std::shared_ptr<InProcNetwork> network) {
  TransportOptions options;
  options.kind = "inproc";
  options.inproc_network = std::move(network);
  auto transport = CreateTransport(options);
  EXPECT_THAT(transport, IsOk());
  return transport.ok() ? std::move(transport).value() : nullptr;
}

TEST(InProcTransportTest, NeedsANetwork) {
  TransportOptions options;
  options.kind = "inproc";
  EXPECT_THAT(CreateTransport(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("inproc_network")));
}

TEST(InProcTransportTest, UnknownAddressIsUnavailableNamingIt) {
  auto network = NewInProcNetwork();
  auto client = NewInProc(network);
  EXPECT_THAT(client->Connect("pserver-3:7000"),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("pserver-3:7000")));
}

TEST(InProcTransportTest, PortZeroPicksUniqueAddressesAndShutdownFreesThem) {
  auto network = NewInProcNetwork();
  auto a = NewInProc(network);
  auto b = NewInProc(network);
  ASSERT_THAT(a->Listen("node", 0, EchoHandler), IsOk());
  ASSERT_THAT(b->Listen("node", 0, EchoHandler), IsOk());
  EXPECT_THAT(a->listen_address(), HasSubstr("node:"));
  EXPECT_NE(a->listen_address(), b->listen_address());

  auto c = NewInProc(network);
  EXPECT_THAT(c->Listen("node", 7000, EchoHandler), IsOk());
  auto d = NewInProc(network);
  EXPECT_THAT(d->Listen("node", 7000, EchoHandler),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("node:7000")));

  const std::string address = a->listen_address();
  a->Shutdown();
  auto client = NewInProc(network);
  EXPECT_THAT(client->Connect(address),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr(address)));
}

TEST(InProcTransportTest, HandlerDoesNotRunInsideCall) {
  auto network = NewInProcNetwork();
  auto server = NewInProc(network);
  auto client = NewInProc(network);
  std::thread::id handler_thread;
  absl::Notification handled;
  ASSERT_THAT(server->Listen("s", 1,
                             [&](Message request, std::shared_ptr<Responder> responder) {
                               handler_thread = std::this_thread::get_id();
                               handled.Notify();
                               EchoHandler(std::move(request), std::move(responder));
                             }),
              IsOk());
  STRATA_ASSERT_OK_AND_ASSIGN(auto conn, client->Connect("s:1"));
  Message ping;
  ping.header.type = MessageType::kPing;
  STRATA_ASSERT_OK_AND_ASSIGN(Message pong, conn->CallSync(ping, kWait));
  ASSERT_TRUE(handled.HasBeenNotified());
  EXPECT_NE(handler_thread, std::this_thread::get_id());
  EXPECT_EQ(pong.header.type, MessageType::kPong);
}

TEST(InProcTransportTest, ResponderPeerNamesTheClient) {
  auto network = NewInProcNetwork();
  auto server = NewInProc(network);
  auto client = NewInProc(network);
  std::string peer;
  ASSERT_THAT(server->Listen("s", 1,
                             [&](Message request, std::shared_ptr<Responder> responder) {
                               peer = responder->peer();
                               EchoHandler(std::move(request), std::move(responder));
                             }),
              IsOk());
  STRATA_ASSERT_OK_AND_ASSIGN(auto conn, client->Connect("s:1"));
  Message ping;
  ping.header.type = MessageType::kPing;
  ASSERT_THAT(conn->CallSync(ping, kWait), IsOk());
  EXPECT_THAT(peer, HasSubstr("inproc:"));
  EXPECT_THAT(peer, Not(HasSubstr("s:1")));
}

}  // namespace
}  // namespace strata::transport::inproc
