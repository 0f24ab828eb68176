#include "storage/checkpoint_export.h"

#include <cmath>
#include <cstring>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "storage/checkpoint_format.h"

namespace strata::storage {
namespace {

uint32_t BitsOf(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
float FloatOf(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

std::string Base(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// The state a partition's chain of files restores, values only.
struct PartitionValues {
  proto::CheckpointPartitionHeader header;  // of the last file
  std::vector<float> dense;
  std::map<uint64_t, std::vector<float>> rows;
};

absl::StatusOr<PartitionValues> ReadValues(FileSystem* fs, const std::string& root,
                                           const proto::CheckpointPartition& p) {
  PartitionValues out;
  for (const proto::CheckpointFile& f : p.files()) {
    const std::string path = JoinPath(root, f.path());
    STRATA_ASSIGN_OR_RETURN(auto streams, ReadBlockFile(fs, path, &f));
    proto::CheckpointPartitionHeader& h = out.header;
    if (!h.ParseFromString(streams[BlockType::kHeader])) {
      return absl::DataLossError(absl::StrCat(path, ": partition header does not parse"));
    }
    if (!h.sparse()) {
      const std::string& v = streams[BlockType::kDenseValues];
      out.dense.resize(v.size() / sizeof(float));
      // memcpy to an empty vector's data() (null) is undefined, even for 0 bytes.
      if (!out.dense.empty()) {
        std::memcpy(out.dense.data(), v.data(), out.dense.size() * sizeof(float));
      }
      continue;
    }
    const std::string& del = streams[BlockType::kSparseDeletes];
    for (size_t i = 0; i + 8 <= del.size(); i += 8) {
      uint64_t key;
      std::memcpy(&key, del.data() + i, 8);
      out.rows.erase(key);
    }
    // A record: key, two u32 counters, then the values.
    const size_t stride = h.row_bytes();
    if (stride < 16 + sizeof(float) * h.dim()) {
      return absl::DataLossError(
          absl::StrCat(path, ": ", stride, "-byte rows cannot hold ", h.dim(), " values"));
    }
    const std::string& recs = streams[BlockType::kSparseRows];
    for (size_t i = 0; i + stride <= recs.size(); i += stride) {
      uint64_t key;
      std::memcpy(&key, recs.data() + i, 8);
      std::vector<float>& row = out.rows[key];
      row.resize(h.dim());
      if (!row.empty()) std::memcpy(row.data(), recs.data() + i + 16, sizeof(float) * h.dim());
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<Precision> ParsePrecision(const std::string& name) {
  if (name == "bf16") return Precision::kBf16;
  if (name == "fp16") return Precision::kFp16;
  return absl::InvalidArgumentError(absl::StrCat("precision '", name, "': expected bf16 or fp16"));
}

uint16_t FloatToBf16(float f) {
  const uint32_t b = BitsOf(f);
  if (std::isnan(f)) return static_cast<uint16_t>((b >> 16) | 0x40);  // stays a (quiet) NaN
  const uint32_t rounded = b + 0x7fff + ((b >> 16) & 1);
  return static_cast<uint16_t>(rounded >> 16);
}

float Bf16ToFloat(uint16_t h) { return FloatOf(static_cast<uint32_t>(h) << 16); }

uint16_t FloatToFp16(float f) {
  const uint32_t x = BitsOf(f);
  const uint32_t sign = (x >> 16) & 0x8000;
  const int exp = static_cast<int>((x >> 23) & 0xff);
  uint32_t mant = x & 0x7fffff;
  if (exp == 255) return static_cast<uint16_t>(sign | 0x7c00 | (mant != 0 ? 0x200 : 0));
  const int e = exp - 127 + 15;
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7c00);  // too large: infinity
  if (e <= 0) {
    if (e < -10) return static_cast<uint16_t>(sign);  // below half the smallest subnormal
    mant |= 0x800000;
    const int shift = 14 - e;
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;  // a carry may reach infinity
  return static_cast<uint16_t>(half);
}

float Fp16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return FloatOf(sign | 0x7f800000 | (mant << 13));
  return FloatOf(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

absl::StatusOr<proto::CheckpointManifest> ExportCheckpoint(FileSystem* fs,
                                                           const std::string& src_dir,
                                                           const std::string& dst_dir,
                                                           Precision precision, int zstd_level) {
  STRATA_ASSIGN_OR_RETURN(proto::CheckpointManifest m, ReadManifest(fs, src_dir));
  if (!m.precision().empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        JoinPath(src_dir, kManifestName), ": already an inference export (", m.precision(), ")"));
  }
  const std::string src_root = ParentDir(src_dir);
  const std::string dst_name = Base(dst_dir);
  STRATA_RETURN_IF_ERROR(CheckManifestFiles(fs, src_root, m));
  STRATA_RETURN_IF_ERROR(fs->CreateDirs(dst_dir));
  STRATA_RETURN_IF_ERROR(fs->SyncDir(ParentDir(dst_dir)));
  auto convert = [precision](float v) {
    return precision == Precision::kBf16 ? FloatToBf16(v) : FloatToFp16(v);
  };
  proto::CheckpointManifest out = m;
  out.clear_partitions();
  out.set_precision(precision == Precision::kBf16 ? "bf16" : "fp16");
  out.set_incremental(false);
  out.set_base_seq(0);
  out.set_reason(absl::StrCat("export of ", Base(src_dir)));
  uint64_t written = 0;
  for (const proto::CheckpointPartition& p : m.partitions()) {
    STRATA_ASSIGN_OR_RETURN(PartitionValues values, ReadValues(fs, src_root, p));
    proto::CheckpointPartitionHeader h = values.header;
    h.set_full(true);
    h.set_optimizer("");
    h.clear_last_seq();
    std::string payload;
    if (h.sparse()) {
      h.set_row_bytes(static_cast<uint32_t>(8 + 2 * h.dim()));
      h.set_rows(values.rows.size());
      for (const auto& [key, row] : values.rows) {
        payload.append(reinterpret_cast<const char*>(&key), 8);
        for (float v : row) {
          const uint16_t x = convert(v);
          payload.append(reinterpret_cast<const char*>(&x), 2);
        }
      }
    } else {
      for (float v : values.dense) {
        const uint16_t x = convert(v);
        payload.append(reinterpret_cast<const char*>(&x), 2);
      }
    }
    const std::string rel = absl::StrFormat("%s/p%05d.blk", dst_name, p.id());
    STRATA_ASSIGN_OR_RETURN(auto w,
                            BlockFileWriter::Create(fs, JoinPath(dst_dir, Base(rel)), zstd_level));
    STRATA_RETURN_IF_ERROR(w->Add(BlockType::kHeader, h.SerializeAsString()));
    STRATA_RETURN_IF_ERROR(
        w->Add(h.sparse() ? BlockType::kSparseRows16 : BlockType::kDenseValues16, payload));
    STRATA_ASSIGN_OR_RETURN(BlockFileInfo info, w->Finish());
    written += info.size;
    proto::CheckpointPartition* e = out.add_partitions();
    *e = p;
    e->clear_files();
    e->set_rows(h.sparse() ? values.rows.size() : 0);
    proto::CheckpointFile* f = e->add_files();
    f->set_path(rel);
    f->set_size(info.size);
    f->set_crc32c(info.crc32c);
    f->set_seq(m.seq());
    f->set_full(true);
    f->set_raw_bytes(info.raw_bytes);
  }
  out.set_bytes_written(written);
  STRATA_RETURN_IF_ERROR(fs->SyncDir(dst_dir));
  STRATA_RETURN_IF_ERROR(WriteManifest(fs, dst_dir, out));
  return out;
}

}  // namespace strata::storage
