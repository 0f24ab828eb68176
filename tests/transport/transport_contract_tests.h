// Contract tests of transport.h that every backend must pass. A backend's
// test file includes this header and instantiates the suite with its kind:
//   INSTANTIATE_TEST_SUITE_P(Tcp, TransportContractTest,
//                            ::testing::Values("tcp"));
#ifndef STRATA_TESTS_TRANSPORT_TRANSPORT_CONTRACT_TESTS_H_
#define STRATA_TESTS_TRANSPORT_TRANSPORT_CONTRACT_TESTS_H_

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/error_reason.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "transport/rdma/rdma_device.h"
#include "transport/transport.h"

namespace strata::transport::testing {

using ::strata::testing::IsOk;
using ::strata::testing::StatusIs;
using ::testing::HasSubstr;

inline constexpr absl::Duration kWait = absl::Seconds(30);

// A request header with every field set to a distinct non-zero value.
inline MessageHeader FullHeader(MessageType type) {
  MessageHeader h;
  h.type = type;
  h.sender_id = 0xA1B2C3D4u;
  h.epoch = 0x0102030405060708ull;
  h.seq = 0x1112131415161718ull;
  h.partition = 0xC0FFEEu;
  h.flags = 0x5Au;
  h.version = 0x2122232425262728ull;
  h.count = 0x3132333435363738ull;
  return h;
}

inline std::string Pattern(size_t n, uint32_t salt = 0) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) {
    s[i] = static_cast<char>((i * 131 + salt * 7 + 17) & 0xff);
  }
  return s;
}

// Echoes each request: same header except the response type, same payload.
inline void EchoHandler(Message request, std::shared_ptr<Responder> responder) {
  Message response;
  response.header = request.header;
  response.header.type = ResponseTypeFor(request.header.type);
  response.payload = std::move(request.payload);
  responder->Respond(std::move(response));
}

// The outcome of one async Call.
struct CallResult {
  absl::Notification done;
  absl::StatusOr<Message> result;
  std::atomic<int> calls{0};

  bool Wait(absl::Duration timeout = kWait) { return done.WaitForNotificationWithTimeout(timeout); }
};
inline ResponseCallback Capture(std::shared_ptr<CallResult> r) {
  return [r](absl::StatusOr<Message> m) {
    if (r->calls.fetch_add(1) > 0) {
      ADD_FAILURE() << "callback called twice";
      return;
    }
    r->result = std::move(m);
    r->done.Notify();
  };
}

// A handler that keeps every request and its responder for the test.
class HeldRequests {
 public:
  RequestHandler Handler() {
    return [this](Message request, std::shared_ptr<Responder> responder) {
      absl::MutexLock l(&mu_);
      held_.push_back({std::move(request), std::move(responder)});
    };
  }
  bool WaitForCount(size_t n, absl::Duration timeout = kWait) {
    absl::MutexLock l(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return held_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }
  std::pair<Message, std::shared_ptr<Responder>> Take(size_t i) {
    absl::MutexLock l(&mu_);
    return std::move(held_.at(i));
  }

 private:
  absl::Mutex mu_;
  std::vector<std::pair<Message, std::shared_ptr<Responder>>> held_ ABSL_GUARDED_BY(mu_);
};

class TransportContractTest : public ::testing::TestWithParam<std::string> {
 protected:
  TransportOptions Options(uint64_t max_payload_bytes = 1ull << 31) {
    TransportOptions options;
    options.kind = GetParam();
    options.inproc_network = network_;
    options.max_payload_bytes = max_payload_bytes;
    return options;
  }

  void SetUp() override {
    if (GetParam() == "rdma") {
      absl::StatusOr<std::vector<rdma::DeviceInfo>> devices = rdma::ListRdmaDevices();
      if ((!devices.ok() || devices->empty()) && std::getenv("STRATA_REQUIRE_RDMA") == nullptr) {
        GTEST_SKIP() << "no RDMA device here; tests/rdma runs this on Soft-RoCE";
      }
    }
    network_ = NewInProcNetwork();
    auto server = CreateTransport(Options());
    ASSERT_THAT(server, IsOk());
    server_ = std::move(server).value();
    auto client = CreateTransport(Options());
    ASSERT_THAT(client, IsOk());
    client_ = std::move(client).value();
  }

  void TearDown() override {
    if (client_ != nullptr) client_->Shutdown();
    if (server_ != nullptr) server_->Shutdown();
  }

  // Declared first so held responders outlive the transports.
  HeldRequests held_;
  std::shared_ptr<InProcNetwork> network_;
  std::unique_ptr<Transport> server_;
  std::unique_ptr<Transport> client_;
};

TEST_P(TransportContractTest, RoundTripPreservesHeaderAndPayload) {
  STRATA_ASSERT_OK(server_->Listen("127.0.0.1", 0, EchoHandler));
  STRATA_ASSERT_OK_AND_ASSIGN(auto conn, client_->Connect(server_->listen_address()));
  EXPECT_TRUE(conn->healthy());
  EXPECT_EQ(conn->peer(), server_->listen_address());
  for (size_t size : {size_t{0}, size_t{1}, size_t{1} << 20, size_t{64} << 20}) {
    SCOPED_TRACE(absl::StrCat("payload bytes ", size));
    Message request;
    request.header = FullHeader(MessageType::kPushRequest);
    request.header.request_id = 999;  // overwritten by Call
    request.payload = Pattern(size);
    STRATA_ASSERT_OK_AND_ASSIGN(Message response, conn->CallSync(request, kWait));
    const MessageHeader& want = request.header;
    const MessageHeader& got = response.header;
    EXPECT_EQ(got.type, MessageType::kPushResponse);
    EXPECT_EQ(got.status, 0);
    EXPECT_NE(got.request_id, 999u);
    EXPECT_EQ(got.sender_id, want.sender_id);
    EXPECT_EQ(got.epoch, want.epoch);
    EXPECT_EQ(got.seq, want.seq);
    EXPECT_EQ(got.partition, want.partition);
    EXPECT_EQ(got.flags, want.flags);
    EXPECT_EQ(got.version, want.version);
    EXPECT_EQ(got.count, want.count);
    EXPECT_THAT(ResponseStatus(response), IsOk());
    ASSERT_EQ(response.payload.size(), size);
    EXPECT_TRUE(response.payload == request.payload);
  }
}

TEST_P(TransportContractTest, ConcurrentCallsFromManyThreadsAreMatched) {
  STRATA_ASSERT_OK(server_->Listen("127.0.0.1", 0, EchoHandler));
  STRATA_ASSERT_OK_AND_ASSIGN(auto conn, client_->Connect(server_->listen_address()));
  constexpr int kThreads = 8;
  constexpr int kCallsPerThread = 200;
  absl::Mutex mu;
  int completed = 0;
  int mismatched = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kCallsPerThread; ++i) {
        const uint64_t seq = static_cast<uint64_t>(t) * 100000 + i;
        Message request;
        request.header.type = MessageType::kPing;
        request.header.seq = seq;
        request.payload = Pattern(static_cast<size_t>(i % 97) * 13, t + i);
        const std::string expected_payload = request.payload;
        conn->Call(std::move(request),
                   [&, seq, expected_payload](absl::StatusOr<Message> response) {
                     absl::MutexLock l(&mu);
                     if (!response.ok() || response->header.seq != seq ||
                         response->header.type != MessageType::kPong ||
                         response->payload != expected_payload) {
                       ++mismatched;
                     }
                     ++completed;
                   });
      }
    });
  }
  for (auto& thread : threads) thread.join();
  absl::MutexLock l(&mu);
  auto all_done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return completed == kThreads * kCallsPerThread;
  };
  ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&all_done), kWait))
      << completed << " of " << kThreads * kCallsPerThread << " completed";
  EXPECT_EQ(mismatched, 0);
}

TEST_P(TransportContractTest, DeferredResponseFromAnotherThread) {
  STRATA_ASSERT_OK(server_->Listen("127.0.0.1", 0, held_.Handler()));
  STRATA_ASSERT_OK_AND_ASSIGN(auto conn, client_->Connect(server_->listen_address()));
  auto result = std::make_shared<CallResult>();
  Message request;
  request.header = FullHeader(MessageType::kPullRequest);
  request.payload = "pull me";
  conn->Call(request, Capture(result));
  ASSERT_TRUE(held_.WaitForCount(1));
  EXPECT_FALSE(result->done.HasBeenNotified());

  auto [held_request, responder] = held_.Take(0);
  EXPECT_EQ(held_request.payload, "pull me");
  EXPECT_EQ(held_request.header.partition, request.header.partition);
  EXPECT_FALSE(responder->peer().empty());
  std::thread later([responder = std::move(responder)]() mutable {
    absl::SleepFor(absl::Milliseconds(50));
    Message response;
    response.header.type = MessageType::kPullResponse;
    response.header.version = 42;
    response.payload = "values";
    responder->Respond(std::move(response));
  });
  ASSERT_TRUE(result->Wait());
  later.join();
  STRATA_ASSERT_OK_AND_ASSIGN(Message response, result->result);
  EXPECT_EQ(response.header.type, MessageType::kPullResponse);
  EXPECT_EQ(response.header.version, 42u);
  EXPECT_EQ(response.payload, "values");
}

TEST_P(TransportContractTest, DroppedResponderAnswersInternal) {
  STRATA_ASSERT_OK(server_->Listen("127.0.0.1", 0, [](Message, std::shared_ptr<Responder>) {}));
  STRATA_ASSERT_OK_AND_ASSIGN(auto conn, client_->Connect(server_->listen_address()));
  Message request;
  request.header = FullHeader(MessageType::kPullRequest);
  STRATA_ASSERT_OK_AND_ASSIGN(Message response, conn->CallSync(request, kWait));
  EXPECT_EQ(response.header.type, MessageType::kPullResponse);
  EXPECT_THAT(ResponseStatus(response),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("without responding")));
  EXPECT_TRUE(conn->healthy());
}

TEST_P(TransportContractTest, ErrorResponseRoundTrip) {
  STRATA_ASSERT_OK(
      server_->Listen("127.0.0.1", 0, [](Message request, std::shared_ptr<Responder> responder) {
        responder->Respond(
            MakeErrorResponse(request.header, MessageType::kPushResponse,
                              WithReason(absl::UnavailableError("partition 7 is not served here"),
                                         proto::REASON_NOT_SERVED)));
      }));
  STRATA_ASSERT_OK_AND_ASSIGN(auto conn, client_->Connect(server_->listen_address()));
  Message request;
  request.header = FullHeader(MessageType::kPushRequest);
  STRATA_ASSERT_OK_AND_ASSIGN(Message response, conn->CallSync(request, kWait));
  EXPECT_EQ(response.header.type, MessageType::kPushResponse);
  EXPECT_EQ(response.header.partition, request.header.partition);
  EXPECT_EQ(response.header.seq, request.header.seq);
  const absl::Status s = ResponseStatus(response);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable, "partition 7 is not served here"));
  // The typed reason crosses the wire beside the code.
  EXPECT_EQ(ReasonOf(s), proto::REASON_NOT_SERVED);
}

TEST_P(TransportContractTest, ServerShutdownFailsPendingCallsNamingPeer) {
  STRATA_ASSERT_OK(server_->Listen("127.0.0.1", 0, held_.Handler()));
  const std::string address = server_->listen_address();
  STRATA_ASSERT_OK_AND_ASSIGN(auto conn, client_->Connect(address));
  std::vector<std::shared_ptr<CallResult>> results;
  for (int i = 0; i < 3; ++i) {
    results.push_back(std::make_shared<CallResult>());
    Message request;
    request.header.type = MessageType::kPullRequest;
    conn->Call(std::move(request), Capture(results.back()));
  }
  ASSERT_TRUE(held_.WaitForCount(3));
  server_->Shutdown();
  for (auto& r : results) {
    ASSERT_TRUE(r->Wait());
    EXPECT_THAT(r->result, StatusIs(absl::StatusCode::kUnavailable, HasSubstr(address)));
  }
  EXPECT_FALSE(conn->healthy());
  // A call on the broken connection fails at once.
  auto late = std::make_shared<CallResult>();
  Message request;
  request.header.type = MessageType::kPing;
  conn->Call(std::move(request), Capture(late));
  ASSERT_TRUE(late->Wait(absl::Seconds(5)));
  EXPECT_THAT(late->result, StatusIs(absl::StatusCode::kUnavailable, HasSubstr(address)));
  // The late responders find the connection gone; nothing happens.
  held_.Take(0).second->Respond(Message());
  server_->Shutdown();  // idempotent
}

TEST_P(TransportContractTest, ClientShutdownFailsPendingCalls) {
  STRATA_ASSERT_OK(server_->Listen("127.0.0.1", 0, held_.Handler()));
  const std::string address = server_->listen_address();
  STRATA_ASSERT_OK_AND_ASSIGN(auto conn, client_->Connect(address));
  auto result = std::make_shared<CallResult>();
  Message request;
  request.header.type = MessageType::kPullRequest;
  conn->Call(std::move(request), Capture(result));
  ASSERT_TRUE(held_.WaitForCount(1));
  client_->Shutdown();
  ASSERT_TRUE(result->Wait());
  EXPECT_THAT(result->result, StatusIs(absl::StatusCode::kUnavailable, HasSubstr(address)));
  EXPECT_FALSE(conn->healthy());
  EXPECT_THAT(client_->Connect(address), StatusIs(absl::StatusCode::kUnavailable));
}

TEST_P(TransportContractTest, ReleasingConnectionFailsPendingCalls) {
  STRATA_ASSERT_OK(server_->Listen("127.0.0.1", 0, held_.Handler()));
  STRATA_ASSERT_OK_AND_ASSIGN(auto conn, client_->Connect(server_->listen_address()));
  auto result = std::make_shared<CallResult>();
  Message request;
  request.header.type = MessageType::kPing;
  conn->Call(std::move(request), Capture(result));
  ASSERT_TRUE(held_.WaitForCount(1));
  conn.reset();
  ASSERT_TRUE(result->Wait());
  EXPECT_THAT(result->result, StatusIs(absl::StatusCode::kUnavailable));
  // Responding to a released connection is silently dropped.
  held_.Take(0).second->Respond(Message());
}

TEST_P(TransportContractTest, CallSyncTimesOutWithDeadlineExceeded) {
  STRATA_ASSERT_OK(server_->Listen("127.0.0.1", 0, held_.Handler()));
  const std::string address = server_->listen_address();
  STRATA_ASSERT_OK_AND_ASSIGN(auto conn, client_->Connect(address));
  Message request;
  request.header.type = MessageType::kPing;
  EXPECT_THAT(conn->CallSync(request, absl::Milliseconds(100)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr(address)));
  // The late response completes the abandoned call harmlessly.
  ASSERT_TRUE(held_.WaitForCount(1));
  held_.Take(0).second->Respond(Message());
  // The connection still works.
  auto result = std::make_shared<CallResult>();
  conn->Call(request, Capture(result));
  ASSERT_TRUE(held_.WaitForCount(2));
  Message pong;
  pong.payload = "pong";
  held_.Take(1).second->Respond(std::move(pong));
  ASSERT_TRUE(result->Wait());
  STRATA_ASSERT_OK_AND_ASSIGN(Message response, result->result);
  EXPECT_EQ(response.header.type, MessageType::kPong);  // filled in
  EXPECT_EQ(response.payload, "pong");
  EXPECT_TRUE(conn->healthy());
}

TEST_P(TransportContractTest, SecondListenFails) {
  STRATA_ASSERT_OK(server_->Listen("127.0.0.1", 0, EchoHandler));
  EXPECT_THAT(
      server_->Listen("127.0.0.1", 0, EchoHandler),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(server_->listen_address())));
}

TEST_P(TransportContractTest, CallWithInvalidTypeIsInvalidArgument) {
  STRATA_ASSERT_OK(server_->Listen("127.0.0.1", 0, EchoHandler));
  STRATA_ASSERT_OK_AND_ASSIGN(auto conn, client_->Connect(server_->listen_address()));
  Message request;  // type kInvalid
  EXPECT_THAT(conn->CallSync(request, kWait), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_TRUE(conn->healthy());
}

// Sends a borrowed payload (payload_ref) and answers with one: the bytes
// arrive intact and the borrowed buffers may change right after the call.
TEST_P(TransportContractTest, BorrowedPayloadsAreSentIntact) {
  const std::string reply = Pattern(3 << 20, 9);
  STRATA_ASSERT_OK(
      server_->Listen("127.0.0.1", 0, [&reply](Message request, std::shared_ptr<Responder> r) {
        Message response;
        response.header = request.header;
        response.header.type = ResponseTypeFor(request.header.type);
        // Echo whether the request arrived intact in the header's count.
        response.header.count = request.payload == Pattern(5 << 20, 4) ? 1 : 0;
        response.payload_ref = reply.data();
        response.payload_ref_size = reply.size();
        r->Respond(std::move(response));
      }));
  STRATA_ASSERT_OK_AND_ASSIGN(auto conn, client_->Connect(server_->listen_address()));
  std::string tensor = Pattern(5 << 20, 4);
  // Registered, as a worker does with its gradients (rdma: the SENDs read
  // it in place, and the call returns only once they are done with it).
  STRATA_ASSERT_OK(
      client_->RegisterMemory(tensor.data(), tensor.size(), Transport::MemoryUse::kSendSource));
  Message request;
  request.header = FullHeader(MessageType::kPushRequest);
  request.payload_ref = tensor.data();
  request.payload_ref_size = tensor.size();
  auto r = std::make_shared<CallResult>();
  conn->Call(std::move(request), Capture(r));
  tensor.assign(tensor.size(), 'z');  // the caller may reuse its buffer now
  ASSERT_TRUE(r->Wait());
  STRATA_ASSERT_OK(r->result);
  EXPECT_EQ(r->result->header.count, 1u) << "request payload arrived corrupted";
  EXPECT_FALSE(r->result->payload_in_destination);
  EXPECT_TRUE(r->result->payload == reply);
}

// CallInto: a response of the expected size lands in the destination; one
// of another size, or an error, arrives as usual and leaves it untouched.
TEST_P(TransportContractTest, CallIntoWritesMatchingPayloadToDestination) {
  STRATA_ASSERT_OK(
      server_->Listen("127.0.0.1", 0, [](Message request, std::shared_ptr<Responder> r) {
        if (request.header.partition == 2) {
          r->Respond(MakeErrorResponse(request.header, MessageType::kPullResponse,
                                       absl::NotFoundError("no partition 2")));
          return;
        }
        Message response;
        response.header = request.header;
        response.header.type = MessageType::kPullResponse;
        response.payload = Pattern(request.header.count, request.header.partition);
        r->Respond(std::move(response));
      }));
  STRATA_ASSERT_OK_AND_ASSIGN(auto conn, client_->Connect(server_->listen_address()));
  auto call_into = [&](uint32_t partition, uint64_t bytes, std::string* dest) {
    Message request;
    request.header.type = MessageType::kPullRequest;
    request.header.partition = partition;
    request.header.count = bytes;  // the size the server answers with
    auto r = std::make_shared<CallResult>();
    conn->CallInto(std::move(request), dest->data(), dest->size(), Capture(r));
    EXPECT_TRUE(r->Wait());
    return r;
  };
  std::string dest(2 << 20, '\0');
  auto r = call_into(1, dest.size(), &dest);
  STRATA_ASSERT_OK(r->result);
  EXPECT_TRUE(r->result->payload_in_destination);
  EXPECT_TRUE(r->result->payload.empty());
  EXPECT_TRUE(dest == Pattern(dest.size(), 1));

  std::string untouched(1000, 'u');
  r = call_into(3, 999, &untouched);  // wrong size: regular payload
  STRATA_ASSERT_OK(r->result);
  EXPECT_FALSE(r->result->payload_in_destination);
  EXPECT_TRUE(r->result->payload == Pattern(999, 3));
  EXPECT_EQ(untouched, std::string(1000, 'u'));

  r = call_into(2, untouched.size(), &untouched);  // error: message in payload
  STRATA_ASSERT_OK(r->result);
  EXPECT_THAT(ResponseStatus(*r->result),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no partition 2")));
  EXPECT_EQ(untouched, std::string(1000, 'u'));
}

// A large tensor cut into slices, all requested at once (pipelined), the
// server answering in a shuffled order from other threads: every slice
// lands in its place, checked by a checksum per slice.
TEST_P(TransportContractTest, PipelinedSlicesAnsweredOutOfOrderLandInPlace) {
  constexpr int kSlices = 24;
  constexpr size_t kSlice = (1 << 20) + 12345;  // odd size
  STRATA_ASSERT_OK(server_->Listen("127.0.0.1", 0, held_.Handler()));
  STRATA_ASSERT_OK_AND_ASSIGN(auto conn, client_->Connect(server_->listen_address()));
  std::string tensor(kSlices * kSlice, '\0');
  // Registered once, as a worker does with its parameters (rdma: the
  // responses are written straight into it).
  STRATA_ASSERT_OK(client_->RegisterMemory(tensor.data(), tensor.size(),
                                           Transport::MemoryUse::kReceiveDestination));
  std::vector<std::shared_ptr<CallResult>> results;
  for (int i = 0; i < kSlices; ++i) {
    Message request;
    request.header.type = MessageType::kPullRequest;
    request.header.partition = i;
    auto r = std::make_shared<CallResult>();
    conn->CallInto(std::move(request), tensor.data() + i * kSlice, kSlice, Capture(r));
    results.push_back(r);
  }
  ASSERT_TRUE(held_.WaitForCount(kSlices));
  std::vector<int> order(kSlices);
  for (int i = 0; i < kSlices; ++i) order[i] = (i * 7 + 3) % kSlices;  // a permutation
  std::vector<std::thread> responders;
  for (int t = 0; t < 3; ++t) {
    responders.emplace_back([&, t] {
      for (int k = t; k < kSlices; k += 3) {
        auto [request, responder] = held_.Take(order[k]);
        Message response;
        response.header = request.header;
        response.header.type = MessageType::kPullResponse;
        response.payload = Pattern(kSlice, request.header.partition);
        responder->Respond(std::move(response));
      }
    });
  }
  for (auto& t : responders) t.join();
  auto checksum = [](const char* p, size_t n) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<unsigned char>(p[i])) * 1099511628211ull;
    return h;
  };
  for (int i = 0; i < kSlices; ++i) {
    ASSERT_TRUE(results[i]->Wait());
    STRATA_ASSERT_OK(results[i]->result);
    EXPECT_TRUE(results[i]->result->payload_in_destination);
    const std::string want = Pattern(kSlice, i);
    EXPECT_EQ(checksum(tensor.data() + i * kSlice, kSlice), checksum(want.data(), kSlice))
        << "slice " << i;
  }
}

}  // namespace strata::transport::testing

#endif  // STRATA_TESTS_TRANSPORT_TRANSPORT_CONTRACT_TESTS_H_
