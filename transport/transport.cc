// Backend-independent parts of the transport API: message helpers,
// Connection::CallSync and the CreateTransport factory.
#include "transport/transport.h"

#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/error_reason.h"
#include "glog/logging.h"
#include "transport/inproc/inproc_transport.h"
#include "transport/once_responder.h"
#include "transport/rdma/rdma_transport.h"
#include "transport/tcp/tcp_transport.h"

namespace strata::transport {

const char* MessageTypeName(MessageType t) {
  switch (t) {
    case MessageType::kInvalid:
      return "INVALID";
    case MessageType::kPullRequest:
      return "PULL_REQUEST";
    case MessageType::kPullResponse:
      return "PULL_RESPONSE";
    case MessageType::kPushRequest:
      return "PUSH_REQUEST";
    case MessageType::kPushResponse:
      return "PUSH_RESPONSE";
    case MessageType::kPing:
      return "PING";
    case MessageType::kPong:
      return "PONG";
    case MessageType::kRdmaHello:
      return "RDMA_HELLO";
    case MessageType::kRdmaHelloReply:
      return "RDMA_HELLO_REPLY";
    case MessageType::kReplicate:
      return "REPLICATE";
    case MessageType::kAuthHello:
      return "AUTH_HELLO";
    case MessageType::kAuthHelloReply:
      return "AUTH_HELLO_REPLY";
    case MessageType::kAuthProof:
      return "AUTH_PROOF";
    case MessageType::kAuthProofReply:
      return "AUTH_PROOF_REPLY";
    case MessageType::kCollective:
      return "COLLECTIVE";
    case MessageType::kCollectiveResponse:
      return "COLLECTIVE_RESPONSE";
    case MessageType::kReplicateResponse:
      return "REPLICATE_RESPONSE";
    case MessageType::kStage:
      return "STAGE";
    case MessageType::kStageResponse:
      return "STAGE_RESPONSE";
  }
  return "UNKNOWN";
}

bool IsValidMessageType(MessageType t) {
  const auto v = static_cast<uint16_t>(t);
  return v >= static_cast<uint16_t>(MessageType::kPullRequest) &&
         v <= static_cast<uint16_t>(MessageType::kStageResponse);
}

MessageType ResponseTypeFor(MessageType request_type) {
  switch (request_type) {
    case MessageType::kPullRequest:
      return MessageType::kPullResponse;
    case MessageType::kPushRequest:
      return MessageType::kPushResponse;
    case MessageType::kPing:
      return MessageType::kPong;
    case MessageType::kRdmaHello:
      return MessageType::kRdmaHelloReply;
    case MessageType::kReplicate:
      return MessageType::kReplicateResponse;
    case MessageType::kAuthHello:
      return MessageType::kAuthHelloReply;
    case MessageType::kAuthProof:
      return MessageType::kAuthProofReply;
    case MessageType::kCollective:
      return MessageType::kCollectiveResponse;
    case MessageType::kStage:
      return MessageType::kStageResponse;
    default:
      return request_type;
  }
}

Message MakeErrorResponse(const MessageHeader& request, MessageType type,
                          const absl::Status& status) {
  Message response;
  // Echo what identifies the request; sender_id/epoch are the responder's to
  // fill in, count is meaningless for an error.
  response.header.type = type;
  response.header.request_id = request.request_id;
  response.header.seq = request.seq;
  response.header.partition = request.partition;
  response.header.version = request.version;
  if (status.ok()) {
    response.header.status = static_cast<uint16_t>(absl::StatusCode::kInternal);
    response.payload = "MakeErrorResponse called with an OK status";
  } else {
    response.header.status = static_cast<uint16_t>(status.code());
    response.header.count = static_cast<uint64_t>(ReasonOf(status));
    response.payload = std::string(status.message());
  }
  return response;
}

absl::Status ResponseStatus(const Message& response) {
  const uint16_t code = response.header.status;
  if (code == 0) return absl::OkStatus();
  if (code > static_cast<uint16_t>(absl::StatusCode::kUnauthenticated)) {
    return absl::UnknownError(
        absl::StrCat("response carries unknown status code ", code, ": ", response.payload));
  }
  return WithWireReason(absl::Status(static_cast<absl::StatusCode>(code), response.payload),
                        response.header.count);
}

void Connection::CallInto(Message request, char* dest, size_t dest_size, ResponseCallback done) {
  Call(std::move(request), [dest, dest_size,
                            done = std::move(done)](absl::StatusOr<Message> response) {
    if (response.ok() && response->header.status == 0 && response->payload.size() == dest_size) {
      std::memcpy(dest, response->payload.data(), dest_size);
      response->payload.clear();
      response->payload_in_destination = true;
    }
    done(std::move(response));
  });
}

absl::StatusOr<Message> Connection::CallSync(Message request, absl::Duration timeout) {
  // Shared with the callback, which may run after we gave up waiting.
  struct State {
    absl::Mutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
    absl::StatusOr<Message> result ABSL_GUARDED_BY(mu);
  };
  auto state = std::make_shared<State>();
  Call(std::move(request), [state](absl::StatusOr<Message> result) {
    absl::MutexLock l(&state->mu);
    state->result = std::move(result);
    state->done = true;
  });
  absl::MutexLock l(&state->mu);
  if (!state->mu.AwaitWithTimeout(absl::Condition(&state->done), timeout)) {
    return absl::DeadlineExceededError(absl::StrCat("call to ", peer(), " got no response within ",
                                                    absl::FormatDuration(timeout)));
  }
  return std::move(state->result);
}

std::shared_ptr<InProcNetwork> NewInProcNetwork() { return std::make_shared<InProcNetwork>(); }

void OnceResponder::Respond(Message response) {
  if (responded_.exchange(true, std::memory_order_acq_rel)) {
    LOG(DFATAL) << backend_ << ": Respond called twice for request " << request_.request_id
                << " from " << peer_;
    return;
  }
  // The caller matches responses by request_id; the type defaults to the
  // one answering the request.
  response.header.request_id = request_.request_id;
  if (response.header.type == MessageType::kInvalid) {
    response.header.type = ResponseTypeFor(request_.type);
  }
  if (!IsValidMessageType(response.header.type)) {
    LOG(ERROR) << backend_ << ": handler responded with invalid message type "
               << static_cast<int>(response.header.type) << " to " << peer_;
    response = MakeErrorResponse(request_, ResponseTypeFor(request_.type),
                                 absl::InternalError("handler produced an invalid message type"));
  }
  Deliver(std::move(response));
}

OnceResponder::~OnceResponder() {
  DCHECK(responded_.load(std::memory_order_acquire))
      << backend_ << ": responder destroyed without AnswerIfDropped";
}

void OnceResponder::AnswerIfDropped() {
  if (responded_.load(std::memory_order_acquire)) return;
  Respond(MakeErrorResponse(
      request_, ResponseTypeFor(request_.type),
      absl::InternalError(absl::StrCat("request handler dropped the responder for ",
                                       MessageTypeName(request_.type), " request ",
                                       request_.request_id, " without responding"))));
}

absl::StatusOr<std::unique_ptr<Transport>> CreateTransport(const TransportOptions& options) {
  if (options.kind == "tcp") {
    tcp::TcpOptions tcp_options;
    tcp_options.max_payload_bytes = options.max_payload_bytes;
    tcp_options.membership = options.membership;
    tcp_options.encrypt = options.encrypt_data_plane;
    tcp_options.handshake_timeout = options.handshake_timeout;
    tcp_options.connect_timeout = options.tcp_connect_timeout;
    tcp_options.lend_request_payloads = options.lend_request_payloads;
    return tcp::NewTcpTransport(tcp_options);
  }
  if (options.kind == "inproc") {
    if (options.inproc_network == nullptr) {
      return absl::InvalidArgumentError("transport kind \"inproc\" needs options.inproc_network");
    }
    return inproc::NewInProcTransport(options.inproc_network);
  }
  if (options.kind == "rdma" || options.kind == "auto") {
    return rdma::NewRdmaTransport(options);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown transport kind \"", options.kind,
                   "\" (known: \"tcp\", \"rdma\", \"auto\", \"inproc\")"));
}

absl::Status CheckCallType(MessageType type, const std::string& peer) {
  if (IsValidMessageType(type)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("call to ", peer, ": cannot send message type ", static_cast<uint16_t>(type)));
}

absl::Status BrokenConnectionError(const std::string& peer, const absl::Status& why) {
  return absl::UnavailableError(
      absl::StrCat("connection to ", peer, " is broken: ", why.message()));
}

bool StartCall(MessageType type, const std::string& peer, ResponseCallback* done,
               const std::function<absl::Status()>& add) {
  absl::Status s = CheckCallType(type, peer);
  if (s.ok()) {
    if (absl::Status broken = add(); !broken.ok()) s = BrokenConnectionError(peer, broken);
  }
  if (s.ok()) return true;
  (*done)(s);
  return false;
}

}  // namespace strata::transport
