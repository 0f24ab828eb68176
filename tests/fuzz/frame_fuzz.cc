// Fuzz target: the TCP wire framing (transport/tcp/tcp_transport.h,
// docs/wire-protocol.md). The input is the byte stream a peer sends on a
// connection. It is written into one end of a socketpair and read at the
// other by the transport's own Endpoint code, the code of a real
// connection: DecodeFrameHeader, the payload buffer sized only after the
// header checked out and grown as bytes arrive, and frame delivery.
//
// It is read three times: by a server endpoint (requests to a handler, which
// answers some and drops others, and kRdmaHello refused); by a server that
// runs the data-plane membership handshake (transport/data_plane_auth.h),
// which must refuse whatever comes before a proof the fuzzer cannot forge;
// and by a client endpoint with calls pending, some with a destination
// buffer (responses matched by request_id, payloads written into the
// destination).
//
// The servers take payloads up to the default max_payload_bytes (2 GiB): a
// frame claiming that much must cost only what was sent. The client takes
// at most 4 KiB, so that too-large frames are refused.
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "glog/logging.h"
#include "tests/fuzz/fuzz_support.h"
#include "transport/data_plane_auth.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/transport.h"

namespace strata::transport::tcp {
namespace {

constexpr uint64_t kClientMaxPayload = 4096;
constexpr int kClientCalls = 4;
constexpr size_t kDestBytes = 16;

// Writes what it can of `bytes` (from *sent) to the non-blocking `fd`.
void WriteSome(int fd, const std::string& bytes, size_t* sent) {
  while (*sent < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + *sent, bytes.size() - *sent, MSG_NOSIGNAL);
    if (n > 0) {
      *sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return;  // EAGAIN: the endpoint reads some first
  }
}

// Reads and drops what the endpoint wrote (responses, requests), so that its
// writes never wait for room.
void Drain(int fd) {
  char buf[4096];
  while (::read(fd, buf, sizeof(buf)) > 0) {
  }
}

// Feeds `bytes` to `endpoint` through the socketpair (endpoint's fd, peer)
// until the endpoint reports the stream's end or a bad frame; then closes
// it. Returns that report.
absl::Status Feed(Endpoint* endpoint, int peer, const std::string& bytes) {
  static char scratch[64 << 10];
  size_t sent = 0;
  bool shut = false;
  absl::Status s;
  while (s.ok()) {
    WriteSome(peer, bytes, &sent);
    if (!shut && sent == bytes.size()) {
      ::shutdown(peer, SHUT_WR);  // the endpoint sees EOF after the bytes
      shut = true;
    }
    s = endpoint->OnReadable(scratch, sizeof(scratch));
    Drain(peer);
  }
  endpoint->Close(s);
  return s;
}

bool SocketPair(int fds[2]) {
  return ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) == 0;
}

// `membership`: the server runs the data-plane handshake with these keys
// (transport/data_plane_auth.h); null: none.
void RunServer(const std::string& bytes, std::shared_ptr<MembershipKeys> membership) {
  int fds[2];
  CHECK(SocketPair(fds)) << "socketpair: " << std::strerror(errno);
  TcpOptions options;
  options.write_stall_timeout = absl::ZeroDuration();
  options.membership = membership;
  auto handler = std::make_shared<const RequestHandler>(
      [](Message request, std::shared_ptr<Responder> responder) {
        CHECK(IsValidMessageType(request.header.type));
        CHECK(!request.payload_in_destination);
        // Odd request ids are answered with an echo; the others dropped
        // (the responder then answers Internal by itself).
        if (request.header.request_id % 2 == 1) {
          Message response;
          response.header = request.header;
          response.header.type = MessageType::kInvalid;  // the responder fills it in
          response.payload = std::move(request.payload);
          responder->Respond(std::move(response));
        }
      });
  auto endpoint = std::make_shared<ServerEndpoint>(fds[0], "fuzz-client:1", options, handler);
  const absl::Status s = Feed(endpoint.get(), fds[1], bytes);
  if (membership == nullptr) {
    CHECK(absl::IsUnavailable(s) || absl::IsDataLoss(s)) << s;
  } else {
    CHECK(!s.ok());  // the handshake's refusals close the connection too
  }
  ::close(fds[1]);
}

void RunClient(const std::string& bytes) {
  int fds[2];
  CHECK(SocketPair(fds)) << "socketpair: " << std::strerror(errno);
  TcpOptions options;
  options.max_payload_bytes = kClientMaxPayload;
  options.write_stall_timeout = absl::ZeroDuration();
  auto endpoint = std::make_shared<ClientEndpoint>(fds[0], "fuzz-server:1", options);
  // Calls get request ids 1, 2, ...; the odd ones have a destination.
  std::vector<int> answered(kClientCalls + 1, 0);
  std::vector<std::string> dests(kClientCalls + 1, std::string(kDestBytes, '\0'));
  for (int id = 1; id <= kClientCalls; ++id) {
    Message request;
    request.header.type = MessageType::kPullRequest;
    auto done = [&answered, id](absl::StatusOr<Message> response) {
      ++answered[id];
      if (!response.ok()) return;
      CHECK_EQ(response->header.request_id, static_cast<uint64_t>(id));
      if (response->payload_in_destination) {
        CHECK(response->payload.empty());
        CHECK_EQ(response->header.status, 0);
      }
    };
    if (id % 2 == 1) {
      endpoint->Call(std::move(request), std::move(done), dests[id].data(), kDestBytes);
    } else {
      endpoint->Call(std::move(request), std::move(done));
    }
  }
  const absl::Status s = Feed(endpoint.get(), fds[1], bytes);
  CHECK(absl::IsUnavailable(s) || absl::IsDataLoss(s)) << s;
  CHECK(!endpoint->healthy());
  // Every call is answered exactly once: by its response or by the close.
  for (int id = 1; id <= kClientCalls; ++id) CHECK_EQ(answered[id], 1) << "call " << id;
  ::close(fds[1]);
}

}  // namespace
}  // namespace strata::transport::tcp

namespace {
// Node 1's key of key epoch 5, and the secret to verify others'. Set once
// by LLVMFuzzerInitialize; never freed.
const std::shared_ptr<strata::transport::MembershipKeys>* membership = nullptr;
}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  strata::fuzz::QuietLogs();
  auto keys = std::make_shared<strata::transport::MembershipKeys>();
  const std::string secret = "fuzz secret";
  keys->Update(1, 5, strata::transport::DeriveNodeKey(secret, 1), secret);
  membership = new std::shared_ptr<strata::transport::MembershipKeys>(std::move(keys));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes = strata::fuzz::AsString(data, size);
  strata::transport::tcp::RunServer(bytes, nullptr);
  strata::transport::tcp::RunServer(bytes, *membership);
  strata::transport::tcp::RunClient(bytes);
  return 0;
}
