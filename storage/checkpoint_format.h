// The on-disk checkpoint format (docs/checkpoint-format.md): partition files
// made of checksummed, compressed blocks; a manifest per checkpoint, written
// last by temp file + fsync + rename, that makes the checkpoint exist; the
// catalogue of a checkpoint root and its retention.
//
//   <root>/ckpt-00000007/p00012.blk   partition 12's file of checkpoint 7
//   <root>/ckpt-00000007/MANIFEST     present only once the checkpoint is whole
#ifndef STRATA_STORAGE_CHECKPOINT_FORMAT_H_
#define STRATA_STORAGE_CHECKPOINT_FORMAT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message_lite.h"
#include "proto/checkpoint.pb.h"
#include "storage/file_system.h"

namespace strata::storage {

inline constexpr uint32_t kCheckpointFormatVersion = 1;
inline constexpr char kManifestName[] = "MANIFEST";

// The streams of a partition file. Each is cut into blocks of at most
// kMaxBlockBytes; a reader concatenates a stream's blocks in order.
enum class BlockType : uint8_t {
  kHeader = 1,          // proto::CheckpointPartitionHeader
  kDenseValues = 2,     // fp32 values of a dense partition
  kOptimizerState = 3,  // a dense optimizer's saved state
  kSparseRows = 4,      // row records of header.row_bytes each
  kSparseDeletes = 5,   // uint64 keys removed since the previous file
  kSparsePending = 6,   // (uint64 key, uint32 count) awaiting admission
  // Inference exports (checkpoint_export.h): values only, 16 bits each.
  kDenseValues16 = 7,  // a dense partition's values, bf16 or fp16
  kSparseRows16 = 8,   // (uint64 key, dim 16-bit values) a row
  // A ring shard's file (ring_checkpoint.h): its header; its values and
  // state are streams 2 and 3.
  kRingHeader = 9,  // proto::CheckpointRingShardHeader
};
inline constexpr uint8_t kMaxBlockType = 9;
inline constexpr size_t kMaxBlockBytes = 1 << 20;

// What a finished file is, for the manifest.
struct BlockFileInfo {
  uint64_t size = 0;
  uint32_t crc32c = 0;
  uint64_t raw_bytes = 0;  // payload bytes before compression
};

// Writes one partition file. Not thread-safe.
class BlockFileWriter {
 public:
  // Creates (truncates) `path`. zstd_level 0 stores blocks uncompressed.
  static absl::StatusOr<std::unique_ptr<BlockFileWriter>> Create(FileSystem* fs,
                                                                 const std::string& path,
                                                                 int zstd_level);
  BlockFileWriter(const BlockFileWriter&) = delete;
  BlockFileWriter& operator=(const BlockFileWriter&) = delete;

  // Appends `payload` to stream `type`, in blocks. A float stream (values,
  // optimizer state, rows) compresses better with `shuffle4`: its bytes are
  // regrouped by position within each 4-byte word before zstd.
  absl::Status Add(BlockType type, absl::string_view payload, bool shuffle4 = false);
  // Syncs and closes. The file is complete only when this returns OK.
  absl::StatusOr<BlockFileInfo> Finish();

 private:
  BlockFileWriter(std::string path, std::unique_ptr<WritableFile> file, int level);
  absl::Status Write(absl::string_view bytes);

  const std::string path_;
  const std::unique_ptr<WritableFile> file_;
  const int level_;
  BlockFileInfo info_;
  std::string scratch_;
};

// A partition file read back: every block checked (magic, sizes, crc32c,
// decompressed size) and each stream concatenated. Errors name the file and
// the byte offset: DataLoss for a torn or corrupt file, FailedPrecondition
// for a format version this build does not read. With `expected`, the
// file's size and crc32c must match it first, and its blocks' raw bytes
// its raw_bytes (when set) before anything is allocated for them.
absl::StatusOr<std::map<BlockType, std::string>> ReadBlockFile(
    FileSystem* fs, const std::string& path, const proto::CheckpointFile* expected = nullptr);

// Parses the header block `type` (kHeader: a partition's; kRingHeader: a
// ring shard's) of a file ReadBlockFile read from `path` into `header`.
// DataLoss naming the file when the file has no such block (a ring
// shard's file where a partition's is expected, or the other way round)
// or it does not parse.
absl::Status ParseHeaderBlock(const std::map<BlockType, std::string>& streams, BlockType type,
                              const std::string& path, google::protobuf::MessageLite* header);

// "ckpt-00000007".
std::string CheckpointDirName(uint64_t seq);
// The seq of a "ckpt-NNNNNNNN" name, or 0 for any other name.
uint64_t CheckpointSeqOfName(absl::string_view name);

// Publishes the manifest of the checkpoint in `dir` (atomically; the
// checkpoint exists once this returns OK).
absl::Status WriteManifest(FileSystem* fs, const std::string& dir,
                           const proto::CheckpointManifest& manifest);
// Reads and checks dir/MANIFEST: NotFound when absent (an incomplete
// checkpoint), DataLoss when torn or corrupt, FailedPrecondition for
// another format version; errors name the file.
absl::StatusOr<proto::CheckpointManifest> ReadManifest(FileSystem* fs, const std::string& dir);
// Whether a manifest's file path stays under the checkpoint root: relative,
// with no empty, "." or ".." component. ReadManifest refuses any other.
bool IsPathUnderRoot(absl::string_view path);
// The manifest's bytes, for tests that corrupt them.
std::string EncodeManifest(const proto::CheckpointManifest& manifest);

struct CheckpointEntry {
  uint64_t seq = 0;
  std::string dir;        // root/ckpt-...
  bool complete = false;  // has a MANIFEST (not yet verified)
};
// The checkpoints under `root`, oldest first; none when root does not exist.
absl::StatusOr<std::vector<CheckpointEntry>> ListCheckpoints(FileSystem* fs,
                                                             const std::string& root);

// Checks that every file the manifest names exists with its size (cheap;
// the blocks' checksums are checked when the files are read). DataLoss
// naming the first file missing or of the wrong size.
absl::Status CheckManifestFiles(FileSystem* fs, const std::string& root,
                                const proto::CheckpointManifest& manifest);

// Keeps the newest `keep_last` complete checkpoints whose manifests read
// back, and every checkpoint their files come from; deletes the other
// checkpoint directories older than the newest complete one (incomplete
// ones included). Never deletes anything newer than the newest complete
// checkpoint (one may be being written). A manifest that cannot be read
// for another reason than being torn, corrupt or of another version stops
// it with that error, deleting nothing. Returns the directories deleted.
absl::StatusOr<std::vector<std::string>> ApplyRetention(FileSystem* fs, const std::string& root,
                                                        int keep_last);

}  // namespace strata::storage

#endif  // STRATA_STORAGE_CHECKPOINT_FORMAT_H_
