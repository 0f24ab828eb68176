// The data plane's messages: a fixed header (its fields, types and flags;
// 72 bytes on the TCP wire, docs/wire-protocol.md) and an opaque payload,
// and the error responses built from an absl::Status and read back into
// one. Every backend carries these; transport/transport.h moves them.
#ifndef STRATA_TRANSPORT_MESSAGE_H_
#define STRATA_TRANSPORT_MESSAGE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace strata::transport {

enum class MessageType : uint16_t {
  kInvalid = 0,
  kPullRequest = 1,   // worker -> pserver: send me partition P (version >= V)
  kPullResponse = 2,  // payload: fp32 values of the partition
  kPushRequest = 3,   // worker -> pserver: gradient for partition P, step V
  kPushResponse = 4,  // ack (status OK) or refusal
  kPing = 5,          // liveness / round-trip probe; echoed as kPong
  kPong = 6,
  // The rdma backend's connection set-up over its TCP bootstrap connection
  // (payload: a serialized proto::RdmaHello; docs/rdma.md). Handled by the
  // transport, never given to a RequestHandler.
  kRdmaHello = 7,
  kRdmaHelloReply = 8,
  // pserver (primary) -> pserver (backup): one replication record of a
  // partition (docs/reliability.md); header.seq is the record's index in the
  // partition's stream, header.count the receiving node's id.
  kReplicate = 9,
  kReplicateResponse = 10,
  // The data-plane membership handshake, first on a TCP connection when the
  // cluster runs mTLS (transport/data_plane_auth.h). Handled by the
  // transport, never given to a RequestHandler.
  kAuthHello = 11,
  kAuthHelloReply = 12,
  kAuthProof = 13,
  kAuthProofReply = 14,
  // worker -> worker: one chunk of a ring collective (transport/
  // ring_allreduce.h): version the operation, flags its phase, partition
  // its step, seq the chunk, count its floats; answered at once.
  kCollective = 15,
  kCollectiveResponse = 16,
  // worker -> worker: one micro-batch of a pipeline's forward pass, from a
  // stage to the next (worker/pipeline.h): version the step, seq the
  // micro-batch, partition the step's micro-batches, count its rows; the
  // payload its activations then its labels. Answered once the receiver's
  // backward pass of it is done, with the gradient of those activations.
  kStage = 17,
  kStageResponse = 18,
};
const char* MessageTypeName(MessageType t);
// True for the message types above other than kInvalid: the only types a
// backend puts on the wire.
bool IsValidMessageType(MessageType t);
// The response type answering `request_type` (kPullRequest -> kPullResponse,
// kPushRequest -> kPushResponse, kPing -> kPong, kRdmaHello ->
// kRdmaHelloReply); other types map to themselves.
MessageType ResponseTypeFor(MessageType request_type);

// Fixed-size message header. On the TCP wire it is 72 bytes, little-endian;
// see docs/wire-protocol.md. Fields a message type does not use are zero.
struct MessageHeader {
  MessageType type = MessageType::kInvalid;
  // Responses: an absl::StatusCode (0 = OK). On error the payload is the
  // UTF-8 error message. Requests: 0.
  uint16_t status = 0;
  uint32_t sender_id = 0;   // node id assigned by the master at registration
  uint64_t epoch = 0;       // sender's cluster-view epoch
  uint64_t request_id = 0;  // set by Connection::Call; echoed in the response
  uint64_t seq = 0;         // per-sender push sequence (push idempotence)
  uint32_t partition = 0;   // partition id
  uint32_t flags = 0;       // kFlagSparse, else 0
  uint64_t version = 0;     // pull: min version wanted / version sent;
                            // push: the step (version) the gradient is for
  uint64_t count = 0;       // push: samples the gradient sums over;
                            // error responses: the proto::ErrorReason
};

// MessageHeader::flags bit 0: a request for a sparse table's partition
// (docs/sparse.md). Pull: the payload is n little-endian uint64 keys and the
// response n rows of `dim` fp32 values in the same order. Push: n keys, then
// n rows of gradient (n * dim fp32).
inline constexpr uint32_t kFlagSparse = 1;
// MessageHeader::flags bit 1, kReplicate only: the record is a full copy of
// the partition (a new backup's catch-up), not an update.
inline constexpr uint32_t kFlagReplicaCopy = 2;
// MessageHeader::flags bit 2, kAuthHello only: the client seals its frames
// after the handshake (TransportOptions::encrypt_data_plane).
inline constexpr uint32_t kFlagEncrypt = 4;
// MessageHeader::flags bit 3, dense kPullRequest / kPushRequest (and their
// responses): the request is for one chunk of the partition (the view's
// chunk_bytes, docs/wire-protocol.md), whose index is in flags bits 16-31.
// Its payload (push) or response (pull) is that chunk's floats only.
inline constexpr uint32_t kFlagChunk = 8;
// MessageHeader::flags bit 4, dense kPushRequest (and kReplicate): the
// payload is the partition's initial values, not a gradient: a training
// script's first worker writes its model's values into the tables it
// declared (docs/python.md). Taken only while the partition is untrained
// (version 0, no push applied); count is 1.
inline constexpr uint32_t kFlagInitialValues = 16;
// MessageHeader::flags bit 5, kReplicate only: no update, a marker: the
// backup has caught up (it holds the copy and every record up to seq) and
// the primary now waits for it before acknowledging updates; the backup
// reports itself in sync from then on (docs/reliability.md).
inline constexpr uint32_t kFlagReplicaCaughtUp = 32;
inline constexpr int kChunkIndexShift = 16;
inline uint32_t ChunkFlags(uint32_t chunk) { return kFlagChunk | (chunk << kChunkIndexShift); }
inline uint32_t ChunkIndex(uint32_t flags) { return flags >> kChunkIndexShift; }

struct Message {
  MessageHeader header;
  std::string payload;  // opaque bytes; fp32 arrays for pull/push

  // Sending without a copy: when payload_ref is set, these bytes are sent
  // instead of `payload`. They are borrowed from the caller and must stay
  // valid and unchanged until Call / Respond returns (tcp writes them before
  // returning; inproc copies them; rdma copies them, or, when they lie in
  // memory registered as kSendSource, sends them in place and returns once
  // sent).
  const char* payload_ref = nullptr;
  size_t payload_ref_size = 0;
  // Call only: the caller keeps payload_ref valid and unchanged until the
  // call's callback has run, not only until Call returns. Then rdma sends
  // registered bytes in place without waiting in Call. A caller that gives
  // up on such a call must release the connection (which stops every send
  // on it) before changing the bytes. The transport puts no time limit on
  // such a call: the caller's own timeout does.
  bool payload_ref_until_response = false;

  // Receiving without a copy: true when the payload was written straight
  // into the destination given to Connection::CallInto (`payload` is empty).
  bool payload_in_destination = false;

  const char* payload_data() const { return payload_ref ? payload_ref : payload.data(); }
  size_t payload_size() const { return payload_ref ? payload_ref_size : payload.size(); }
  // Copies a borrowed payload into `payload` (for backends that send later).
  void OwnPayload() {
    if (payload_ref != nullptr) {
      payload.assign(payload_ref, payload_ref_size);
      payload_ref = nullptr;
      payload_ref_size = 0;
    }
  }
};

// Builds an error response to `request` with `status` (not OK); the
// status's reason (common/error_reason.h) goes into header.count.
Message MakeErrorResponse(const MessageHeader& request, MessageType type,
                          const absl::Status& status);
// The status carried by a response (OK or header.status + payload message,
// with the reason of header.count).
absl::Status ResponseStatus(const Message& response);

}  // namespace strata::transport

#endif  // STRATA_TRANSPORT_MESSAGE_H_
