// Fuzz target: the rdma backend's frames on receipt (transport/rdma/
// rdma_frames.h, docs/wire-protocol.md "rdma frames"). The input is the
// SENDs a peer posts on a connection: [u16 length][that many bytes] after
// each other, each handed to a FrameReader as a receive slot's bytes, the
// code a real connection runs for each completion.
//
// It is read twice: by a server (a bound node, destinations the client
// announced, the path check) and by a client with calls pending, some with
// a destination buffer (written responses, payloads into the destination).
// Beyond "a Status, never a crash": the message in progress never holds
// more than its total, a delivered message is whole, a payload written in
// place stays inside its destination (ASan), and once a frame is refused
// the connection reads no more (as the transport fails it).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "glog/logging.h"
#include "tests/fuzz/fuzz_support.h"
#include "transport/rdma/rdma_frames.h"

namespace strata::transport::rdma {
namespace {

constexpr uint64_t kMaxPayload = 1 << 20;
constexpr size_t kDestBytes = 16;

void Read(const uint8_t* data, size_t size, bool server, uint64_t choice) {
  std::map<uint32_t, RemoteRegion> regions = {{1, {0x1000, 4096, 7}}, {2, {~0ull - 64, 64, 8}}};
  std::vector<std::string> dests(4, std::string(kDestBytes, '\0'));
  FrameReader reader;
  FrameReader::Context c;
  c.server = server;
  c.peer = "fuzz";
  c.max_payload_bytes = kMaxPayload;
  c.credits_out = static_cast<uint32_t>(choice % 64);
  if (server && (choice & 64)) c.bound_node = static_cast<uint32_t>(choice >> 8) % 4;
  c.remote_regions = &regions;
  c.destination = [&dests](uint64_t id) -> std::pair<char*, uint64_t> {
    if (id == 0 || id > dests.size()) return {nullptr, 0};
    return {dests[id - 1].data(), kDestBytes};  // calls 1..4 have a destination
  };
  size_t at = 0;
  while (at + 2 <= size) {
    const uint16_t len = static_cast<uint16_t>(data[at] | (data[at + 1] << 8));
    at += 2;
    const size_t n = std::min<size_t>(len, size - at);
    // A slot's bytes, in a buffer of exactly that size (ASan sees overreads).
    std::vector<char> slot(data + at, data + at + n);
    at += n;
    FrameReader::Result r;
    const absl::Status s = reader.OnFrame(c, slot.data(), static_cast<uint32_t>(slot.size()), &r);
    if (!s.ok()) return;         // the transport fails the connection
    c.credits_out -= r.credits;  // returned to us
    const IncomingMessage& in = reader.incoming();
    CHECK_LE(in.got, in.total);
    if (r.delivered.has_value()) {
      const IncomingMessage& m = *r.delivered;
      CHECK_EQ(m.got, m.total);
      if (m.dest == nullptr && !m.message.payload_in_destination) {
        CHECK_EQ(m.message.payload.size(), m.total);
      }
      if (m.reply_target.valid) CHECK(server);
    }
  }
}

}  // namespace
}  // namespace strata::transport::rdma

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  strata::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const uint64_t choice = strata::fuzz::InputHash(data, size);
  strata::transport::rdma::Read(data, size, /*server=*/true, choice);
  strata::transport::rdma::Read(data, size, /*server=*/false, choice);
  return 0;
}
