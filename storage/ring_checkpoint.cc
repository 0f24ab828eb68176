#include "storage/ring_checkpoint.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "storage/checkpoint_format.h"

namespace strata::storage {

std::string RingShardFileName(uint64_t seq, uint64_t ring_epoch, uint32_t rank) {
  return absl::StrFormat("%s/ring-%d-%05d.blk", CheckpointDirName(seq), ring_epoch, rank);
}

absl::StatusOr<proto::CheckpointFile> WriteRingShard(FileSystem* fs, const std::string& root,
                                                     const proto::CheckpointRingShardHeader& header,
                                                     const std::vector<float>& values,
                                                     const std::string& state, int zstd_level) {
  const std::string rel = RingShardFileName(header.seq(), header.ring_epoch(), header.rank());
  const std::string dir = JoinPath(root, CheckpointDirName(header.seq()));
  STRATA_RETURN_IF_ERROR(fs->CreateDirs(dir));
  STRATA_ASSIGN_OR_RETURN(auto w, BlockFileWriter::Create(fs, JoinPath(root, rel), zstd_level));
  STRATA_RETURN_IF_ERROR(w->Add(BlockType::kRingHeader, header.SerializeAsString()));
  STRATA_RETURN_IF_ERROR(
      w->Add(BlockType::kDenseValues,
             absl::string_view(reinterpret_cast<const char*>(values.data()), values.size() * 4),
             /*shuffle4=*/true));
  if (!state.empty()) STRATA_RETURN_IF_ERROR(w->Add(BlockType::kOptimizerState, state, true));
  STRATA_ASSIGN_OR_RETURN(BlockFileInfo info, w->Finish());
  STRATA_RETURN_IF_ERROR(fs->SyncDir(dir));
  proto::CheckpointFile f;
  f.set_path(rel);
  f.set_size(info.size);
  f.set_crc32c(info.crc32c);
  f.set_seq(header.seq());
  f.set_full(true);
  f.set_raw_bytes(info.raw_bytes);
  return f;
}

absl::StatusOr<RingState> ReadRingState(FileSystem* fs, const std::string& root,
                                        const std::vector<proto::CheckpointRingShard>& shards,
                                        uint64_t floats, const std::string& job,
                                        const std::string& optimizer) {
  std::vector<const proto::CheckpointRingShard*> order;
  for (const auto& s : shards) order.push_back(&s);
  std::sort(order.begin(), order.end(),
            [](const auto* a, const auto* b) { return a->begin() < b->begin(); });
  RingState out;
  out.values.assign(floats, 0.f);
  uint64_t at = 0;
  bool first = true;
  bool count = false;
  for (const proto::CheckpointRingShard* s : order) {
    const std::string path = JoinPath(root, s->file().path());
    if (s->begin() != at || s->end() < s->begin() || s->end() > floats) {
      return absl::DataLossError(absl::StrCat(
          path, ": a shard of floats [", s->begin(), ", ", s->end(), ") where the shards of [0, ",
          floats, ") need one starting at ", at, " (shards missing or overlapping)"));
    }
    STRATA_ASSIGN_OR_RETURN(auto streams, ReadBlockFile(fs, path, &s->file()));
    proto::CheckpointRingShardHeader h;
    STRATA_RETURN_IF_ERROR(ParseHeaderBlock(streams, BlockType::kRingHeader, path, &h));
    if (h.job() != job) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": a shard of job '", h.job(), "', not of '", job, "'"));
    }
    if (h.optimizer() != optimizer) {
      return absl::FailedPreconditionError(absl::StrCat(path, ": optimizer '", h.optimizer(),
                                                        "' in the shard, '", optimizer,
                                                        "' in the config (optimizer.type)"));
    }
    if (h.begin() != s->begin() || h.end() != s->end() || h.total() != floats) {
      return absl::DataLossError(absl::StrCat(path, ": the shard says floats [", h.begin(), ", ",
                                              h.end(), ") of ", h.total(), ", the manifest [",
                                              s->begin(), ", ", s->end(), ") of ", floats));
    }
    if (first) {
      out.step = h.step();
      out.updates = h.updates();
      out.state_vectors = h.state_vectors();
      count = h.state_count();
      if (out.state_vectors > 16) {
        return absl::DataLossError(
            absl::StrCat(path, ": ", out.state_vectors, " optimizer state vectors (at most 16)"));
      }
      out.state.assign(static_cast<size_t>(out.state_vectors) * floats, 0.f);
      first = false;
    } else if (h.step() != out.step || h.updates() != out.updates ||
               h.state_vectors() != out.state_vectors || h.state_count() != count) {
      return absl::DataLossError(absl::StrCat(
          path, ": step ", h.step(), ", ", h.updates(), " updates, ", h.state_vectors(),
          " state vectors; the shard before it: step ", out.step, ", ", out.updates, " updates, ",
          out.state_vectors, " state vectors (shards of different states)"));
    }
    const uint64_t n = s->end() - s->begin();
    const std::string& values = streams[BlockType::kDenseValues];
    if (values.size() != n * 4) {
      return absl::DataLossError(
          absl::StrCat(path, ": ", values.size(), " bytes of parameters for ", n, " floats"));
    }
    if (n > 0) std::memcpy(out.values.data() + s->begin(), values.data(), values.size());
    const std::string& state = streams[BlockType::kOptimizerState];
    const size_t head = count ? sizeof(uint64_t) : 0;
    const size_t want = out.state_vectors == 0 ? 0 : head + out.state_vectors * n * 4;
    if (state.size() != want) {
      return absl::DataLossError(absl::StrCat(path, ": ", state.size(),
                                              " bytes of optimizer state, ", want, " expected (",
                                              out.state_vectors, " vectors of ", n, " floats)"));
    }
    for (uint32_t v = 0; v < out.state_vectors && n > 0; ++v) {
      std::memcpy(out.state.data() + v * floats + s->begin(), state.data() + head + v * n * 4,
                  n * 4);
    }
    at = s->end();
  }
  if (at != floats) {
    return absl::DataLossError(absl::StrCat("ring shards under ", root, " cover floats [0, ", at,
                                            ") of ", floats, " (a shard is missing)"));
  }
  return out;
}

absl::StatusOr<RingState> ReadNewestRingState(FileSystem* fs, const std::string& root,
                                              uint64_t floats, const std::string& job,
                                              const std::string& optimizer, uint64_t* seq,
                                              const RingState* cached, uint64_t cached_seq) {
  STRATA_ASSIGN_OR_RETURN(const std::vector<CheckpointEntry> all, ListCheckpoints(fs, root));
  absl::Status newest_failed;  // (a newer one's shards that did not read back)
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (!it->complete) continue;
    absl::StatusOr<proto::CheckpointManifest> m = ReadManifest(fs, it->dir);
    if (!m.ok() || m->ring_shards_size() == 0) continue;
    if (cached != nullptr && m->seq() == cached_seq) {
      *seq = cached_seq;
      return *cached;
    }
    const std::vector<proto::CheckpointRingShard> shards(m->ring_shards().begin(),
                                                         m->ring_shards().end());
    absl::StatusOr<RingState> state = ReadRingState(fs, root, shards, floats, job, optimizer);
    if (state.ok()) {
      *seq = m->seq();
      return state;
    }
    if (newest_failed.ok()) newest_failed = state.status();
  }
  if (!newest_failed.ok()) return newest_failed;
  return absl::NotFoundError(absl::StrCat("no checkpoint with allreduce tables under ", root));
}

}  // namespace strata::storage
