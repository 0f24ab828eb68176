#include "storage/checkpoint_format.h"

#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/crc32c.h"
#include "common/huge_pages.h"
#include "common/status_macros.h"

namespace strata::storage {
namespace {

constexpr char kFileMagic[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'P', 'F'};
constexpr char kManifestMagic[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'M', 'F'};
constexpr size_t kFileHeaderBytes = 16;       // magic, u32 version, u32 zero
constexpr size_t kManifestHeaderBytes = 24;   // magic, u32 version, u32 crc, u64 length
constexpr uint32_t kBlockMagic = 0x4B4C4253;  // "SBLK"
constexpr size_t kBlockHeaderBytes = 20;
constexpr uint8_t kCodecNone = 0, kCodecZstd = 1;
constexpr uint8_t kFilterNone = 0, kFilterShuffle4 = 1;

void PutU32(char* p, uint32_t v) { std::memcpy(p, &v, 4); }
void PutU64(char* p, uint64_t v) { std::memcpy(p, &v, 8); }
uint32_t GetU32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t GetU64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// Byte k of every 4-byte word together: [b0 b0 .. b1 b1 .. b2 .. b3 ..].
// The exponent bytes of floats then sit side by side and compress well.
std::string Shuffle4(absl::string_view in) {
  const size_t words = in.size() / 4;
  std::string out(in.size(), '\0');
  for (size_t k = 0; k < 4; ++k) {
    char* dst = out.data() + k * words;
    for (size_t i = 0; i < words; ++i) dst[i] = in[i * 4 + k];
  }
  std::memcpy(out.data() + words * 4, in.data() + words * 4, in.size() - words * 4);
  return out;
}

// Undoes Shuffle4 into `out` (in.size() bytes).
void Unshuffle4Into(absl::string_view in, char* out) {
  const size_t words = in.size() / 4;
  const char* s0 = in.data();
  const char* s1 = s0 + words;
  const char* s2 = s1 + words;
  const char* s3 = s2 + words;
  for (size_t i = 0; i < words; ++i) {
    out[i * 4] = s0[i];
    out[i * 4 + 1] = s1[i];
    out[i * 4 + 2] = s2[i];
    out[i * 4 + 3] = s3[i];
  }
  std::memcpy(out + words * 4, in.data() + words * 4, in.size() - words * 4);
}

// FailedPrecondition naming `path` unless `version` is the one this build reads.
absl::Status CheckVersion(const std::string& path, uint32_t version) {
  if (version == kCheckpointFormatVersion) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(path, ": checkpoint format version ", version,
                                                    "; this build reads version ",
                                                    kCheckpointFormatVersion));
}

absl::Status Corrupt(const std::string& path, uint64_t offset, absl::string_view what) {
  return absl::DataLossError(absl::StrCat(path, ": ", what, " (at byte ", offset, ")"));
}

}  // namespace

BlockFileWriter::BlockFileWriter(std::string path, std::unique_ptr<WritableFile> file, int level)
    : path_(std::move(path)), file_(std::move(file)), level_(level) {}

absl::StatusOr<std::unique_ptr<BlockFileWriter>> BlockFileWriter::Create(FileSystem* fs,
                                                                         const std::string& path,
                                                                         int zstd_level) {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> f, fs->NewWritableFile(path));
  std::unique_ptr<BlockFileWriter> w(new BlockFileWriter(path, std::move(f), zstd_level));
  char header[kFileHeaderBytes] = {};
  std::memcpy(header, kFileMagic, 8);
  PutU32(header + 8, kCheckpointFormatVersion);
  STRATA_RETURN_IF_ERROR(w->Write(absl::string_view(header, sizeof(header))));
  return w;
}

absl::Status BlockFileWriter::Write(absl::string_view bytes) {
  STRATA_RETURN_IF_ERROR(file_->Append(bytes));
  info_.size += bytes.size();
  info_.crc32c = Crc32cExtend(info_.crc32c, bytes.data(), bytes.size());
  return absl::OkStatus();
}

absl::Status BlockFileWriter::Add(BlockType type, absl::string_view payload, bool shuffle4) {
  do {
    const absl::string_view raw = payload.substr(0, kMaxBlockBytes);
    payload.remove_prefix(raw.size());
    info_.raw_bytes += raw.size();
    std::string filtered;
    absl::string_view input = raw;
    uint8_t filter = kFilterNone;
    if (shuffle4 && raw.size() >= 4) {
      filtered = Shuffle4(raw);
      input = filtered;
      filter = kFilterShuffle4;
    }
    uint8_t codec = kCodecNone;
    absl::string_view stored = input;
    if (level_ > 0 && !input.empty()) {
      scratch_.resize(ZSTD_compressBound(input.size()));
      const size_t n =
          ZSTD_compress(scratch_.data(), scratch_.size(), input.data(), input.size(), level_);
      if (ZSTD_isError(n)) {
        return absl::InternalError(
            absl::StrCat("zstd compress for ", path_, ": ", ZSTD_getErrorName(n)));
      }
      if (n < input.size()) {  // else stored as is
        codec = kCodecZstd;
        stored = absl::string_view(scratch_.data(), n);
      }
    }
    char h[kBlockHeaderBytes];
    PutU32(h, kBlockMagic);
    h[4] = static_cast<char>(type);
    h[5] = static_cast<char>(codec);
    h[6] = static_cast<char>(filter);
    h[7] = 0;
    PutU32(h + 8, static_cast<uint32_t>(raw.size()));
    PutU32(h + 12, static_cast<uint32_t>(stored.size()));
    uint32_t crc = Crc32cExtend(0, h, 16);
    crc = Crc32cExtend(crc, stored.data(), stored.size());
    PutU32(h + 16, crc);
    STRATA_RETURN_IF_ERROR(Write(absl::string_view(h, sizeof(h))));
    STRATA_RETURN_IF_ERROR(Write(stored));
  } while (!payload.empty());
  return absl::OkStatus();
}

absl::StatusOr<BlockFileInfo> BlockFileWriter::Finish() {
  STRATA_RETURN_IF_ERROR(file_->Sync());
  STRATA_RETURN_IF_ERROR(file_->Close());
  return info_;
}

absl::StatusOr<std::map<BlockType, std::string>> ReadBlockFile(
    FileSystem* fs, const std::string& path, const proto::CheckpointFile* expected) {
  STRATA_ASSIGN_OR_RETURN(std::string data, fs->ReadFile(path));
  if (expected != nullptr) {
    if (data.size() != expected->size()) {
      return absl::DataLossError(absl::StrCat(path, ": ", data.size(), " bytes, the manifest says ",
                                              expected->size(), " (truncated or replaced)"));
    }
    const uint32_t crc = Crc32c(data);
    if (crc != expected->crc32c()) {
      return absl::DataLossError(
          absl::StrFormat("%s: checksum 0x%08x, the manifest says 0x%08x (corrupt)", path, crc,
                          expected->crc32c()));
    }
  }
  if (data.size() < kFileHeaderBytes || std::memcmp(data.data(), kFileMagic, 8) != 0) {
    return Corrupt(path, 0, "not a Strata checkpoint partition file (bad magic)");
  }
  STRATA_RETURN_IF_ERROR(CheckVersion(path, GetU32(data.data() + 8)));
  // Two passes: the blocks are checked and each stream's size summed, then
  // every block is decoded straight into its stream, sized once (a growing
  // string would copy a large stream several times over, and page-fault
  // on each new buffer).
  struct Block {
    size_t pos;
    BlockType type;
    uint8_t codec, filter;
    uint32_t raw_size, stored_size;
  };
  std::vector<Block> blocks;
  std::map<BlockType, size_t> sizes;
  uint64_t raw_total = 0;
  size_t pos = kFileHeaderBytes;
  for (int block = 0; pos < data.size(); ++block) {
    if (data.size() - pos < kBlockHeaderBytes) {
      return Corrupt(path, pos, absl::StrCat("block ", block, ": header cut short (torn write)"));
    }
    const char* h = data.data() + pos;
    if (GetU32(h) != kBlockMagic)
      return Corrupt(path, pos, absl::StrCat("block ", block, ": bad magic"));
    const uint32_t raw_size = GetU32(h + 8);
    const uint32_t stored_size = GetU32(h + 12);
    if (data.size() - pos - kBlockHeaderBytes < stored_size) {
      return Corrupt(path, pos,
                     absl::StrCat("block ", block, ": ", stored_size,
                                  " bytes of payload, the file ends first (torn write)"));
    }
    // With `expected`, the whole file's checksum matched already: a block's
    // own would only read the same bytes again.
    uint32_t crc = GetU32(h + 16);
    if (expected == nullptr) {
      crc = Crc32cExtend(0, h, 16);
      crc = Crc32cExtend(crc, h + kBlockHeaderBytes, stored_size);
    }
    if (crc != GetU32(h + 16)) {
      return Corrupt(path, pos,
                     absl::StrFormat("block %d: checksum mismatch (stored 0x%08x, "
                                     "computed 0x%08x)",
                                     block, GetU32(h + 16), crc));
    }
    const uint8_t codec = static_cast<uint8_t>(h[5]);
    const uint8_t filter = static_cast<uint8_t>(h[6]);
    if (h[4] < 1 || h[4] > kMaxBlockType || codec > kCodecZstd || filter > kFilterShuffle4 ||
        raw_size > kMaxBlockBytes) {
      return Corrupt(path, pos, absl::StrCat("block ", block, ": unknown type, codec or size"));
    }
    if (codec != kCodecZstd && stored_size != raw_size) {
      return Corrupt(path, pos, absl::StrCat("block ", block, ": stored size differs"));
    }
    if (codec == kCodecZstd &&
        ZSTD_getFrameContentSize(h + kBlockHeaderBytes, stored_size) != raw_size) {
      return Corrupt(
          path, pos,
          absl::StrCat("block ", block, ": its zstd frame does not hold ", raw_size, " bytes"));
    }
    const auto type = static_cast<BlockType>(h[4]);
    blocks.push_back(Block{pos, type, codec, filter, raw_size, stored_size});
    sizes[type] += raw_size;
    raw_total += raw_size;
    pos += kBlockHeaderBytes + stored_size;
  }
  // Nothing is allocated for more than the manifest says the file holds
  // (a crafted file's blocks could claim 1 MiB each from a few bytes).
  if (expected != nullptr && expected->raw_bytes() != 0 && raw_total != expected->raw_bytes()) {
    return absl::DataLossError(absl::StrCat(path, ": its blocks hold ", raw_total,
                                            " bytes, the manifest says ", expected->raw_bytes()));
  }
  std::map<BlockType, std::string> streams;
  std::map<BlockType, size_t> filled;
  for (const auto& [type, size] : sizes) ResizeLargeString(&streams[type], size);
  std::string scratch;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const Block& b = blocks[i];
    const char* stored = data.data() + b.pos + kBlockHeaderBytes;
    char* dst = streams[b.type].data() + filled[b.type];
    filled[b.type] += b.raw_size;
    // A shuffled block is decoded into scratch, then unshuffled into place.
    char* out = b.filter == kFilterShuffle4 ? (scratch.resize(b.raw_size), scratch.data()) : dst;
    if (b.codec == kCodecZstd) {
      const size_t n = ZSTD_decompress(out, b.raw_size, stored, b.stored_size);
      if (ZSTD_isError(n) || n != b.raw_size) {
        return Corrupt(
            path, b.pos,
            absl::StrCat("block ", i, ": zstd: ",
                         ZSTD_isError(n) ? ZSTD_getErrorName(n) : "wrong decompressed size"));
      }
    } else {
      std::memcpy(out, stored, b.raw_size);
    }
    if (b.filter == kFilterShuffle4) Unshuffle4Into(absl::string_view(out, b.raw_size), dst);
  }
  if (streams.count(BlockType::kHeader) == 0 && streams.count(BlockType::kRingHeader) == 0) {
    return Corrupt(path, kFileHeaderBytes, "no header block");
  }
  return streams;
}

absl::Status ParseHeaderBlock(const std::map<BlockType, std::string>& streams, BlockType type,
                              const std::string& path, google::protobuf::MessageLite* header) {
  const bool ring = type == BlockType::kRingHeader;
  const char* what = ring ? "ring shard" : "partition";
  auto it = streams.find(type);
  if (it == streams.end()) {
    return absl::DataLossError(absl::StrCat(
        path, ": no ", what, " header block (stream ", static_cast<int>(type), "); the file is a ",
        ring ? "partition's" : "ring shard's", " or not a checkpoint file"));
  }
  if (!header->ParseFromString(it->second)) {
    return absl::DataLossError(absl::StrCat(path, ": ", what, " header does not parse"));
  }
  return absl::OkStatus();
}

std::string CheckpointDirName(uint64_t seq) { return absl::StrFormat("ckpt-%08d", seq); }

uint64_t CheckpointSeqOfName(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, "ckpt-") || name.empty()) return 0;
  for (char c : name) {
    if (c < '0' || c > '9') return 0;
  }
  uint64_t seq = 0;
  return absl::SimpleAtoi(name, &seq) ? seq : 0;
}

std::string EncodeManifest(const proto::CheckpointManifest& manifest) {
  const std::string body = manifest.SerializeAsString();
  std::string out(kManifestHeaderBytes, '\0');
  std::memcpy(out.data(), kManifestMagic, 8);
  PutU32(out.data() + 8, kCheckpointFormatVersion);
  PutU32(out.data() + 12, Crc32c(body));
  PutU64(out.data() + 16, body.size());
  return out + body;
}

absl::Status WriteManifest(FileSystem* fs, const std::string& dir,
                           const proto::CheckpointManifest& manifest) {
  return fs->WriteFileAtomic(JoinPath(dir, kManifestName), EncodeManifest(manifest));
}

bool IsPathUnderRoot(absl::string_view path) {
  if (path.empty() || path.front() == '/' || path.find('\0') != absl::string_view::npos) {
    return false;
  }
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part.empty() || part == "." || part == "..") return false;
  }
  return true;
}

absl::StatusOr<proto::CheckpointManifest> ReadManifest(FileSystem* fs, const std::string& dir) {
  const std::string path = JoinPath(dir, kManifestName);
  STRATA_ASSIGN_OR_RETURN(std::string data, fs->ReadFile(path));
  if (data.size() < kManifestHeaderBytes || std::memcmp(data.data(), kManifestMagic, 8) != 0) {
    return Corrupt(path, 0, "not a Strata checkpoint manifest (bad magic or cut short)");
  }
  STRATA_RETURN_IF_ERROR(CheckVersion(path, GetU32(data.data() + 8)));
  const uint64_t length = GetU64(data.data() + 16);
  if (data.size() - kManifestHeaderBytes != length) {
    return Corrupt(path, kManifestHeaderBytes,
                   absl::StrCat("body of ", data.size() - kManifestHeaderBytes,
                                " bytes, the header says ", length));
  }
  const absl::string_view body(data.data() + kManifestHeaderBytes, length);
  const uint32_t crc = Crc32c(body);
  if (crc != GetU32(data.data() + 12)) {
    return Corrupt(path, kManifestHeaderBytes,
                   absl::StrFormat("checksum mismatch (stored 0x%08x, computed 0x%08x)",
                                   GetU32(data.data() + 12), crc));
  }
  proto::CheckpointManifest m;
  if (!m.ParseFromArray(body.data(), static_cast<int>(body.size()))) {
    return Corrupt(path, kManifestHeaderBytes, "body does not parse");
  }
  STRATA_RETURN_IF_ERROR(CheckVersion(path, m.format_version()));
  // A partition's files are named by its id: two entries of one id would
  // be restored into one partition and exported to one file.
  std::set<uint32_t> ids;
  for (const proto::CheckpointPartition& p : m.partitions()) {
    if (!ids.insert(p.id()).second) {
      return Corrupt(path, kManifestHeaderBytes,
                     absl::StrCat("partition ", p.id(), " listed twice"));
    }
    // Files are read (and exported, and removed by retention) under the
    // checkpoint root: a path must stay there.
    for (const proto::CheckpointFile& f : p.files()) {
      if (!IsPathUnderRoot(f.path())) {
        return Corrupt(path, kManifestHeaderBytes,
                       absl::StrCat("partition ", p.id(), ": file path \"", absl::CEscape(f.path()),
                                    "\" is not a relative path under the checkpoint root"));
      }
    }
  }
  for (const proto::CheckpointRingShard& r : m.ring_shards()) {
    if (!IsPathUnderRoot(r.file().path())) {
      return Corrupt(
          path, kManifestHeaderBytes,
          absl::StrCat("ring shard ", r.rank(), ": file path \"", absl::CEscape(r.file().path()),
                       "\" is not a relative path under the checkpoint root"));
    }
  }
  return m;
}

absl::StatusOr<std::vector<CheckpointEntry>> ListCheckpoints(FileSystem* fs,
                                                             const std::string& root) {
  std::vector<CheckpointEntry> out;
  // Only "not there" means no checkpoints: any other error (an object
  // store answering 503, a key refused) is returned, never taken for an
  // empty root, or a resumed job would start afresh and write over the
  // checkpoints it could not see.
  absl::StatusOr<std::vector<std::string>> names = fs->ListDir(root);
  if (absl::IsNotFound(names.status())) return out;
  if (!names.ok()) return names.status();
  for (const std::string& name : *names) {
    const uint64_t seq = CheckpointSeqOfName(name);
    if (seq == 0) continue;
    const std::string dir = JoinPath(root, name);
    absl::StatusOr<uint64_t> manifest = fs->FileSize(JoinPath(dir, kManifestName));
    if (manifest.ok()) {
      out.push_back({seq, dir, true});
      continue;
    }
    if (!fs->IsDirectory(dir)) continue;  // a stray file of that name
    if (!absl::IsNotFound(manifest.status())) return manifest.status();
    out.push_back({seq, dir, false});
  }
  std::sort(out.begin(), out.end(),
            [](const CheckpointEntry& a, const CheckpointEntry& b) { return a.seq < b.seq; });
  return out;
}

absl::Status CheckManifestFiles(FileSystem* fs, const std::string& root,
                                const proto::CheckpointManifest& manifest) {
  std::vector<const proto::CheckpointFile*> files;
  for (const auto& r : manifest.ring_shards()) files.push_back(&r.file());
  for (const auto& p : manifest.partitions()) {
    for (const auto& f : p.files()) files.push_back(&f);
  }
  for (const proto::CheckpointFile* f : files) {
    const std::string path = JoinPath(root, f->path());
    auto size = fs->FileSize(path);
    if (!size.ok()) {
      return absl::DataLossError(absl::StrCat(path, ": missing (", size.status().message(), ")"));
    }
    if (*size != f->size()) {
      return absl::DataLossError(absl::StrCat(path, ": ", *size, " bytes, the manifest says ",
                                              f->size(), " (truncated or replaced)"));
    }
  }
  for (const auto& p : manifest.partitions()) {
    if (p.files().empty() || !p.files(0).full()) {
      return absl::DataLossError(
          absl::StrCat(JoinPath(CheckpointDirName(manifest.seq()), kManifestName), ": partition ",
                       p.id(), " has no full image to start from"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> ApplyRetention(FileSystem* fs, const std::string& root,
                                                        int keep_last) {
  STRATA_ASSIGN_OR_RETURN(std::vector<CheckpointEntry> all, ListCheckpoints(fs, root));
  // Newest first: the complete ones to keep, and the checkpoints they need.
  std::set<uint64_t> needed;
  uint64_t newest_complete = 0;
  int kept = 0;
  for (auto it = all.rbegin(); it != all.rend() && kept < std::max(keep_last, 1); ++it) {
    if (!it->complete) continue;
    auto m = ReadManifest(fs, it->dir);
    if (!m.ok()) {
      // A torn, corrupt or foreign-version manifest makes no checkpoint: it
      // neither counts nor protects. Any other error (I/O, permissions)
      // stops retention: nothing is deleted on a guess.
      if (absl::IsDataLoss(m.status()) || absl::IsFailedPrecondition(m.status()) ||
          absl::IsNotFound(m.status())) {
        continue;
      }
      return m.status();
    }
    if (newest_complete == 0) newest_complete = it->seq;
    ++kept;
    needed.insert(it->seq);
    for (const auto& p : m->partitions()) {
      for (const auto& f : p.files()) needed.insert(f.seq());
    }
  }
  std::vector<std::string> deleted;
  for (const CheckpointEntry& e : all) {
    if (e.seq >= newest_complete || needed.count(e.seq) > 0) continue;
    // The manifest goes first: a half-deleted checkpoint no longer exists.
    if (e.complete) STRATA_RETURN_IF_ERROR(fs->DeleteFile(JoinPath(e.dir, kManifestName)));
    STRATA_RETURN_IF_ERROR(fs->DeleteRecursively(e.dir));
    deleted.push_back(e.dir);
  }
  return deleted;
}

}  // namespace strata::storage
