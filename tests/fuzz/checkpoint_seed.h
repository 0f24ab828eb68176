// A small checkpoint built from constants with the code's own writers
// (BlockFileWriter, EncodeManifest; docs/checkpoint-format.md): the
// partition files that the checkpoint_manifest fuzz target puts beside
// each manifest it reads, and seeds of the checkpoint corpora
// (make_seed_corpus.cc). Its bytes are the same in every build: no
// optimizer arithmetic, no proto maps.
#ifndef STRATA_TESTS_FUZZ_CHECKPOINT_SEED_H_
#define STRATA_TESTS_FUZZ_CHECKPOINT_SEED_H_

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/crc32c.h"
#include "glog/logging.h"
#include "proto/checkpoint.pb.h"
#include "storage/checkpoint_format.h"
#include "storage/file_system.h"

namespace strata::fuzz {

inline constexpr char kSeedDenseFile[] = "ckpt-00000001/p00000.blk";
inline constexpr char kSeedSparseFile[] = "ckpt-00000002/p00001.blk";

// One partition file: `streams` written in order with BlockFileWriter.
inline std::string WriteSeedBlockFile(
    const std::vector<std::pair<storage::BlockType, std::string>>& streams, int zstd_level,
    bool shuffle4) {
  std::unique_ptr<storage::FileSystem> fs = storage::NewMemoryFileSystem();
  auto w = storage::BlockFileWriter::Create(fs.get(), "f.blk", zstd_level);
  CHECK(w.ok()) << w.status();
  for (const auto& [type, payload] : streams) {
    CHECK((*w)->Add(type, payload, shuffle4 && type != storage::BlockType::kHeader).ok());
  }
  CHECK((*w)->Finish().ok());
  absl::StatusOr<std::string> bytes = fs->ReadFile("f.blk");
  CHECK(bytes.ok()) << bytes.status();
  return *bytes;
}

template <typename T>
void AppendRaw(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

// Relative path -> bytes:
//   ckpt-00000001/p00000.blk  dense partition 0 of "fc0.weight": 4 values,
//                             sgd, zstd with the shuffle filter
//   ckpt-00000002/p00001.blk  sparse partition 1 of "embedding": dim 2,
//                             sgd, 2 rows and 1 removed key, stored as is
inline std::map<std::string, std::string> SeedPartitionFiles() {
  std::map<std::string, std::string> files;
  {
    proto::CheckpointPartitionHeader h;
    h.set_format_version(storage::kCheckpointFormatVersion);
    h.set_job("fuzz");
    h.set_seq(1);
    h.set_id(0);
    h.set_table("fc0.weight");
    h.set_length(4);
    h.set_version(3);
    h.set_full(true);
    h.set_optimizer("sgd");
    std::string values;
    for (float v : {0.5f, -1.0f, 2.0f, 0.25f}) AppendRaw(&values, v);
    files[kSeedDenseFile] =
        WriteSeedBlockFile({{storage::BlockType::kHeader, h.SerializeAsString()},
                            {storage::BlockType::kDenseValues, values}},
                           3, /*shuffle4=*/true);
  }
  {
    proto::CheckpointPartitionHeader h;
    h.set_format_version(storage::kCheckpointFormatVersion);
    h.set_job("fuzz");
    h.set_seq(2);
    h.set_id(1);
    h.set_table("embedding");
    h.set_sparse(true);
    h.set_dim(2);
    h.set_version(3);
    h.set_full(true);
    h.set_optimizer("sgd");
    h.set_row_bytes(24);  // key, two u32 counters, 2 floats
    h.set_rows(2);
    std::string rows;
    for (uint64_t key : {uint64_t{11}, uint64_t{0x8000000000000001}}) {
      AppendRaw(&rows, key);
      AppendRaw(&rows, uint32_t{2});  // updates
      AppendRaw(&rows, uint32_t{3});  // last update
      AppendRaw(&rows, 0.125f);
      AppendRaw(&rows, -0.5f);
    }
    std::string removed;
    AppendRaw(&removed, uint64_t{12});
    files[kSeedSparseFile] =
        WriteSeedBlockFile({{storage::BlockType::kHeader, h.SerializeAsString()},
                            {storage::BlockType::kSparseRows, rows},
                            {storage::BlockType::kSparseDeletes, removed}},
                           0, /*shuffle4=*/false);
  }
  return files;
}

// The manifest of checkpoint 2 (incremental over 1) naming those files with
// their sizes and checksums.
inline proto::CheckpointManifest SeedManifest(const std::map<std::string, std::string>& files) {
  proto::CheckpointManifest m;
  m.set_format_version(storage::kCheckpointFormatVersion);
  m.set_job("fuzz");
  m.set_seq(2);
  m.set_incremental(true);
  m.set_base_seq(1);
  m.set_consistency("bsp");
  m.set_step(3);
  m.set_cluster_epoch(4);
  m.set_created_unix_ms(1764590000123);
  m.set_reason("steps");
  proto::CheckpointTable* dense = m.add_tables();
  dense->set_name("fc0.weight");
  dense->add_shape(2);
  dense->add_shape(2);
  dense->set_partitions(1);
  proto::CheckpointTable* sparse = m.add_tables();
  sparse->set_name("embedding");
  sparse->set_sparse(true);
  sparse->set_dim(2);
  sparse->set_partitions(1);
  m.set_optimizer("sgd");
  m.set_sparse_optimizer("sgd");
  m.set_slice_bytes(1 << 20);
  const auto add = [&](uint32_t id, const char* table, const char* path, uint64_t seq) {
    proto::CheckpointPartition* p = m.add_partitions();
    p->set_id(id);
    p->set_table(table);
    p->set_version(3);
    proto::CheckpointFile* f = p->add_files();
    f->set_path(path);
    f->set_size(files.at(path).size());
    f->set_crc32c(Crc32c(files.at(path)));
    f->set_seq(seq);
    f->set_full(true);
    return p;
  };
  add(0, "fc0.weight", kSeedDenseFile, 1)->set_length(4);
  proto::CheckpointPartition* p = add(1, "embedding", kSeedSparseFile, 2);
  p->set_sparse(true);
  p->set_dim(2);
  p->set_rows(2);
  m.add_tasks_done(1);
  m.add_tasks_done(2);
  proto::CheckpointTask* t = m.add_tasks_partial();
  t->set_id(3);
  t->set_trained_records(10);
  m.set_samples(100);
  m.set_next_node_id(5);
  return m;
}

}  // namespace strata::fuzz

#endif  // STRATA_TESTS_FUZZ_CHECKPOINT_SEED_H_
