#include "storage/checkpoint_export.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/checkpoint_format.h"
#include "storage/ring_checkpoint.h"
#include "tests/testing/status_matchers.h"

namespace strata::storage {
namespace {

using ::strata::testing::IsOk;
using ::strata::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(PrecisionTest, ConvertsKnownValuesWithRoundToNearestEven) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToFp16(1.0f), 0x3c00);
  EXPECT_EQ(FloatToFp16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToFp16(65504.f), 0x7bff);                     // the largest half
  EXPECT_EQ(FloatToFp16(65520.f), 0x7c00);                     // rounds up to infinity
  EXPECT_EQ(FloatToFp16(std::ldexp(1.f, -24)), 0x0001);        // the smallest subnormal
  EXPECT_EQ(FloatToFp16(std::ldexp(1.f, -25)), 0x0000);        // a tie: to even (zero)
  EXPECT_EQ(FloatToFp16(std::ldexp(3.f, -26)), 0x0001);        // above the tie
  EXPECT_EQ(FloatToFp16(1.f + std::ldexp(1.f, -11)), 0x3c00);  // tie to even
  EXPECT_EQ(FloatToFp16(1.f + std::ldexp(3.f, -11)), 0x3c02);  // tie to even, up
  EXPECT_TRUE(std::isnan(Fp16ToFloat(FloatToFp16(std::nanf("")))));
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::nanf("")))));
  EXPECT_EQ(Fp16ToFloat(FloatToFp16(std::numeric_limits<float>::infinity())),
            std::numeric_limits<float>::infinity());
}

TEST(PrecisionTest, RoundTripsWithinHalfAnUlp) {
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.f, 0.5f);
  for (int i = 0; i < 10000; ++i) {
    const float v = d(rng);
    EXPECT_NEAR(Bf16ToFloat(FloatToBf16(v)), v, std::fabs(v) * std::ldexp(1.f, -8)) << v;
    if (std::fabs(v) > std::ldexp(1.f, -14)) {
      EXPECT_NEAR(Fp16ToFloat(FloatToFp16(v)), v, std::fabs(v) * std::ldexp(1.f, -11)) << v;
    }
  }
}

std::string Floats(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

// One partition file; returns its manifest entry.
proto::CheckpointFile WriteFile(FileSystem* fs, const std::string& root, uint64_t seq,
                                const proto::CheckpointPartitionHeader& h,
                                const std::vector<std::pair<BlockType, std::string>>& streams) {
  const std::string rel = CheckpointDirName(seq) + "/p" + std::to_string(h.id()) + ".blk";
  EXPECT_THAT(fs->CreateDirs(JoinPath(root, CheckpointDirName(seq))), IsOk());
  auto w = BlockFileWriter::Create(fs, JoinPath(root, rel), 1);
  EXPECT_THAT(w.status(), IsOk());
  EXPECT_THAT((*w)->Add(BlockType::kHeader, h.SerializeAsString()), IsOk());
  for (const auto& [t, s] : streams) EXPECT_THAT((*w)->Add(t, s), IsOk());
  auto info = (*w)->Finish();
  EXPECT_THAT(info.status(), IsOk());
  proto::CheckpointFile f;
  f.set_path(rel);
  f.set_size(info->size);
  f.set_crc32c(info->crc32c);
  f.set_seq(seq);
  f.set_full(h.full());
  return f;
}

// A sparse record: key, counters, `values`, then as many floats of state.
std::string Row(uint64_t key, const std::vector<float>& values) {
  std::string r(16, '\0');
  std::memcpy(r.data(), &key, 8);
  r += Floats(values);
  r += Floats(std::vector<float>(values.size(), 0.5f));
  return r;
}

TEST(ExportTest, WritesTheChainsValuesIn16BitsAndIsNotResumable) {
  auto fs = NewMemoryFileSystem();
  const std::string root = "/ck";
  proto::CheckpointManifest m;
  m.set_format_version(kCheckpointFormatVersion);
  m.set_job("j");
  m.set_seq(2);
  m.set_step(40);
  // A dense partition.
  proto::CheckpointPartitionHeader dense;
  dense.set_id(0);
  dense.set_table("fc.weight");
  dense.set_length(3);
  dense.set_full(true);
  proto::CheckpointPartition* p0 = m.add_partitions();
  p0->set_id(0);
  *p0->add_files() = WriteFile(fs.get(), root, 2, dense,
                               {{BlockType::kDenseValues, Floats({1.f, -0.25f, 3.14159f})},
                                {BlockType::kOptimizerState, Floats({9.f, 9.f, 9.f})}});
  // A sparse partition: a full image, then a delta updating key 7,
  // removing key 8 and adding key 9.
  proto::CheckpointPartitionHeader sparse;
  sparse.set_id(1);
  sparse.set_table("emb");
  sparse.set_sparse(true);
  sparse.set_dim(2);
  sparse.set_row_bytes(32);
  sparse.set_full(true);
  proto::CheckpointPartition* p1 = m.add_partitions();
  p1->set_id(1);
  *p1->add_files() = WriteFile(fs.get(), root, 1, sparse,
                               {{BlockType::kSparseRows, Row(7, {1.f, 2.f}) + Row(8, {3.f, 4.f})}});
  sparse.set_full(false);
  const uint64_t removed = 8;
  *p1->add_files() = WriteFile(
      fs.get(), root, 2, sparse,
      {{BlockType::kSparseDeletes, std::string(reinterpret_cast<const char*>(&removed), 8)},
       {BlockType::kSparseRows, Row(7, {-1.f, 0.5f}) + Row(9, {6.f, 8.f})}});
  ASSERT_THAT(WriteManifest(fs.get(), JoinPath(root, CheckpointDirName(2)), m), IsOk());

  auto out =
      ExportCheckpoint(fs.get(), "/ck/ckpt-00000002", "/export/fmnist-bf16", Precision::kBf16);
  ASSERT_THAT(out.status(), IsOk());
  EXPECT_EQ(out->precision(), "bf16");
  EXPECT_EQ(out->step(), 40u);
  auto back = ReadManifest(fs.get(), "/export/fmnist-bf16");
  ASSERT_THAT(back.status(), IsOk());
  ASSERT_THAT(CheckManifestFiles(fs.get(), "/export", *back), IsOk());
  // Dense: 3 values, 2 bytes each.
  auto streams = ReadBlockFile(fs.get(), "/export/" + back->partitions(0).files(0).path(),
                               &back->partitions(0).files(0));
  ASSERT_THAT(streams.status(), IsOk());
  const std::string& v16 = (*streams)[BlockType::kDenseValues16];
  ASSERT_EQ(v16.size(), 6u);
  uint16_t x[3];
  std::memcpy(x, v16.data(), 6);
  EXPECT_EQ(Bf16ToFloat(x[0]), 1.f);
  EXPECT_EQ(Bf16ToFloat(x[1]), -0.25f);
  EXPECT_NEAR(Bf16ToFloat(x[2]), 3.14159f, 0.02f);
  EXPECT_EQ(streams->count(BlockType::kOptimizerState), 0u);
  // Sparse: keys 7 (updated) and 9, not 8 (removed).
  streams = ReadBlockFile(fs.get(), "/export/" + back->partitions(1).files(0).path(),
                          &back->partitions(1).files(0));
  ASSERT_THAT(streams.status(), IsOk());
  const std::string& rows = (*streams)[BlockType::kSparseRows16];
  ASSERT_EQ(rows.size(), 2u * 12);
  uint64_t k0, k1;
  std::memcpy(&k0, rows.data(), 8);
  std::memcpy(&k1, rows.data() + 12, 8);
  EXPECT_EQ(k0, 7u);
  EXPECT_EQ(k1, 9u);
  uint16_t r0[2];
  std::memcpy(r0, rows.data() + 8, 4);
  EXPECT_EQ(Bf16ToFloat(r0[0]), -1.f);
  EXPECT_EQ(Bf16ToFloat(r0[1]), 0.5f);
  // An export is no checkpoint to export again.
  EXPECT_THAT(
      ExportCheckpoint(fs.get(), "/export/fmnist-bf16", "/export/again", Precision::kFp16).status(),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("already an inference export")));
  EXPECT_THAT(ParsePrecision("fp8").status(), StatusIs(absl::StatusCode::kInvalidArgument));
}

// A checkpoint of an allreduce job: a sparse table on the pservers and
// two dense tables (2x3 and 2 floats) kept by a ring of 2, whose shards
// split the flat space of 8 floats mid-table. The export holds each dense
// table as one partition of its own, numbered after the pservers'.
TEST(ExportTest, AllreduceTablesAreExportedFromTheRingsShards) {
  auto fs = NewMemoryFileSystem();
  const std::string root = "/ck";
  proto::CheckpointManifest m;
  m.set_format_version(kCheckpointFormatVersion);
  m.set_job("j");
  m.set_seq(3);
  m.set_optimizer("adam");
  proto::CheckpointTable* emb = m.add_tables();
  emb->set_name("emb");
  emb->set_sparse(true);
  emb->set_dim(2);
  emb->set_partitions(1);
  proto::CheckpointTable* w = m.add_tables();
  w->set_name("fc.weight");
  w->add_shape(2);
  w->add_shape(3);
  w->set_allreduce(true);
  proto::CheckpointTable* b = m.add_tables();
  b->set_name("fc.bias");
  b->add_shape(2);
  b->set_allreduce(true);
  proto::CheckpointPartitionHeader sparse;
  sparse.set_id(4);
  sparse.set_table("emb");
  sparse.set_sparse(true);
  sparse.set_dim(2);
  sparse.set_row_bytes(32);
  sparse.set_full(true);
  proto::CheckpointPartition* p = m.add_partitions();
  p->set_id(4);
  p->set_table("emb");
  *p->add_files() =
      WriteFile(fs.get(), root, 3, sparse, {{BlockType::kSparseRows, Row(7, {1.f, 2.f})}});
  const std::vector<float> flat = {1.f, 2.f, 3.f, 4.f, 5.f, 6.f, -1.f, -2.f};
  m.set_ring_floats(flat.size());
  for (uint32_t rank = 0; rank < 2; ++rank) {
    proto::CheckpointRingShardHeader h;
    h.set_format_version(kCheckpointFormatVersion);
    h.set_job("j");
    h.set_seq(3);
    h.set_rank(rank);
    h.set_ring_size(2);
    h.set_ring_epoch(5);
    h.set_begin(rank == 0 ? 0 : 5);
    h.set_end(rank == 0 ? 5 : 8);
    h.set_total(flat.size());
    h.set_optimizer("adam");
    h.set_state_vectors(2);
    h.set_state_count(true);
    h.set_step(9);
    h.set_updates(9);
    const std::vector<float> values(flat.begin() + h.begin(), flat.begin() + h.end());
    std::string state(8, '\0');
    state += Floats(std::vector<float>(2 * values.size(), 0.5f));
    auto f = WriteRingShard(fs.get(), root, h, values, state, 1);
    ASSERT_THAT(f.status(), IsOk());
    proto::CheckpointRingShard* r = m.add_ring_shards();
    r->set_rank(rank);
    r->set_begin(h.begin());
    r->set_end(h.end());
    *r->mutable_file() = *f;
  }
  ASSERT_THAT(WriteManifest(fs.get(), JoinPath(root, CheckpointDirName(3)), m), IsOk());

  auto out = ExportCheckpoint(fs.get(), "/ck/ckpt-00000003", "/export/e", Precision::kFp16);
  ASSERT_THAT(out.status(), IsOk());
  auto back = ReadManifest(fs.get(), "/export/e");
  ASSERT_THAT(back.status(), IsOk());
  ASSERT_THAT(CheckManifestFiles(fs.get(), "/export", *back), IsOk());
  EXPECT_EQ(back->ring_shards_size(), 0);
  ASSERT_EQ(back->partitions_size(), 3);
  EXPECT_EQ(back->partitions(0).id(), 4u);
  const std::vector<std::pair<std::string, std::vector<float>>> want = {
      {"fc.weight", {1.f, 2.f, 3.f, 4.f, 5.f, 6.f}}, {"fc.bias", {-1.f, -2.f}}};
  for (int i = 0; i < 2; ++i) {
    const proto::CheckpointPartition& e = back->partitions(1 + i);
    EXPECT_EQ(e.id(), 5u + i);
    EXPECT_EQ(e.table(), want[i].first);
    EXPECT_EQ(e.table_id(), 1u + i);
    EXPECT_EQ(e.length(), want[i].second.size());
    EXPECT_EQ(back->tables(1 + i).partitions(), 1u);
    auto streams = ReadBlockFile(fs.get(), "/export/" + e.files(0).path(), &e.files(0));
    ASSERT_THAT(streams.status(), IsOk());
    proto::CheckpointPartitionHeader h;
    ASSERT_THAT(ParseHeaderBlock(*streams, BlockType::kHeader, e.files(0).path(), &h), IsOk());
    EXPECT_EQ(h.table(), want[i].first);
    EXPECT_EQ(h.length(), want[i].second.size());
    EXPECT_FALSE(h.sparse());
    const std::string& v16 = (*streams)[BlockType::kDenseValues16];
    ASSERT_EQ(v16.size(), 2 * want[i].second.size());
    for (size_t j = 0; j < want[i].second.size(); ++j) {
      uint16_t x;
      std::memcpy(&x, v16.data() + 2 * j, 2);
      EXPECT_EQ(Fp16ToFloat(x), want[i].second[j]) << want[i].first << "[" << j << "]";
    }
  }

  // Tables whose shapes do not add up to the ring's floats: refused,
  // naming the manifest.
  b->set_shape(0, 1);
  ASSERT_THAT(WriteManifest(fs.get(), JoinPath(root, CheckpointDirName(3)), m), IsOk());
  EXPECT_THAT(
      ExportCheckpoint(fs.get(), "/ck/ckpt-00000003", "/export/f", Precision::kFp16).status(),
      StatusIs(absl::StatusCode::kDataLoss, AllOf(HasSubstr("/ck/ckpt-00000003"),
                                                  HasSubstr("hold 7 floats, its ring shards 8"))));
  w->add_shape(2);
  ASSERT_THAT(WriteManifest(fs.get(), JoinPath(root, CheckpointDirName(3)), m), IsOk());
  EXPECT_THAT(
      ExportCheckpoint(fs.get(), "/ck/ckpt-00000003", "/export/g", Precision::kFp16).status(),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr("'fc.weight' is larger")));
}

}  // namespace
}  // namespace strata::storage
