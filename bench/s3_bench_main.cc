// Checkpoint files to and from an S3 object store through the checkpoint
// writer and reader (storage/checkpoint_format.h) and the object-store file
// system: what a pserver does at a checkpoint and at a restore. Prints one
// JSON object; bench/s3_bench.sh runs it beside s3cmd on the same bytes.
//
//   strata-s3-bench --config C --root s3://bucket/prefix --files 4 --mb 64
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "storage/checkpoint_format.h"
#include "storage/s3_file_system.h"

DEFINE_string(config, "", "a job config whose s3 section names the store");
DEFINE_string(root, "", "where the files go: s3://bucket/prefix (or a local directory)");
DEFINE_int32(files, 4, "partition files, written one after another (as one pserver does)");
DEFINE_int32(mb, 64, "MB of float values per file");
DEFINE_int32(read_files, 4,
             "files read at once, as a pserver restores its partitions (pserver.cc: 4)");
DEFINE_int32(zstd, 0, "zstd level of the blocks (0: stored; random floats do not compress)");

namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("strata-s3-bench --config C --root s3://bucket/prefix");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  if (FLAGS_config.empty() || FLAGS_root.empty()) {
    std::fprintf(stderr, "strata-s3-bench: --config and --root are required\n");
    return 2;
  }
  auto config = strata::LoadJobConfig(FLAGS_config);
  if (!config.ok()) {
    std::fprintf(stderr, "strata-s3-bench: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  auto fs = strata::storage::NewFileSystemForConfig(config->s3, ::getenv);
  if (!fs.ok()) {
    std::fprintf(stderr, "strata-s3-bench: %s\n", std::string(fs.status().message()).c_str());
    return 2;
  }
  // Random floats: incompressible, as trained weights nearly are.
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> values(static_cast<size_t>(FLAGS_mb) * (1 << 20) / sizeof(float));
  for (float& v : values) v = dist(rng);
  const std::string payload(reinterpret_cast<const char*>(values.data()),
                            values.size() * sizeof(float));

  std::vector<strata::proto::CheckpointFile> files;
  uint64_t bytes = 0;
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < FLAGS_files; ++i) {
    const std::string path = strata::storage::JoinPath(FLAGS_root, absl::StrCat("p", i, ".blk"));
    auto w = strata::storage::BlockFileWriter::Create(fs->get(), path, FLAGS_zstd);
    absl::Status s = w.status();
    strata::proto::CheckpointPartitionHeader header;
    header.set_format_version(strata::storage::kCheckpointFormatVersion);
    header.set_id(i);
    if (s.ok()) s = (*w)->Add(strata::storage::BlockType::kHeader, header.SerializeAsString());
    if (s.ok()) s = (*w)->Add(strata::storage::BlockType::kDenseValues, payload, true);
    absl::StatusOr<strata::storage::BlockFileInfo> info =
        s.ok() ? (*w)->Finish() : absl::StatusOr<strata::storage::BlockFileInfo>(s);
    if (!info.ok()) {
      std::fprintf(stderr, "strata-s3-bench: write %s: %s\n", path.c_str(),
                   std::string(info.status().message()).c_str());
      return 1;
    }
    strata::proto::CheckpointFile f;
    f.set_path(path);
    f.set_size(info->size);
    f.set_crc32c(info->crc32c);
    files.push_back(f);
    bytes += info->size;
  }
  const double write_s = Seconds(start);
  start = std::chrono::steady_clock::now();
  std::vector<absl::Status> read(files.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < files.size(); i = next++) {
      read[i] = strata::storage::ReadBlockFile(fs->get(), files[i].path(), &files[i]).status();
    }
  };
  std::vector<std::thread> readers;
  for (int t = 1; t < FLAGS_read_files; ++t) readers.emplace_back(work);
  work();
  for (std::thread& t : readers) t.join();
  for (size_t i = 0; i < files.size(); ++i) {
    if (!read[i].ok()) {
      std::fprintf(stderr, "strata-s3-bench: read %s: %s\n", files[i].path().c_str(),
                   std::string(read[i].message()).c_str());
      return 1;
    }
  }
  const double read_s = Seconds(start);
  std::printf(
      "{\"files\": %d, \"bytes\": %llu, \"write_seconds\": %.3f, \"read_seconds\": %.3f, "
      "\"write_mb_per_s\": %.1f, \"read_mb_per_s\": %.1f, \"part_size_mb\": %d, "
      "\"parallel_parts\": %d, \"read_files\": %d}\n",
      FLAGS_files, static_cast<unsigned long long>(bytes), write_s, read_s, bytes / 1e6 / write_s,
      bytes / 1e6 / read_s, config->s3.part_size_mb, config->s3.parallel_parts, FLAGS_read_files);
  return 0;
}
