#include "storage/checkpoint_format.h"

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/checkpoint.pb.h"
#include "storage/faulty_file_system.h"
#include "storage/file_system.h"
#include "tests/testing/status_matchers.h"

namespace strata::storage {
namespace {

using ::strata::testing::IsOk;
using ::strata::testing::StatusIs;
using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

// The layout of a partition file, for the tests that damage one: a file
// header (8-byte magic, u32 format version, u32 0), then blocks, each a
// header (u32 magic, u8 type, u8 codec, u8 filter, u8 0, u32 raw size,
// u32 stored size, u32 crc32c) followed by its stored payload. The
// manifest's header is 8-byte magic, u32 version, u32 crc32c, u64 length.
constexpr size_t kFileHeaderBytes = 16;
constexpr size_t kBlockHeaderBytes = 20;
constexpr size_t kBlockStoredSizeOffset = 12;
constexpr size_t kVersionOffset = 8;  // in both the file's and the manifest's header
constexpr size_t kManifestHeaderBytes = 24;

uint32_t GetU32(const std::string& s, size_t pos) {
  uint32_t v;
  std::memcpy(&v, s.data() + pos, 4);
  return v;
}

void PutU32(std::string* s, size_t pos, uint32_t v) { std::memcpy(s->data() + pos, &v, 4); }

struct Block {
  size_t begin;          // of its header
  size_t payload_begin;  // of its stored payload
  size_t end;
  BlockType type;
};

// The blocks of a well-formed partition file.
std::vector<Block> Blocks(const std::string& file) {
  std::vector<Block> blocks;
  size_t pos = kFileHeaderBytes;
  while (pos + kBlockHeaderBytes <= file.size()) {
    const size_t stored = GetU32(file, pos + kBlockStoredSizeOffset);
    blocks.push_back({pos, pos + kBlockHeaderBytes, pos + kBlockHeaderBytes + stored,
                      static_cast<BlockType>(file[pos + 4])});
    pos = blocks.back().end;
  }
  return blocks;
}

std::string FloatBytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// Weights-like values: hard to compress.
std::string RandomFloats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.1f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return FloatBytes(v);
}

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

std::string HeaderPayload(uint64_t seq) {
  proto::CheckpointPartitionHeader h;
  h.set_format_version(kCheckpointFormatVersion);
  h.set_job("ctr");
  h.set_seq(seq);
  h.set_id(12);
  h.set_table("emb");
  h.set_offset(4096);
  h.set_length(1 << 20);
  h.set_version(77);
  h.set_full(true);
  h.set_optimizer("adam");
  return h.SerializeAsString();
}

struct Stream {
  BlockType type;
  std::string payload;
  bool shuffle4;
};

absl::StatusOr<BlockFileInfo> WriteBlockFile(FileSystem* fs, const std::string& path,
                                             int zstd_level, const std::vector<Stream>& streams) {
  absl::StatusOr<std::unique_ptr<BlockFileWriter>> w =
      BlockFileWriter::Create(fs, path, zstd_level);
  if (!w.ok()) return w.status();
  for (const Stream& s : streams) {
    absl::Status status = (*w)->Add(s.type, s.payload, s.shuffle4);
    if (!status.ok()) return status;
  }
  return (*w)->Finish();
}

// A file of three small blocks: the header, dense values, sparse deletes.
absl::StatusOr<BlockFileInfo> WriteSmallFile(FileSystem* fs, const std::string& path,
                                             int zstd_level) {
  return WriteBlockFile(fs, path, zstd_level,
                        {{BlockType::kHeader, HeaderPayload(1), false},
                         {BlockType::kDenseValues, RandomFloats(256, 1), true},
                         {BlockType::kSparseDeletes, RandomBytes(40, 2), false}});
}

// --- Partition files -------------------------------------------------------

class BlockFileRoundTripTest : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(BlockFileRoundTripTest, StreamsReadBackAndTheInfoDescribesTheFile) {
  const int level = std::get<0>(GetParam());
  const bool shuffle = std::get<1>(GetParam());
  std::unique_ptr<FileSystem> fs = NewMemoryFileSystem();
  const std::string path = "/ckpt/ckpt-00000001/p00000.blk";

  const std::string header = HeaderPayload(1);
  // Three blocks: two full ones and a short one.
  const std::string dense = RandomFloats(2 * kMaxBlockBytes / 4 + 1000, 3);
  // A full block, then 7 bytes: one word and a 3-byte tail.
  const std::string state = RandomFloats(kMaxBlockBytes / 4, 4) + "1234567";
  // Two Adds to one stream concatenate.
  const std::string rows_a = RandomBytes(1000, 5);
  const std::string rows_b = RandomBytes(501, 6);

  STRATA_ASSERT_OK_AND_ASSIGN(BlockFileInfo info,
                              WriteBlockFile(fs.get(), path, level,
                                             {{BlockType::kHeader, header, false},
                                              {BlockType::kDenseValues, dense, shuffle},
                                              {BlockType::kOptimizerState, state, shuffle},
                                              {BlockType::kSparseRows, rows_a, shuffle},
                                              {BlockType::kSparseRows, rows_b, shuffle}}));

  STRATA_ASSERT_OK_AND_ASSIGN(const std::string file, fs->ReadFile(path));
  EXPECT_EQ(info.size, file.size());
  EXPECT_EQ(info.crc32c, Crc32c(file));
  EXPECT_EQ(info.raw_bytes,
            header.size() + dense.size() + state.size() + rows_a.size() + rows_b.size());

  const std::vector<Block> blocks = Blocks(file);
  ASSERT_FALSE(blocks.empty());
  EXPECT_EQ(blocks.back().end, file.size());
  int dense_blocks = 0, state_blocks = 0;
  for (const Block& b : blocks) {
    if (b.type == BlockType::kDenseValues) ++dense_blocks;
    if (b.type == BlockType::kOptimizerState) ++state_blocks;
  }
  EXPECT_EQ(dense_blocks, 3);
  EXPECT_EQ(state_blocks, 2);

  STRATA_ASSERT_OK_AND_ASSIGN(auto streams, ReadBlockFile(fs.get(), path));
  EXPECT_EQ(streams.size(), 4u);
  EXPECT_EQ(streams[BlockType::kHeader], header);
  ASSERT_EQ(streams[BlockType::kDenseValues].size(), dense.size());
  EXPECT_TRUE(streams[BlockType::kDenseValues] == dense);
  ASSERT_EQ(streams[BlockType::kOptimizerState].size(), state.size());
  EXPECT_TRUE(streams[BlockType::kOptimizerState] == state);
  EXPECT_TRUE(streams[BlockType::kSparseRows] == rows_a + rows_b);

  proto::CheckpointPartitionHeader parsed;
  ASSERT_TRUE(parsed.ParseFromString(streams[BlockType::kHeader]));
  EXPECT_EQ(parsed.seq(), 1u);
  EXPECT_EQ(parsed.table(), "emb");

  proto::CheckpointFile expected;
  expected.set_size(info.size);
  expected.set_crc32c(info.crc32c);
  EXPECT_THAT(ReadBlockFile(fs.get(), path, &expected).status(), IsOk());
  expected.set_raw_bytes(info.raw_bytes);
  EXPECT_THAT(ReadBlockFile(fs.get(), path, &expected).status(), IsOk());
  // A manifest that disagrees with the blocks' sizes: refused before the
  // streams are allocated.
  expected.set_raw_bytes(info.raw_bytes + 1);
  EXPECT_THAT(ReadBlockFile(fs.get(), path, &expected).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("the manifest says")));
}

INSTANTIATE_TEST_SUITE_P(LevelsAndFilters, BlockFileRoundTripTest,
                         ::testing::Combine(::testing::Values(0, 1), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<int, bool>>& info) {
                           return absl::StrCat("Level", std::get<0>(info.param),
                                               std::get<1>(info.param) ? "Shuffle4" : "Plain");
                         });

TEST(BlockFileTest, FloatsWithFewDistinctValuesCompressWell) {
  std::unique_ptr<FileSystem> fs = NewMemoryFileSystem();
  std::vector<float> v(1 << 20);  // 4 MiB
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.25f * static_cast<float>(i % 4);
  const std::string values = FloatBytes(v);

  STRATA_ASSERT_OK_AND_ASSIGN(BlockFileInfo zstd,
                              WriteBlockFile(fs.get(), "/c/zstd.blk", 1,
                                             {{BlockType::kHeader, HeaderPayload(1), false},
                                              {BlockType::kDenseValues, values, true}}));
  EXPECT_LT(zstd.size * 20, zstd.raw_bytes) << zstd.size << " of " << zstd.raw_bytes;
  STRATA_ASSERT_OK_AND_ASSIGN(auto size, fs->FileSize("/c/zstd.blk"));
  EXPECT_EQ(size, zstd.size);
  STRATA_ASSERT_OK_AND_ASSIGN(auto streams, ReadBlockFile(fs.get(), "/c/zstd.blk"));
  EXPECT_TRUE(streams[BlockType::kDenseValues] == values);

  // Level 0 stores the same data as is, headers included.
  STRATA_ASSERT_OK_AND_ASSIGN(BlockFileInfo stored,
                              WriteBlockFile(fs.get(), "/c/stored.blk", 0,
                                             {{BlockType::kHeader, HeaderPayload(1), false},
                                              {BlockType::kDenseValues, values, true}}));
  EXPECT_EQ(stored.raw_bytes, zstd.raw_bytes);
  EXPECT_GT(stored.size, stored.raw_bytes);
}

TEST(BlockFileTest, ExpectedSizeOrChecksumMismatchIsDataLossNamingTheFile) {
  std::unique_ptr<FileSystem> fs = NewMemoryFileSystem();
  const std::string path = "/ckpt/ckpt-00000002/p00003.blk";
  STRATA_ASSERT_OK_AND_ASSIGN(BlockFileInfo info, WriteSmallFile(fs.get(), path, 1));

  proto::CheckpointFile expected;
  expected.set_path("ckpt-00000002/p00003.blk");
  expected.set_size(info.size);
  expected.set_crc32c(info.crc32c);
  EXPECT_THAT(ReadBlockFile(fs.get(), path, &expected).status(), IsOk());

  proto::CheckpointFile wrong_size = expected;
  wrong_size.set_size(info.size + 1);
  EXPECT_THAT(ReadBlockFile(fs.get(), path, &wrong_size).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr(path)));

  proto::CheckpointFile wrong_crc = expected;
  wrong_crc.set_crc32c(info.crc32c ^ 1u);
  EXPECT_THAT(ReadBlockFile(fs.get(), path, &wrong_crc).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr(path)));
}

TEST(BlockFileTest, AFlippedByteInABlockIsDataLoss) {
  for (const int level : {0, 1}) {
    SCOPED_TRACE(absl::StrCat("zstd level ", level));
    std::unique_ptr<FileSystem> fs = NewMemoryFileSystem();
    const std::string path = "/ckpt/p.blk";
    ASSERT_THAT(WriteSmallFile(fs.get(), path, level).status(), IsOk());
    STRATA_ASSERT_OK_AND_ASSIGN(const std::string original, fs->ReadFile(path));
    const std::vector<Block> blocks = Blocks(original);
    ASSERT_EQ(blocks.size(), 3u);

    // Every byte of every payload, and the header fields the block's
    // checksum covers besides its magic and sizes (type, codec, filter,
    // reserved, raw size) and the checksum itself.
    std::vector<size_t> undetected_payload, undetected_header;
    for (const Block& b : blocks) {
      for (size_t pos = b.payload_begin; pos < b.end; ++pos) {
        std::string corrupt = original;
        corrupt[pos] ^= 0x20;
        ASSERT_THAT(fs->WriteFileAtomic(path, corrupt), IsOk());
        const absl::Status s = ReadBlockFile(fs.get(), path).status();
        if (s.code() != absl::StatusCode::kDataLoss || !absl::StrContains(s.message(), path) ||
            !absl::StrContains(s.message(), "checksum")) {
          undetected_payload.push_back(pos);
        }
      }
      for (size_t off : {4, 5, 6, 7, 8, 9, 10, 11, 16, 17, 18, 19}) {
        std::string corrupt = original;
        corrupt[b.begin + off] ^= 0x01;
        ASSERT_THAT(fs->WriteFileAtomic(path, corrupt), IsOk());
        const absl::Status s = ReadBlockFile(fs.get(), path).status();
        if (s.code() != absl::StatusCode::kDataLoss || !absl::StrContains(s.message(), path)) {
          undetected_header.push_back(b.begin + off);
        }
      }
    }
    EXPECT_THAT(undetected_payload, IsEmpty());
    EXPECT_THAT(undetected_header, IsEmpty());
  }
}

TEST(BlockFileTest, ATruncatedFileIsDataLossNamingTheFile) {
  std::unique_ptr<FileSystem> fs = NewMemoryFileSystem();
  const std::string path = "/ckpt/p.blk";
  STRATA_ASSERT_OK_AND_ASSIGN(BlockFileInfo info, WriteSmallFile(fs.get(), path, 0));
  STRATA_ASSERT_OK_AND_ASSIGN(const std::string original, fs->ReadFile(path));
  const std::vector<Block> blocks = Blocks(original);
  ASSERT_EQ(blocks.size(), 3u);

  // Within the file header, or nothing after it.
  for (const size_t cut : {size_t{0}, size_t{7}, kFileHeaderBytes - 1, kFileHeaderBytes}) {
    SCOPED_TRACE(absl::StrCat("cut at ", cut));
    ASSERT_THAT(fs->WriteFileAtomic(path, original.substr(0, cut)), IsOk());
    EXPECT_THAT(ReadBlockFile(fs.get(), path).status(),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr(path)));
  }
  // Within a block's header or payload.
  for (const Block& b : blocks) {
    ASSERT_GT(b.end - b.payload_begin, 2u);
    for (const size_t cut : {b.begin + 1, b.begin + kBlockHeaderBytes - 1, b.payload_begin,
                             (b.payload_begin + b.end) / 2, b.end - 1}) {
      SCOPED_TRACE(absl::StrCat("cut at ", cut, " of ", original.size()));
      ASSERT_THAT(fs->WriteFileAtomic(path, original.substr(0, cut)), IsOk());
      EXPECT_THAT(
          ReadBlockFile(fs.get(), path).status(),
          StatusIs(absl::StatusCode::kDataLoss,
                   AllOf(HasSubstr(path), AnyOf(HasSubstr("torn"), HasSubstr("cut short")))));
    }
  }
  // At a block boundary only the manifest's size tells.
  proto::CheckpointFile expected;
  expected.set_size(info.size);
  expected.set_crc32c(info.crc32c);
  ASSERT_THAT(fs->WriteFileAtomic(path, original.substr(0, blocks[2].begin)), IsOk());
  EXPECT_THAT(ReadBlockFile(fs.get(), path, &expected).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr(path)));
}

TEST(BlockFileTest, BadFileMagicIsDataLoss) {
  std::unique_ptr<FileSystem> fs = NewMemoryFileSystem();
  const std::string path = "/ckpt/p.blk";
  ASSERT_THAT(WriteSmallFile(fs.get(), path, 1).status(), IsOk());
  STRATA_ASSERT_OK_AND_ASSIGN(std::string data, fs->ReadFile(path));
  data[0] = 'X';
  ASSERT_THAT(fs->WriteFileAtomic(path, data), IsOk());
  EXPECT_THAT(ReadBlockFile(fs.get(), path).status(),
              StatusIs(absl::StatusCode::kDataLoss, AllOf(HasSubstr(path), HasSubstr("magic"))));

  ASSERT_THAT(fs->WriteFileAtomic(path, std::string(100, 'x')), IsOk());
  EXPECT_THAT(ReadBlockFile(fs.get(), path).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr(path)));
}

TEST(BlockFileTest, AnotherFormatVersionIsFailedPrecondition) {
  std::unique_ptr<FileSystem> fs = NewMemoryFileSystem();
  const std::string path = "/ckpt/p.blk";
  ASSERT_THAT(WriteSmallFile(fs.get(), path, 1).status(), IsOk());
  STRATA_ASSERT_OK_AND_ASSIGN(const std::string original, fs->ReadFile(path));
  ASSERT_EQ(GetU32(original, kVersionOffset), kCheckpointFormatVersion);

  for (const uint32_t version : {0u, kCheckpointFormatVersion + 1, 0xFFFFFFFFu}) {
    SCOPED_TRACE(absl::StrCat("version ", version));
    std::string data = original;
    PutU32(&data, kVersionOffset, version);
    ASSERT_THAT(fs->WriteFileAtomic(path, data), IsOk());
    EXPECT_THAT(ReadBlockFile(fs.get(), path).status(),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         AllOf(HasSubstr(path), HasSubstr("version"))));
  }
}

TEST(BlockFileTest, AFileWithoutAHeaderStreamIsDataLoss) {
  std::unique_ptr<FileSystem> fs = NewMemoryFileSystem();
  const std::string path = "/ckpt/p.blk";
  ASSERT_THAT(
      WriteBlockFile(fs.get(), path, 1, {{BlockType::kDenseValues, RandomFloats(100, 7), true}})
          .status(),
      IsOk());
  EXPECT_THAT(ReadBlockFile(fs.get(), path).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr(path)));
}

// A ring shard's file reads (its header is stream 9), but a reader of
// partitions is told it has no partition header, and the other way round.
TEST(BlockFileTest, ARingShardFileIsNotTakenForAPartitionFile) {
  std::unique_ptr<FileSystem> fs = NewMemoryFileSystem();
  const std::string path = "/ckpt/ckpt-00000001/ring-1-00000.blk";
  proto::CheckpointRingShardHeader ring;
  ring.set_job("j");
  ring.set_total(100);
  ASSERT_THAT(WriteBlockFile(fs.get(), path, 1,
                             {{BlockType::kRingHeader, ring.SerializeAsString(), false},
                              {BlockType::kDenseValues, RandomFloats(100, 7), true}})
                  .status(),
              IsOk());
  STRATA_ASSERT_OK_AND_ASSIGN(auto streams, ReadBlockFile(fs.get(), path));
  proto::CheckpointRingShardHeader parsed_ring;
  EXPECT_THAT(ParseHeaderBlock(streams, BlockType::kRingHeader, path, &parsed_ring), IsOk());
  EXPECT_EQ(parsed_ring.total(), 100u);
  proto::CheckpointPartitionHeader partition;
  EXPECT_THAT(ParseHeaderBlock(streams, BlockType::kHeader, path, &partition),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr(path), HasSubstr("no partition header block"))));

  streams.clear();
  streams[BlockType::kHeader] = HeaderPayload(1);
  EXPECT_THAT(ParseHeaderBlock(streams, BlockType::kRingHeader, path, &parsed_ring),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr(path), HasSubstr("no ring shard header block"))));
  streams[BlockType::kRingHeader] = "\xff\xff";
  EXPECT_THAT(ParseHeaderBlock(streams, BlockType::kRingHeader, path, &parsed_ring),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("does not parse")));
}

TEST(BlockFileTest, AMissingFileIsNotFound) {
  std::unique_ptr<FileSystem> fs = NewMemoryFileSystem();
  EXPECT_THAT(ReadBlockFile(fs.get(), "/ckpt/none.blk").status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/ckpt/none.blk")));
}

// --- Manifests -------------------------------------------------------------

proto::CheckpointManifest SampleManifest(uint64_t seq) {
  proto::CheckpointManifest m;
  m.set_format_version(kCheckpointFormatVersion);
  m.set_job("ctr");
  m.set_seq(seq);
  m.set_incremental(true);
  m.set_base_seq(seq - 1);
  m.set_consistency("bsp");
  m.set_step(1234);
  m.set_cluster_epoch(3);
  m.set_created_unix_ms(1700000000000);
  m.set_reason("steps");
  m.set_optimizer("adam");
  m.set_sparse_optimizer("adagrad");
  m.set_slice_bytes(1 << 20);
  m.add_tasks_done(3);
  m.add_tasks_done(5);
  proto::CheckpointTask* task = m.add_tasks_partial();
  task->set_id(7);
  task->set_trained_records(99);
  m.set_samples(123456);
  m.set_bytes_written(1000);
  m.set_raw_bytes(5000);
  m.set_write_seconds(1.5);
  proto::CheckpointPartition* p = m.add_partitions();
  p->set_id(2);
  p->set_table("emb");
  p->set_sparse(true);
  p->set_dim(8);
  p->set_version(1234);
  p->set_rows(10);
  for (uint64_t s : {seq - 1, seq}) {
    proto::CheckpointFile* f = p->add_files();
    f->set_path(JoinPath(CheckpointDirName(s), "p00002.blk"));
    f->set_size(100 + s);
    f->set_crc32c(0xABCD0000u + static_cast<uint32_t>(s));
    f->set_seq(s);
    f->set_full(s == seq - 1);
    f->set_raw_bytes(400);
  }
  return m;
}

TEST(ManifestTest, RoundTrips) {
  std::unique_ptr<FileSystem> fs = NewMemoryFileSystem();
  const std::string dir = "/r/ckpt-00000005";
  const proto::CheckpointManifest m = SampleManifest(5);
  ASSERT_THAT(WriteManifest(fs.get(), dir, m), IsOk());

  STRATA_ASSERT_OK_AND_ASSIGN(const std::string bytes, fs->ReadFile(dir + "/MANIFEST"));
  EXPECT_EQ(bytes, EncodeManifest(m));
  STRATA_ASSERT_OK_AND_ASSIGN(proto::CheckpointManifest read, ReadManifest(fs.get(), dir));
  EXPECT_EQ(read.DebugString(), m.DebugString());
  EXPECT_EQ(read.seq(), 5u);
  ASSERT_EQ(read.partitions_size(), 1);
  EXPECT_EQ(read.partitions(0).files_size(), 2);
  // No temp file is left next to it.
  STRATA_ASSERT_OK_AND_ASSIGN(auto names, fs->ListDir(dir));
  EXPECT_THAT(names, ElementsAre(std::string(kManifestName)));
}

// A manifest's file paths are read, exported and removed under the root:
// one that climbs out of it (or is absolute) is refused, naming it.
TEST(ManifestTest, AFilePathOutsideTheRootIsRefused) {
  std::unique_ptr<FileSystem> fs = NewMemoryFileSystem();
  const std::string dir = "/r/ckpt-00000005";
  for (const std::string bad : {"../../etc/passwd", "/etc/passwd", "ckpt-00000004/../../x",
                                "ckpt-00000004//p.blk", "./p.blk", ""}) {
    proto::CheckpointManifest m = SampleManifest(5);
    m.mutable_partitions(0)->mutable_files(1)->set_path(bad);
    ASSERT_THAT(WriteManifest(fs.get(), dir, m), IsOk());
    EXPECT_THAT(ReadManifest(fs.get(), dir).status(),
                StatusIs(absl::StatusCode::kDataLoss,
                         AllOf(HasSubstr("/r/ckpt-00000005/MANIFEST"),
                               HasSubstr("not a relative path under the checkpoint root"))))
        << bad;
  }
  EXPECT_TRUE(IsPathUnderRoot("ckpt-00000004/p00002.blk"));
  EXPECT_FALSE(IsPathUnderRoot(std::string("a\0b", 3)));
}

TEST(ManifestTest, MissingIsNotFound) {
  std::unique_ptr<FileSystem> fs = NewMemoryFileSystem();
  EXPECT_THAT(ReadManifest(fs.get(), "/r/ckpt-00000001").status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/r/ckpt-00000001/MANIFEST")));
}

TEST(ManifestTest, TruncatedIsDataLossNamingTheFile) {
  std::unique_ptr<FileSystem> fs = NewMemoryFileSystem();
  const std::string dir = "/r/ckpt-00000002";
  const std::string path = dir + "/MANIFEST";
  const std::string bytes = EncodeManifest(SampleManifest(2));
  ASSERT_GT(bytes.size(), kManifestHeaderBytes + 2);
  for (const size_t cut :
       {size_t{0}, size_t{8}, size_t{12}, kManifestHeaderBytes - 1, kManifestHeaderBytes,
        (kManifestHeaderBytes + bytes.size()) / 2, bytes.size() - 1}) {
    SCOPED_TRACE(absl::StrCat("cut at ", cut, " of ", bytes.size()));
    ASSERT_THAT(fs->WriteFileAtomic(path, bytes.substr(0, cut)), IsOk());
    EXPECT_THAT(ReadManifest(fs.get(), dir).status(),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr(path)));
  }
}

TEST(ManifestTest, AFlippedByteIsDataLossNamingTheFile) {
  std::unique_ptr<FileSystem> fs = NewMemoryFileSystem();
  const std::string dir = "/r/ckpt-00000002";
  const std::string path = dir + "/MANIFEST";
  const std::string bytes = EncodeManifest(SampleManifest(2));

  std::vector<size_t> undetected;
  for (size_t pos = kManifestHeaderBytes; pos < bytes.size(); ++pos) {
    std::string corrupt = bytes;
    corrupt[pos] ^= 0x04;
    ASSERT_THAT(fs->WriteFileAtomic(path, corrupt), IsOk());
    const absl::Status s = ReadManifest(fs.get(), dir).status();
    if (s.code() != absl::StatusCode::kDataLoss || !absl::StrContains(s.message(), path) ||
        !absl::StrContains(s.message(), "checksum")) {
      undetected.push_back(pos);
    }
  }
  EXPECT_THAT(undetected, IsEmpty());

  // The magic, the stored checksum and the length.
  for (const size_t pos : {size_t{0}, size_t{12}, size_t{16}}) {
    SCOPED_TRACE(absl::StrCat("byte ", pos));
    std::string corrupt = bytes;
    corrupt[pos] ^= 0x04;
    ASSERT_THAT(fs->WriteFileAtomic(path, corrupt), IsOk());
    EXPECT_THAT(ReadManifest(fs.get(), dir).status(),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr(path)));
  }
}

TEST(ManifestTest, AnotherFormatVersionIsFailedPrecondition) {
  std::unique_ptr<FileSystem> fs = NewMemoryFileSystem();
  const std::string dir = "/r/ckpt-00000002";
  const std::string path = dir + "/MANIFEST";

  std::string bytes = EncodeManifest(SampleManifest(2));
  ASSERT_EQ(GetU32(bytes, kVersionOffset), kCheckpointFormatVersion);
  PutU32(&bytes, kVersionOffset, kCheckpointFormatVersion + 1);
  ASSERT_THAT(fs->WriteFileAtomic(path, bytes), IsOk());
  EXPECT_THAT(ReadManifest(fs.get(), dir).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr(path), HasSubstr("version"))));

  // The version inside the body is checked too.
  proto::CheckpointManifest m = SampleManifest(2);
  m.set_format_version(kCheckpointFormatVersion + 1);
  ASSERT_THAT(WriteManifest(fs.get(), dir, m), IsOk());
  EXPECT_THAT(ReadManifest(fs.get(), dir).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(path)));
}

TEST(ManifestTest, APartitionListedTwiceIsDataLoss) {
  // Found by tests/fuzz/checkpoint_manifest_fuzz.cc: both entries would be
  // restored into one partition, and exported to one file.
  std::unique_ptr<FileSystem> fs = NewMemoryFileSystem();
  const std::string dir = "/r/ckpt-00000002";
  proto::CheckpointManifest m = SampleManifest(2);
  *m.add_partitions() = m.partitions(0);
  ASSERT_THAT(WriteManifest(fs.get(), dir, m), IsOk());
  EXPECT_THAT(ReadManifest(fs.get(), dir).status(),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr(dir + "/MANIFEST"), HasSubstr("partition 2 listed twice"))));
}

// --- Names and the catalogue -------------------------------------------------

TEST(CheckpointNameTest, DirNameAndSeqRoundTrip) {
  EXPECT_EQ(CheckpointDirName(7), "ckpt-00000007");
  EXPECT_EQ(CheckpointDirName(12345678), "ckpt-12345678");
  for (const uint64_t seq :
       {uint64_t{1}, uint64_t{7}, uint64_t{99999999}, uint64_t{123456789}, uint64_t{1} << 40}) {
    EXPECT_EQ(CheckpointSeqOfName(CheckpointDirName(seq)), seq) << CheckpointDirName(seq);
  }
}

TEST(CheckpointNameTest, OtherNamesHaveSeqZero) {
  EXPECT_EQ(CheckpointSeqOfName("ckpt-"), 0u);
  EXPECT_EQ(CheckpointSeqOfName("ckpt-12x"), 0u);
  EXPECT_EQ(CheckpointSeqOfName("foo"), 0u);
  EXPECT_EQ(CheckpointSeqOfName(""), 0u);
  EXPECT_EQ(CheckpointSeqOfName("ckpt-00000000"), 0u);
  EXPECT_EQ(CheckpointSeqOfName("ckpt--1"), 0u);
  EXPECT_EQ(CheckpointSeqOfName("ckpt-+1"), 0u);
  EXPECT_EQ(CheckpointSeqOfName("ckpt-00000001.tmp"), 0u);
  EXPECT_EQ(CheckpointSeqOfName("xckpt-00000001"), 0u);
  EXPECT_EQ(CheckpointSeqOfName("ckpt-99999999999999999999999"), 0u);  // overflows
}

TEST(ListCheckpointsTest, SortedBySeqWithTheCompleteFlag) {
  std::unique_ptr<FileSystem> fs = NewMemoryFileSystem();
  const std::string root = "/r";
  auto at = [&](uint64_t seq) { return JoinPath(root, CheckpointDirName(seq)); };
  // A MANIFEST file makes one complete (it is not read here). Names sort
  // differently from seqs: "ckpt-200000000" < "ckpt-30000000".
  ASSERT_THAT(fs->WriteFileAtomic(JoinPath(at(200000000), kManifestName), "m"), IsOk());
  ASSERT_THAT(fs->WriteFileAtomic(JoinPath(at(30000000), "p00000.blk"), "data"), IsOk());
  ASSERT_THAT(fs->WriteFileAtomic(JoinPath(at(3), kManifestName), "m"), IsOk());
  ASSERT_THAT(fs->WriteFileAtomic(JoinPath(at(3), "p00000.blk"), "data"), IsOk());
  ASSERT_THAT(fs->CreateDirs(at(5)), IsOk());
  // Not checkpoints: a plain file with a checkpoint's name, other names.
  ASSERT_THAT(fs->WriteFileAtomic(at(4), "a file"), IsOk());
  ASSERT_THAT(fs->CreateDirs(JoinPath(root, "other")), IsOk());
  ASSERT_THAT(fs->CreateDirs(JoinPath(root, "ckpt-")), IsOk());
  ASSERT_THAT(fs->CreateDirs(JoinPath(root, "ckpt-00000006.tmp")), IsOk());
  ASSERT_THAT(fs->CreateDirs(JoinPath(root, "ckpt-00000000")), IsOk());
  ASSERT_THAT(fs->WriteFileAtomic(JoinPath(root, "notes.txt"), "x"), IsOk());

  STRATA_ASSERT_OK_AND_ASSIGN(std::vector<CheckpointEntry> list, ListCheckpoints(fs.get(), root));
  std::vector<uint64_t> seqs;
  std::vector<std::string> dirs;
  std::vector<int> complete;
  for (const CheckpointEntry& e : list) {
    seqs.push_back(e.seq);
    dirs.push_back(e.dir);
    complete.push_back(e.complete ? 1 : 0);
  }
  EXPECT_THAT(seqs, ElementsAre(3u, 5u, 30000000u, 200000000u));
  EXPECT_THAT(dirs, ElementsAre(at(3), at(5), at(30000000), at(200000000)));
  EXPECT_THAT(complete, ElementsAre(1, 0, 0, 1));
}

TEST(ListCheckpointsTest, EmptyWhenTheRootIsMissing) {
  std::unique_ptr<FileSystem> fs = NewMemoryFileSystem();
  STRATA_ASSERT_OK_AND_ASSIGN(std::vector<CheckpointEntry> list,
                              ListCheckpoints(fs.get(), "/nothing/here"));
  EXPECT_THAT(list, IsEmpty());
}

// An object store answering 503 (or any error but "not there") is an
// error, never an empty root: a resumed job would otherwise start afresh and
// write its checkpoint 1 over the ones it could not see.
TEST(ListCheckpointsTest, AnErrorReadingTheRootOrAManifestIsNotAnEmptyRoot) {
  std::unique_ptr<FileSystem> base = NewMemoryFileSystem();
  ASSERT_THAT(
      base->WriteFileAtomic(JoinPath("/r", JoinPath(CheckpointDirName(1), kManifestName)), "m"),
      IsOk());
  FaultyFileSystem fs(base.get());
  fs.FailOp(FsOp::kRead, "", absl::UnavailableError("503 SlowDown"), 1);
  EXPECT_THAT(ListCheckpoints(&fs, "/r"), StatusIs(absl::StatusCode::kUnavailable));
  fs.ClearFaults();
  fs.FailOp(FsOp::kRead, kManifestName, absl::UnavailableError("503 SlowDown"), 1);
  EXPECT_THAT(ListCheckpoints(&fs, "/r"), StatusIs(absl::StatusCode::kUnavailable));
  fs.ClearFaults();
  STRATA_ASSERT_OK_AND_ASSIGN(std::vector<CheckpointEntry> list, ListCheckpoints(&fs, "/r"));
  ASSERT_EQ(list.size(), 1u);
  EXPECT_TRUE(list[0].complete);
}

// A one-partition checkpoint `seq` whose partition is made of the files of
// the checkpoints `chain` (oldest first: a full image, then deltas). Each
// checkpoint writes one data file, of a size that tells it apart.
std::string DataFile(uint64_t seq) { return JoinPath(CheckpointDirName(seq), "p00000.blk"); }
std::string DataFileContents(uint64_t seq) { return std::string(10 + seq, 'd'); }

proto::CheckpointManifest ChainManifest(uint64_t seq, const std::vector<uint64_t>& chain) {
  proto::CheckpointManifest m;
  m.set_format_version(kCheckpointFormatVersion);
  m.set_job("ctr");
  m.set_seq(seq);
  m.set_incremental(chain.size() > 1);
  m.set_base_seq(chain.front());
  proto::CheckpointPartition* p = m.add_partitions();
  p->set_id(0);
  p->set_table("w");
  for (const uint64_t s : chain) {
    proto::CheckpointFile* f = p->add_files();
    f->set_path(DataFile(s));
    f->set_seq(s);
    f->set_full(s == chain.front());
    f->set_size(DataFileContents(s).size());
    f->set_crc32c(Crc32c(DataFileContents(s)));
  }
  return m;
}

// Writes checkpoint `seq`'s directory and data file and, when `chain` is
// not empty, its manifest (else it stays incomplete).
absl::Status WriteCheckpoint(FileSystem* fs, const std::string& root, uint64_t seq,
                             const std::vector<uint64_t>& chain) {
  const std::string dir = JoinPath(root, CheckpointDirName(seq));
  absl::Status s = fs->CreateDirs(dir);
  if (!s.ok()) return s;
  s = fs->WriteFileAtomic(JoinPath(root, DataFile(seq)), DataFileContents(seq));
  if (!s.ok() || chain.empty()) return s;
  return WriteManifest(fs, dir, ChainManifest(seq, chain));
}

TEST(CheckManifestFilesTest, OkWhenEveryFileIsThereWithItsSize) {
  std::unique_ptr<FileSystem> fs = NewMemoryFileSystem();
  const std::string root = "/r";
  ASSERT_THAT(WriteCheckpoint(fs.get(), root, 1, {1}), IsOk());
  ASSERT_THAT(WriteCheckpoint(fs.get(), root, 2, {1, 2}), IsOk());
  EXPECT_THAT(CheckManifestFiles(fs.get(), root, ChainManifest(1, {1})), IsOk());
  EXPECT_THAT(CheckManifestFiles(fs.get(), root, ChainManifest(2, {1, 2})), IsOk());
}

TEST(CheckManifestFilesTest, AMissingFileIsDataLossNamingIt) {
  std::unique_ptr<FileSystem> fs = NewMemoryFileSystem();
  const std::string root = "/r";
  ASSERT_THAT(WriteCheckpoint(fs.get(), root, 1, {1}), IsOk());
  ASSERT_THAT(WriteCheckpoint(fs.get(), root, 2, {1, 2}), IsOk());
  const std::string base_file = JoinPath(root, DataFile(1));
  ASSERT_THAT(fs->DeleteFile(base_file), IsOk());
  EXPECT_THAT(CheckManifestFiles(fs.get(), root, ChainManifest(2, {1, 2})),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr(base_file)));
}

TEST(CheckManifestFilesTest, AFileOfAnotherSizeIsDataLossNamingIt) {
  std::unique_ptr<FileSystem> fs = NewMemoryFileSystem();
  const std::string root = "/r";
  ASSERT_THAT(WriteCheckpoint(fs.get(), root, 1, {1}), IsOk());
  ASSERT_THAT(WriteCheckpoint(fs.get(), root, 2, {1, 2}), IsOk());
  const std::string delta = JoinPath(root, DataFile(2));
  ASSERT_THAT(fs->WriteFileAtomic(delta, DataFileContents(2) + "more"), IsOk());
  EXPECT_THAT(CheckManifestFiles(fs.get(), root, ChainManifest(2, {1, 2})),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr(delta)));
  ASSERT_THAT(fs->WriteFileAtomic(delta, ""), IsOk());
  EXPECT_THAT(CheckManifestFiles(fs.get(), root, ChainManifest(2, {1, 2})),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr(delta)));
}

TEST(CheckManifestFilesTest, APartitionWithoutAFullImageFirstIsDataLoss) {
  std::unique_ptr<FileSystem> fs = NewMemoryFileSystem();
  const std::string root = "/r";
  ASSERT_THAT(WriteCheckpoint(fs.get(), root, 1, {1}), IsOk());
  ASSERT_THAT(WriteCheckpoint(fs.get(), root, 2, {1, 2}), IsOk());

  proto::CheckpointManifest not_full = ChainManifest(2, {1, 2});
  not_full.mutable_partitions(0)->mutable_files(0)->set_full(false);
  EXPECT_THAT(CheckManifestFiles(fs.get(), root, not_full), StatusIs(absl::StatusCode::kDataLoss));

  proto::CheckpointManifest no_files = ChainManifest(2, {1, 2});
  no_files.mutable_partitions(0)->clear_files();
  EXPECT_THAT(CheckManifestFiles(fs.get(), root, no_files), StatusIs(absl::StatusCode::kDataLoss));
}

// --- Retention ---------------------------------------------------------------

std::vector<uint64_t> Seqs(FileSystem* fs, const std::string& root) {
  std::vector<uint64_t> seqs;
  auto list = ListCheckpoints(fs, root);
  EXPECT_THAT(list.status(), IsOk());
  if (!list.ok()) return seqs;
  for (const CheckpointEntry& e : *list) seqs.push_back(e.seq);
  return seqs;
}

TEST(ApplyRetentionTest, KeepsTheNewestAndTheCheckpointsTheyNeed) {
  std::unique_ptr<FileSystem> fs = NewMemoryFileSystem();
  const std::string root = "/r";
  auto at = [&](uint64_t seq) { return JoinPath(root, CheckpointDirName(seq)); };
  ASSERT_THAT(WriteCheckpoint(fs.get(), root, 1, {1}), IsOk());     // full
  ASSERT_THAT(WriteCheckpoint(fs.get(), root, 2, {1, 2}), IsOk());  // over 1
  ASSERT_THAT(WriteCheckpoint(fs.get(), root, 3, {3}), IsOk());     // full
  ASSERT_THAT(WriteCheckpoint(fs.get(), root, 4, {3, 4}), IsOk());  // over 3
  ASSERT_THAT(WriteCheckpoint(fs.get(), root, 5, {}), IsOk());      // being written

  STRATA_ASSERT_OK_AND_ASSIGN(std::vector<std::string> deleted,
                              ApplyRetention(fs.get(), root, /*keep_last=*/2));
  EXPECT_THAT(deleted, UnorderedElementsAre(at(1), at(2)));
  EXPECT_FALSE(fs->Exists(at(1)));
  EXPECT_FALSE(fs->Exists(at(2)));
  EXPECT_THAT(Seqs(fs.get(), root), ElementsAre(3u, 4u, 5u));
  // What is kept still reads back whole.
  STRATA_ASSERT_OK_AND_ASSIGN(proto::CheckpointManifest m4, ReadManifest(fs.get(), at(4)));
  EXPECT_THAT(CheckManifestFiles(fs.get(), root, m4), IsOk());
  EXPECT_TRUE(fs->Exists(JoinPath(root, DataFile(5))));

  // Again: nothing more to delete.
  STRATA_ASSERT_OK_AND_ASSIGN(std::vector<std::string> again, ApplyRetention(fs.get(), root, 2));
  EXPECT_THAT(again, IsEmpty());
  EXPECT_THAT(Seqs(fs.get(), root), ElementsAre(3u, 4u, 5u));
}

TEST(ApplyRetentionTest, KeepsTheFullCheckpointAKeptIncrementalNeeds) {
  std::unique_ptr<FileSystem> fs = NewMemoryFileSystem();
  const std::string root = "/r";
  auto at = [&](uint64_t seq) { return JoinPath(root, CheckpointDirName(seq)); };
  ASSERT_THAT(WriteCheckpoint(fs.get(), root, 1, {1}), IsOk());     // full
  ASSERT_THAT(WriteCheckpoint(fs.get(), root, 2, {}), IsOk());      // abandoned
  ASSERT_THAT(WriteCheckpoint(fs.get(), root, 3, {1, 3}), IsOk());  // over 1

  STRATA_ASSERT_OK_AND_ASSIGN(std::vector<std::string> deleted,
                              ApplyRetention(fs.get(), root, /*keep_last=*/1));
  EXPECT_THAT(deleted, ElementsAre(at(2)));
  EXPECT_THAT(Seqs(fs.get(), root), ElementsAre(1u, 3u));
  STRATA_ASSERT_OK_AND_ASSIGN(proto::CheckpointManifest m3, ReadManifest(fs.get(), at(3)));
  EXPECT_THAT(CheckManifestFiles(fs.get(), root, m3), IsOk());
}

TEST(ApplyRetentionTest, DeletesNothingWithoutACompleteCheckpoint) {
  std::unique_ptr<FileSystem> fs = NewMemoryFileSystem();
  const std::string root = "/r";
  ASSERT_THAT(WriteCheckpoint(fs.get(), root, 1, {}), IsOk());
  ASSERT_THAT(WriteCheckpoint(fs.get(), root, 2, {}), IsOk());
  STRATA_ASSERT_OK_AND_ASSIGN(std::vector<std::string> deleted, ApplyRetention(fs.get(), root, 1));
  EXPECT_THAT(deleted, IsEmpty());
  EXPECT_THAT(Seqs(fs.get(), root), ElementsAre(1u, 2u));
}

TEST(ApplyRetentionTest, NothingToDoWhenTheRootIsMissing) {
  std::unique_ptr<FileSystem> fs = NewMemoryFileSystem();
  STRATA_ASSERT_OK_AND_ASSIGN(std::vector<std::string> deleted,
                              ApplyRetention(fs.get(), "/nothing", 2));
  EXPECT_THAT(deleted, IsEmpty());
}

}  // namespace
}  // namespace strata::storage
