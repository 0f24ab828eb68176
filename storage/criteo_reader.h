// Reader for the Criteo display-advertising text format (the Kaggle / Criteo
// 1TB click logs), plain or gzipped.
//
// Format: one example per line, '\n'-terminated (a '\r' before it is
// tolerated), exactly 40 TAB-separated fields:
//   column 1       label: "0" or "1"
//   columns 2-14   I1..I13: decimal integers, may be negative; empty = missing
//   columns 15-40  C1..C26: categorical values as 1 to 16 hex digits (usually
//                  8), upper or lower case; empty = missing
// Empty lines (and the empty "line" after a final newline) are not records.
//
// Every consumer of this data (this reader, the generator in tools/ctr_gen.h,
// the models) turns a row into features the same way:
//   - an integer x becomes CriteoDenseTransform(x) = sign(x) * log1p(|x|),
//     a missing one 0;
//   - categorical field f with value v becomes the 64-bit feature key
//     CriteoFeatureKey(f, v), a missing one CriteoMissingKey(f).
//
// All functions are thread-safe (no shared state); FileSystem access is
// through the caller's `fs`, borrowed for the call only.
#ifndef STRATA_STORAGE_CRITEO_READER_H_
#define STRATA_STORAGE_CRITEO_READER_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/file_system.h"

namespace strata::storage {

inline constexpr int kCriteoDense = 13;
inline constexpr int kCriteoCategorical = 26;
inline constexpr int kCriteoFields = 1 + kCriteoDense + kCriteoCategorical;

enum class BadLinePolicy {
  kSkip,  // count the line, log the first few, go on
  kFail,  // stop with InvalidArgument "path:LINE: <what>"
};

struct CriteoReadOptions {
  BadLinePolicy bad_lines = BadLinePolicy::kFail;
  // A line (without its '\n') longer than this is a bad line. 0 = no limit.
  size_t max_line_bytes = 65536;
  // Keep the first `limit` records and stop reading there; 0 = all.
  int64_t limit = 0;
};

struct CriteoReadStats {
  int64_t lines = 0;    // non-empty lines examined
  int64_t records = 0;  // lines kept as records
  int64_t skipped = 0;  // bad lines skipped (BadLinePolicy::kSkip)
  // "path:LINE: <what>" of the first skipped line; empty when none.
  std::string first_error;
};

// sign(x) * log1p(|x|), as a float; 0 maps to 0, as does a missing value.
float CriteoDenseTransform(int64_t x);

// The feature key of categorical field `field` (0..25 for C1..C26) holding
// hex value `value`:
//   CriteoFeatureKey(f, v) = Fmix(v XOR ((f + 1) << 56))
//   CriteoMissingKey(f)    = Fmix((0x80 | (f + 1)) << 56)
// where Fmix is the splitmix64 finalizer, a bijection on 64 bits:
//   z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9;
//   z = (z ^ (z >> 27)) * 0x94d049bb133111eb;
//   z =  z ^ (z >> 31).
// So keys are distinct for distinct (field, value) pairs, and distinct from
// every field's missing key, whenever values are below 2^56 (14 hex digits);
// the same value in two fields gives two different keys.
// Models and checkpoints are keyed by these numbers: this formula must never
// change (criteo_reader_test pins golden values).
// REQUIRES: 0 <= field < kCriteoCategorical.
uint64_t CriteoFeatureKey(int field, uint64_t value);
uint64_t CriteoMissingKey(int field);

// One row as written, before the feature transform.
struct CriteoRawRow {
  int label = 0;                              // 0 or 1
  std::array<int64_t, kCriteoDense> dense{};  // 0 when missing
  std::array<bool, kCriteoDense> dense_present{};
  std::array<uint64_t, kCriteoCategorical> categorical{};  // 0 when missing
  std::array<bool, kCriteoCategorical> categorical_present{};
};

// Parses one line (without its '\n'; a trailing '\r' is ignored).
// InvalidArgument naming the field and the offending text, e.g.
//   expected 40 tab-separated fields, found 39
//   label must be 0 or 1, got "2"
//   field I4 (column 5): bad integer "1x"
//   field C3 (column 17): bad hex "zz"
// but not the file or line number: the caller prefixes "path:LINE: ".
absl::Status ParseCriteoRow(absl::string_view line, CriteoRawRow* row);

// ParseCriteoRow followed by the feature transform: writes the label,
// kCriteoDense transformed integers to dense[0..12] and kCriteoCategorical
// feature keys to keys[0..25]. Same errors; the outputs are unspecified
// after an error.
absl::Status ParseCriteoLine(absl::string_view line, float* label, float* dense, uint64_t* keys);

// A whole file in feature form, row-major.
struct CtrDataset {
  int64_t num_examples = 0;
  std::vector<float> labels;   // num_examples, 0 or 1
  std::vector<float> dense;    // num_examples * kCriteoDense, transformed
  std::vector<uint64_t> keys;  // num_examples * kCriteoCategorical
};

// Reads `path` through `fs` (gunzipping when it starts with the gzip magic)
// and parses every non-empty line. Bad lines (unparsable, or longer than
// options.max_line_bytes) under BadLinePolicy::kFail end the read with
// InvalidArgument "path:LINE: <what>" (LINE 1-based, counting empty lines);
// under kSkip they are counted in the stats, the first few logged with
// LOG(WARNING). InvalidArgument naming the path when no valid record is
// left; the file system's error when it cannot be read, DataLoss when the
// gzip data is corrupt. `stats` may be null; when given it is filled in
// also on error, as far as the read got.
absl::StatusOr<CtrDataset> LoadCriteoFile(FileSystem* fs, const std::string& path,
                                          const CriteoReadOptions& options, CriteoReadStats* stats);

// What a master needs to cut a plain-text training file into byte ranges
// without reading it whole.
struct CriteoTextShape {
  uint64_t file_bytes = 0;
  // Gzipped files cannot be cut by bytes (their records are counted).
  bool gzipped = false;
  // Mean bytes per non-empty line in the first `sample_bytes` (whole lines):
  // an estimate for progress and task sizes. 0 when gzipped.
  double bytes_per_record = 0;
  uint64_t sample_bytes = 0;
};

// Reads the size of `path` and at most `sample_bytes` from its start, and
// parses the whole lines there under `options` (limit ignored): so a
// missing, empty or non-Criteo file is an error at once, naming it (and
// "path:LINE" under kFail). Does not check the gzipped case further.
absl::StatusOr<CriteoTextShape> ProbeCriteoFile(FileSystem* fs, const std::string& path,
                                                const CriteoReadOptions& options,
                                                uint64_t sample_bytes = 1 << 20);

// The records of plain-text `path` whose lines START in bytes [begin, end):
// the line running across `begin` belongs to the range before, the one
// running across `end` to this one (read on to its '\n'). So ranges that
// tile the file read every line exactly once, whatever the cut points.
// Reads only about the range (ReadFileRange: pread, or a ranged GET).
// Errors as LoadCriteoFile's, but a line is named "path (the line at byte
// N)"; no records is not an error here. InvalidArgument for a gzipped file.
// options.limit is ignored.
absl::StatusOr<CtrDataset> LoadCriteoRange(FileSystem* fs, const std::string& path, uint64_t begin,
                                           uint64_t end, const CriteoReadOptions& options,
                                           CriteoReadStats* stats);

// The number of records (non-empty lines) in `path`, plain or gzipped,
// without parsing them: lets a master split the data into tasks.
absl::StatusOr<int64_t> CountCriteoLines(FileSystem* fs, const std::string& path);

}  // namespace strata::storage

#endif  // STRATA_STORAGE_CRITEO_READER_H_
