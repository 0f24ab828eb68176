#include "storage/criteo_reader.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/faulty_file_system.h"
#include "storage/file_system.h"
#include "tests/testing/gzip.h"
#include "tests/testing/status_matchers.h"

namespace strata::storage {
namespace {

using ::strata::testing::Gzip;
using ::strata::testing::IsOk;
using ::strata::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// A line of the Kaggle Criteo training set: I12 and C22 are missing.
constexpr char kKaggleLine[] =
    "0\t1\t1\t5\t0\t1382\t4\t15\t2\t181\t1\t2\t\t2\t"
    "68fd1e64\t80e26c9b\tfb936136\t7b4723c4\t25c83c98\t7e0ccccf\tde7995b8\t"
    "1f89b562\ta73ee510\ta8cd5504\tb2cb9c98\t37c9c164\t2824a5f6\t1adce6ef\t"
    "8ba8b39a\t891b62e7\te5ba7672\tf54016b9\t21ddcdc9\tb1252a9d\t07b5194c\t"
    "\t3a171ecb\tc5c50484\te8b83407\t9727dd16";

// A line with every field present: I(j+1) = j - 3, C(c+1) = hex of c * 17.
std::vector<std::string> FullFields(const std::string& label = "1") {
  std::vector<std::string> f = {label};
  for (int j = 0; j < kCriteoDense; ++j) f.push_back(std::to_string(j - 3));
  for (int c = 0; c < kCriteoCategorical; ++c) {
    f.push_back(absl::StrCat(absl::Hex(c * 17 + 0x1000000, absl::kZeroPad8)));
  }
  return f;
}
std::string Join(const std::vector<std::string>& fields) { return absl::StrJoin(fields, "\t"); }
std::string FullLine(const std::string& label = "1") { return Join(FullFields(label)); }

struct Parsed {
  float label = -1;
  float dense[kCriteoDense];
  uint64_t keys[kCriteoCategorical];
};
absl::Status Parse(const std::string& line, Parsed* p) {
  return ParseCriteoLine(line, &p->label, p->dense, p->keys);
}

TEST(CriteoDenseTransformTest, SignedLog1p) {
  EXPECT_EQ(CriteoDenseTransform(0), 0.0f);
  EXPECT_FLOAT_EQ(CriteoDenseTransform(1), std::log(2.0f));
  EXPECT_FLOAT_EQ(CriteoDenseTransform(-1), -std::log(2.0f));
  EXPECT_FLOAT_EQ(CriteoDenseTransform(1382), std::log1p(1382.0f));
  EXPECT_FLOAT_EQ(CriteoDenseTransform(std::numeric_limits<int64_t>::min()),
                  -std::log(9.223372e18f));
}

TEST(CriteoKeyTest, GoldenValuesNeverChange) {
  // Models and checkpoints are keyed by these: see the header's formula.
  EXPECT_EQ(CriteoFeatureKey(0, 0x68fd1e64), 0xfc657422cfdbdabaull);
  EXPECT_EQ(CriteoFeatureKey(25, 0x68fd1e64), 0x6a61f790f5ecf187ull);
  EXPECT_EQ(CriteoFeatureKey(2, 0), 0xb899d8061ca685c9ull);
  EXPECT_EQ(CriteoMissingKey(0), 0xf6b6ed551e7b5a1dull);
  EXPECT_EQ(CriteoMissingKey(25), 0x94adeeca59da49e1ull);
}

TEST(CriteoKeyTest, DistinctAcrossFieldsValuesAndMissing) {
  std::set<uint64_t> keys;
  const uint64_t values[] = {0, 1, 0x68fd1e64, 0xffffffff, 0xfffffffffffffull};
  for (int f = 0; f < kCriteoCategorical; ++f) {
    keys.insert(CriteoMissingKey(f));
    for (uint64_t v : values) {
      EXPECT_EQ(CriteoFeatureKey(f, v), CriteoFeatureKey(f, v));  // pure
      keys.insert(CriteoFeatureKey(f, v));
    }
  }
  EXPECT_EQ(keys.size(), kCriteoCategorical * (1 + std::size(values)));
}

TEST(ParseCriteoLineTest, ParsesKaggleLine) {
  Parsed p;
  ASSERT_THAT(Parse(kKaggleLine, &p), IsOk());
  EXPECT_EQ(p.label, 0.0f);
  const int64_t ints[kCriteoDense] = {1, 1, 5, 0, 1382, 4, 15, 2, 181, 1, 2, 0, 2};
  for (int j = 0; j < kCriteoDense; ++j) {
    EXPECT_EQ(p.dense[j], CriteoDenseTransform(ints[j])) << "I" << j + 1;
  }
  EXPECT_EQ(p.keys[0], CriteoFeatureKey(0, 0x68fd1e64));
  EXPECT_EQ(p.keys[1], CriteoFeatureKey(1, 0x80e26c9b));
  EXPECT_EQ(p.keys[21], CriteoMissingKey(21));  // C22 is empty
  EXPECT_EQ(p.keys[25], CriteoFeatureKey(25, 0x9727dd16));
}

TEST(ParseCriteoLineTest, ParsesEveryFieldOfAFullLine) {
  Parsed p;
  ASSERT_THAT(Parse(FullLine("1"), &p), IsOk());
  EXPECT_EQ(p.label, 1.0f);
  for (int j = 0; j < kCriteoDense; ++j) {
    EXPECT_EQ(p.dense[j], CriteoDenseTransform(j - 3)) << "I" << j + 1;
  }
  for (int c = 0; c < kCriteoCategorical; ++c) {
    EXPECT_EQ(p.keys[c], CriteoFeatureKey(c, c * 17 + 0x1000000)) << "C" << c + 1;
  }
  CriteoRawRow row;
  ASSERT_THAT(ParseCriteoRow(FullLine("0"), &row), IsOk());
  EXPECT_EQ(row.label, 0);
  EXPECT_EQ(row.dense[0], -3);
  EXPECT_TRUE(row.dense_present[0]);
  EXPECT_EQ(row.categorical[2], 2 * 17 + 0x1000000u);
  EXPECT_TRUE(row.categorical_present[2]);
}

TEST(ParseCriteoLineTest, MissingFieldsAreZeroAndMissingKeys) {
  std::vector<std::string> f(kCriteoFields, "");
  f[0] = "1";
  Parsed p;
  ASSERT_THAT(Parse(Join(f), &p), IsOk());
  for (int j = 0; j < kCriteoDense; ++j) EXPECT_EQ(p.dense[j], 0.0f);
  for (int c = 0; c < kCriteoCategorical; ++c) {
    EXPECT_EQ(p.keys[c], CriteoMissingKey(c));
  }
  CriteoRawRow row;
  ASSERT_THAT(ParseCriteoRow(Join(f), &row), IsOk());
  EXPECT_FALSE(row.dense_present[4]);
  EXPECT_FALSE(row.categorical_present[4]);
}

TEST(ParseCriteoLineTest, NegativeAndExtremeIntegers) {
  auto f = FullFields();
  f[1] = "-1";
  f[2] = "-9223372036854775808";
  f[3] = "9223372036854775807";
  CriteoRawRow row;
  ASSERT_THAT(ParseCriteoRow(Join(f), &row), IsOk());
  EXPECT_EQ(row.dense[0], -1);
  EXPECT_EQ(row.dense[1], std::numeric_limits<int64_t>::min());
  EXPECT_EQ(row.dense[2], std::numeric_limits<int64_t>::max());
  Parsed p;
  ASSERT_THAT(Parse(Join(f), &p), IsOk());
  EXPECT_FLOAT_EQ(p.dense[0], -std::log(2.0f));
}

TEST(ParseCriteoLineTest, BadIntegersNameTheField) {
  for (const char* bad :
       {"1x", "x", "-", "1.5", " 1", "+1", "9223372036854775808", "-9223372036854775809"}) {
    auto f = FullFields();
    f[4] = bad;  // I4
    Parsed p;
    EXPECT_THAT(
        Parse(Join(f), &p),
        StatusIs(absl::StatusCode::kInvalidArgument,
                 HasSubstr(absl::StrCat("field I4 (column 5): bad integer \"", bad, "\""))));
  }
}

TEST(ParseCriteoLineTest, HexInEitherCaseOneTo16Digits) {
  auto lower = FullFields(), upper = FullFields();
  lower[14] = "68fd1e64";
  upper[14] = "68FD1E64";
  lower[15] = "a";
  lower[16] = "ffffffffffffffff";
  Parsed l, u;
  ASSERT_THAT(Parse(Join(lower), &l), IsOk());
  ASSERT_THAT(Parse(Join(upper), &u), IsOk());
  EXPECT_EQ(l.keys[0], u.keys[0]);
  EXPECT_EQ(l.keys[1], CriteoFeatureKey(1, 0xa));
  EXPECT_EQ(l.keys[2], CriteoFeatureKey(2, ~0ull));
}

TEST(ParseCriteoLineTest, BadHexNamesTheField) {
  auto f = FullFields();
  f[16] = "zz";  // C3
  Parsed p;
  EXPECT_THAT(Parse(Join(f), &p), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("field C3 (column 17): bad hex \"zz\"")));
  f[16] = "12345678901234567";  // 17 digits
  EXPECT_THAT(Parse(Join(f), &p), StatusIs(absl::StatusCode::kInvalidArgument,
                                           AllOf(HasSubstr("field C3 (column 17): bad hex"),
                                                 HasSubstr("more than 16 digits"))));
  f = FullFields();
  f[40 - 1] = "0x12";  // C26
  EXPECT_THAT(Parse(Join(f), &p), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("field C26 (column 40): bad hex \"0x12\"")));
}

TEST(ParseCriteoLineTest, BadLabel) {
  for (const char* bad : {"2", "", "01", "-1", "1.0"}) {
    auto f = FullFields(bad);
    Parsed p;
    EXPECT_THAT(Parse(Join(f), &p),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat("label must be 0 or 1, got \"", bad, "\""))));
  }
}

TEST(ParseCriteoLineTest, WrongFieldCount) {
  auto f = FullFields();
  f.pop_back();
  Parsed p;
  EXPECT_THAT(Parse(Join(f), &p),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("expected 40 tab-separated fields, found 39")));
  f = FullFields();
  f.push_back("extra");
  EXPECT_THAT(Parse(Join(f), &p),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("expected 40 tab-separated fields, found 41")));
  EXPECT_THAT(Parse("1 2 3", &p),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("found 1")));
}

TEST(ParseCriteoLineTest, LongBadValuesAreCutInTheMessage) {
  auto f = FullFields();
  f[20] = std::string(10000, 'g');
  Parsed p;
  absl::Status s = Parse(Join(f), &p);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("(10000 bytes)")));
  EXPECT_LT(s.message().size(), 200u);
}

TEST(ParseCriteoLineTest, ToleratesTrailingCarriageReturn) {
  Parsed a, b;
  ASSERT_THAT(Parse(FullLine(), &a), IsOk());
  ASSERT_THAT(Parse(FullLine() + "\r", &b), IsOk());
  EXPECT_EQ(a.keys[25], b.keys[25]);
}

class LoadCriteoFileTest : public ::testing::Test {
 protected:
  void Write(const std::string& path, const std::string& contents) {
    ASSERT_THAT(fs_->WriteFileAtomic(path, contents), IsOk());
  }
  std::unique_ptr<FileSystem> fs_ = NewMemoryFileSystem();
};

TEST_F(LoadCriteoFileTest, LoadsLinesIgnoringEmptyOnes) {
  Write("/d/a.txt",
        FullLine("1") + "\n\n" + std::string(kKaggleLine) + "\n" + FullLine("0") + "\n");
  CriteoReadStats stats;
  auto data = LoadCriteoFile(fs_.get(), "/d/a.txt", {}, &stats);
  ASSERT_THAT(data, IsOk());
  EXPECT_EQ(data->num_examples, 3);
  EXPECT_EQ(data->labels, (std::vector<float>{1, 0, 0}));
  ASSERT_EQ(data->dense.size(), 3u * kCriteoDense);
  ASSERT_EQ(data->keys.size(), 3u * kCriteoCategorical);
  EXPECT_EQ(data->dense[kCriteoDense + 4], CriteoDenseTransform(1382));
  EXPECT_EQ(data->keys[kCriteoCategorical], CriteoFeatureKey(0, 0x68fd1e64));
  EXPECT_EQ(stats.lines, 3);
  EXPECT_EQ(stats.records, 3);
  EXPECT_EQ(stats.skipped, 0);
  EXPECT_EQ(stats.first_error, "");
}

TEST_F(LoadCriteoFileTest, CrLfLineEndings) {
  Write("/crlf.txt", FullLine("1") + "\r\n" + FullLine("0") + "\r\n\r\n");
  auto data = LoadCriteoFile(fs_.get(), "/crlf.txt", {}, nullptr);
  ASSERT_THAT(data, IsOk());
  EXPECT_EQ(data->labels, (std::vector<float>{1, 0}));
  EXPECT_EQ(data->keys[kCriteoCategorical - 1], CriteoFeatureKey(25, 25 * 17 + 0x1000000));
}

TEST_F(LoadCriteoFileTest, NoFinalNewline) {
  Write("/n.txt", FullLine("1") + "\n" + FullLine("0"));
  auto data = LoadCriteoFile(fs_.get(), "/n.txt", {}, nullptr);
  ASSERT_THAT(data, IsOk());
  EXPECT_EQ(data->num_examples, 2);
}

TEST_F(LoadCriteoFileTest, FailPolicyNamesPathAndLine) {
  Write("/d/f.txt", FullLine() + "\n\n" + FullLine("7") + "\n" + FullLine());
  CriteoReadStats stats;
  EXPECT_THAT(
      LoadCriteoFile(fs_.get(), "/d/f.txt", {}, &stats),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(StartsWith("/d/f.txt:3: "), HasSubstr("label must be 0 or 1, got \"7\""))));
  EXPECT_EQ(stats.records, 1);
}

TEST_F(LoadCriteoFileTest, SkipPolicyCountsAndKeepsFirstError) {
  std::string text;
  for (int i = 1; i <= 20; ++i) {
    // Lines 4, 8, ... are good; the others lack their last field.
    if (i % 4 == 0) {
      absl::StrAppend(&text, FullLine(), "\n");
    } else {
      auto f = FullFields();
      f.pop_back();
      absl::StrAppend(&text, Join(f), "\n");
    }
  }
  Write("/s.txt", text);
  CriteoReadOptions options;
  options.bad_lines = BadLinePolicy::kSkip;
  CriteoReadStats stats;
  auto data = LoadCriteoFile(fs_.get(), "/s.txt", options, &stats);
  ASSERT_THAT(data, IsOk());
  EXPECT_EQ(data->num_examples, 5);
  EXPECT_EQ(data->labels.size(), 5u);
  EXPECT_EQ(data->dense.size(), 5u * kCriteoDense);
  EXPECT_EQ(data->keys.size(), 5u * kCriteoCategorical);
  EXPECT_EQ(stats.lines, 20);
  EXPECT_EQ(stats.records, 5);
  EXPECT_EQ(stats.skipped, 15);
  EXPECT_EQ(stats.first_error, "/s.txt:1: expected 40 tab-separated fields, found 39");
}

TEST_F(LoadCriteoFileTest, OverlongLineIsABadLine) {
  Write("/o.txt", FullLine() + "\n" + FullLine() + "\n");
  CriteoReadOptions options;
  options.max_line_bytes = 100;
  EXPECT_THAT(LoadCriteoFile(fs_.get(), "/o.txt", options, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(StartsWith("/o.txt:1: "), HasSubstr("line longer than 100 bytes"))));

  // The default limit is 64 KiB; a short line is fine, a huge one is not.
  Write("/o2.txt",
        FullLine() + "\n" + FullLine() + std::string(70000, 'x') + "\n" + FullLine() + "\n");
  options = CriteoReadOptions();
  options.bad_lines = BadLinePolicy::kSkip;
  CriteoReadStats stats;
  auto data = LoadCriteoFile(fs_.get(), "/o2.txt", options, &stats);
  ASSERT_THAT(data, IsOk());
  EXPECT_EQ(data->num_examples, 2);
  EXPECT_EQ(stats.skipped, 1);
  EXPECT_THAT(stats.first_error,
              AllOf(StartsWith("/o2.txt:2: "), HasSubstr("line longer than 65536 bytes")));
}

TEST_F(LoadCriteoFileTest, LimitKeepsTheFirstRecords) {
  // The bad line after the limit is never read.
  Write("/l.txt", FullLine("1") + "\n" + FullLine("0") + "\n" + FullLine("1") + "\n" +
                      FullLine("1") + "\nbad\n");
  CriteoReadOptions options;
  options.limit = 3;
  CriteoReadStats stats;
  auto data = LoadCriteoFile(fs_.get(), "/l.txt", options, &stats);
  ASSERT_THAT(data, IsOk());
  EXPECT_EQ(data->num_examples, 3);
  EXPECT_EQ(data->labels, (std::vector<float>{1, 0, 1}));
  EXPECT_EQ(data->keys.size(), 3u * kCriteoCategorical);
  EXPECT_EQ(stats.records, 3);
  options.limit = -1;
  EXPECT_THAT(LoadCriteoFile(fs_.get(), "/l.txt", options, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(LoadCriteoFileTest, GzippedInput) {
  std::string text;
  for (int i = 0; i < 1000; ++i) {
    absl::StrAppend(&text, i == 500 ? std::string(kKaggleLine) : FullLine(), "\n");
  }
  Write("/g.txt.gz", Gzip(text));
  Write("/g.txt", text);
  auto gz = LoadCriteoFile(fs_.get(), "/g.txt.gz", {}, nullptr);
  auto plain = LoadCriteoFile(fs_.get(), "/g.txt", {}, nullptr);
  ASSERT_THAT(gz, IsOk());
  ASSERT_THAT(plain, IsOk());
  EXPECT_EQ(gz->num_examples, 1000);
  EXPECT_EQ(gz->labels, plain->labels);
  EXPECT_EQ(gz->dense, plain->dense);
  EXPECT_EQ(gz->keys, plain->keys);
  EXPECT_EQ(gz->keys[500 * kCriteoCategorical], CriteoFeatureKey(0, 0x68fd1e64));
  EXPECT_THAT(CountCriteoLines(fs_.get(), "/g.txt.gz"), IsOk());
  EXPECT_EQ(*CountCriteoLines(fs_.get(), "/g.txt.gz"), 1000);

  // Corrupt gzip is DataLoss naming the file.
  std::string bad = Gzip(text);
  bad.resize(bad.size() / 2);
  Write("/bad.gz", bad);
  EXPECT_THAT(LoadCriteoFile(fs_.get(), "/bad.gz", {}, nullptr),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("/bad.gz")));
}

TEST_F(LoadCriteoFileTest, NoValidRecordNamesThePath) {
  Write("/empty.txt", "\n\n");
  EXPECT_THAT(LoadCriteoFile(fs_.get(), "/empty.txt", {}, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("/empty.txt")));
  Write("/allbad.txt", "a\nb\n");
  CriteoReadOptions options;
  options.bad_lines = BadLinePolicy::kSkip;
  EXPECT_THAT(LoadCriteoFile(fs_.get(), "/allbad.txt", options, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("/allbad.txt"), HasSubstr("no valid record"))));
  EXPECT_THAT(LoadCriteoFile(fs_.get(), "/missing.txt", {}, nullptr),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(LoadCriteoFileTest, CountCriteoLinesCountsNonEmptyLines) {
  // Fields are not parsed: "junk" counts.
  Write("/c.txt", FullLine() + "\n\njunk\r\n\r\n" + FullLine());
  auto n = CountCriteoLines(fs_.get(), "/c.txt");
  ASSERT_THAT(n, IsOk());
  EXPECT_EQ(*n, 3);
  Write("/c0.txt", "");
  EXPECT_EQ(*CountCriteoLines(fs_.get(), "/c0.txt"), 0);
  EXPECT_THAT(CountCriteoLines(fs_.get(), "/nope.txt"), StatusIs(absl::StatusCode::kNotFound));
}

// Line i's C1 is i: its key tells which line a record came from.
std::string NumberedLine(int i, bool short_form = false) {
  std::vector<std::string> f = FullFields(i % 2 ? "1" : "0");
  f[1 + kCriteoDense] = absl::StrCat(absl::Hex(i));
  // Lines of different lengths: some with their integers missing.
  if (short_form) {
    for (int j = 1; j <= kCriteoDense; ++j) f[j].clear();
  }
  return Join(f);
}
int LineOf(const CtrDataset& d, int64_t r) {
  for (int i = 0; i < 100000; ++i) {
    if (d.keys[r * kCriteoCategorical] == CriteoFeatureKey(0, i)) return i;
  }
  return -1;
}

// Records the ranges read, and whether anything read a file whole.
class RangeCountingFs : public FaultyFileSystem {
 public:
  explicit RangeCountingFs(FileSystem* base) : FaultyFileSystem(base), base_(base) {}
  absl::StatusOr<std::string> ReadFile(const std::string& path) override {
    ++whole_reads;
    return base_->ReadFile(path);
  }
  absl::StatusOr<std::string> ReadFileRange(const std::string& path, uint64_t offset,
                                            uint64_t n) override {
    auto r = base_->ReadFileRange(path, offset, n);
    if (r.ok()) bytes_read += r->size();
    return r;
  }
  int whole_reads = 0;
  uint64_t bytes_read = 0;

 private:
  FileSystem* const base_;
};

class LoadCriteoRangeTest : public LoadCriteoFileTest {
 protected:
  // The lines read by ranges of `step` bytes tiling [0, size), in order.
  std::vector<int> ReadTiled(const std::string& path, uint64_t size, uint64_t step,
                             const CriteoReadOptions& options = {}) {
    std::vector<int> lines;
    for (uint64_t b = 0; b < size; b += step) {
      auto d = LoadCriteoRange(fs_.get(), path, b, std::min(size, b + step), options, nullptr);
      EXPECT_THAT(d, IsOk()) << "range at " << b;
      if (!d.ok()) break;
      EXPECT_EQ(d->num_examples, static_cast<int64_t>(d->labels.size()));
      for (int64_t r = 0; r < d->num_examples; ++r) lines.push_back(LineOf(*d, r));
    }
    return lines;
  }
};

TEST_F(LoadCriteoRangeTest, RangesThatTileTheFileReadEveryLineOnce) {
  // Lines of two lengths, empty lines, a CRLF, and no final newline.
  std::string text;
  std::vector<int> want;
  for (int i = 0; i < 57; ++i) {
    absl::StrAppend(&text, NumberedLine(i, i % 3 == 0), i == 20 ? "\r\n" : "\n");
    if (i % 11 == 0) text += "\n";
    want.push_back(i);
  }
  for (const std::string& last : {std::string("\n"), std::string("")}) {
    const std::string file = text + NumberedLine(57) + last;
    Write("/t.txt", file);
    std::vector<int> all = want;
    all.push_back(57);
    const uint64_t size = file.size();
    for (uint64_t step : {uint64_t{1}, uint64_t{7}, uint64_t{100}, uint64_t{333}, size / 3,
                          size - 1, size, size + 10}) {
      EXPECT_EQ(ReadTiled("/t.txt", size, step), all)
          << "ranges of " << step << " bytes, final newline: " << !last.empty();
    }
  }
}

TEST_F(LoadCriteoRangeTest, ReadsOnlyAboutTheRange) {
  std::string text;
  for (int i = 0; i < 2000; ++i) absl::StrAppend(&text, NumberedLine(i), "\n");
  Write("/big.txt", text);
  RangeCountingFs counting(fs_.get());
  const uint64_t line = NumberedLine(0).size() + 1;
  // Lines 100..199 (the range starts inside line 99, ends inside 199).
  auto d = LoadCriteoRange(&counting, "/big.txt", 100 * line - 5, 200 * line - 5, {}, nullptr);
  ASSERT_THAT(d, IsOk());
  ASSERT_EQ(d->num_examples, 100);
  EXPECT_EQ(LineOf(*d, 0), 100);
  EXPECT_EQ(LineOf(*d, 99), 199);
  EXPECT_EQ(counting.whole_reads, 0);
  // The range, its byte before, and one look-ahead step (64 KiB) at most.
  EXPECT_LE(counting.bytes_read, 100 * line + 1 + (64 << 10));
}

TEST_F(LoadCriteoRangeTest, AnOverlongLineIsOneBadLineOfTheRangeItStartsIn) {
  const std::string text = NumberedLine(0) + "\n" + NumberedLine(1) + std::string(200000, 'x') +
                           "\n" + NumberedLine(2) + "\n";
  Write("/o.txt", text);
  const uint64_t second = NumberedLine(0).size() + 1;
  CriteoReadOptions skip;
  skip.bad_lines = BadLinePolicy::kSkip;
  CriteoReadStats stats;
  // The range holds line 0 and the start of the overlong line 1.
  auto a = LoadCriteoRange(fs_.get(), "/o.txt", 0, second + 10, skip, &stats);
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ(a->num_examples, 1);
  EXPECT_EQ(stats.skipped, 1);
  EXPECT_THAT(stats.first_error,
              AllOf(HasSubstr(absl::StrCat("/o.txt (the line at byte ", second, ")")),
                    HasSubstr("line longer than 65536 bytes")));
  // The next range starts inside it: it holds line 2 only.
  auto b = LoadCriteoRange(fs_.get(), "/o.txt", second + 10, text.size(), skip, &stats);
  ASSERT_THAT(b, IsOk());
  ASSERT_EQ(b->num_examples, 1);
  EXPECT_EQ(LineOf(*b, 0), 2);
  EXPECT_EQ(stats.skipped, 0);
  // Under kFail the range's read fails, naming the line's byte.
  EXPECT_THAT(LoadCriteoRange(fs_.get(), "/o.txt", 0, second + 10, {}, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(absl::StrCat("(the line at byte ", second, ")"))));
}

TEST_F(LoadCriteoRangeTest, GzippedOrMissingFilesAreErrors) {
  Write("/g.txt.gz", Gzip(NumberedLine(0) + "\n"));
  EXPECT_THAT(LoadCriteoRange(fs_.get(), "/g.txt.gz", 0, 10, {}, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("/g.txt.gz"), HasSubstr("gzipped"))));
  EXPECT_THAT(LoadCriteoRange(fs_.get(), "/none.txt", 0, 10, {}, nullptr),
              StatusIs(absl::StatusCode::kNotFound));
  // An empty range is no records, not an error.
  auto e = LoadCriteoRange(fs_.get(), "/none.txt", 10, 10, {}, nullptr);
  ASSERT_THAT(e, IsOk());
  EXPECT_EQ(e->num_examples, 0);
}

TEST_F(LoadCriteoRangeTest, ProbeSizesTheFileFromItsStart) {
  std::string text;
  for (int i = 0; i < 5000; ++i) absl::StrAppend(&text, NumberedLine(i), "\n");
  Write("/p.txt", text);
  RangeCountingFs counting(fs_.get());
  auto shape = ProbeCriteoFile(&counting, "/p.txt", {}, 4096);
  ASSERT_THAT(shape, IsOk());
  EXPECT_FALSE(shape->gzipped);
  EXPECT_EQ(shape->file_bytes, text.size());
  EXPECT_LE(shape->sample_bytes, 4096u);
  EXPECT_EQ(counting.whole_reads, 0);
  EXPECT_LE(counting.bytes_read, 4096u);
  // Every line has nearly the same length: the estimate is close.
  EXPECT_NEAR(shape->file_bytes / shape->bytes_per_record, 5000, 50);

  Write("/p.gz", Gzip(text));
  auto gz = ProbeCriteoFile(fs_.get(), "/p.gz", {});
  ASSERT_THAT(gz, IsOk());
  EXPECT_TRUE(gz->gzipped);
}

TEST_F(LoadCriteoRangeTest, ProbeRefusesWhatIsNotCriteoText) {
  Write("/empty.txt", "");
  EXPECT_THAT(ProbeCriteoFile(fs_.get(), "/empty.txt", {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("/empty.txt"), HasSubstr("empty"))));
  Write("/csv.txt", "a,b,c\n1,2,3\n");
  EXPECT_THAT(ProbeCriteoFile(fs_.get(), "/csv.txt", {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("/csv.txt:1:"), HasSubstr("40 tab-separated"))));
  CriteoReadOptions skip;
  skip.bad_lines = BadLinePolicy::kSkip;
  EXPECT_THAT(ProbeCriteoFile(fs_.get(), "/csv.txt", skip),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("/csv.txt"), HasSubstr("no valid record"))));
  Write("/one-line.bin", std::string(100000, 'z'));
  EXPECT_THAT(ProbeCriteoFile(fs_.get(), "/one-line.bin", {}, 4096),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("/one-line.bin"), HasSubstr("no line ends"))));
  EXPECT_THAT(ProbeCriteoFile(fs_.get(), "/nope.txt", {}), StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace strata::storage
