// Fuzz target: the Criteo reader (storage/criteo_reader.h). The input is a
// data file, plain or gzipped. Each of its lines goes through
// ParseCriteoRow and ParseCriteoLine; the whole file through
// LoadCriteoFile (both bad-line policies), ProbeCriteoFile,
// CountCriteoLines and LoadCriteoRange over a byte range picked from the
// input's hash, all through an in-memory file system. Whatever the bytes,
// the answer is a Status, and what is read agrees with itself.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "glog/logging.h"
#include "storage/criteo_reader.h"
#include "storage/file_system.h"
#include "tests/fuzz/fuzz_support.h"

namespace strata::storage {
namespace {

void CheckShape(const CtrDataset& d) {
  CHECK_EQ(d.labels.size(), static_cast<size_t>(d.num_examples));
  CHECK_EQ(d.dense.size(), static_cast<size_t>(d.num_examples) * kCriteoDense);
  CHECK_EQ(d.keys.size(), static_cast<size_t>(d.num_examples) * kCriteoCategorical);
  for (float label : d.labels) CHECK(label == 0.0f || label == 1.0f);
}

void Run(const std::string& bytes, uint64_t hash) {
  // Line by line.
  absl::string_view rest(bytes);
  while (!rest.empty()) {
    const size_t nl = rest.find('\n');
    const absl::string_view line = rest.substr(0, nl);
    rest.remove_prefix(nl == absl::string_view::npos ? rest.size() : nl + 1);
    CriteoRawRow row;
    const bool row_ok = ParseCriteoRow(line, &row).ok();
    float label = -1;
    float dense[kCriteoDense];
    uint64_t keys[kCriteoCategorical];
    CHECK_EQ(ParseCriteoLine(line, &label, dense, keys).ok(), row_ok);
    if (row_ok) CHECK(row.label == 0 || row.label == 1);
  }

  // The whole file.
  std::unique_ptr<FileSystem> fs = NewMemoryFileSystem();
  const std::string path = "data/train.txt";
  CHECK(fs->WriteFileAtomic(path, bytes).ok());
  CriteoReadOptions options;
  options.max_line_bytes = (hash & 1) ? 0 : 1 + (hash >> 1) % 1024;
  options.limit = (hash >> 12) % 4;
  for (BadLinePolicy policy : {BadLinePolicy::kFail, BadLinePolicy::kSkip}) {
    options.bad_lines = policy;
    CriteoReadStats stats;
    absl::StatusOr<CtrDataset> d = LoadCriteoFile(fs.get(), path, options, &stats);
    // Every line examined is a record or skipped, but for the one that
    // failed the read under kFail.
    const bool failed_on_a_line = policy == BadLinePolicy::kFail && !d.ok() && stats.lines > 0 &&
                                  stats.lines != stats.records;
    CHECK_EQ(stats.lines, stats.records + stats.skipped + (failed_on_a_line ? 1 : 0));
    if (!d.ok()) continue;
    CheckShape(*d);
    CHECK_EQ(d->num_examples, stats.records);
    if (options.limit > 0) CHECK_LE(d->num_examples, options.limit);
  }
  absl::StatusOr<int64_t> count = CountCriteoLines(fs.get(), path);
  (void)count;
  absl::StatusOr<CriteoTextShape> shape =
      ProbeCriteoFile(fs.get(), path, options, 1 + (hash >> 24) % 512);
  if (shape.ok()) CHECK_EQ(shape->file_bytes, bytes.size());

  // A byte range, as a worker reads its task of a plain-text file.
  const uint64_t begin = (hash >> 32) % (bytes.size() + 1);
  const uint64_t end = begin + (hash >> 48) % (bytes.size() + 2 - begin);
  CriteoReadStats stats;
  absl::StatusOr<CtrDataset> range = LoadCriteoRange(fs.get(), path, begin, end, options, &stats);
  if (range.ok()) CheckShape(*range);
}

}  // namespace
}  // namespace strata::storage

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  strata::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  strata::storage::Run(strata::fuzz::AsString(data, size), strata::fuzz::InputHash(data, size));
  return 0;
}
