// strata-gen-ctr's library: synthetic click-through-rate data in the Criteo
// text format (storage/criteo_reader.h), drawn from a planted logistic model
// so that the best achievable test AUC and log-loss are known.
//
// The planted model. For a row with categorical value ranks r_f (f = 0..25,
// C1..C26) and integers x_j (j = 0..12, I1..I13):
//   logit = bias + sum_f w_f(r_f) + sum_j u_j * CriteoDenseTransform(x_j)
//   p     = sigmoid(logit),  label ~ Bernoulli(p)
// with a missing value contributing 0. Nothing is tabulated: with
// H(...) a 64-bit hash (splitmix64 finalizer chain) and N(h) the standard
// normal obtained from a hash by Box-Muller,
//   w_f(r) = weight_scale       * N(H(seed, 1, f, r))
//   u_j    = dense_weight_scale * N(H(seed, 2, j, 0))
// so vocabularies can be large. `bias` is solved (bisection) so that the mean
// p over a 50000-row calibration sample (its own stream) is target_ctr.
//
// A row. Field f is missing with probability categorical_missing_rate, else
// has rank r with P(r) proportional to (r + 1)^-zipf_s, r < vocab_sizes[f],
// and is written as 8 lowercase hex digits: a keyed 32-bit bijection of r
// (distinct ranks of a field give distinct values). Integer j is missing with
// probability dense_missing_rate, else x_j = floor(exp(m_j + s_j * z)), z
// standard normal (a heavy-tailed, non-negative count; m_j, s_j are fixed,
// see kCtrDenseLogMean / kCtrDenseLogStd). Row i of the train (test) split
// draws from its own generator seeded with H(seed, 4 (5), i, 0), so rows
// depend only on (options, split, i): the same options give byte-identical
// files, and train and test are independent.
//
// Output in out_dir, each file published atomically through FileSystem:
//   train.txt, test.txt  Criteo text, '\n' line ends
//   test.probs           the planted p of each test row, one per line, %.9g
//   planted.json         {"planted_test_auc", "planted_test_logloss" (of
//                        test.probs against the test labels), "train_rows",
//                        "test_rows", "seed", "mean_ctr", ... parameters}
// planted.json is written last: its presence marks a complete data set.
#ifndef STRATA_TOOLS_CTR_GEN_H_
#define STRATA_TOOLS_CTR_GEN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "storage/criteo_reader.h"
#include "storage/file_system.h"

namespace strata::tools {

// Log-scale mean and standard deviation of each integer feature I1..I13:
// x = floor(exp(mean + std * z)). Loosely shaped after the Criteo columns
// (I5 large, I10 and I12 mostly 0). Part of the generator's output: fixed.
inline constexpr double kCtrDenseLogMean[storage::kCriteoDense] = {
    0.5, 2.5, 1.5, 1.2, 7.5, 3.5, 1.5, 1.8, 3.5, -0.5, 0.5, -1.0, 1.5};
inline constexpr double kCtrDenseLogStd[storage::kCriteoDense] = {1.2, 1.8, 1.3, 1.0, 2.0, 1.6, 1.5,
                                                                  1.0, 1.3, 0.8, 1.0, 1.2, 1.2};

// The default vocabulary sizes: field f (C(f+1)) has round(10 * 1.5^f)
// values, capped at 200000: 10, 15, 23, 34, 51, ..., 112227, 168341, 200000
// (705003 in all: from a handful of values to Criteo-like long tails).
std::vector<int64_t> DefaultCtrVocabSizes();

struct CtrGenOptions {
  std::string out_dir;  // required; created when missing
  int64_t train_rows = 200000;
  int64_t test_rows = 50000;
  uint64_t seed = 1;
  // kCriteoCategorical entries, each in [1, kMaxCtrVocab].
  std::vector<int64_t> vocab_sizes = DefaultCtrVocabSizes();
  double zipf_s = 1.1;  // P(rank r) proportional to (r + 1)^-zipf_s; (0, 10]
  double categorical_missing_rate = 0.02;
  double dense_missing_rate = 0.05;
  // Standard deviations of the per-value weights w_f(r) and of the integer
  // features' weights u_j. With the other defaults they put the planted
  // model's test AUC near 0.78 and its log-loss near 0.46 (the integers
  // alone give an AUC of about 0.61).
  double weight_scale = 0.24;
  double dense_weight_scale = 0.1;
  double target_ctr = 0.25;  // the bias makes the mean p about this
  // When train.txt, test.txt and planted.json all exist in out_dir, log that
  // and write nothing.
  bool if_missing = false;
};

// Bounds: one Zipf CDF table of 8 bytes per value is held per field, and
// the files are built in memory before they are written.
inline constexpr int64_t kMaxCtrVocab = int64_t{1} << 22;
inline constexpr int64_t kMaxCtrRows = int64_t{50} * 1000 * 1000;

// InvalidArgument naming the first bad option.
absl::Status ValidateCtrGenOptions(const CtrGenOptions& options);

// The planted model of a set of options (only seed, vocab_sizes, zipf_s,
// the weight scales and target_ctr matter), with the samplers the generator
// draws rows from. Immutable once created, so thread-safe. Move-only (holds
// the per-field CDF tables).
class PlantedCtrModel {
 public:
  // InvalidArgument from ValidateCtrGenOptions (out_dir is not needed here).
  static absl::StatusOr<PlantedCtrModel> Create(const CtrGenOptions& options);

  PlantedCtrModel(PlantedCtrModel&&) = default;
  PlantedCtrModel& operator=(PlantedCtrModel&&) = default;
  PlantedCtrModel(const PlantedCtrModel&) = delete;
  PlantedCtrModel& operator=(const PlantedCtrModel&) = delete;

  // The value written for rank `rank` of field `field`, and back: -1 when
  // `value` is no value of the field's vocabulary.
  uint32_t CategoricalValue(int field, int64_t rank) const;
  int64_t CategoricalRank(int field, uint64_t value) const;
  // w_f(rank), u_j and the bias of the header comment.
  double CategoricalWeight(int field, int64_t rank) const;
  double DenseWeight(int j) const { return dense_weights_[j]; }
  double bias() const { return bias_; }

  // The planted logit and p = sigmoid(logit) of a row (its label is
  // ignored); a categorical value outside the vocabulary contributes 0.
  // Probability() of a row read back from the files equals the number the
  // generator wrote for it to test.probs.
  double Logit(const storage::CriteoRawRow& row) const;
  float Probability(const storage::CriteoRawRow& row) const;

  // Row `index` of the split drawing from stream `stream` (4 train, 5 test;
  // others are free for callers): features, then its label.
  storage::CriteoRawRow SampleRow(uint64_t stream, int64_t index) const;

 private:
  PlantedCtrModel() = default;
  double LogitWithoutBias(const storage::CriteoRawRow& row) const;

  uint64_t seed_ = 0;
  double weight_scale_ = 0;
  double categorical_missing_rate_ = 0;
  double dense_missing_rate_ = 0;
  std::vector<int64_t> vocab_sizes_;
  // cdf_[f][r] = sum over i <= r of (i + 1)^-zipf_s (unnormalised).
  std::vector<std::vector<double>> cdf_;
  // Keys of the 32-bit value bijection, two per field.
  std::vector<uint32_t> value_keys_;
  std::vector<double> dense_weights_;
  double bias_ = 0;
};

// The stream ids of PlantedCtrModel::SampleRow.
inline constexpr uint64_t kCtrTrainStream = 4;
inline constexpr uint64_t kCtrTestStream = 5;

// Writes one row as a Criteo line (no newline) to *out.
void AppendCriteoLine(const storage::CriteoRawRow& row, std::string* out);

struct CtrGenSummary {
  bool already_existed = false;  // if_missing found the data: nothing done
  int64_t train_rows = 0;
  int64_t test_rows = 0;
  double mean_ctr = 0;  // over train and test labels
  double planted_test_auc = 0;
  double planted_test_logloss = 0;
  double bias = 0;
  uint64_t bytes_written = 0;
};

// Generates the data set of `options` into options.out_dir through `fs`
// (borrowed for the call). InvalidArgument for bad options; the file
// system's error when a write fails (files already published stay, but
// planted.json is written only after the rest succeeded). `summary` may be
// null.
absl::Status GenerateCtrData(const CtrGenOptions& options, storage::FileSystem* fs,
                             CtrGenSummary* summary = nullptr);

// strata-gen-ctr's command line (without the program name): --out_dir DIR
// (required) [--train_rows N] [--test_rows N] [--seed N] [--zipf S]
// [--weight_scale W] [--dense_weight_scale W] [--categorical_missing_rate R]
// [--dense_missing_rate R] [--target_ctr C] [--if_missing[=true|false]], as
// "--flag value" or "--flag=value". InvalidArgument naming the bad flag,
// including options that fail ValidateCtrGenOptions.
absl::StatusOr<CtrGenOptions> ParseCtrGenFlags(const std::vector<std::string>& args);
extern const char kCtrGenUsage[];

// `strata-gen-ctr --config JOB.yaml`: the flags equivalent to the job's
// data.generate section (docs/config.md), with --if_missing: an empty list
// when the config has no such section (nothing to generate). The config's
// errors name its file, line and key.
absl::StatusOr<std::vector<std::string>> CtrGenFlagsFromConfig(const std::string& path);

}  // namespace strata::tools

#endif  // STRATA_TOOLS_CTR_GEN_H_
