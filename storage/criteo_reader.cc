#include "storage/criteo_reader.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "storage/idx_reader.h"

namespace strata::storage {
namespace {

// Bad lines logged one by one under BadLinePolicy::kSkip; the rest are only
// counted.
constexpr int kMaxLoggedBadLines = 5;
// Offending field text longer than this is cut in error messages.
constexpr size_t kMaxQuotedBytes = 40;
constexpr int kMaxHexDigits = 16;

// The splitmix64 finalizer (see the header: part of the key formula).
constexpr uint64_t Fmix(uint64_t z) { return Fmix64(z); }

bool StartsWithGzipMagic(const std::string& bytes) {
  return bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x1f &&
         static_cast<unsigned char>(bytes[1]) == 0x8b;
}

// `s` quoted and C-escaped for an error message, cut after kMaxQuotedBytes.
std::string Quote(absl::string_view s) {
  if (s.size() <= kMaxQuotedBytes) return absl::StrCat("\"", absl::CHexEscape(s), "\"");
  return absl::StrCat("\"", absl::CHexEscape(s.substr(0, kMaxQuotedBytes)), "\"... (", s.size(),
                      " bytes)");
}

// A decimal int64 with an optional leading '-'; no spaces, no '+'.
bool ParseInt64(absl::string_view s, int64_t* out) {
  size_t i = 0;
  const bool negative = !s.empty() && s[0] == '-';
  if (negative) i = 1;
  if (i == s.size()) return false;
  // Magnitude limit: 2^63 - 1, or 2^63 for a negative number.
  const uint64_t limit = static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) + negative;
  uint64_t v = 0;
  for (; i < s.size(); ++i) {
    const unsigned d = static_cast<unsigned char>(s[i]) - '0';
    if (d > 9) return false;
    if (v > (limit - d) / 10) return false;  // v * 10 + d > limit
    v = v * 10 + d;
  }
  *out = negative ? static_cast<int64_t>(0 - v) : static_cast<int64_t>(v);
  return true;
}

// 1 to 16 hex digits, either case.
bool ParseHex64(absl::string_view s, uint64_t* out) {
  if (s.empty() || s.size() > kMaxHexDigits) return false;
  uint64_t v = 0;
  for (char c : s) {
    unsigned d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    } else {
      return false;
    }
    v = (v << 4) | d;
  }
  *out = v;
  return true;
}

// Reads `path`, gunzipping it when it starts with the gzip magic.
absl::StatusOr<std::string> ReadMaybeGzipped(FileSystem* fs, const std::string& path) {
  absl::StatusOr<std::string> bytes = fs->ReadFile(path);
  if (bytes.ok() && StartsWithGzipMagic(*bytes)) return Gunzip(*bytes, path);
  return bytes;
}

// Calls fn(line_number, line) for each non-empty line of `text` (a line
// holding only '\r' counts as empty) until fn returns false. Line numbers
// are 1-based and count the empty lines.
template <typename Fn>
void ForEachNonEmptyLine(absl::string_view text, Fn fn) {
  const char* data = text.data();
  const size_t size = text.size();
  size_t pos = 0;
  int64_t line_number = 0;
  while (pos < size) {
    const void* nl = std::memchr(data + pos, '\n', size - pos);
    const size_t end = nl != nullptr ? static_cast<const char*>(nl) - data : size;
    absl::string_view line(data + pos, end - pos);
    pos = end + 1;
    ++line_number;
    if (line.empty() || line == "\r") continue;
    if (!fn(line_number, line)) return;
  }
}

}  // namespace

float CriteoDenseTransform(int64_t x) {
  if (x == 0) return 0.0f;
  const float magnitude = static_cast<float>(std::log1p(std::fabs(static_cast<double>(x))));
  return x < 0 ? -magnitude : magnitude;
}

uint64_t CriteoFeatureKey(int field, uint64_t value) {
  DCHECK(field >= 0 && field < kCriteoCategorical) << field;
  return Fmix(value ^ (static_cast<uint64_t>(field + 1) << 56));
}

uint64_t CriteoMissingKey(int field) {
  DCHECK(field >= 0 && field < kCriteoCategorical) << field;
  return Fmix(static_cast<uint64_t>(0x80 | (field + 1)) << 56);
}

absl::Status ParseCriteoRow(absl::string_view line, CriteoRawRow* row) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);

  // Split on tabs without allocating; count the fields past the 40th only
  // for the message.
  absl::string_view fields[kCriteoFields];
  int num_fields = 0;
  size_t start = 0;
  while (true) {
    const size_t tab = line.find('\t', start);
    const size_t end = tab == absl::string_view::npos ? line.size() : tab;
    if (num_fields < kCriteoFields) {
      fields[num_fields] = line.substr(start, end - start);
    }
    ++num_fields;
    if (tab == absl::string_view::npos) break;
    start = tab + 1;
  }
  if (num_fields != kCriteoFields) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected ", kCriteoFields, " tab-separated fields, found ", num_fields));
  }

  if (fields[0] == "0" || fields[0] == "1") {
    row->label = fields[0][0] - '0';
  } else {
    return absl::InvalidArgumentError(absl::StrCat("label must be 0 or 1, got ", Quote(fields[0])));
  }
  for (int j = 0; j < kCriteoDense; ++j) {
    const absl::string_view f = fields[1 + j];
    row->dense_present[j] = !f.empty();
    row->dense[j] = 0;
    if (f.empty()) continue;
    if (!ParseInt64(f, &row->dense[j])) {
      return absl::InvalidArgumentError(
          absl::StrCat("field I", j + 1, " (column ", j + 2, "): bad integer ", Quote(f)));
    }
  }
  for (int c = 0; c < kCriteoCategorical; ++c) {
    const absl::string_view f = fields[1 + kCriteoDense + c];
    row->categorical_present[c] = !f.empty();
    row->categorical[c] = 0;
    if (f.empty()) continue;
    if (!ParseHex64(f, &row->categorical[c])) {
      return absl::InvalidArgumentError(
          absl::StrCat("field C", c + 1, " (column ", c + 2 + kCriteoDense, "): bad hex ", Quote(f),
                       f.size() > kMaxHexDigits ? " (more than 16 digits)" : ""));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseCriteoLine(absl::string_view line, float* label, float* dense, uint64_t* keys) {
  CriteoRawRow row;
  STRATA_RETURN_IF_ERROR(ParseCriteoRow(line, &row));
  *label = static_cast<float>(row.label);
  for (int j = 0; j < kCriteoDense; ++j) {
    dense[j] = row.dense_present[j] ? CriteoDenseTransform(row.dense[j]) : 0.0f;
  }
  for (int c = 0; c < kCriteoCategorical; ++c) {
    keys[c] =
        row.categorical_present[c] ? CriteoFeatureKey(c, row.categorical[c]) : CriteoMissingKey(c);
  }
  return absl::OkStatus();
}

namespace {

// Parses the non-empty lines of text[from, end) into *data under `options`,
// stats counted into *stats. `where(line_number, offset)` names a line in
// messages ("path:LINE" or "path at byte N"): its 1-based number within the
// text and its offset in it. Returns the kFail error, if any.
template <typename Where>
absl::Status ParseLines(const std::string& text, size_t from, const CriteoReadOptions& options,
                        Where where, CtrDataset* data, CriteoReadStats* stats) {
  // One reservation: the number of lines bounds the number of records.
  int64_t capacity = std::count(text.begin() + from, text.end(), '\n') + 1;
  if (options.limit > 0) capacity = std::min(capacity, options.limit);
  data->labels.reserve(capacity);
  data->dense.reserve(capacity * kCriteoDense);
  data->keys.reserve(capacity * kCriteoCategorical);
  const absl::string_view all(text);
  absl::Status error;  // set under kFail
  ForEachNonEmptyLine(all.substr(from), [&](int64_t line_number, absl::string_view line) {
    ++stats->lines;
    const size_t n = data->labels.size();
    data->labels.push_back(0);
    data->dense.resize((n + 1) * kCriteoDense);
    data->keys.resize((n + 1) * kCriteoCategorical);
    absl::Status s;
    if (options.max_line_bytes > 0 && line.size() > options.max_line_bytes) {
      s = absl::InvalidArgumentError(
          absl::StrCat("line longer than ", options.max_line_bytes, " bytes (", line.size(), ")"));
    } else {
      s = ParseCriteoLine(line, &data->labels[n], &data->dense[n * kCriteoDense],
                          &data->keys[n * kCriteoCategorical]);
    }
    if (s.ok()) {
      ++stats->records;
      return options.limit == 0 || stats->records < options.limit;
    }
    data->labels.resize(n);
    data->dense.resize(n * kCriteoDense);
    data->keys.resize(n * kCriteoCategorical);
    std::string what = absl::StrCat(
        where(line_number, static_cast<size_t>(line.data() - all.data())), ": ", s.message());
    if (options.bad_lines == BadLinePolicy::kFail) {
      error = absl::InvalidArgumentError(std::move(what));
      return false;
    }
    ++stats->skipped;
    if (stats->skipped <= kMaxLoggedBadLines) {
      LOG(WARNING) << what << " (skipping the line)";
    }
    if (stats->first_error.empty()) stats->first_error = std::move(what);
    return true;
  });
  data->num_examples = stats->records;
  return error;
}

}  // namespace

absl::StatusOr<CtrDataset> LoadCriteoFile(FileSystem* fs, const std::string& path,
                                          const CriteoReadOptions& options,
                                          CriteoReadStats* stats) {
  CriteoReadStats local_stats;
  if (stats == nullptr) stats = &local_stats;
  *stats = CriteoReadStats();
  if (options.limit < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("criteo ", path, ": limit must be >= 0, got ", options.limit));
  }
  STRATA_ASSIGN_OR_RETURN(const std::string text, ReadMaybeGzipped(fs, path));
  CtrDataset data;
  STRATA_RETURN_IF_ERROR(ParseLines(
      text, 0, options,
      [&path](int64_t line_number, size_t) { return absl::StrCat(path, ":", line_number); }, &data,
      stats));
  if (stats->skipped > kMaxLoggedBadLines) {
    LOG(WARNING) << "criteo " << path << ": skipped " << stats->skipped << " bad lines of "
                 << stats->lines << " (first " << kMaxLoggedBadLines << " logged above)";
  }
  if (stats->records == 0) {
    return absl::InvalidArgumentError(
        stats->lines == 0 ? absl::StrCat("criteo ", path, ": no records (empty file)")
                          : absl::StrCat("criteo ", path, ": no valid record in ", stats->lines,
                                         " lines; first error: ", stats->first_error));
  }
  return data;
}

absl::StatusOr<CriteoTextShape> ProbeCriteoFile(FileSystem* fs, const std::string& path,
                                                const CriteoReadOptions& options,
                                                uint64_t sample_bytes) {
  CriteoTextShape shape;
  STRATA_ASSIGN_OR_RETURN(shape.file_bytes, fs->FileSize(path));
  if (shape.file_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat("criteo ", path, ": no records (empty file)"));
  }
  STRATA_ASSIGN_OR_RETURN(std::string sample,
                          fs->ReadFileRange(path, 0, std::max<uint64_t>(sample_bytes, 2)));
  if (StartsWithGzipMagic(sample)) {
    shape.gzipped = true;
    return shape;
  }
  // Whole lines only: the last one may be cut by the sample's end.
  if (sample.size() < shape.file_bytes) {
    const size_t nl = sample.rfind('\n');
    if (nl == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("criteo ", path, ": no line ends within its first ", sample.size(),
                       " bytes (is it a text file of Criteo lines?)"));
    }
    sample.resize(nl + 1);
  }
  shape.sample_bytes = sample.size();
  CriteoReadOptions first = options;
  first.limit = 0;
  CriteoReadStats stats;
  CtrDataset parsed;
  STRATA_RETURN_IF_ERROR(ParseLines(
      sample, 0, first,
      [&path](int64_t line_number, size_t) { return absl::StrCat(path, ":", line_number); },
      &parsed, &stats));
  if (stats.records == 0) {
    return absl::InvalidArgumentError(
        stats.lines == 0
            ? absl::StrCat("criteo ", path, ": no records in its first ", sample.size(), " bytes")
            : absl::StrCat("criteo ", path, ": no valid record in its first ", stats.lines,
                           " lines; first error: ", stats.first_error));
  }
  shape.bytes_per_record = static_cast<double>(sample.size()) / stats.lines;
  return shape;
}

absl::StatusOr<CtrDataset> LoadCriteoRange(FileSystem* fs, const std::string& path, uint64_t begin,
                                           uint64_t end, const CriteoReadOptions& options,
                                           CriteoReadStats* stats) {
  CriteoReadStats local_stats;
  if (stats == nullptr) stats = &local_stats;
  *stats = CriteoReadStats();
  CtrDataset data;
  if (begin >= end) return data;
  // From the byte before `begin`: a line starts in the range when the byte
  // before it is a '\n' (or it is the file's first).
  const uint64_t start = begin > 0 ? begin - 1 : 0;
  STRATA_ASSIGN_OR_RETURN(std::string text, fs->ReadFileRange(path, start, end - start));
  if (start == 0 && StartsWithGzipMagic(text)) {
    return absl::InvalidArgumentError(
        absl::StrCat("criteo ", path, " is gzipped: it cannot be read by byte ranges"));
  }
  size_t from = 0;
  if (begin > 0) {
    const size_t nl = text.find('\n');
    if (nl == std::string::npos) return data;  // inside a line that started before
    from = nl + 1;
  }
  // The last line started before `end` is this range's too: read on to its
  // '\n' (or the end of the file), in growing steps, no further than a
  // line may be long.
  if (text.size() == end - start && from < text.size() && text.back() != '\n') {
    const size_t last_start = [&] {
      const size_t nl = text.rfind('\n');
      return nl == std::string::npos || nl < from ? from : nl + 1;
    }();
    uint64_t pos = end;
    uint64_t step = 64 << 10;
    for (;;) {
      STRATA_ASSIGN_OR_RETURN(std::string more, fs->ReadFileRange(path, pos, step));
      if (more.empty()) break;  // the end of the file
      const size_t nl = more.find('\n');
      if (nl != std::string::npos) {
        text.append(more, 0, nl + 1);
        break;
      }
      text += more;
      pos += more.size();
      if (options.max_line_bytes > 0 && text.size() - last_start > options.max_line_bytes + 1) {
        break;  // too long already: a bad line whatever follows
      }
      step = std::min<uint64_t>(step * 2, 8 << 20);
    }
  }
  CriteoReadOptions all_lines = options;
  all_lines.limit = 0;
  STRATA_RETURN_IF_ERROR(ParseLines(
      text, from, all_lines,
      [&path, start](int64_t, size_t offset) {
        return absl::StrCat(path, " (the line at byte ", start + offset, ")");
      },
      &data, stats));
  return data;
}

absl::StatusOr<int64_t> CountCriteoLines(FileSystem* fs, const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(const std::string text, ReadMaybeGzipped(fs, path));
  int64_t records = 0;
  ForEachNonEmptyLine(text, [&](int64_t, absl::string_view) {
    ++records;
    return true;
  });
  return records;
}

}  // namespace strata::storage
