#include "transport/rdma/rdma_frames.h"

#include <cstring>
#include <map>
#include <string>
#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "transport/tcp/tcp_transport.h"

namespace strata::transport::rdma {
namespace {

using ::strata::testing::IsOk;
using ::strata::testing::StatusIs;
using ::testing::HasSubstr;

// A SEND: frame header, the message header for message frames, the chunk.
std::string Send(const Frame& f, const MessageHeader* h = nullptr, const std::string& chunk = "") {
  std::string out(kFrameBytes, '\0');
  EncodeFrame(f, out.data());
  if (h != nullptr) {
    char head[kMsgHeaderBytes];
    tcp::EncodeFrameHeader(*h, f.total_bytes, head);
    out.append(head, kMsgHeaderBytes);
  }
  return out + chunk;
}

Frame MessageFrame(uint16_t kind, uint32_t chunk, uint64_t total) {
  Frame f;
  f.kind = kind;
  f.chunk_bytes = chunk;
  f.total_bytes = total;
  return f;
}

class FrameReaderTest : public ::testing::Test {
 protected:
  FrameReaderTest() {
    c_.peer = "peer-a";
    c_.max_payload_bytes = 1 << 20;
    c_.credits_out = 2;
    c_.remote_regions = &regions_;
  }
  absl::Status Feed(const std::string& bytes, FrameReader::Result* r) {
    return reader_.OnFrame(c_, bytes.data(), static_cast<uint32_t>(bytes.size()), r);
  }
  std::map<uint32_t, RemoteRegion> regions_ = {{3, {0x1000, 64, 99}}};
  FrameReader::Context c_;
  FrameReader reader_;
};

TEST_F(FrameReaderTest, EncodeAndDecodeAgree) {
  Frame f = MessageFrame(kMessage, 5, 9);
  f.flags = kFlagHasDest;
  f.credits = 3;
  f.dest_addr = 0x1234;
  f.dest_len = 16;
  f.dest_region = 7;
  char b[kFrameBytes];
  EncodeFrame(f, b);
  Frame g;
  ASSERT_TRUE(DecodeFrame(b, &g));
  EXPECT_EQ(g.kind, f.kind);
  EXPECT_EQ(g.credits, 3u);
  EXPECT_EQ(g.total_bytes, 9u);
  EXPECT_EQ(g.dest_region, 7u);
  b[0] ^= 1;  // bad magic
  EXPECT_FALSE(DecodeFrame(b, &g));
}

TEST_F(FrameReaderTest, AMessageInTwoChunksIsDeliveredWhole) {
  c_.server = true;
  MessageHeader h;
  h.type = MessageType::kPushRequest;
  h.sender_id = 4;
  h.request_id = 1;
  FrameReader::Result r;
  ASSERT_THAT(Feed(Send(MessageFrame(kMessage, 3, 5), &h, "abc"), &r), IsOk());
  EXPECT_TRUE(r.took_credit);
  EXPECT_FALSE(r.delivered.has_value());
  ASSERT_THAT(Feed(Send(MessageFrame(kMore, 2, 5), nullptr, "de"), &r), IsOk());
  ASSERT_TRUE(r.delivered.has_value());
  EXPECT_EQ(r.delivered->message.payload, "abcde");
  EXPECT_EQ(r.delivered->message.header.sender_id, 4u);
}

TEST_F(FrameReaderTest, WhatTheProtocolDoesNotAllowIsDataLossNamingThePeer) {
  FrameReader::Result r;
  Frame credit;
  credit.kind = kCredit;
  credit.credits = 3;  // only 2 are out
  EXPECT_THAT(Feed(Send(credit), &r), StatusIs(absl::StatusCode::kDataLoss,
                                               HasSubstr("rdma frame from peer-a: returns 3")));
  EXPECT_THAT(Feed(Send(MessageFrame(kMore, 2, 5), nullptr, "de"), &r),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("continuation without a message")));
  EXPECT_THAT(Feed(std::string(10, 'x'), &r),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("not a frame")));
  Frame probe;
  probe.kind = kProbe;  // a client gets no path check
  EXPECT_THAT(Feed(Send(probe), &r),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("unexpected path check")));
  // Lengths that do not add up.
  MessageHeader h;
  h.type = MessageType::kPullResponse;
  EXPECT_THAT(Feed(Send(MessageFrame(kMessage, 4, 5), &h, "abc"), &r),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("says")));
}

TEST_F(FrameReaderTest, AServerChecksTheBoundNodeAndKeepsOnlyAnnouncedDestinations) {
  c_.server = true;
  c_.bound_node = 4;
  MessageHeader h;
  h.type = MessageType::kPullRequest;
  h.sender_id = 5;
  FrameReader::Result r;
  EXPECT_THAT(Feed(Send(MessageFrame(kMessage, 0, 0), &h), &r),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("belongs to node 4")));
  h.sender_id = 4;
  Frame f = MessageFrame(kMessage, 0, 0);
  f.flags = kFlagHasDest;
  f.dest_region = 3;
  f.dest_addr = 0x1000 + 32;
  f.dest_len = 32;  // inside the region
  ASSERT_THAT(Feed(Send(f, &h), &r), IsOk());
  ASSERT_TRUE(r.delivered.has_value());
  EXPECT_TRUE(r.delivered->reply_target.valid);
  EXPECT_EQ(r.delivered->reply_target.rkey, 99u);
  f.dest_len = 33;  // one byte past it: answered by SEND instead
  ASSERT_THAT(Feed(Send(f, &h), &r), IsOk());
  ASSERT_TRUE(r.delivered.has_value());
  EXPECT_FALSE(r.delivered->reply_target.valid);
  // A written frame is for clients only.
  EXPECT_THAT(Feed(Send(MessageFrame(kWritten, 0, 16), &h), &r),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("written frame sent to a server")));
}

TEST_F(FrameReaderTest, AClientTakesAWrittenResponseOnlyForItsDestination) {
  std::string dest(16, '\0');
  c_.destination = [&dest](uint64_t id) -> std::pair<char*, uint64_t> {
    return id == 7 ? std::pair<char*, uint64_t>(dest.data(), dest.size())
                   : std::pair<char*, uint64_t>(nullptr, 0);
  };
  MessageHeader h;
  h.type = MessageType::kPullResponse;
  h.request_id = 7;
  FrameReader::Result r;
  ASSERT_THAT(Feed(Send(MessageFrame(kWritten, 0, 16), &h), &r), IsOk());
  EXPECT_TRUE(r.written);
  ASSERT_TRUE(r.delivered.has_value());
  EXPECT_TRUE(r.delivered->message.payload_in_destination);
  h.request_id = 8;  // no destination
  EXPECT_THAT(Feed(Send(MessageFrame(kWritten, 0, 16), &h), &r),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("matches no destination")));
  // A SENT response for the destination lands in it.
  FrameReader fresh;
  h.request_id = 7;
  const std::string send = Send(MessageFrame(kMessage, 16, 16), &h, std::string(16, 'z'));
  ASSERT_THAT(fresh.OnFrame(c_, send.data(), static_cast<uint32_t>(send.size()), &r), IsOk());
  ASSERT_TRUE(r.delivered.has_value());
  EXPECT_EQ(r.delivered->dest, dest.data());
  EXPECT_EQ(dest, std::string(16, 'z'));
}

}  // namespace
}  // namespace strata::transport::rdma
