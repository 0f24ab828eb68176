// The rdma backend's frames (docs/wire-protocol.md, "rdma frames") and the
// receiving side of a connection: each received SEND is checked against the
// protocol and messages are put together from their chunks. No verbs here:
// the connection (rdma_transport.cc) hands over the bytes of a receive
// slot and acts on what the reader says, so a peer's bytes can be fuzzed
// (tests/fuzz/rdma_frame_fuzz.cc) without a device.
#ifndef STRATA_TRANSPORT_RDMA_RDMA_FRAMES_H_
#define STRATA_TRANSPORT_RDMA_RDMA_FRAMES_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/transport.h"

namespace strata::transport::rdma {

// Every SEND starts with a 48-byte frame header; message frames then carry
// the 72-byte message header of the tcp framing; message and continuation
// frames then a chunk of the payload. Host order (little-endian only).
inline constexpr uint32_t kFrameMagic = 0x31445253;  // "SRD1"
inline constexpr size_t kFrameBytes = 48;
inline constexpr size_t kMsgHeaderBytes = tcp::kFrameHeaderBytes;

enum FrameKind : uint16_t {
  kCredit = 1,    // credits only
  kMessage = 2,   // first frame of a message: header + first chunk
  kMore = 3,      // a further chunk of the message in progress
  kWritten = 4,   // a message whose payload was RDMA-written to the
                  // destination the request named
  kProbe = 5,     // the path check: the client's first frame once joined
  kProbeAck = 6,  // and the server's answer (never handed to a handler)
};
// Request: dest_* name a registered destination for the response: an
// address range in the region the client announced as dest_region.
inline constexpr uint16_t kFlagHasDest = 1;

struct Frame {
  uint16_t kind = 0;
  uint16_t flags = 0;
  uint32_t credits = 0;
  uint32_t chunk_bytes = 0;
  uint64_t total_bytes = 0;
  uint64_t dest_addr = 0;
  uint64_t dest_len = 0;
  uint32_t dest_region = 0;  // the region's handle (RdmaRegion), never its key
};

// Writes kFrameBytes at `out`.
void EncodeFrame(const Frame& f, char* out);
// Reads kFrameBytes at `in`; false for a bad magic or kind.
bool DecodeFrame(const char* in, Frame* f);

// Server: a destination a client announced (by handle), and its key.
struct RemoteRegion {
  uint64_t addr = 0;
  uint64_t length = 0;
  uint32_t rkey = 0;
};

// Where a response goes by RDMA WRITE: the destination a request named.
// Client: `region` the announced region's handle; server: `rkey` its key.
struct WriteTarget {
  bool valid = false;
  uint64_t addr = 0;
  uint64_t len = 0;
  uint32_t rkey = 0;
  uint32_t region = 0;
};

// A message being received, and once whole, received.
struct IncomingMessage {
  bool active = false;
  Message message;
  uint64_t total = 0;
  uint64_t got = 0;
  char* dest = nullptr;      // client: the CallInto destination in use
  WriteTarget reply_target;  // server: the request's destination
};

// The receiving side of one connection. Not thread-safe: the connection's
// lock guards it.
class FrameReader {
 public:
  // What the connection knows that the checks need; borrowed for the call.
  struct Context {
    bool server = false;
    std::string peer;  // for errors
    uint64_t max_payload_bytes = 0;
    // The credits the peer may still return (those we spent).
    uint32_t credits_out = 0;
    // Server: the node the connection belongs to, once bound.
    std::optional<uint32_t> bound_node;
    // Server: the destinations the client announced.
    const std::map<uint32_t, RemoteRegion>* remote_regions = nullptr;
    // Client: the CallInto destination of pending call `request_id`
    // (nullptr, 0 when there is none or it has none).
    std::function<std::pair<char*, uint64_t>(uint64_t request_id)> destination;
  };
  // What one frame did, for the connection to act on.
  struct Result {
    bool took_credit = false;  // it came on a credit (all but kCredit)
    uint32_t credits = 0;      // credits the peer returned
    bool send_probe_ack = false;
    bool probe_acked = false;
    bool written = false;                      // a response RDMA-written into its destination
    std::optional<IncomingMessage> delivered;  // a whole message
  };

  // One received frame: `len` bytes at `p`. DataLoss naming the peer and
  // what is wrong for anything the protocol does not allow (the connection
  // is then failed); the message in progress is then unusable.
  absl::Status OnFrame(const Context& c, const char* p, uint32_t len, Result* r);

  // Forgets the message in progress (a closed connection).
  void Reset() { incoming_ = IncomingMessage(); }
  const IncomingMessage& incoming() const { return incoming_; }

 private:
  void AppendChunk(const char* chunk, uint32_t n);
  absl::Status StartMessage(const Context& c, const Frame& f, const char* p, Result* r);

  IncomingMessage incoming_;
};

}  // namespace strata::transport::rdma

#endif  // STRATA_TRANSPORT_RDMA_RDMA_FRAMES_H_
