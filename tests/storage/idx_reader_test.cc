#include "storage/idx_reader.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/file_system.h"
#include "tests/testing/gzip.h"
#include "tests/testing/status_matchers.h"

namespace strata::storage {
namespace {

using ::strata::testing::Gzip;
using ::strata::testing::IsOk;
using ::strata::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kFashionDir[] = "/usr/share/datasets/fashion-mnist/";

// IDX bytes: magic 0 0 <type> <ndims>, big-endian dims, then `data`.
std::string MakeIdx(const std::vector<uint32_t>& dims, const std::vector<uint8_t>& data,
                    uint8_t type = 0x08) {
  std::string out = {0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
  for (uint32_t d : dims) {
    out.push_back(static_cast<char>(d >> 24));
    out.push_back(static_cast<char>(d >> 16));
    out.push_back(static_cast<char>(d >> 8));
    out.push_back(static_cast<char>(d));
  }
  out.append(data.begin(), data.end());
  return out;
}

std::vector<uint8_t> Iota(size_t n, uint8_t start = 0) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(start + i);
  return v;
}

TEST(GunzipTest, RoundTrips) {
  std::string raw(100000, '\0');
  for (size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<char>(i % 251);
  auto out = Gunzip(Gzip(raw), "x.gz");
  ASSERT_THAT(out, IsOk());
  EXPECT_EQ(*out, raw);
}

TEST(GunzipTest, ConcatenatedMembers) {
  auto out = Gunzip(Gzip("hello ") + Gzip("world"), "x.gz");
  ASSERT_THAT(out, IsOk());
  EXPECT_EQ(*out, "hello world");
}

TEST(GunzipTest, TruncatedIsDataLossNamingTheFile) {
  std::string gz = Gzip(std::string(5000, 'q') + "tail");
  EXPECT_THAT(
      Gunzip(gz.substr(0, gz.size() - 6), "short.gz"),
      StatusIs(absl::StatusCode::kDataLoss, AllOf(HasSubstr("short.gz"), HasSubstr("truncated"))));
  EXPECT_THAT(Gunzip(gz.substr(0, 5), "short.gz"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("short.gz")));
  EXPECT_THAT(Gunzip("", "empty.gz"), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("empty.gz")));
}

TEST(GunzipTest, CorruptIsDataLossNamingTheFile) {
  std::string raw;
  for (int i = 0; i < 2000; ++i) raw += std::to_string(i * 7919 % 1000);
  std::string gz = Gzip(raw);
  // Flip bits in the middle of the deflate stream.
  for (size_t i = gz.size() / 2; i < gz.size() / 2 + 8; ++i) gz[i] ^= 0x5a;
  EXPECT_THAT(Gunzip(gz, "bad.gz"), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("bad.gz")));

  // A damaged trailer (CRC) is caught as well.
  std::string crc = Gzip(raw);
  crc[crc.size() - 8] ^= 0x01;
  EXPECT_THAT(Gunzip(crc, "crc.gz"), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("crc.gz")));
}

TEST(GunzipTest, TrailingGarbageIsDataLoss) {
  EXPECT_THAT(
      Gunzip(Gzip("abc") + "junk", "t.gz"),
      StatusIs(absl::StatusCode::kDataLoss, AllOf(HasSubstr("t.gz"), HasSubstr("trailing"))));
}

TEST(ParseIdxTest, ParsesPlainIdx) {
  auto array = ParseIdx(MakeIdx({2, 3}, Iota(6, 10)), "m.idx");
  ASSERT_THAT(array, IsOk());
  EXPECT_THAT(array->dims, ElementsAre(2, 3));
  EXPECT_THAT(array->data, ElementsAre(10, 11, 12, 13, 14, 15));
}

TEST(ParseIdxTest, ParsesGzippedIdx) {
  auto array = ParseIdx(Gzip(MakeIdx({3, 2, 2}, Iota(12))), "m.idx.gz");
  ASSERT_THAT(array, IsOk());
  EXPECT_THAT(array->dims, ElementsAre(3, 2, 2));
  EXPECT_EQ(array->data, Iota(12));
}

TEST(ParseIdxTest, ParsesLargeBigEndianDims) {
  // 0x0102 = 258 elements: checks multi-byte big-endian decoding.
  auto array = ParseIdx(MakeIdx({258}, std::vector<uint8_t>(258, 7)), "l");
  ASSERT_THAT(array, IsOk());
  EXPECT_THAT(array->dims, ElementsAre(258));
  EXPECT_EQ(array->data.size(), 258u);
}

TEST(ParseIdxTest, FourDimensionsAndZeroSizedDimension) {
  auto four = ParseIdx(MakeIdx({1, 2, 1, 2}, Iota(4)), "four");
  ASSERT_THAT(four, IsOk());
  EXPECT_THAT(four->dims, ElementsAre(1, 2, 1, 2));
  auto empty = ParseIdx(MakeIdx({0, 28, 28}, {}), "empty");
  ASSERT_THAT(empty, IsOk());
  EXPECT_TRUE(empty->data.empty());
}

TEST(ParseIdxTest, BadMagic) {
  std::string bytes = MakeIdx({2}, Iota(2));
  bytes[1] = 1;
  EXPECT_THAT(ParseIdx(bytes, "m.idx"), StatusIs(absl::StatusCode::kInvalidArgument,
                                                 AllOf(HasSubstr("m.idx"), HasSubstr("magic"))));
}

TEST(ParseIdxTest, UnsupportedType) {
  EXPECT_THAT(
      ParseIdx(MakeIdx({2}, Iota(2), /*type=*/0x0d), "f.idx"),
      StatusIs(absl::StatusCode::kInvalidArgument, AllOf(HasSubstr("f.idx"), HasSubstr("0x0d"))));
}

TEST(ParseIdxTest, BadDimensionCount) {
  EXPECT_THAT(ParseIdx(MakeIdx({}, {}), "z.idx"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("z.idx")));
  EXPECT_THAT(ParseIdx(MakeIdx({1, 1, 1, 1, 1}, {1}), "five.idx"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("five.idx")));
}

TEST(ParseIdxTest, TooShortForHeader) {
  EXPECT_THAT(ParseIdx(std::string("\0\0", 2), "tiny"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("tiny")));
  // Claims 3 dims but holds only one.
  std::string bytes = MakeIdx({5}, {});
  bytes[3] = 3;
  EXPECT_THAT(ParseIdx(bytes, "hdr"), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("hdr")));
}

TEST(ParseIdxTest, TruncatedDataNamesFileAndBothSizes) {
  EXPECT_THAT(ParseIdx(MakeIdx({4, 5}, Iota(17)), "trunc.idx"),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("trunc.idx"), HasSubstr("20"), HasSubstr("17"))));
}

TEST(ParseIdxTest, ExtraDataNamesFileAndBothSizes) {
  EXPECT_THAT(ParseIdx(MakeIdx({4, 5}, Iota(23)), "long.idx"),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("long.idx"), HasSubstr("20"), HasSubstr("23"))));
}

TEST(ParseIdxTest, HugeDimensionsDoNotOverflow) {
  EXPECT_THAT(ParseIdx(MakeIdx({0xffffffff, 0xffffffff, 0xffffffff}, Iota(3)), "huge"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("huge")));
}

TEST(ParseIdxTest, CorruptGzipIsDataLoss) {
  std::string gz = Gzip(MakeIdx({100}, Iota(100)));
  gz.resize(gz.size() - 10);
  EXPECT_THAT(ParseIdx(gz, "c.gz"), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("c.gz")));
}

class LoadIdxDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // 3 images of 2 x 2 pixels; pixel values 0, 51, ..., 255 scaled to [0,1].
    std::vector<uint8_t> pixels = {0,   51,  102, 153,  //
                                   204, 255, 0,   0,    //
                                   1,   2,   3,   4};
    ASSERT_THAT(fs_->WriteFileAtomic("/d/images.gz", Gzip(MakeIdx({3, 2, 2}, pixels))), IsOk());
    ASSERT_THAT(fs_->WriteFileAtomic("/d/labels", MakeIdx({3}, {7, 0, 9})), IsOk());
  }
  std::unique_ptr<FileSystem> fs_ = NewMemoryFileSystem();
};

TEST_F(LoadIdxDatasetTest, LoadsAndScales) {
  auto ds = LoadIdxDataset(fs_.get(), "/d/images.gz", "/d/labels");
  ASSERT_THAT(ds, IsOk());
  EXPECT_EQ(ds->num_examples, 3);
  EXPECT_EQ(ds->feature_dim, 4);
  ASSERT_EQ(ds->features.size(), 12u);
  EXPECT_FLOAT_EQ(ds->features[0], 0.0f);
  EXPECT_FLOAT_EQ(ds->features[1], 0.2f);
  EXPECT_FLOAT_EQ(ds->features[3], 0.6f);
  EXPECT_FLOAT_EQ(ds->features[5], 1.0f);
  EXPECT_FLOAT_EQ(ds->features[8], 1.0f / 255.0f);
  EXPECT_THAT(ds->labels, ElementsAre(7, 0, 9));
}

TEST_F(LoadIdxDatasetTest, LimitKeepsTheFirstExamples) {
  auto ds = LoadIdxDataset(fs_.get(), "/d/images.gz", "/d/labels", 2);
  ASSERT_THAT(ds, IsOk());
  EXPECT_EQ(ds->num_examples, 2);
  EXPECT_EQ(ds->features.size(), 8u);
  EXPECT_FLOAT_EQ(ds->features[4], 0.8f);
  EXPECT_THAT(ds->labels, ElementsAre(7, 0));

  // A limit above the count keeps everything.
  auto all = LoadIdxDataset(fs_.get(), "/d/images.gz", "/d/labels", 100);
  ASSERT_THAT(all, IsOk());
  EXPECT_EQ(all->num_examples, 3);
}

TEST_F(LoadIdxDatasetTest, CountMismatchNamesBothFiles) {
  ASSERT_THAT(fs_->WriteFileAtomic("/d/labels4", MakeIdx({4}, {1, 2, 3, 4})), IsOk());
  EXPECT_THAT(LoadIdxDataset(fs_.get(), "/d/images.gz", "/d/labels4"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("/d/images.gz"), HasSubstr("/d/labels4"), HasSubstr("3"),
                             HasSubstr("4"))));
}

TEST_F(LoadIdxDatasetTest, WrongShapesAreInvalidArgument) {
  // Labels passed as images and the other way round.
  EXPECT_THAT(LoadIdxDataset(fs_.get(), "/d/labels", "/d/images.gz"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("/d/labels")));
}

TEST_F(LoadIdxDatasetTest, MissingFileIsNotFound) {
  EXPECT_THAT(LoadIdxDataset(fs_.get(), "/d/nope", "/d/labels"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/d/nope")));
}

TEST(ReadIdxFileTest, ErrorsNameThePath) {
  auto fs = NewMemoryFileSystem();
  ASSERT_THAT(fs->WriteFileAtomic("/x/bad.idx", "\x01\x02\x08\x01"), IsOk());
  EXPECT_THAT(ReadIdxFile(fs.get(), "/x/bad.idx"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("/x/bad.idx")));
}

TEST(FashionMnistTest, LoadsTheRealTestSet) {
  auto fs = NewPosixFileSystem();
  const std::string images = std::string(kFashionDir) + "t10k-images-idx3-ubyte.gz";
  const std::string labels = std::string(kFashionDir) + "t10k-labels-idx1-ubyte.gz";
  if (!fs->Exists(labels) || !fs->Exists(images)) {
    GTEST_SKIP() << "Fashion-MNIST test set not installed at " << kFashionDir;
  }
  auto ds = LoadIdxDataset(fs.get(), images, labels);
  ASSERT_THAT(ds, IsOk());
  EXPECT_EQ(ds->num_examples, 10000);
  EXPECT_EQ(ds->feature_dim, 784);
  EXPECT_EQ(ds->features.size(), 10000u * 784u);
  ASSERT_EQ(ds->labels.size(), 10000u);
  std::vector<int> per_class(10, 0);
  for (int32_t label : ds->labels) {
    ASSERT_GE(label, 0);
    ASSERT_LE(label, 9);
    ++per_class[label];
  }
  // The test set is balanced: 1000 of each class.
  for (int c = 0; c < 10; ++c) EXPECT_EQ(per_class[c], 1000) << "class " << c;
  auto [min_it, max_it] = std::minmax_element(ds->features.begin(), ds->features.end());
  EXPECT_EQ(*min_it, 0.0f);
  EXPECT_EQ(*max_it, 1.0f);

  auto limited = LoadIdxDataset(fs.get(), images, labels, 100);
  ASSERT_THAT(limited, IsOk());
  EXPECT_EQ(limited->num_examples, 100);
  EXPECT_EQ(limited->features.size(), 100u * 784u);
  EXPECT_TRUE(std::equal(limited->labels.begin(), limited->labels.end(), ds->labels.begin()));
}

}  // namespace
}  // namespace strata::storage

namespace strata::storage {
namespace {

// An IDX file of `n` 2x3 images, gzipped when asked.
std::string IdxImages(uint32_t n, bool gz) {
  std::string b = {0, 0, 8, 3};
  for (uint32_t d : {n, 2u, 3u}) {
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<char>((d >> s) & 0xff));
  }
  for (uint32_t i = 0; i < n * 6; ++i) b.push_back(static_cast<char>(i));
  return gz ? ::strata::testing::Gzip(b) : b;
}

TEST(ReadIdxShapeTest, HeaderAndSizeWithoutReadingTheWholeFile) {
  auto fs = NewMemoryFileSystem();
  ASSERT_TRUE(fs->WriteFileAtomic("/d/plain", IdxImages(1000, false)).ok());
  ASSERT_TRUE(fs->WriteFileAtomic("/d/gz", IdxImages(1000, true)).ok());
  for (const char* path : {"/d/plain", "/d/gz"}) {
    auto dims = ReadIdxShape(fs.get(), path);
    ASSERT_TRUE(dims.ok()) << dims.status();
    EXPECT_EQ(*dims, (std::vector<uint32_t>{1000, 2, 3})) << path;
  }
}

TEST(ReadIdxShapeTest, TruncatedOrMissingFilesAreNamed) {
  auto fs = NewMemoryFileSystem();
  std::string plain = IdxImages(10, false);
  ASSERT_TRUE(fs->WriteFileAtomic("/d/cut", plain.substr(0, plain.size() - 1)).ok());
  auto cut = ReadIdxShape(fs.get(), "/d/cut");
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(cut.status().message().find("/d/cut"), std::string::npos) << cut.status();
  std::string gz = IdxImages(10, true);
  ASSERT_TRUE(fs->WriteFileAtomic("/d/cutgz", gz.substr(0, gz.size() - 6)).ok());
  EXPECT_FALSE(ReadIdxShape(fs.get(), "/d/cutgz").ok());
  auto missing = ReadIdxShape(fs.get(), "/d/none");
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/d/none"), std::string::npos) << missing.status();
  ASSERT_TRUE(fs->WriteFileAtomic("/d/bad", "\x01\x02\x08\x01xxxx").ok());
  EXPECT_EQ(ReadIdxShape(fs.get(), "/d/bad").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata::storage
