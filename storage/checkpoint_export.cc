#include "storage/checkpoint_export.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "storage/checkpoint_format.h"
#include "storage/ring_checkpoint.h"

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
    STRATA_RETURN_IF_ERROR(ParseHeaderBlock(streams, BlockType::kHeader, path, &h));
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

// A table kept by allreduce: its place in the manifest's tables and its
// floats' in the ring's flat space.
struct RingTable {
  int index = 0;
  uint64_t begin = 0;
  uint64_t floats = 0;
};

// The manifest's allreduce tables in order (the flat space is theirs one
// after another); DataLoss when their shapes do not add up to ring_floats.
absl::StatusOr<std::vector<RingTable>> RingTablesOf(const std::string& dir,
                                                    const proto::CheckpointManifest& m) {
  std::vector<RingTable> out;
  uint64_t at = 0;
  for (int i = 0; i < m.tables_size(); ++i) {
    const proto::CheckpointTable& t = m.tables(i);
    if (!t.allreduce()) continue;
    uint64_t n = 1;
    for (uint64_t d : t.shape()) {
      if (d != 0 && n > m.ring_floats() / d) {
        return absl::DataLossError(absl::StrCat(JoinPath(dir, kManifestName), ": table '", t.name(),
                                                "' is larger than the ring's ", m.ring_floats(),
                                                " floats"));
      }
      n *= d;
    }
    out.push_back(RingTable{i, at, n});
    at += n;
  }
  if (at != m.ring_floats()) {
    return absl::DataLossError(absl::StrCat(JoinPath(dir, kManifestName),
                                            ": its allreduce tables hold ", at,
                                            " floats, its ring shards ", m.ring_floats()));
  }
  return out;
}

// Writes one file of an export, `rel` (under the export's root, whose
// directory `dst_dir` is): the partition header `h` and the 16-bit
// `payload` (a sparse partition's rows, else dense values). Returns it for
// the manifest (as of checkpoint `seq`), and adds its size to *written.
absl::StatusOr<proto::CheckpointFile> WriteExportFile(FileSystem* fs, const std::string& dst_dir,
                                                      const std::string& rel,
                                                      const proto::CheckpointPartitionHeader& h,
                                                      const std::string& payload, uint64_t seq,
                                                      int zstd_level, uint64_t* written) {
  STRATA_ASSIGN_OR_RETURN(auto w,
                          BlockFileWriter::Create(fs, JoinPath(dst_dir, Base(rel)), zstd_level));
  STRATA_RETURN_IF_ERROR(w->Add(BlockType::kHeader, h.SerializeAsString()));
  STRATA_RETURN_IF_ERROR(
      w->Add(h.sparse() ? BlockType::kSparseRows16 : BlockType::kDenseValues16, payload));
  STRATA_ASSIGN_OR_RETURN(BlockFileInfo info, w->Finish());
  *written += info.size;
  proto::CheckpointFile f;
  f.set_path(rel);
  f.set_size(info.size);
  f.set_crc32c(info.crc32c);
  f.set_seq(seq);
  f.set_full(true);
  f.set_raw_bytes(info.raw_bytes);
  return f;
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
    STRATA_ASSIGN_OR_RETURN(
        proto::CheckpointFile f,
        WriteExportFile(fs, dst_dir, absl::StrFormat("%s/p%05d.blk", dst_name, p.id()), h, payload,
                        m.seq(), zstd_level, &written));
    proto::CheckpointPartition* e = out.add_partitions();
    *e = p;
    e->clear_files();
    e->set_rows(h.sparse() ? values.rows.size() : 0);
    *e->add_files() = std::move(f);
  }
  if (m.ring_shards_size() > 0) {
    // The tables kept by allreduce among the workers: their parameters put
    // together from the ring's shards, one dense partition each in the
    // export (numbered after the pservers'), so that it reads as any other.
    STRATA_ASSIGN_OR_RETURN(const std::vector<RingTable> tables, RingTablesOf(src_dir, m));
    const std::vector<proto::CheckpointRingShard> shards(m.ring_shards().begin(),
                                                         m.ring_shards().end());
    STRATA_ASSIGN_OR_RETURN(RingState ring, ReadRingState(fs, src_root, shards, m.ring_floats(),
                                                          m.job(), m.optimizer()));
    uint32_t id = 0;
    for (const proto::CheckpointPartition& p : m.partitions()) id = std::max(id, p.id() + 1);
    out.clear_ring_shards();
    out.set_ring_floats(0);
    for (const RingTable& t : tables) {
      proto::CheckpointPartitionHeader h;
      h.set_format_version(kCheckpointFormatVersion);
      h.set_job(m.job());
      h.set_seq(m.seq());
      h.set_id(id);
      h.set_table(m.tables(t.index).name());
      h.set_length(t.floats);
      h.set_version(ring.updates);
      h.set_full(true);
      std::string payload;
      payload.reserve(t.floats * 2);
      for (uint64_t i = t.begin; i < t.begin + t.floats; ++i) {
        const uint16_t x = convert(ring.values[i]);
        payload.append(reinterpret_cast<const char*>(&x), 2);
      }
      STRATA_ASSIGN_OR_RETURN(
          proto::CheckpointFile f,
          WriteExportFile(fs, dst_dir, absl::StrFormat("%s/p%05d.blk", dst_name, id), h, payload,
                          m.seq(), zstd_level, &written));
      out.mutable_tables(t.index)->set_partitions(1);
      proto::CheckpointPartition* e = out.add_partitions();
      e->set_id(id);
      e->set_table(h.table());
      e->set_table_id(static_cast<uint32_t>(t.index));
      e->set_offset(0);
      e->set_length(t.floats);
      e->set_version(h.version());
      e->set_raw_bytes(f.raw_bytes());
      *e->add_files() = std::move(f);
      ++id;
    }
  }
  out.set_bytes_written(written);
  STRATA_RETURN_IF_ERROR(fs->SyncDir(dst_dir));
  STRATA_RETURN_IF_ERROR(WriteManifest(fs, dst_dir, out));
  return out;
}

}  // namespace strata::storage
