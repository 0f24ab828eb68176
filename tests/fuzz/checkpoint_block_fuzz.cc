// Fuzz target: the checkpoint partition file reader (ReadBlockFile,
// storage/checkpoint_format.h, docs/checkpoint-format.md) and the restore
// path behind it. The input is a partition file. It is read from an
// in-memory file system twice: as it is, and with every block's crc32c
// made to fit (so that mutations reach the size checks, zstd and the
// shuffle filter, not only the checksum). A file whose header block parses
// is then restored as a pserver restores it (LoadPartition into a
// partition made to fit the header, which checks it against the
// manifest's size and crc32c first), checkpointed again and restored once
// more; and exported (ExportCheckpoint through a manifest naming it).
//
// A file whose header block is a ring shard's (stream 9, the allreduce
// tables' checkpoint: storage/ring_checkpoint.h) is read as a shard of a
// flat space its header sizes (ReadRingState), written again and read
// back; and, as a partition file, refused naming the file.
//
// Checked beyond "a Status, never a crash": a file reads the same with and
// without the manifest's whole-file checksum; what was restored can be
// written and restored again, to the same values.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "common/config.h"
#include "common/crc32c.h"
#include "common/initializer.h"
#include "common/optimizer.h"
#include "common/row_optimizer.h"
#include "glog/logging.h"
#include "proto/checkpoint.pb.h"
#include "pserver/partition.h"
#include "pserver/partition_files.h"
#include "pserver/sparse_table.h"
#include "storage/checkpoint_export.h"
#include "storage/checkpoint_format.h"
#include "storage/file_system.h"
#include "storage/ring_checkpoint.h"
#include "tests/fuzz/fuzz_support.h"

namespace strata::pserver {
namespace {

using storage::BlockType;

constexpr char kRoot[] = "root";
constexpr char kRel[] = "ckpt-00000001/p00000.blk";
constexpr size_t kFileHeaderBytes = 16;
constexpr size_t kBlockHeaderBytes = 20;
// Partitions made for a header are at most this large.
constexpr uint64_t kMaxLength = 4096;
constexpr uint32_t kMaxDim = 64;
// Ring shards read are of flat spaces at most this large.
constexpr uint64_t kMaxRingFloats = 4096;

// `bytes` with the crc32c of every whole block set to fit it.
std::string FitBlockChecksums(std::string bytes) {
  size_t pos = kFileHeaderBytes;
  while (pos < bytes.size() && bytes.size() - pos >= kBlockHeaderBytes) {
    char* h = bytes.data() + pos;
    uint32_t stored;
    std::memcpy(&stored, h + 12, 4);
    if (bytes.size() - pos - kBlockHeaderBytes < stored) break;
    uint32_t crc = Crc32cExtend(0, h, 16);
    crc = Crc32cExtend(crc, h + kBlockHeaderBytes, stored);
    std::memcpy(h + 16, &crc, 4);
    pos += kBlockHeaderBytes + stored;
  }
  return bytes;
}

bool OneOf(const std::string& s, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (s == n) return true;
  }
  return false;
}

// A new partition that fits `h` as far as this target allows, or nullptr.
std::unique_ptr<Partition> PartitionFor(const proto::CheckpointPartitionHeader& h) {
  if (!h.sparse()) {
    // A pserver holds no empty dense partition (every table has elements).
    if (h.length() == 0 || h.length() > kMaxLength) return nullptr;
    OptimizerSection o;
    o.type = OneOf(h.optimizer(), {"sgd", "momentum", "adam"}) ? h.optimizer() : "sgd";
    auto opt = Optimizer::Create(o, h.length());
    CHECK(opt.ok()) << opt.status();
    return std::make_unique<Partition>(h.id(), h.table(), std::vector<float>(h.length()),
                                       std::move(*opt), Consistency::kBsp);
  }
  RowOptimizerSection o;
  o.type = OneOf(h.optimizer(), {"sgd", "adagrad", "adam", "ftrl"}) ? h.optimizer() : "sgd";
  auto opt = RowOptimizer::Create(o);
  CHECK(opt.ok()) << opt.status();
  auto init = RowInitializer::Create("zeros", 0, 0, 0);
  CHECK(init.ok());
  SparseTableOptions so;
  so.dim = h.dim() >= 1 && h.dim() <= kMaxDim ? static_cast<int>(h.dim()) : 2;
  so.optimizer = std::shared_ptr<const RowOptimizer>(std::move(*opt));
  so.initializer = &*init;
  auto rows = SparseTable::Create(so);
  CHECK(rows.ok()) << rows.status();
  return std::make_unique<Partition>(h.id(), h.table(), std::move(*rows), Consistency::kBsp);
}

// Restores the file into a partition fitting its header; when that works,
// checkpoints the partition and restores the result into another.
void Restore(storage::FileSystem* fs, const proto::CheckpointPartitionHeader& h,
             const proto::CheckpointFile& file) {
  std::unique_ptr<Partition> p = PartitionFor(h);
  if (p == nullptr) return;
  proto::CheckpointPartition entry;
  entry.set_id(h.id());
  *entry.add_files() = file;
  if (!LoadPartition(fs, kRoot, entry, file.seq(), p.get()).ok()) return;

  absl::StatusOr<PartitionSnapshot> snap = absl::UnknownError("no snapshot");
  SnapshotRequest req;
  req.job = "fuzz";
  req.seq = 2;
  p->RequestSnapshot(req, [&snap](absl::StatusOr<PartitionSnapshot> s) { snap = std::move(s); });
  CHECK(snap.ok()) << snap.status();
  absl::StatusOr<proto::CheckpointFile> written = WritePartitionFile(fs, kRoot, *snap, 1);
  CHECK(written.ok()) << written.status();
  std::unique_ptr<Partition> again = PartitionFor(snap->header);
  CHECK(again != nullptr);
  proto::CheckpointPartition entry2;
  entry2.set_id(h.id());
  *entry2.add_files() = *written;
  const absl::Status s = LoadPartition(fs, kRoot, entry2, 2, again.get());
  CHECK(s.ok()) << "a restored partition's own checkpoint does not restore: " << s;
  const std::vector<float> a = p->ValuesForTesting(), b = again->ValuesForTesting();
  CHECK_EQ(a.size(), b.size());
  CHECK(a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
  CHECK_EQ(p->stats().version, again->stats().version);
  CHECK_EQ(p->sparse_stats().rows, again->sparse_stats().rows);
}

// Exports a checkpoint whose manifest names only this file.
void Export(storage::FileSystem* fs, const proto::CheckpointPartitionHeader& h,
            const proto::CheckpointFile& file) {
  proto::CheckpointManifest m;
  m.set_format_version(storage::kCheckpointFormatVersion);
  m.set_seq(1);
  proto::CheckpointPartition* p = m.add_partitions();
  p->set_id(h.id());
  p->set_table(h.table());
  p->set_sparse(h.sparse());
  *p->add_files() = file;
  CHECK(storage::WriteManifest(fs, "root/ckpt-00000001", m).ok());
  (void)storage::ExportCheckpoint(fs, "root/ckpt-00000001", "exports/e1", storage::Precision::kBf16,
                                  0);
}

// Reads the file as the only shard of a flat space that its header sizes
// (when that header says it covers the whole of one of at most
// kMaxRingFloats floats); when that works, writes the state again as one
// shard and reads it back, to the same state.
void RingShard(storage::FileSystem* fs, const proto::CheckpointRingShardHeader& h,
               const proto::CheckpointFile& file) {
  if (h.total() > kMaxRingFloats) return;
  proto::CheckpointRingShard shard;
  shard.set_begin(h.begin());
  shard.set_end(h.end());
  *shard.mutable_file() = file;
  absl::StatusOr<storage::RingState> state =
      storage::ReadRingState(fs, kRoot, {shard}, h.total(), h.job(), h.optimizer());
  if (!state.ok()) return;

  proto::CheckpointRingShardHeader again = h;
  again.set_seq(2);
  again.set_begin(0);
  again.set_end(h.total());
  std::string saved;
  if (h.state_count() && state->state_vectors > 0) {
    saved.append(reinterpret_cast<const char*>(&state->updates), sizeof(uint64_t));
  }
  saved.append(reinterpret_cast<const char*>(state->state.data()),
               state->state.size() * sizeof(float));
  absl::StatusOr<proto::CheckpointFile> written =
      storage::WriteRingShard(fs, kRoot, again, state->values, saved, 1);
  CHECK(written.ok()) << written.status();
  shard.set_begin(0);
  shard.set_end(h.total());
  *shard.mutable_file() = *written;
  absl::StatusOr<storage::RingState> back =
      storage::ReadRingState(fs, kRoot, {shard}, h.total(), h.job(), h.optimizer());
  CHECK(back.ok()) << "a ring shard's state written again does not read: " << back.status();
  CHECK_EQ(back->step, state->step);
  CHECK_EQ(back->updates, state->updates);
  CHECK_EQ(back->state_vectors, state->state_vectors);
  CHECK(back->values.size() == state->values.size() &&
        (back->values.empty() || std::memcmp(back->values.data(), state->values.data(),
                                             back->values.size() * sizeof(float)) == 0));
  CHECK(back->state.size() == state->state.size() &&
        (back->state.empty() || std::memcmp(back->state.data(), state->state.data(),
                                            back->state.size() * sizeof(float)) == 0));
}

void Run(const std::string& input) {
  std::unique_ptr<storage::FileSystem> fs = storage::NewMemoryFileSystem();
  const std::string path = storage::JoinPath(kRoot, kRel);
  CHECK(fs->WriteFileAtomic(path, input).ok());
  (void)storage::ReadBlockFile(fs.get(), path);
  const std::string bytes = FitBlockChecksums(input);
  if (bytes != input) CHECK(fs->WriteFileAtomic(path, bytes).ok());
  auto streams = storage::ReadBlockFile(fs.get(), path);

  // With the manifest's size and checksum, the blocks' own are not read
  // again: the answer must be the same.
  proto::CheckpointFile file;
  file.set_path(kRel);
  file.set_size(bytes.size());
  file.set_crc32c(Crc32c(bytes));
  file.set_seq(1);
  file.set_full(true);
  auto checked = storage::ReadBlockFile(fs.get(), path, &file);
  CHECK_EQ(streams.ok(), checked.ok()) << streams.status() << " / " << checked.status();
  if (!streams.ok()) return;
  CHECK(*streams == *checked);

  proto::CheckpointRingShardHeader ring;
  if (storage::ParseHeaderBlock(*streams, BlockType::kRingHeader, path, &ring).ok()) {
    RingShard(fs.get(), ring, file);
  }
  proto::CheckpointPartitionHeader h;
  const absl::Status parsed = storage::ParseHeaderBlock(*streams, BlockType::kHeader, path, &h);
  if (!parsed.ok()) {
    CHECK(absl::StrContains(parsed.message(), path)) << parsed;
    return;
  }
  Restore(fs.get(), h, file);
  Export(fs.get(), h, file);
}

}  // namespace
}  // namespace strata::pserver

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  strata::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  strata::pserver::Run(strata::fuzz::AsString(data, size));
  return 0;
}
