// Reader for IDX files (the MNIST / Fashion-MNIST format), plain or gzipped.
// Format: magic 0x00 0x00 <type> <ndims>, then ndims big-endian uint32
// dimensions, then the data, row-major. Only type 0x08 (unsigned byte) is
// used by these datasets and supported.
#ifndef STRATA_STORAGE_IDX_READER_H_
#define STRATA_STORAGE_IDX_READER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "storage/file_system.h"

namespace strata::storage {

struct IdxArray {
  std::vector<uint32_t> dims;
  std::vector<uint8_t> data;  // product(dims) bytes
};

// Inflates gzip data (RFC 1952). DataLoss naming `name` when corrupt or
// truncated.
absl::StatusOr<std::string> Gunzip(const std::string& bytes, const std::string& name);

// Parses IDX bytes, gunzipping first when they start with the gzip magic.
// Errors are DataLoss/InvalidArgument naming `name` and what is wrong
// (bad magic, unsupported type, size mismatch).
absl::StatusOr<IdxArray> ParseIdx(const std::string& bytes, const std::string& name);
absl::StatusOr<IdxArray> ReadIdxFile(FileSystem* fs, const std::string& path);

// The dimensions of an IDX file from its header and its size, without
// reading it whole (the master sizes the data tasks with it, also on a
// shared file system or an object store): the first bytes (inflated when
// gzipped) and, for gzip, the trailer's uncompressed size. DataLoss naming
// the file when its size does not fit its header (truncated); the errors
// of ParseIdx otherwise. A gzip file of several members is read whole.
absl::StatusOr<std::vector<uint32_t>> ReadIdxShape(FileSystem* fs, const std::string& path);

// Images as float features scaled to [0, 1], labels as int32.
struct LabeledDataset {
  int64_t num_examples = 0;
  int feature_dim = 0;          // e.g. 784
  std::vector<float> features;  // num_examples * feature_dim
  std::vector<int32_t> labels;  // num_examples
};

// Loads an images file (N x rows x cols) and a labels file (N). Keeps the
// first `limit` examples when limit > 0. InvalidArgument when the counts do
// not match, naming both files.
absl::StatusOr<LabeledDataset> LoadIdxDataset(FileSystem* fs, const std::string& images_path,
                                              const std::string& labels_path, int64_t limit = 0);

}  // namespace strata::storage

#endif  // STRATA_STORAGE_IDX_READER_H_
