#include "tools/ctr_gen.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/eval_metrics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/criteo_reader.h"
#include "storage/file_system.h"
#include "tests/testing/status_matchers.h"

namespace strata::tools {
namespace {

using storage::kCriteoCategorical;
using ::strata::testing::IsOk;
using ::strata::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int64_t kTrainRows = 3000;
constexpr int64_t kTestRows = 1000;

CtrGenOptions SmallOptions(const std::string& out_dir, uint64_t seed = 1) {
  CtrGenOptions o;
  o.out_dir = out_dir;
  o.train_rows = kTrainRows;
  o.test_rows = kTestRows;
  o.seed = seed;
  return o;
}

std::string Read(storage::FileSystem* fs, const std::string& path) {
  auto bytes = fs->ReadFile(path);
  EXPECT_THAT(bytes, IsOk()) << path;
  return bytes.ok() ? *bytes : "";
}

// The number after "\"key\": " in planted.json.
double JsonNumber(const std::string& json, const std::string& key) {
  const std::string tag = absl::StrCat("\"", key, "\": ");
  const size_t pos = json.find(tag);
  EXPECT_NE(pos, std::string::npos) << key;
  if (pos == std::string::npos) return NAN;
  const size_t start = pos + tag.size();
  const size_t end = json.find_first_of(",\n", start);
  double v = NAN;
  EXPECT_TRUE(absl::SimpleAtod(json.substr(start, end - start), &v)) << key;
  return v;
}

std::vector<float> ReadProbs(storage::FileSystem* fs, const std::string& path) {
  std::vector<float> probs;
  for (absl::string_view line : absl::StrSplit(Read(fs, path), '\n', absl::SkipEmpty())) {
    probs.push_back(std::strtof(std::string(line).c_str(), nullptr));
  }
  return probs;
}

// One data set with the small options in /data, shared by the tests that
// only read it.
class CtrGenTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    fs_ = storage::NewMemoryFileSystem().release();
    summary_ = new CtrGenSummary;
    ASSERT_THAT(GenerateCtrData(SmallOptions("/data"), fs_, summary_), IsOk());
  }
  static void TearDownTestSuite() {
    delete fs_;
    delete summary_;
  }
  static storage::FileSystem* fs_;
  static CtrGenSummary* summary_;
};
storage::FileSystem* CtrGenTest::fs_ = nullptr;
CtrGenSummary* CtrGenTest::summary_ = nullptr;

TEST_F(CtrGenTest, FilesLoadWithoutBadLines) {
  storage::CriteoReadStats stats;
  auto train = storage::LoadCriteoFile(fs_, "/data/train.txt", {}, &stats);
  ASSERT_THAT(train, IsOk());
  EXPECT_EQ(train->num_examples, kTrainRows);
  EXPECT_EQ(stats.skipped, 0);
  auto test = storage::LoadCriteoFile(fs_, "/data/test.txt", {}, &stats);
  ASSERT_THAT(test, IsOk());
  EXPECT_EQ(test->num_examples, kTestRows);
  EXPECT_EQ(stats.skipped, 0);
  EXPECT_EQ(*storage::CountCriteoLines(fs_, "/data/train.txt"), kTrainRows);
  EXPECT_EQ(ReadProbs(fs_, "/data/test.probs").size(), static_cast<size_t>(kTestRows));
  EXPECT_FALSE(summary_->already_existed);
  EXPECT_EQ(summary_->train_rows, kTrainRows);
  EXPECT_EQ(summary_->test_rows, kTestRows);
}

TEST_F(CtrGenTest, LinesAreCriteoTextWithEightDigitLowercaseHex) {
  const std::string train = Read(fs_, "/data/train.txt");
  ASSERT_FALSE(train.empty());
  EXPECT_EQ(train.back(), '\n');
  EXPECT_EQ(train.find('\r'), std::string::npos);
  const std::vector<std::string> lines = absl::StrSplit(train, '\n', absl::SkipEmpty());
  int64_t missing = 0;
  for (size_t i = 0; i < 100; ++i) {
    const std::vector<std::string> f = absl::StrSplit(lines[i], '\t');
    ASSERT_EQ(f.size(), 40u) << lines[i];
    EXPECT_TRUE(f[0] == "0" || f[0] == "1");
    for (int j = 1; j <= 13; ++j) {
      int64_t x;
      if (f[j].empty()) {
        ++missing;
      } else {
        EXPECT_TRUE(absl::SimpleAtoi(f[j], &x) && x >= 0) << f[j];
      }
    }
    for (int c = 14; c < 40; ++c) {
      if (f[c].empty()) {
        ++missing;
        continue;
      }
      EXPECT_EQ(f[c].size(), 8u) << f[c];
      EXPECT_EQ(f[c].find_first_not_of("0123456789abcdef"), std::string::npos) << f[c];
    }
  }
  // 5% of 1300 integers and 2% of 2600 values are missing: about 117.
  EXPECT_GT(missing, 50);
  EXPECT_LT(missing, 200);
}

TEST_F(CtrGenTest, PlantedJsonMatchesRecomputedMetrics) {
  const std::string json = Read(fs_, "/data/planted.json");
  auto test = storage::LoadCriteoFile(fs_, "/data/test.txt", {}, nullptr);
  ASSERT_THAT(test, IsOk());
  const std::vector<float> probs = ReadProbs(fs_, "/data/test.probs");
  ASSERT_EQ(probs.size(), test->labels.size());
  const double auc = Auc(probs, test->labels);
  EXPECT_NEAR(JsonNumber(json, "planted_test_auc"), auc, 1e-8);
  EXPECT_NEAR(JsonNumber(json, "planted_test_logloss"), LogLoss(probs, test->labels), 1e-8);
  EXPECT_NEAR(summary_->planted_test_auc, auc, 1e-12);
  // The planted model predicts far better than chance.
  EXPECT_GT(auc, 0.65);
  EXPECT_LT(JsonNumber(json, "planted_test_logloss"), std::log(2.0));
  EXPECT_EQ(JsonNumber(json, "train_rows"), kTrainRows);
  EXPECT_EQ(JsonNumber(json, "test_rows"), kTestRows);
  EXPECT_EQ(JsonNumber(json, "seed"), 1);
  EXPECT_NEAR(JsonNumber(json, "mean_ctr"), summary_->mean_ctr, 1e-8);
  EXPECT_THAT(json, HasSubstr("\"vocab_sizes\": [10, 15, 23,"));
}

TEST_F(CtrGenTest, MeanCtrNearTarget) {
  auto train = storage::LoadCriteoFile(fs_, "/data/train.txt", {}, nullptr);
  ASSERT_THAT(train, IsOk());
  double clicks = 0;
  for (float y : train->labels) clicks += y;
  const double ctr = clicks / train->num_examples;
  EXPECT_GE(ctr, 0.15);
  EXPECT_LE(ctr, 0.35);
  EXPECT_GE(summary_->mean_ctr, 0.15);
  EXPECT_LE(summary_->mean_ctr, 0.35);
  // The bias calibrates the mean p itself to about 0.25.
  const std::vector<float> probs = ReadProbs(fs_, "/data/test.probs");
  double mean_p = 0;
  for (float p : probs) mean_p += p;
  EXPECT_NEAR(mean_p / probs.size(), 0.25, 0.03);
}

TEST_F(CtrGenTest, TestProbsAreThePlantedProbabilitiesOfTheRows) {
  auto model = PlantedCtrModel::Create(SmallOptions("/data"));
  ASSERT_THAT(model, IsOk());
  const std::vector<float> probs = ReadProbs(fs_, "/data/test.probs");
  const std::vector<std::string> lines =
      absl::StrSplit(Read(fs_, "/data/test.txt"), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), probs.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    storage::CriteoRawRow row;
    ASSERT_THAT(storage::ParseCriteoRow(lines[i], &row), IsOk());
    ASSERT_EQ(model->Probability(row), probs[i]) << "test row " << i;
  }
}

TEST_F(CtrGenTest, ValuesFollowAPowerLaw) {
  auto train = storage::LoadCriteoFile(fs_, "/data/train.txt", {}, nullptr);
  ASSERT_THAT(train, IsOk());
  // C26 has 200000 values: the head value is common, the typical one rare.
  const int field = kCriteoCategorical - 1;
  std::map<uint64_t, int64_t> counts;
  for (int64_t i = 0; i < train->num_examples; ++i) {
    const uint64_t key = train->keys[i * kCriteoCategorical + field];
    if (key != storage::CriteoMissingKey(field)) ++counts[key];
  }
  std::vector<int64_t> sorted;
  for (const auto& [key, n] : counts) sorted.push_back(n);
  std::sort(sorted.begin(), sorted.end());
  const int64_t top = sorted.back(), median = sorted[sorted.size() / 2];
  EXPECT_GT(top, 20 * median) << "top " << top << " median " << median;
  EXPECT_GT(top, kTrainRows / 20);  // P(rank 0) is about 0.13
  EXPECT_GT(counts.size(), 300u);   // and the tail is long

  // C1 has 10 values; rank 0 has P = 1 / sum_{k=1..10} k^-1.1 of the
  // present ones.
  std::map<uint64_t, int64_t> c1;
  for (int64_t i = 0; i < train->num_examples; ++i) {
    const uint64_t key = train->keys[i * kCriteoCategorical];
    if (key != storage::CriteoMissingKey(0)) ++c1[key];
  }
  EXPECT_LE(c1.size(), 10u);
  double norm = 0;
  for (int k = 1; k <= 10; ++k) norm += std::pow(k, -1.1);
  int64_t present = 0, most = 0;
  for (const auto& [key, n] : c1) {
    present += n;
    most = std::max(most, n);
  }
  const double p0 = 1 / norm;  // ~0.37
  const double sd = std::sqrt(p0 * (1 - p0) / present);
  EXPECT_NEAR(static_cast<double>(most) / present, p0, 5 * sd);
}

TEST(CtrGenDeterminismTest, SameSeedSameBytesOtherSeedOtherBytes) {
  auto fs = storage::NewMemoryFileSystem();
  CtrGenOptions a = SmallOptions("/a"), b = SmallOptions("/b"), c = SmallOptions("/c", /*seed=*/2);
  a.train_rows = b.train_rows = c.train_rows = 500;
  ASSERT_THAT(GenerateCtrData(a, fs.get()), IsOk());
  ASSERT_THAT(GenerateCtrData(b, fs.get()), IsOk());
  ASSERT_THAT(GenerateCtrData(c, fs.get()), IsOk());
  for (const char* name : {"train.txt", "test.txt", "test.probs", "planted.json"}) {
    const std::string in_a = Read(fs.get(), absl::StrCat("/a/", name));
    EXPECT_FALSE(in_a.empty()) << name;
    EXPECT_EQ(in_a, Read(fs.get(), absl::StrCat("/b/", name))) << name;
    EXPECT_NE(in_a, Read(fs.get(), absl::StrCat("/c/", name))) << name;
  }
  // Rows depend on their index only: a longer train split starts with the
  // shorter one, and the test split does not change with it.
  CtrGenOptions longer = SmallOptions("/d");
  longer.train_rows = 600;
  ASSERT_THAT(GenerateCtrData(longer, fs.get()), IsOk());
  const std::string train_a = Read(fs.get(), "/a/train.txt");
  EXPECT_EQ(Read(fs.get(), "/d/train.txt").substr(0, train_a.size()), train_a);
  EXPECT_EQ(Read(fs.get(), "/d/test.txt"), Read(fs.get(), "/a/test.txt"));
}

TEST(CtrGenIfMissingTest, LeavesExistingDataUntouched) {
  auto fs = storage::NewMemoryFileSystem();
  CtrGenOptions first = SmallOptions("/d");
  first.train_rows = 200;
  first.test_rows = 100;
  ASSERT_THAT(GenerateCtrData(first, fs.get()), IsOk());
  const std::string train = Read(fs.get(), "/d/train.txt");
  const std::string json = Read(fs.get(), "/d/planted.json");

  CtrGenOptions again = first;
  again.if_missing = true;
  CtrGenSummary summary;
  ASSERT_THAT(GenerateCtrData(again, fs.get(), &summary), IsOk());
  EXPECT_TRUE(summary.already_existed);
  EXPECT_EQ(Read(fs.get(), "/d/train.txt"), train);
  EXPECT_EQ(Read(fs.get(), "/d/planted.json"), json);

  // Data generated with other options is not "already there".
  again.seed = 9;
  ASSERT_THAT(GenerateCtrData(again, fs.get(), &summary), IsOk());
  EXPECT_FALSE(summary.already_existed);
  EXPECT_NE(Read(fs.get(), "/d/train.txt"), train);
  EXPECT_NE(Read(fs.get(), "/d/planted.json").find("\"seed\": 9,"), std::string::npos);
  ASSERT_THAT(GenerateCtrData(again, fs.get(), &summary), IsOk());
  EXPECT_TRUE(summary.already_existed);

  // Without if_missing the data is replaced.
  again.if_missing = false;
  again.seed = 2;
  ASSERT_THAT(GenerateCtrData(again, fs.get(), &summary), IsOk());
  EXPECT_FALSE(summary.already_existed);
  EXPECT_NE(Read(fs.get(), "/d/train.txt"), train);
}

TEST(CtrGenIfMissingTest, GeneratesWhenPartOfTheDataIsMissing) {
  auto fs = storage::NewMemoryFileSystem();
  ASSERT_THAT(fs->WriteFileAtomic("/p/train.txt", "stale"), IsOk());
  ASSERT_THAT(fs->WriteFileAtomic("/p/test.txt", "stale"), IsOk());
  CtrGenOptions o = SmallOptions("/p");
  o.train_rows = 100;
  o.test_rows = 100;
  o.if_missing = true;
  CtrGenSummary summary;
  ASSERT_THAT(GenerateCtrData(o, fs.get(), &summary), IsOk());
  EXPECT_FALSE(summary.already_existed);
  EXPECT_NE(Read(fs.get(), "/p/train.txt"), "stale");
  EXPECT_TRUE(fs->Exists("/p/planted.json"));
}

TEST(PlantedCtrModelTest, ValuesAreABijectionOfRanks) {
  auto model = PlantedCtrModel::Create(SmallOptions("/x"));
  ASSERT_THAT(model, IsOk());
  const int field = kCriteoCategorical - 1;
  const int64_t vocab = DefaultCtrVocabSizes()[field];
  std::set<uint32_t> values;
  for (int64_t r = 0; r < vocab; ++r) {
    const uint32_t v = model->CategoricalValue(field, r);
    values.insert(v);
    ASSERT_EQ(model->CategoricalRank(field, v), r);
  }
  EXPECT_EQ(values.size(), static_cast<size_t>(vocab));
  // Fields use different values for the same rank.
  EXPECT_NE(model->CategoricalValue(0, 0), model->CategoricalValue(1, 0));
  // Values outside the vocabulary have no rank.
  EXPECT_EQ(model->CategoricalRank(0, model->CategoricalValue(0, 10)), -1);
  EXPECT_EQ(model->CategoricalRank(0, uint64_t{1} << 40), -1);
}

TEST(PlantedCtrModelTest, WeightsDependOnSeedFieldAndRank) {
  auto a = PlantedCtrModel::Create(SmallOptions("/x", 1));
  auto b = PlantedCtrModel::Create(SmallOptions("/x", 2));
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  EXPECT_EQ(a->CategoricalWeight(3, 7),
            PlantedCtrModel::Create(SmallOptions("/y", 1))->CategoricalWeight(3, 7));
  EXPECT_NE(a->CategoricalWeight(3, 7), b->CategoricalWeight(3, 7));
  EXPECT_NE(a->CategoricalWeight(3, 7), a->CategoricalWeight(4, 7));
  EXPECT_NE(a->CategoricalWeight(3, 7), a->CategoricalWeight(3, 8));
  // Their spread is weight_scale.
  double sum = 0, sum2 = 0;
  const int n = 20000;
  for (int r = 0; r < n; ++r) {
    const double w = a->CategoricalWeight(25, r);
    sum += w;
    sum2 += w * w;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(std::sqrt(sum2 / n), 0.24, 0.01);
}

TEST(CtrGenOptionsTest, RejectsBadOptions) {
  auto fs = storage::NewMemoryFileSystem();
  CtrGenOptions o = SmallOptions("");
  EXPECT_THAT(GenerateCtrData(o, fs.get()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("out_dir")));
  o = SmallOptions("/o");
  o.vocab_sizes.pop_back();
  EXPECT_THAT(GenerateCtrData(o, fs.get()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("vocab_sizes")));
  o = SmallOptions("/o");
  o.vocab_sizes[3] = 0;
  EXPECT_THAT(PlantedCtrModel::Create(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("vocab_sizes[3] (C4)")));
  o = SmallOptions("/o");
  o.zipf_s = 0;
  EXPECT_THAT(ValidateCtrGenOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("zipf")));
  o = SmallOptions("/o");
  o.test_rows = 0;
  EXPECT_THAT(ValidateCtrGenOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("test_rows")));
  o = SmallOptions("/o");
  o.dense_missing_rate = NAN;
  EXPECT_THAT(ValidateCtrGenOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dense_missing_rate")));
  EXPECT_FALSE(fs->Exists("/o"));
}

TEST(ParseCtrGenFlagsTest, ParsesFlags) {
  auto o = ParseCtrGenFlags({"--out_dir", "/tmp/x", "--train_rows=10", "--test_rows", "5", "--seed",
                             "7", "--zipf", "1.3", "--if_missing"});
  ASSERT_THAT(o, IsOk());
  EXPECT_EQ(o->out_dir, "/tmp/x");
  EXPECT_EQ(o->train_rows, 10);
  EXPECT_EQ(o->test_rows, 5);
  EXPECT_EQ(o->seed, 7u);
  EXPECT_DOUBLE_EQ(o->zipf_s, 1.3);
  EXPECT_TRUE(o->if_missing);
  EXPECT_FALSE(ParseCtrGenFlags({"--out_dir=/x", "--if_missing=false"})->if_missing);
  auto defaults = ParseCtrGenFlags({"--out_dir=/x"});
  ASSERT_THAT(defaults, IsOk());
  EXPECT_EQ(defaults->train_rows, 200000);
  EXPECT_EQ(defaults->test_rows, 50000);
}

TEST(ParseCtrGenFlagsTest, BadFlagsAreNamed) {
  const struct {
    std::vector<std::string> args;
    const char* message;
  } cases[] = {
      {{}, "--out_dir"},
      {{"--out_dir=/x", "--train_rows", "ten"}, "--train_rows: bad value 'ten'"},
      {{"--out_dir=/x", "--seed=-1"}, "--seed: bad value '-1'"},
      {{"--out_dir=/x", "--zipf"}, "--zipf needs a value"},
      {{"--out_dir=/x", "--zipf", "--seed=1"}, "--zipf needs a value"},
      {{"--out_dir=/x", "--zipf=0"}, "zipf"},
      {{"--out_dir=/x", "--test_rows=0"}, "test_rows"},
      {{"--out_dir=/x", "--rows=5"}, "unknown flag --rows"},
      {{"--out_dir=/x", "extra"}, "unexpected argument 'extra'"},
      {{"--out_dir=/x", "--if_missing=maybe"}, "--if_missing: bad value"},
  };
  for (const auto& c : cases) {
    EXPECT_THAT(ParseCtrGenFlags(c.args),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)))
        << c.message;
  }
}

}  // namespace
}  // namespace strata::tools
