// Fuzz target: the IDX dataset reader (storage/idx_reader.h). The input is an
// IDX file, plain or gzipped. It is parsed whole (ParseIdx, Gunzip), its
// shape probed the way the master does (ReadIdxShape, through an in-memory
// file system), and, when it holds images, loaded as a dataset with labels
// that fit it (LoadIdxDataset). Whatever the bytes, the answer is a Status,
// and the shape probe agrees with the full parse.
//
// Work per input is bounded by scripts/fuzz.sh's -max_len: gzip inflates at
// most about 1000 times, so a 4 KiB input yields at most about 4 MiB.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "glog/logging.h"
#include "storage/file_system.h"
#include "storage/idx_reader.h"
#include "tests/fuzz/fuzz_support.h"

namespace strata::storage {
namespace {

// An IDX file of unsigned bytes with these dimensions and data.
std::string IdxFile(const std::vector<uint32_t>& dims, const std::string& data) {
  std::string out = {0, 0, 0x08, static_cast<char>(dims.size())};
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>(d >> shift));
  }
  return out + data;
}

void Run(const std::string& bytes) {
  absl::StatusOr<IdxArray> parsed = ParseIdx(bytes, "fuzz.idx");
  if (bytes.size() >= 2 && bytes[0] == '\x1f' && bytes[1] == '\x8b') {
    (void)Gunzip(bytes, "fuzz.idx.gz");
  }
  if (parsed.ok()) {
    uint64_t product = 1;
    for (uint32_t d : parsed->dims) product *= d;
    CHECK_EQ(product, parsed->data.size());
  }

  std::unique_ptr<FileSystem> fs = NewMemoryFileSystem();
  CHECK(fs->WriteFileAtomic("data/images", bytes).ok());
  absl::StatusOr<std::vector<uint32_t>> shape = ReadIdxShape(fs.get(), "data/images");
  // The probe reads less than the parse; when both succeed they agree.
  if (parsed.ok() && shape.ok()) CHECK(*shape == parsed->dims);
  if (parsed.ok()) CHECK(shape.ok()) << shape.status();

  if (!parsed.ok() || parsed->dims.size() != 3) return;
  // Labels for as many examples as the images file holds (bounded: an
  // N x 0 x 0 file holds up to 2^32 - 1 empty images in no bytes).
  const uint32_t n = parsed->dims[0];
  if (n > (1u << 16)) return;
  std::string labels(n, '\0');
  for (uint32_t i = 0; i < n; ++i) labels[i] = static_cast<char>(i % 10);
  CHECK(fs->WriteFileAtomic("data/labels", IdxFile({n}, labels)).ok());
  for (int64_t limit : {int64_t{0}, int64_t{1}, int64_t{n} + 1}) {
    absl::StatusOr<LabeledDataset> d =
        LoadIdxDataset(fs.get(), "data/images", "data/labels", limit);
    if (!d.ok()) continue;
    CHECK_EQ(d->features.size(), static_cast<size_t>(d->num_examples) * d->feature_dim);
    CHECK_EQ(d->labels.size(), static_cast<size_t>(d->num_examples));
  }
  // Labels that do not fit: one example more.
  CHECK(fs->WriteFileAtomic("data/labels", IdxFile({n + 1}, labels + '\0')).ok());
  CHECK(!LoadIdxDataset(fs.get(), "data/images", "data/labels").ok());
}

}  // namespace
}  // namespace strata::storage

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  strata::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  strata::storage::Run(strata::fuzz::AsString(data, size));
  return 0;
}
