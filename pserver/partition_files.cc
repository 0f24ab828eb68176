#include "pserver/partition_files.h"

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "storage/checkpoint_format.h"

namespace strata::pserver {

using storage::BlockType;

std::string PartitionFileName(uint64_t seq, uint32_t partition) {
  return absl::StrFormat("%s/p%05d.blk", storage::CheckpointDirName(seq), partition);
}

absl::StatusOr<proto::CheckpointFile> WritePartitionFile(storage::FileSystem* fs,
                                                         const std::string& root,
                                                         const PartitionSnapshot& snap,
                                                         int zstd_level) {
  const auto& h = snap.header;
  const std::string rel = PartitionFileName(h.seq(), h.id());
  STRATA_ASSIGN_OR_RETURN(
      auto w, storage::BlockFileWriter::Create(fs, storage::JoinPath(root, rel), zstd_level));
  STRATA_RETURN_IF_ERROR(w->Add(BlockType::kHeader, h.SerializeAsString()));
  if (h.sparse()) {
    STRATA_RETURN_IF_ERROR(w->Add(BlockType::kSparseRows, snap.rows, /*shuffle4=*/true));
    if (!snap.removed.empty())
      STRATA_RETURN_IF_ERROR(w->Add(BlockType::kSparseDeletes, snap.removed));
    if (!snap.pending.empty())
      STRATA_RETURN_IF_ERROR(w->Add(BlockType::kSparsePending, snap.pending));
  } else {
    STRATA_RETURN_IF_ERROR(w->Add(BlockType::kDenseValues, snap.values, /*shuffle4=*/true));
    if (!snap.optimizer_state.empty()) {
      STRATA_RETURN_IF_ERROR(w->Add(BlockType::kOptimizerState, snap.optimizer_state, true));
    }
  }
  STRATA_ASSIGN_OR_RETURN(storage::BlockFileInfo info, w->Finish());
  proto::CheckpointFile f;
  f.set_path(rel);
  f.set_size(info.size);
  f.set_crc32c(info.crc32c);
  f.set_seq(h.seq());
  f.set_full(h.full());
  f.set_raw_bytes(info.raw_bytes);
  return f;
}

absl::Status LoadPartition(storage::FileSystem* fs, const std::string& root,
                           const proto::CheckpointPartition& entry, uint64_t seq,
                           Partition* partition) {
  if (entry.files().empty() || !entry.files(0).full()) {
    return absl::DataLossError(absl::StrCat("checkpoint ", seq, ": partition ", entry.id(),
                                            " has no full image to start from"));
  }
  for (const proto::CheckpointFile& f : entry.files()) {
    const std::string path = storage::JoinPath(root, f.path());
    STRATA_ASSIGN_OR_RETURN(auto streams, storage::ReadBlockFile(fs, path, &f));
    STRATA_RETURN_IF_ERROR(partition->ApplyCheckpointFile(streams, path));
  }
  partition->FinishRestore(seq);
  return absl::OkStatus();
}

}  // namespace strata::pserver
