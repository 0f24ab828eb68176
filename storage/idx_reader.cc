#include "storage/idx_reader.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace strata::storage {
namespace {

constexpr unsigned char kGzipMagic0 = 0x1f;
constexpr unsigned char kGzipMagic1 = 0x8b;
constexpr uint8_t kTypeUnsignedByte = 0x08;
constexpr int kMaxDims = 4;

bool StartsWithGzipMagic(const std::string& bytes, size_t pos = 0) {
  return bytes.size() >= pos + 2 && static_cast<unsigned char>(bytes[pos]) == kGzipMagic0 &&
         static_cast<unsigned char>(bytes[pos + 1]) == kGzipMagic1;
}

uint32_t ReadBigEndian32(const std::string& bytes, size_t pos) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data() + pos);
  return (static_cast<uint32_t>(p[0]) << 24) | (static_cast<uint32_t>(p[1]) << 16) |
         (static_cast<uint32_t>(p[2]) << 8) | static_cast<uint32_t>(p[3]);
}

std::string DimsToString(const std::vector<uint32_t>& dims) {
  std::string out;
  for (size_t i = 0; i < dims.size(); ++i) {
    absl::StrAppend(&out, i == 0 ? "" : " x ", dims[i]);
  }
  return out;
}

// Owns a z_stream set up for gzip decoding; ends it on destruction.
class GzipInflater {
 public:
  GzipInflater() { std::memset(&stream_, 0, sizeof(stream_)); }
  ~GzipInflater() {
    if (initialized_) inflateEnd(&stream_);
  }
  GzipInflater(const GzipInflater&) = delete;
  GzipInflater& operator=(const GzipInflater&) = delete;

  int Init() {
    int rc = inflateInit2(&stream_, 16 + MAX_WBITS);  // gzip wrapper only
    initialized_ = rc == Z_OK;
    return rc;
  }
  z_stream* stream() { return &stream_; }

 private:
  z_stream stream_;
  bool initialized_ = false;
};

}  // namespace

absl::StatusOr<std::string> Gunzip(const std::string& bytes, const std::string& name) {
  GzipInflater inflater;
  if (int rc = inflater.Init(); rc != Z_OK) {
    return absl::InternalError(absl::StrCat("gunzip ", name, ": inflateInit2 failed (", rc, ")"));
  }
  z_stream* zs = inflater.stream();
  std::string out;
  out.reserve(bytes.size() * 4);
  char buf[1 << 16];
  size_t consumed = 0;  // input bytes handed to zlib so far
  zs->avail_in = 0;
  bool member_done = false;
  while (true) {
    if (zs->avail_in == 0 && consumed < bytes.size()) {
      // uInt is 32 bits: hand the input over in chunks.
      size_t chunk = std::min<size_t>(bytes.size() - consumed, std::numeric_limits<uInt>::max());
      zs->next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data() + consumed));
      zs->avail_in = static_cast<uInt>(chunk);
      consumed += chunk;
    }
    zs->next_out = reinterpret_cast<Bytef*>(buf);
    zs->avail_out = sizeof(buf);
    int rc = inflate(zs, Z_NO_FLUSH);
    out.append(buf, sizeof(buf) - zs->avail_out);
    if (rc == Z_STREAM_END) {
      // RFC 1952 allows concatenated members; anything else after the end
      // is garbage.
      size_t pos = consumed - zs->avail_in;
      if (pos == bytes.size()) {
        member_done = true;
        break;
      }
      if (!StartsWithGzipMagic(bytes, pos)) {
        return absl::DataLossError(
            absl::StrCat("gunzip ", name, ": ", bytes.size() - pos,
                         " bytes of trailing garbage after the gzip stream"));
      }
      inflateReset(zs);
      continue;
    }
    if (rc == Z_OK) continue;
    if (rc == Z_BUF_ERROR && zs->avail_in == 0) {
      if (consumed == bytes.size()) break;  // input ended inside a member
      continue;                             // refill the input
    }
    return absl::DataLossError(absl::StrCat("gunzip ", name, ": corrupt gzip data (",
                                            zs->msg != nullptr ? zs->msg : zError(rc), ")"));
  }
  if (!member_done) {
    return absl::DataLossError(absl::StrCat("gunzip ", name, ": truncated gzip data (",
                                            bytes.size(),
                                            " compressed bytes end before the stream does)"));
  }
  return out;
}

absl::StatusOr<IdxArray> ParseIdx(const std::string& bytes, const std::string& name) {
  if (StartsWithGzipMagic(bytes)) {
    STRATA_ASSIGN_OR_RETURN(std::string raw, Gunzip(bytes, name));
    return ParseIdx(raw, name);
  }
  if (bytes.size() < 4) {
    return absl::DataLossError(
        absl::StrCat("idx ", name, ": ", bytes.size(), " bytes, too short for the header"));
  }
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  if (p[0] != 0 || p[1] != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("idx %s: bad magic 0x%02x 0x%02x, want 0x00 0x00", name, p[0], p[1]));
  }
  if (p[2] != kTypeUnsignedByte) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "idx %s: unsupported data type 0x%02x (only 0x08, unsigned byte)", name, p[2]));
  }
  const int ndims = p[3];
  if (ndims < 1 || ndims > kMaxDims) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "idx %s: unsupported number of dimensions %d (want 1..%d)", name, ndims, kMaxDims));
  }
  const size_t header_size = 4 + 4 * static_cast<size_t>(ndims);
  if (bytes.size() < header_size) {
    return absl::DataLossError(absl::StrCat("idx ", name, ": ", bytes.size(),
                                            " bytes, too short for the ", header_size,
                                            "-byte header of ", ndims, " dimensions"));
  }

  IdxArray array;
  array.dims.reserve(ndims);
  uint64_t expected = 1;
  bool overflow = false;
  for (int i = 0; i < ndims; ++i) {
    uint32_t dim = ReadBigEndian32(bytes, 4 + 4 * i);
    array.dims.push_back(dim);
    if (dim != 0 && expected > std::numeric_limits<uint64_t>::max() / dim) {
      overflow = true;
    }
    expected *= dim;
  }
  const uint64_t actual = bytes.size() - header_size;
  if (overflow) {
    return absl::DataLossError(absl::StrCat("idx ", name, ": dimensions ", DimsToString(array.dims),
                                            " overflow; file has ", actual, " data bytes"));
  }
  if (actual != expected) {
    return absl::DataLossError(
        absl::StrCat("idx ", name, ": dimensions ", DimsToString(array.dims), " need ", expected,
                     " data bytes but the file has ", actual,
                     actual < expected ? " (truncated)" : " (trailing bytes)"));
  }
  array.data.assign(bytes.begin() + header_size, bytes.end());
  return array;
}

absl::StatusOr<IdxArray> ReadIdxFile(FileSystem* fs, const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(std::string bytes, fs->ReadFile(path));
  return ParseIdx(bytes, path);
}

absl::StatusOr<LabeledDataset> LoadIdxDataset(FileSystem* fs, const std::string& images_path,
                                              const std::string& labels_path, int64_t limit) {
  STRATA_ASSIGN_OR_RETURN(IdxArray images, ReadIdxFile(fs, images_path));
  STRATA_ASSIGN_OR_RETURN(IdxArray labels, ReadIdxFile(fs, labels_path));
  if (images.dims.size() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("idx ", images_path, ": images must have 3 dimensions ",
                     "(N x rows x cols), got ", DimsToString(images.dims)));
  }
  if (labels.dims.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("idx ", labels_path,
                                                   ": labels must have 1 dimension ", "(N), got ",
                                                   DimsToString(labels.dims)));
  }
  if (images.dims[0] != labels.dims[0]) {
    return absl::InvalidArgumentError(absl::StrCat("idx: ", images_path, " has ", images.dims[0],
                                                   " images but ", labels_path, " has ",
                                                   labels.dims[0], " labels"));
  }
  const uint64_t feature_dim = static_cast<uint64_t>(images.dims[1]) * images.dims[2];
  if (feature_dim > static_cast<uint64_t>(std::numeric_limits<int>::max())) {
    return absl::InvalidArgumentError(absl::StrCat("idx ", images_path, ": images of ",
                                                   DimsToString(images.dims), " are too large"));
  }

  int64_t n = images.dims[0];
  if (limit > 0) n = std::min(n, limit);
  LabeledDataset dataset;
  dataset.num_examples = n;
  dataset.feature_dim = static_cast<int>(feature_dim);
  const size_t num_values = static_cast<size_t>(n) * feature_dim;
  dataset.features.resize(num_values);
  for (size_t i = 0; i < num_values; ++i) {
    dataset.features[i] = static_cast<float>(images.data[i]) / 255.0f;
  }
  dataset.labels.assign(labels.data.begin(), labels.data.begin() + n);
  return dataset;
}

absl::StatusOr<std::vector<uint32_t>> ReadIdxShape(FileSystem* fs, const std::string& path) {
  constexpr size_t kHead = 64 << 10;
  STRATA_ASSIGN_OR_RETURN(const uint64_t size, fs->FileSize(path));
  absl::StatusOr<std::string> first = fs->ReadFileRange(path, 0, kHead);
  if (!first.ok()) return first.status();
  const std::string& head = *first;
  const bool gzipped = absl::StartsWith(head, "\x1f\x8b");
  std::string raw_head = head;
  if (gzipped) {
    // Inflate only as far as the header (4 + 4 * kMaxDims bytes).
    GzipInflater inflater;
    if (int rc = inflater.Init(); rc != Z_OK) {
      return absl::InternalError(absl::StrCat("gunzip ", path, ": inflateInit2 failed (", rc, ")"));
    }
    z_stream* zs = inflater.stream();
    char buf[4 + 4 * kMaxDims];
    zs->next_in = reinterpret_cast<Bytef*>(const_cast<char*>(head.data()));
    zs->avail_in = static_cast<uInt>(head.size());
    zs->next_out = reinterpret_cast<Bytef*>(buf);
    zs->avail_out = sizeof(buf);
    while (zs->avail_out > 0) {
      const int rc = inflate(zs, Z_NO_FLUSH);
      if (rc == Z_STREAM_END) break;
      if (rc != Z_OK) {
        return absl::DataLossError(absl::StrCat("gunzip ", path, ": corrupt (",
                                                zs->msg ? zs->msg : "inflate failed", ")"));
      }
      if (zs->avail_in == 0) break;
    }
    raw_head.assign(buf, sizeof(buf) - zs->avail_out);
    const size_t need = raw_head.size() >= 4
                            ? 4 + 4 * static_cast<size_t>(static_cast<unsigned char>(raw_head[3]))
                            : 4;
    if (raw_head.size() < need && raw_head.size() < sizeof(buf)) {
      // The first gzip member ends before the header does (several
      // members), or its header fills the bytes read: read it whole.
      STRATA_ASSIGN_OR_RETURN(IdxArray all, ReadIdxFile(fs, path));
      return all.dims;
    }
  }
  // The header alone, as a file of no data: ParseIdx checks it, and the
  // size is checked here against the real file's.
  if (raw_head.size() < 4) {
    return absl::DataLossError(absl::StrCat("idx ", path, ": too short for the header"));
  }
  const size_t header = 4 + 4 * static_cast<size_t>(static_cast<unsigned char>(raw_head[3]));
  std::vector<uint32_t> dims;
  uint64_t data = 1;
  if (raw_head.size() >= header && static_cast<unsigned char>(raw_head[3]) <= kMaxDims) {
    for (size_t i = 4; i + 4 <= header; i += 4) {
      const uint32_t d = ReadBigEndian32(raw_head, i);
      dims.push_back(d);
      data *= d;
    }
  }
  // Let ParseIdx judge the header (magic, type, dimensions) and name what
  // is wrong: it sees the header with its data replaced by nothing.
  std::string probe = raw_head.substr(0, std::min(raw_head.size(), header));
  if (absl::StatusOr<IdxArray> a = ParseIdx(probe, path);
      !a.ok() && !absl::IsDataLoss(a.status())) {
    return a.status();
  }
  if (dims.empty()) {
    return absl::DataLossError(absl::StrCat("idx ", path, ": too short for its header"));
  }
  const uint64_t want = header + data;
  if (!gzipped) {
    if (size != want) {
      return absl::DataLossError(absl::StrCat("idx ", path, ": ", size, " bytes, its header (",
                                              header, " bytes) says ", want, " (truncated?)"));
    }
    return dims;
  }
  // gzip's trailer: the uncompressed size mod 2^32, of the last member.
  if (size < 18) return absl::DataLossError(absl::StrCat("gunzip ", path, ": truncated"));
  STRATA_ASSIGN_OR_RETURN(std::string tail, fs->ReadFileRange(path, size - 4, 4));
  if (tail.size() != 4) return absl::DataLossError(absl::StrCat("gunzip ", path, ": truncated"));
  uint32_t isize = 0;
  for (int i = 3; i >= 0; --i) isize = (isize << 8) | static_cast<unsigned char>(tail[i]);
  if (isize == static_cast<uint32_t>(want)) return dims;
  // Several members, or truncated: only the whole file can tell.
  STRATA_ASSIGN_OR_RETURN(IdxArray all, ReadIdxFile(fs, path));
  return all.dims;
}

}  // namespace strata::storage
