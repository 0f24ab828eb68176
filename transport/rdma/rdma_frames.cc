#include "transport/rdma/rdma_frames.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace strata::transport::rdma {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the rdma frame header is written in host order");

void EncodeFrame(const Frame& f, char* out) {
  std::memset(out, 0, kFrameBytes);
  std::memcpy(out + 0, &kFrameMagic, 4);
  std::memcpy(out + 4, &f.kind, 2);
  std::memcpy(out + 6, &f.flags, 2);
  std::memcpy(out + 8, &f.credits, 4);
  std::memcpy(out + 12, &f.chunk_bytes, 4);
  std::memcpy(out + 16, &f.total_bytes, 8);
  std::memcpy(out + 24, &f.dest_addr, 8);
  std::memcpy(out + 32, &f.dest_len, 8);
  std::memcpy(out + 40, &f.dest_region, 4);
}

bool DecodeFrame(const char* in, Frame* f) {
  uint32_t magic;
  std::memcpy(&magic, in, 4);
  if (magic != kFrameMagic) return false;
  std::memcpy(&f->kind, in + 4, 2);
  std::memcpy(&f->flags, in + 6, 2);
  std::memcpy(&f->credits, in + 8, 4);
  std::memcpy(&f->chunk_bytes, in + 12, 4);
  std::memcpy(&f->total_bytes, in + 16, 8);
  std::memcpy(&f->dest_addr, in + 24, 8);
  std::memcpy(&f->dest_len, in + 32, 8);
  std::memcpy(&f->dest_region, in + 40, 4);
  return f->kind >= kCredit && f->kind <= kProbeAck;
}

namespace {

absl::Status Bad(const FrameReader::Context& c, absl::string_view what) {
  return absl::DataLossError(absl::StrCat("rdma frame from ", c.peer, ": ", what));
}

}  // namespace

absl::Status FrameReader::OnFrame(const Context& c, const char* p, uint32_t len, Result* r) {
  *r = Result();
  Frame f;
  if (len < kFrameBytes || !DecodeFrame(p, &f)) {
    return Bad(c, absl::StrCat("not a frame (", len, " bytes, bad magic or kind)"));
  }
  r->took_credit = f.kind != kCredit;
  if (f.credits > c.credits_out) {
    return Bad(c,
               absl::StrCat("returns ", f.credits, " credits, only ", c.credits_out, " are out"));
  }
  r->credits = f.credits;
  const size_t head =
      kFrameBytes + (f.kind == kMessage || f.kind == kWritten ? kMsgHeaderBytes : 0);
  if (len != head + f.chunk_bytes) {
    return Bad(c, absl::StrCat("frame of ", len, " bytes says ", head, " + ", f.chunk_bytes));
  }
  switch (f.kind) {
    case kCredit:
      return absl::OkStatus();
    case kProbe:
      if (!c.server || f.chunk_bytes != 0) return Bad(c, "unexpected path check");
      r->send_probe_ack = true;
      return absl::OkStatus();
    case kProbeAck:
      if (c.server || f.chunk_bytes != 0) return Bad(c, "unexpected path check answer");
      r->probe_acked = true;
      return absl::OkStatus();
    case kMore:
      if (!incoming_.active) return Bad(c, "continuation without a message");
      if (f.chunk_bytes > incoming_.total - incoming_.got) {
        return Bad(c, "continuation beyond the message's payload");
      }
      AppendChunk(p + kFrameBytes, f.chunk_bytes);
      break;
    case kMessage:
    case kWritten:
      if (absl::Status s = StartMessage(c, f, p, r); !s.ok()) return s;
      break;
  }
  if (incoming_.got == incoming_.total) {
    r->delivered = std::move(incoming_);
    incoming_ = IncomingMessage();
  }
  return absl::OkStatus();
}

absl::Status FrameReader::StartMessage(const Context& c, const Frame& f, const char* p, Result* r) {
  if (incoming_.active) return Bad(c, "a new message before the last one ended");
  MessageHeader h;
  uint64_t payload_bytes = 0;
  absl::Status s = tcp::DecodeFrameHeader(p + kFrameBytes, c.max_payload_bytes, &h, &payload_bytes);
  if (!s.ok()) return Bad(c, s.message());
  if (payload_bytes != f.total_bytes) {
    return Bad(c, absl::StrCat("message header says ", payload_bytes, " payload bytes, frame ",
                               f.total_bytes));
  }
  if (f.chunk_bytes > f.total_bytes) return Bad(c, "chunk beyond the payload");
  if (c.server && c.bound_node.has_value() && h.sender_id != *c.bound_node) {
    return Bad(c, absl::StrCat(MessageTypeName(h.type), " says it is node ", h.sender_id,
                               " but the connection belongs to node ", *c.bound_node));
  }
  incoming_ = IncomingMessage();
  incoming_.active = true;
  incoming_.message.header = h;
  incoming_.total = f.total_bytes;
  if (c.server && (f.flags & kFlagHasDest) != 0 && f.dest_len <= c.max_payload_bytes &&
      c.remote_regions != nullptr) {
    // Only inside a region the client announced on the bootstrap; else the
    // answer goes by SEND (the client copies it in place).
    auto region = c.remote_regions->find(f.dest_region);
    if (region != c.remote_regions->end() && f.dest_addr >= region->second.addr &&
        f.dest_len <= region->second.length &&
        f.dest_addr - region->second.addr <= region->second.length - f.dest_len) {
      incoming_.reply_target =
          WriteTarget{true, f.dest_addr, f.dest_len, region->second.rkey, f.dest_region};
    }
  }
  if (!c.server) {
    const auto [dest, dest_size] =
        c.destination ? c.destination(h.request_id) : std::pair<char*, uint64_t>(nullptr, 0);
    const bool fits =
        dest != nullptr && h.status == 0 && dest_size == f.total_bytes && f.total_bytes > 0;
    if (f.kind == kWritten) {
      if (!fits) return Bad(c, "a written response that matches no destination");
      incoming_.got = incoming_.total;  // already in place
      incoming_.message.payload_in_destination = true;
      r->written = true;
    } else if (fits) {
      incoming_.dest = dest;
    }
  } else if (f.kind == kWritten) {
    return Bad(c, "a written frame sent to a server");
  }
  if (f.kind == kMessage) {
    if (incoming_.dest == nullptr) {
      incoming_.message.payload.reserve(std::min<uint64_t>(f.total_bytes, uint64_t{64} << 20));
    }
    AppendChunk(p + kFrameBytes + kMsgHeaderBytes, f.chunk_bytes);
  }
  return absl::OkStatus();
}

void FrameReader::AppendChunk(const char* chunk, uint32_t n) {
  if (incoming_.dest != nullptr) {
    std::memcpy(incoming_.dest + incoming_.got, chunk, n);
  } else {
    incoming_.message.payload.append(chunk, n);
  }
  incoming_.got += n;
}

}  // namespace strata::transport::rdma
