#include "pserver/replica_record.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace strata::pserver {
namespace {

using ::strata::testing::IsOk;
using ::strata::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

TEST(ReplicaRecordTest, UpdateRoundTrips) {
  ReplicaUpdate u;
  u.scale = 0.25f;
  u.chunk = 5;
  u.version = 1ull << 40;
  u.pushes = {{3, 17}, {4, 9}};
  u.keys = {1, 1ull << 63};
  u.grads = {1.5f, -2.f, 0.f, 3.f};
  auto back = DecodeReplicaUpdate(EncodeReplicaUpdate(u));
  ASSERT_THAT(back.status(), IsOk());
  EXPECT_EQ(back->scale, 0.25f);
  EXPECT_EQ(back->chunk, 5u);
  EXPECT_EQ(back->version, 1ull << 40);
  EXPECT_THAT(back->pushes, ElementsAre(Pair(3u, 17u), Pair(4u, 9u)));
  EXPECT_EQ(back->keys, u.keys);
  EXPECT_EQ(back->grads, u.grads);
}

TEST(ReplicaRecordTest, EveryTruncationOrExtensionIsDataLoss) {
  ReplicaUpdate u;
  u.scale = 1;
  u.pushes = {{1, 2}};
  u.grads = {1, 2, 3};
  const std::string bytes = EncodeReplicaUpdate(u);
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_THAT(DecodeReplicaUpdate(bytes.substr(0, n)).status(),
                StatusIs(absl::StatusCode::kDataLoss))
        << n;
  }
  EXPECT_THAT(DecodeReplicaUpdate(bytes + "x").status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("1 pushes, 0 keys and 3 floats")));
  // Counts that would overflow a 32-bit size do not.
  std::string huge(28, '\xff');
  EXPECT_THAT(DecodeReplicaUpdate(huge).status(), StatusIs(absl::StatusCode::kDataLoss));
}

// A primary writes its copy into a buffer allocated before its lock:
// streams given in parts, written in place when the buffer is larger
// (then cut to the copy), grown when it is smaller; the bytes are those
// of the copy made from whole streams.
TEST(ReplicaRecordTest, ACopyFromPartsIntoABufferIsTheSameCopy) {
  using storage::BlockType;
  const std::string header = "hdr", values = "0123456789", t = "T", m = "mm", v = "vvv";
  const std::string whole =
      EncodeReplicaCopy(std::map<BlockType, std::string>{{BlockType::kHeader, header},
                                                         {BlockType::kDenseValues, values},
                                                         {BlockType::kOptimizerState, t + m + v}});
  const std::vector<CopyStream> parts = {{BlockType::kHeader, {header}},
                                         {BlockType::kDenseValues, {values}},
                                         {BlockType::kOptimizerState, {t, m, v, ""}}};
  EXPECT_EQ(ReplicaCopySize(parts), whole.size());
  for (size_t buffer : {size_t{0}, whole.size() - 1, whole.size(), whole.size() + 256}) {
    std::string out(buffer, 'x');
    const char* at = out.data();
    EncodeReplicaCopy(parts, &out);
    EXPECT_EQ(out, whole) << "buffer of " << buffer;
    if (buffer >= whole.size()) EXPECT_EQ(out.data(), at) << "not written in place";
  }
  auto back = DecodeReplicaCopy(whole);
  ASSERT_THAT(back.status(), IsOk());
  EXPECT_EQ(back->at(BlockType::kOptimizerState), "Tmmvvv");
}

TEST(ReplicaRecordTest, CopyRoundTripsAndRefusesMalformedInput) {
  std::map<storage::BlockType, std::string> streams = {
      {storage::BlockType::kHeader, "head"},
      {storage::BlockType::kDenseValues, std::string(10, 'v')}};
  const std::string bytes = EncodeReplicaCopy(streams);
  auto back = DecodeReplicaCopy(bytes);
  ASSERT_THAT(back.status(), IsOk());
  EXPECT_EQ(*back, streams);
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_THAT(DecodeReplicaCopy(bytes.substr(0, n)).status(),
                StatusIs(absl::StatusCode::kDataLoss))
        << n;
  }
  EXPECT_THAT(DecodeReplicaCopy(bytes + "z").status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("after the last stream")));
}

}  // namespace
}  // namespace strata::pserver
