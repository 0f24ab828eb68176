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
