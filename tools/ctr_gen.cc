#include "tools/ctr_gen.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/config.h"
#include "common/eval_metrics.h"
#include "common/hash.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace strata::tools {
namespace {

using storage::CriteoRawRow;
using storage::kCriteoCategorical;
using storage::kCriteoDense;

// Hash stream tags (see the header comment); 4 and 5 are the train and test
// streams.
constexpr uint64_t kWeightTag = 1;
constexpr uint64_t kDenseWeightTag = 2;
constexpr uint64_t kValueKeyTag = 3;
constexpr uint64_t kCalibrationStream = 6;
constexpr int64_t kCalibrationRows = 50000;

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;
constexpr double kTwoPi = 6.283185307179586476925;
// Integer features are capped here (a lognormal tail could overflow int64).
constexpr double kMaxDenseValue = 1e15;

// The splitmix64 finalizer: a bijection on 64 bits.
constexpr uint64_t Fmix(uint64_t z) { return Fmix64(z); }
constexpr uint64_t Combine(uint64_t h, uint64_t x) { return Fmix(h ^ Fmix(x + kGolden)); }
// H(seed, tag, a, b) of the header comment.
constexpr uint64_t Hash(uint64_t seed, uint64_t tag, uint64_t a, uint64_t b) {
  return Combine(Combine(Combine(Fmix(seed + kGolden), tag), a), b);
}

// A standard normal from the two 32-bit halves of a hash (Box-Muller).
double NormalFromHash(uint64_t h) {
  const double u1 = (static_cast<double>(h >> 32) + 0.5) * 0x1.0p-32;  // (0,1)
  const double u2 = static_cast<double>(h & 0xffffffffu) * 0x1.0p-32;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
}

// The multiplicative inverse of odd `a` modulo 2^32 (Newton's iteration;
// each step doubles the correct low bits, 3 to start with).
constexpr uint32_t InverseMod32(uint32_t a) {
  uint32_t x = a;
  for (int i = 0; i < 4; ++i) x *= 2u - a * x;
  return x;
}
constexpr uint32_t kMul1 = 0x7feb352du;
constexpr uint32_t kMul2 = 0x846ca68bu;
static_assert(kMul1 * InverseMod32(kMul1) == 1u);
static_assert(kMul2 * InverseMod32(kMul2) == 1u);

// A 32-bit bijection ("lowbias32", C. Wellons) and its inverse.
constexpr uint32_t Mix32(uint32_t x) {
  x ^= x >> 16;
  x *= kMul1;
  x ^= x >> 15;
  x *= kMul2;
  x ^= x >> 16;
  return x;
}
constexpr uint32_t Unmix32(uint32_t x) {
  x ^= x >> 16;
  x *= InverseMod32(kMul2);
  x ^= (x >> 15) ^ (x >> 30);
  x *= InverseMod32(kMul1);
  x ^= x >> 16;
  return x;
}
static_assert(Unmix32(Mix32(0x12345678u)) == 0x12345678u);

// splitmix64: the per-row generator. Not thread-safe; one per row.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() { return Fmix(state_ += kGolden); }
  // Uniform in [0, 1), 53 bits.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  // Standard normal (Box-Muller, one of the pair).
  double Normal() {
    const double u1 = 1.0 - Uniform();  // (0, 1]
    const double u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
  }

 private:
  uint64_t state_;
};

double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// The options the model depends on.
absl::Status ValidateModelOptions(const CtrGenOptions& o) {
  if (o.vocab_sizes.size() != static_cast<size_t>(kCriteoCategorical)) {
    return absl::InvalidArgumentError(absl::StrCat("vocab_sizes must have ", kCriteoCategorical,
                                                   " entries, got ", o.vocab_sizes.size()));
  }
  for (int f = 0; f < kCriteoCategorical; ++f) {
    if (o.vocab_sizes[f] < 1 || o.vocab_sizes[f] > kMaxCtrVocab) {
      return absl::InvalidArgumentError(absl::StrCat("vocab_sizes[", f, "] (C", f + 1,
                                                     ") must be in [1, ", kMaxCtrVocab, "], got ",
                                                     o.vocab_sizes[f]));
    }
  }
  if (!(o.zipf_s > 0 && o.zipf_s <= 10)) {
    return absl::InvalidArgumentError(
        absl::StrCat("zipf_s (--zipf) must be in (0, 10], got ", o.zipf_s));
  }
  if (!(o.categorical_missing_rate >= 0 && o.categorical_missing_rate <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "categorical_missing_rate must be in [0, 1], got ", o.categorical_missing_rate));
  }
  if (!(o.dense_missing_rate >= 0 && o.dense_missing_rate <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dense_missing_rate must be in [0, 1], got ", o.dense_missing_rate));
  }
  if (!(o.weight_scale >= 0 && o.weight_scale <= 100)) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight_scale must be in [0, 100], got ", o.weight_scale));
  }
  if (!(o.dense_weight_scale >= 0 && o.dense_weight_scale <= 100)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dense_weight_scale must be in [0, 100], got ", o.dense_weight_scale));
  }
  if (!(o.target_ctr >= 0.001 && o.target_ctr <= 0.999)) {
    return absl::InvalidArgumentError(
        absl::StrCat("target_ctr must be in [0.001, 0.999], got ", o.target_ctr));
  }
  return absl::OkStatus();
}

std::string JoinPath(const std::string& dir, const std::string& name) {
  if (!dir.empty() && dir.back() == '/') return dir + name;
  return absl::StrCat(dir, "/", name);
}

std::string JsonNumber(double x) { return absl::StrFormat("%.9g", x); }

}  // namespace

std::vector<int64_t> DefaultCtrVocabSizes() {
  std::vector<int64_t> sizes(kCriteoCategorical);
  for (int f = 0; f < kCriteoCategorical; ++f) {
    sizes[f] = std::min<int64_t>(200000, std::llround(10 * std::pow(1.5, f)));
  }
  return sizes;
}

absl::Status ValidateCtrGenOptions(const CtrGenOptions& o) {
  if (o.out_dir.empty()) {
    return absl::InvalidArgumentError("out_dir (--out_dir) is required");
  }
  if (o.train_rows < 1 || o.train_rows > kMaxCtrRows) {
    return absl::InvalidArgumentError(
        absl::StrCat("train_rows must be in [1, ", kMaxCtrRows, "], got ", o.train_rows));
  }
  if (o.test_rows < 1 || o.test_rows > kMaxCtrRows) {
    return absl::InvalidArgumentError(
        absl::StrCat("test_rows must be in [1, ", kMaxCtrRows, "], got ", o.test_rows));
  }
  return ValidateModelOptions(o);
}

absl::StatusOr<PlantedCtrModel> PlantedCtrModel::Create(const CtrGenOptions& options) {
  STRATA_RETURN_IF_ERROR(ValidateModelOptions(options));
  PlantedCtrModel m;
  m.seed_ = options.seed;
  m.weight_scale_ = options.weight_scale;
  m.categorical_missing_rate_ = options.categorical_missing_rate;
  m.dense_missing_rate_ = options.dense_missing_rate;
  m.vocab_sizes_ = options.vocab_sizes;
  m.cdf_.resize(kCriteoCategorical);
  m.value_keys_.resize(2 * kCriteoCategorical);
  for (int f = 0; f < kCriteoCategorical; ++f) {
    std::vector<double>& cdf = m.cdf_[f];
    cdf.resize(m.vocab_sizes_[f]);
    double total = 0;
    for (int64_t r = 0; r < m.vocab_sizes_[f]; ++r) {
      total += std::pow(static_cast<double>(r + 1), -options.zipf_s);
      cdf[r] = total;
    }
    const uint64_t h = Hash(m.seed_, kValueKeyTag, f, 0);
    m.value_keys_[2 * f] = static_cast<uint32_t>(h);
    m.value_keys_[2 * f + 1] = static_cast<uint32_t>(h >> 32);
  }
  m.dense_weights_.resize(kCriteoDense);
  for (int j = 0; j < kCriteoDense; ++j) {
    m.dense_weights_[j] =
        options.dense_weight_scale * NormalFromHash(Hash(m.seed_, kDenseWeightTag, j, 0));
  }

  // The bias: mean sigmoid(bias + z) over a calibration sample equals
  // target_ctr. The mean is increasing in the bias: bisect.
  std::vector<double> z(kCalibrationRows);
  for (int64_t i = 0; i < kCalibrationRows; ++i) {
    z[i] = m.LogitWithoutBias(m.SampleRow(kCalibrationStream, i));
  }
  double lo = -60, hi = 60;
  for (int iter = 0; iter < 60; ++iter) {
    const double mid = 0.5 * (lo + hi);
    double sum = 0;
    for (double x : z) sum += Sigmoid(mid + x);
    (sum / kCalibrationRows < options.target_ctr ? lo : hi) = mid;
  }
  m.bias_ = 0.5 * (lo + hi);
  return m;
}

uint32_t PlantedCtrModel::CategoricalValue(int field, int64_t rank) const {
  const uint32_t x = Mix32(static_cast<uint32_t>(rank) ^ value_keys_[2 * field]);
  return Mix32(x + value_keys_[2 * field + 1]);
}

int64_t PlantedCtrModel::CategoricalRank(int field, uint64_t value) const {
  if (value > 0xffffffffu) return -1;
  const uint32_t x = Unmix32(static_cast<uint32_t>(value)) - value_keys_[2 * field + 1];
  const int64_t rank = Unmix32(x) ^ value_keys_[2 * field];
  return rank < vocab_sizes_[field] ? rank : -1;
}

double PlantedCtrModel::CategoricalWeight(int field, int64_t rank) const {
  return weight_scale_ *
         NormalFromHash(Hash(seed_, kWeightTag, field, static_cast<uint64_t>(rank)));
}

double PlantedCtrModel::LogitWithoutBias(const CriteoRawRow& row) const {
  double logit = 0;
  for (int f = 0; f < kCriteoCategorical; ++f) {
    if (!row.categorical_present[f]) continue;
    const int64_t rank = CategoricalRank(f, row.categorical[f]);
    if (rank >= 0) logit += CategoricalWeight(f, rank);
  }
  for (int j = 0; j < kCriteoDense; ++j) {
    if (!row.dense_present[j]) continue;
    logit += dense_weights_[j] * storage::CriteoDenseTransform(row.dense[j]);
  }
  return logit;
}

double PlantedCtrModel::Logit(const CriteoRawRow& row) const {
  return bias_ + LogitWithoutBias(row);
}

float PlantedCtrModel::Probability(const CriteoRawRow& row) const {
  return static_cast<float>(Sigmoid(Logit(row)));
}

CriteoRawRow PlantedCtrModel::SampleRow(uint64_t stream, int64_t index) const {
  Rng rng(Hash(seed_, stream, static_cast<uint64_t>(index), 0));
  CriteoRawRow row;
  for (int f = 0; f < kCriteoCategorical; ++f) {
    if (rng.Uniform() < categorical_missing_rate_) continue;  // missing
    const std::vector<double>& cdf = cdf_[f];
    const double target = rng.Uniform() * cdf.back();
    const int64_t rank = std::min<int64_t>(
        std::upper_bound(cdf.begin(), cdf.end(), target) - cdf.begin(), vocab_sizes_[f] - 1);
    row.categorical_present[f] = true;
    row.categorical[f] = CategoricalValue(f, rank);
  }
  for (int j = 0; j < kCriteoDense; ++j) {
    if (rng.Uniform() < dense_missing_rate_) continue;  // missing
    const double x = std::exp(kCtrDenseLogMean[j] + kCtrDenseLogStd[j] * rng.Normal());
    row.dense_present[j] = true;
    row.dense[j] = static_cast<int64_t>(std::floor(std::min(x, kMaxDenseValue)));
  }
  row.label = rng.Uniform() < Probability(row) ? 1 : 0;
  return row;
}

void AppendCriteoLine(const CriteoRawRow& row, std::string* out) {
  out->push_back(row.label != 0 ? '1' : '0');
  for (int j = 0; j < kCriteoDense; ++j) {
    out->push_back('\t');
    if (row.dense_present[j]) absl::StrAppend(out, row.dense[j]);
  }
  for (int f = 0; f < kCriteoCategorical; ++f) {
    out->push_back('\t');
    if (row.categorical_present[f]) {
      absl::StrAppend(out, absl::Hex(row.categorical[f], absl::kZeroPad8));
    }
  }
}

namespace {

// Whether out_dir already holds data generated with these options: with
// if_missing, a rerun (a launch script, a benchmark) reuses it rather than
// spending minutes writing the same bytes again.
bool CtrDataUpToDate(const CtrGenOptions& options, storage::FileSystem* fs,
                     const std::string& train_path, const std::string& test_path,
                     const std::string& json_path) {
  if (!options.if_missing || !fs->Exists(train_path) || !fs->Exists(test_path) ||
      !fs->Exists(json_path)) {
    return false;
  }
  // What planted.json records of the options: data generated with other
  // options is not "already there".
  const std::vector<std::string> recorded = {
      absl::StrCat("\"train_rows\": ", options.train_rows, ","),
      absl::StrCat("\"test_rows\": ", options.test_rows, ","),
      absl::StrCat("\"seed\": ", options.seed, ","),
      absl::StrCat("\"target_ctr\": ", JsonNumber(options.target_ctr), ","),
      absl::StrCat("\"zipf_s\": ", JsonNumber(options.zipf_s), ","),
      absl::StrCat("\"weight_scale\": ", JsonNumber(options.weight_scale), ","),
      absl::StrCat("\"dense_weight_scale\": ", JsonNumber(options.dense_weight_scale), ","),
      absl::StrCat("\"categorical_missing_rate\": ", JsonNumber(options.categorical_missing_rate),
                   ","),
      absl::StrCat("\"dense_missing_rate\": ", JsonNumber(options.dense_missing_rate), ","),
      absl::StrCat("\"vocab_sizes\": [", absl::StrJoin(options.vocab_sizes, ", "), "],"),
  };
  auto existing = fs->ReadFile(json_path);
  std::string differs;
  for (const std::string& line : recorded) {
    if (existing.ok() && existing->find(line) == std::string::npos) {
      differs = line.substr(0, line.find(':'));
      break;
    }
  }
  if (existing.ok() && differs.empty()) {
    LOG(INFO) << "CTR data already in " << options.out_dir
              << " (train.txt, test.txt, planted.json); not regenerating";
    return true;
  }
  LOG(INFO) << "CTR data in " << options.out_dir << " was generated with other options ("
            << (existing.ok() ? differs : existing.status().ToString()) << "); regenerating";
  return false;
}

// Writes the training rows to `path`; returns their clicks. The file is
// built in memory and published atomically: a crash leaves no half file
// that a later if_missing run would take for finished data.
absl::StatusOr<int64_t> WriteCtrTrainRows(const PlantedCtrModel& model,
                                          const CtrGenOptions& options, storage::FileSystem* fs,
                                          const std::string& path, CtrGenSummary* summary) {
  int64_t clicks = 0;
  std::string text;
  text.reserve(options.train_rows * 200);
  for (int64_t i = 0; i < options.train_rows; ++i) {
    const CriteoRawRow row = model.SampleRow(kCtrTrainStream, i);
    AppendCriteoLine(row, &text);
    text.push_back('\n');
    clicks += row.label;
  }
  STRATA_RETURN_IF_ERROR(fs->WriteFileAtomic(path, text));
  summary->bytes_written += text.size();
  return clicks;
}

// Writes the test rows and, beside them, each row's planted probability
// (what an ideal model predicts, for the AUC a trained one should reach);
// fills *probs and *labels and returns the clicks.
absl::StatusOr<int64_t> WriteCtrTestRows(const PlantedCtrModel& model, const CtrGenOptions& options,
                                         storage::FileSystem* fs, const std::string& test_path,
                                         const std::string& probs_path, std::vector<float>* probs,
                                         std::vector<float>* labels, CtrGenSummary* summary) {
  int64_t clicks = 0;
  std::string text, probs_text;
  text.reserve(options.test_rows * 200);
  probs_text.reserve(options.test_rows * 12);
  for (int64_t i = 0; i < options.test_rows; ++i) {
    const CriteoRawRow row = model.SampleRow(kCtrTestStream, i);
    AppendCriteoLine(row, &text);
    text.push_back('\n');
    clicks += row.label;
    (*labels)[i] = static_cast<float>(row.label);
    (*probs)[i] = model.Probability(row);
    // %.9g of a float reads back as the same float.
    char buf[32];
    const int n = std::snprintf(buf, sizeof(buf), "%.9g\n", static_cast<double>((*probs)[i]));
    probs_text.append(buf, n);
  }
  STRATA_RETURN_IF_ERROR(fs->WriteFileAtomic(test_path, text));
  STRATA_RETURN_IF_ERROR(fs->WriteFileAtomic(probs_path, probs_text));
  summary->bytes_written += text.size() + probs_text.size();
  return clicks;
}

// planted.json: the options and the planted model's parameters, so that a
// run's results can be judged against the truth (and CtrDataUpToDate can
// tell which options made the data).
std::string PlantedJson(const CtrGenOptions& options, const PlantedCtrModel& model,
                        const CtrGenSummary& summary) {
  std::vector<std::string> dense_weights, log_means, log_stds;
  for (int j = 0; j < kCriteoDense; ++j) {
    dense_weights.push_back(JsonNumber(model.DenseWeight(j)));
    log_means.push_back(JsonNumber(kCtrDenseLogMean[j]));
    log_stds.push_back(JsonNumber(kCtrDenseLogStd[j]));
  }
  return absl::StrCat(
      "{\n", "  \"planted_test_auc\": ", JsonNumber(summary.planted_test_auc), ",\n",
      "  \"planted_test_logloss\": ", JsonNumber(summary.planted_test_logloss), ",\n",
      "  \"train_rows\": ", options.train_rows, ",\n", "  \"test_rows\": ", options.test_rows,
      ",\n", "  \"seed\": ", options.seed, ",\n", "  \"mean_ctr\": ", JsonNumber(summary.mean_ctr),
      ",\n", "  \"target_ctr\": ", JsonNumber(options.target_ctr), ",\n",
      "  \"bias\": ", JsonNumber(model.bias()), ",\n", "  \"zipf_s\": ", JsonNumber(options.zipf_s),
      ",\n", "  \"weight_scale\": ", JsonNumber(options.weight_scale), ",\n",
      "  \"dense_weight_scale\": ", JsonNumber(options.dense_weight_scale), ",\n",
      "  \"categorical_missing_rate\": ", JsonNumber(options.categorical_missing_rate), ",\n",
      "  \"dense_missing_rate\": ", JsonNumber(options.dense_missing_rate), ",\n",
      "  \"vocab_sizes\": [", absl::StrJoin(options.vocab_sizes, ", "), "],\n",
      "  \"dense_weights\": [", absl::StrJoin(dense_weights, ", "), "],\n",
      "  \"dense_log_mean\": [", absl::StrJoin(log_means, ", "), "],\n", "  \"dense_log_std\": [",
      absl::StrJoin(log_stds, ", "), "]\n", "}\n");
}

}  // namespace

absl::Status GenerateCtrData(const CtrGenOptions& options, storage::FileSystem* fs,
                             CtrGenSummary* summary) {
  CtrGenSummary local_summary;
  if (summary == nullptr) summary = &local_summary;
  *summary = CtrGenSummary();
  STRATA_RETURN_IF_ERROR(ValidateCtrGenOptions(options));
  const std::string train_path = JoinPath(options.out_dir, "train.txt");
  const std::string test_path = JoinPath(options.out_dir, "test.txt");
  const std::string probs_path = JoinPath(options.out_dir, "test.probs");
  const std::string json_path = JoinPath(options.out_dir, "planted.json");
  if (CtrDataUpToDate(options, fs, train_path, test_path, json_path)) {
    summary->already_existed = true;
    return absl::OkStatus();
  }

  STRATA_ASSIGN_OR_RETURN(PlantedCtrModel model, PlantedCtrModel::Create(options));
  STRATA_RETURN_IF_ERROR(fs->CreateDirs(options.out_dir));
  STRATA_ASSIGN_OR_RETURN(const int64_t train_clicks,
                          WriteCtrTrainRows(model, options, fs, train_path, summary));
  std::vector<float> probs(options.test_rows), labels(options.test_rows);
  STRATA_ASSIGN_OR_RETURN(
      const int64_t test_clicks,
      WriteCtrTestRows(model, options, fs, test_path, probs_path, &probs, &labels, summary));

  summary->train_rows = options.train_rows;
  summary->test_rows = options.test_rows;
  summary->mean_ctr = static_cast<double>(train_clicks + test_clicks) /
                      static_cast<double>(options.train_rows + options.test_rows);
  summary->planted_test_auc = Auc(probs, labels);
  summary->planted_test_logloss = LogLoss(probs, labels);
  summary->bias = model.bias();

  const std::string json = PlantedJson(options, model, *summary);
  STRATA_RETURN_IF_ERROR(fs->WriteFileAtomic(json_path, json));
  summary->bytes_written += json.size();
  LOG(INFO) << "wrote CTR data to " << options.out_dir << ": " << options.train_rows
            << " train and " << options.test_rows << " test rows, mean CTR " << summary->mean_ctr
            << ", planted test AUC " << summary->planted_test_auc << ", log-loss "
            << summary->planted_test_logloss;
  return absl::OkStatus();
}

const char kCtrGenUsage[] =
    "usage: strata-gen-ctr --out_dir DIR [--train_rows N] [--test_rows N]\n"
    "                      [--seed N] [--zipf S] [--weight_scale W]\n"
    "                      [--dense_weight_scale W] [--target_ctr C]\n"
    "                      [--categorical_missing_rate R]\n"
    "                      [--dense_missing_rate R] [--if_missing]\n"
    "Writes DIR/train.txt, DIR/test.txt (Criteo format), DIR/test.probs and\n"
    "DIR/planted.json from a planted logistic model (tools/ctr_gen.h).\n"
    "  --train_rows N                training rows (default 200000)\n"
    "  --test_rows N                 test rows (default 50000)\n"
    "  --seed N                      model and rows derive from it (default "
    "1)\n"
    "  --zipf S                      Zipf exponent of the values (default "
    "1.1)\n"
    "  --weight_scale W              std of the value weights (default 0.24)\n"
    "  --dense_weight_scale W        std of the integer weights (default 0.1)\n"
    "  --categorical_missing_rate R  (default 0.02)\n"
    "  --dense_missing_rate R        (default 0.05)\n"
    "  --target_ctr C                mean click probability (default 0.25)\n"
    "  --max_vocab N                 cap every field's vocabulary at N values\n"
    "                                (default: round(10 * 1.5^f) up to 200000)\n"
    "  --if_missing                  do nothing when the data is already "
    "there\n"
    "   or: strata-gen-ctr --config JOB.yaml   (the job's data.generate "
    "section, --if_missing)\n";

absl::StatusOr<CtrGenOptions> ParseCtrGenFlags(const std::vector<std::string>& args) {
  CtrGenOptions o;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", a, "'"));
    }
    std::string key = a.substr(2), value;
    bool has_value = false;
    if (const size_t eq = key.find('='); eq != std::string::npos) {
      value = key.substr(eq + 1);
      key.resize(eq);
      has_value = true;
    }
    if (key == "if_missing") {
      if (!has_value || value == "true" || value == "1") {
        o.if_missing = true;
      } else if (value == "false" || value == "0") {
        o.if_missing = false;
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("--if_missing: bad value '", value, "' (want true or false)"));
      }
      continue;
    }
    if (!has_value) {
      if (i + 1 >= args.size() || args[i + 1].rfind("--", 0) == 0) {
        return absl::InvalidArgumentError(absl::StrCat("--", key, " needs a value"));
      }
      value = args[++i];
    }
    bool ok = true;
    if (key == "out_dir") {
      o.out_dir = value;
    } else if (key == "train_rows") {
      ok = absl::SimpleAtoi(value, &o.train_rows);
    } else if (key == "test_rows") {
      ok = absl::SimpleAtoi(value, &o.test_rows);
    } else if (key == "seed") {
      ok = absl::SimpleAtoi(value, &o.seed);
    } else if (key == "zipf") {
      ok = absl::SimpleAtod(value, &o.zipf_s);
    } else if (key == "weight_scale") {
      ok = absl::SimpleAtod(value, &o.weight_scale);
    } else if (key == "dense_weight_scale") {
      ok = absl::SimpleAtod(value, &o.dense_weight_scale);
    } else if (key == "categorical_missing_rate") {
      ok = absl::SimpleAtod(value, &o.categorical_missing_rate);
    } else if (key == "dense_missing_rate") {
      ok = absl::SimpleAtod(value, &o.dense_missing_rate);
    } else if (key == "target_ctr") {
      ok = absl::SimpleAtod(value, &o.target_ctr);
    } else if (key == "max_vocab") {
      int64_t cap = 0;
      ok = absl::SimpleAtoi(value, &cap) && cap >= 1;
      if (ok) {
        o.vocab_sizes = DefaultCtrVocabSizes();
        for (int64_t& v : o.vocab_sizes) v = std::min(v, cap);
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", key));
    }
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat("--", key, ": bad value '", value, "'"));
    }
  }
  STRATA_RETURN_IF_ERROR(ValidateCtrGenOptions(o));
  return o;
}

absl::StatusOr<std::vector<std::string>> CtrGenFlagsFromConfig(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(JobConfig config, LoadJobConfig(path));
  const CtrGenerateSection& g = config.data.generate;
  if (!g.enabled) return std::vector<std::string>();
  return std::vector<std::string>{
      "--out_dir",      g.out_dir,
      "--train_rows",   absl::StrCat(g.train_rows),
      "--test_rows",    absl::StrCat(g.test_rows),
      "--seed",         absl::StrCat(g.seed),
      "--zipf",         absl::StrCat(g.zipf),
      "--weight_scale", absl::StrCat(g.weight_scale),
      "--max_vocab",    absl::StrCat(g.max_vocab),
      "--if_missing",
  };
}

}  // namespace strata::tools
