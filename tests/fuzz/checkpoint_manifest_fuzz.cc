// Fuzz target: the checkpoint manifest reader (storage/checkpoint_format.h,
// docs/checkpoint-format.md) and what reads a checkpoint through its
// manifest. The input is a MANIFEST file. It is put in checkpoint 2 of an
// in-memory checkpoint root that also holds the partition files of
// checkpoint_seed.h, and read with ReadManifest twice: as it is, and with
// its header's length and crc32c made to fit its body (so that mutations
// of the body reach the proto parser, not only the checksum). A manifest
// that reads is then used as a resumed job and an export would use it:
// CheckManifestFiles, ExportCheckpoint (which reads the files it names),
// ListCheckpoints and ApplyRetention. Whatever the bytes, each answers with
// a Status, and an export that succeeds reads back.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/crc32c.h"
#include "glog/logging.h"
#include "proto/checkpoint.pb.h"
#include "storage/checkpoint_export.h"
#include "storage/checkpoint_format.h"
#include "storage/file_system.h"
#include "tests/fuzz/checkpoint_seed.h"
#include "tests/fuzz/fuzz_support.h"

namespace strata::storage {
namespace {

constexpr char kRoot[] = "root";
constexpr char kDir[] = "root/ckpt-00000002";
constexpr size_t kManifestHeaderBytes = 24;  // magic, version, crc32c, length

const std::map<std::string, std::string>* seed_files = nullptr;

// `bytes` with the header's crc32c and length set to fit the body.
std::string FitHeader(std::string bytes) {
  const uint32_t crc = Crc32c(absl::string_view(bytes).substr(kManifestHeaderBytes));
  const uint64_t length = bytes.size() - kManifestHeaderBytes;
  std::memcpy(bytes.data() + 12, &crc, 4);
  std::memcpy(bytes.data() + 16, &length, 8);
  return bytes;
}

void Use(FileSystem* fs, const proto::CheckpointManifest& m, uint64_t hash) {
  (void)CheckManifestFiles(fs, kRoot, m);
  const Precision precision = hash % 2 ? Precision::kBf16 : Precision::kFp16;
  absl::StatusOr<proto::CheckpointManifest> exported =
      ExportCheckpoint(fs, kDir, "exports/e1", precision, /*zstd_level=*/(hash >> 1) % 2);
  if (exported.ok()) {
    absl::StatusOr<proto::CheckpointManifest> back = ReadManifest(fs, "exports/e1");
    CHECK(back.ok()) << back.status();
    CHECK_EQ(back->precision(), precision == Precision::kBf16 ? "bf16" : "fp16");
    CHECK(CheckManifestFiles(fs, "exports", *back).ok());
  }
  (void)ListCheckpoints(fs, kRoot);
  (void)ApplyRetention(fs, kRoot, 1 + static_cast<int>((hash >> 2) % 2));
}

void Run(const std::string& bytes, uint64_t hash) {
  std::unique_ptr<FileSystem> fs = NewMemoryFileSystem();
  for (const auto& [rel, content] : *seed_files) {
    CHECK(fs->WriteFileAtomic(JoinPath(kRoot, rel), content).ok());
  }
  const std::string path = JoinPath(kDir, kManifestName);
  CHECK(fs->WriteFileAtomic(path, bytes).ok());
  absl::StatusOr<proto::CheckpointManifest> m = ReadManifest(fs.get(), kDir);
  if (!m.ok() && bytes.size() >= kManifestHeaderBytes) {
    CHECK(fs->WriteFileAtomic(path, FitHeader(bytes)).ok());
    m = ReadManifest(fs.get(), kDir);
  }
  if (m.ok()) Use(fs.get(), *m, hash);
}

}  // namespace
}  // namespace strata::storage

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  strata::fuzz::QuietLogs();
  strata::storage::seed_files =
      new std::map<std::string, std::string>(strata::fuzz::SeedPartitionFiles());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  strata::storage::Run(strata::fuzz::AsString(data, size), strata::fuzz::InputHash(data, size));
  return 0;
}
