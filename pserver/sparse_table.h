// The rows of one virtual partition of a sparse table: uint64 key -> row of
// `dim` floats plus the row's optimizer state, created on first touch,
// admitted and evicted by policy (docs/sparse.md).
//
// Memory layout: rows live in fixed-size chunks of kChunkRows rows, each row
//   [key u64][updates u32][last_update u32][values f32 x dim][state f32 x slots*dim]
// and an open-addressing index (linear probing) of 8-byte slots, each the
// row's number and 32 bits of the key's hash, kept between 3/8 and 3/4
// full. So a row costs 4 * dim * (1 + slots) bytes of data (rounded up to
// 8, keeping every key aligned) plus kRowOverheadBytes (16 of header, about
// 16 of index), and the only slack is the last chunk. Removing a row moves
// the last row into its place.
#ifndef STRATA_PSERVER_SPARSE_TABLE_H_
#define STRATA_PSERVER_SPARSE_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/initializer.h"
#include "common/row_optimizer.h"

namespace strata::pserver {

struct SparseTableOptions {
  int dim = 8;                                    // floats per row, >= 1
  std::shared_ptr<const RowOptimizer> optimizer;  // required
  // Required (RowInitializer has no default); Create takes it by value.
  const RowInitializer* initializer = nullptr;  // borrowed during Create only
  uint32_t admit_min_count = 1;                 // >= 1
  double admit_probability = 1.0;               // (0, 1]
  uint64_t idle_updates = 0;                    // 0 = no idle eviction
  uint64_t capacity_rows = 0;                   // 0 = unbounded
  // Keys counted towards admission but not admitted yet are forgotten when
  // there are more than this many (bounds the counting memory).
  uint64_t max_pending_keys = 1 << 20;
  uint64_t seed = 0;  // the admission probability's random stream
};

struct SparseTableStats {
  uint64_t rows = 0;
  uint64_t admitted = 0;          // keys that became rows
  uint64_t rejected = 0;          // pushed keys not admitted (gradient dropped)
  uint64_t evicted_idle = 0;      // rows dropped for not being updated
  uint64_t evicted_capacity = 0;  // rows dropped beyond the capacity
  uint64_t pending_keys = 0;      // keys counted towards admission
  uint64_t updates = 0;           // Update calls (the idle clock)
  uint64_t memory_bytes = 0;      // allocated now: chunks, index, pending keys
};

// Not thread-safe: its partition calls it under the partition's lock.
class SparseTable {
 public:
  static constexpr size_t kChunkRows = 1024;
  static constexpr size_t kRowOverheadBytes = 32;

  // InvalidArgument for a bad option (dim < 1, no optimizer, ...).
  static absl::StatusOr<std::unique_ptr<SparseTable>> Create(const SparseTableOptions& options);
  SparseTable(const SparseTable&) = delete;
  SparseTable& operator=(const SparseTable&) = delete;

  int dim() const { return dim_; }
  const char* optimizer_name() const { return optimizer_->name(); }
  // Bytes of one row as stated in docs/sparse.md: data and state (rounded
  // up to 8 bytes), plus kRowOverheadBytes.
  size_t stated_bytes_per_row() const;

  // out[i * dim ..] = the row of keys[i]: its values when it exists, else
  // its initial values when a key is admitted at first touch (min_count 1,
  // probability 1), else zeros (a key not admitted contributes nothing).
  // Creates no row.
  void Lookup(const uint64_t* keys, size_t n, float* out) const;

  // Applies the gradient rows grad[i * dim ..] * grad_scale to the rows of
  // keys[i] with the optimizer, creating the rows of admitted keys (from
  // their initial values) and dropping the gradients of keys not admitted.
  // A key given twice is updated twice. Then evicts idle rows (a bounded
  // number checked per call) and rows beyond the capacity.
  void Update(const uint64_t* keys, size_t n, const float* grad, float grad_scale);

  SparseTableStats stats() const;
  size_t rows() const { return rows_; }
  // The values of a key's row, or nullptr when it has none. Valid until
  // the next Update.
  const float* Find(uint64_t key) const;
  // The row's update count (0 when it has none).
  uint32_t UpdateCountForTesting(uint64_t key) const;

  // Checkpoints (docs/checkpoint-format.md). A row record is row_bytes()
  // bytes: [key u64][updates u32][last_update u32][values][state][padding],
  // the row as it is in memory.
  size_t row_bytes() const { return stride_; }
  // The counters that decide future admissions and evictions.
  struct Clock {
    uint64_t updates = 0;  // Update calls (the idle clock)
    uint64_t rng = 0;      // the admission probability's random state
    uint64_t sweep = 0;    // where the idle sweep goes on
  };
  Clock clock() const { return {stats_.updates, rng_, sweep_}; }
  void SetClock(const Clock& c);
  // Appends the records of every row (`all`), or of the rows updated since
  // the last MarkClean (all of them before the first).
  void ExportRows(bool all, std::string* out) const;
  // Appends the keys (u64) of rows removed since the last MarkClean.
  void ExportRemoved(std::string* out) const;
  // Appends the keys counted towards admission: (u64 key, u32 count).
  void ExportPending(std::string* out) const;
  // The state now is the baseline of ExportRows(false) and ExportRemoved.
  void MarkClean();
  // Inserts or overwrites rows from records. InvalidArgument when the size
  // is not a whole number of records.
  absl::Status ImportRows(absl::string_view records);
  // Removes the rows of these u64 keys (keys with no row are skipped).
  absl::Status RemoveKeys(absl::string_view keys);
  // Replaces the admission counts with ExportPending's pairs.
  absl::Status ImportPending(absl::string_view pairs);

 private:
  struct RowHeader {
    uint64_t key;
    uint32_t updates;      // optimizer steps on this row (Adam's t; frequency)
    uint32_t last_update;  // updates_ (low 32 bits) at its last update
  };
  static constexpr uint64_t kEmpty = ~0ull;

  SparseTable(const SparseTableOptions& options, RowInitializer initializer);
  // Bytes of a row in its chunk: header, then values and state rounded up
  // to 8 bytes.
  static size_t RowStride(int dim, int slots);
  char* RowPtr(uint64_t row) const {
    return chunks_[row / kChunkRows].get() + (row % kChunkRows) * stride_;
  }
  RowHeader* Header(uint64_t row) const { return reinterpret_cast<RowHeader*>(RowPtr(row)); }
  float* Values(uint64_t row) const {
    return reinterpret_cast<float*>(RowPtr(row) + sizeof(RowHeader));
  }
  // The index slot holding `key`, or the empty slot where it would go.
  size_t FindSlot(uint64_t key, uint32_t tag, bool* found) const;
  // For keys[0..m), m <= kGroup: the row each key's first tag match points
  // to (kNoRow when none), with the index lines and those rows' first
  // `row_bytes` prefetched. Hints only, to be confirmed by the row's key:
  // a lookup waits on two dependent cache misses (index slot, then row),
  // and this overlaps them across a group of keys.
  static constexpr size_t kGroup = 16;
  static constexpr uint64_t kNoRow = ~0ull;
  void Candidates(const uint64_t* keys, size_t m, size_t row_bytes, uint64_t* rows) const;
  // Appends a row for `key` (initial values and state) and indexes it.
  uint64_t AddRow(uint64_t key);
  // Removes the row of `key` (which must exist).
  void RemoveRow(uint64_t key);
  void Grow();
  bool Admit(uint64_t key);
  void EvictIdle(size_t budget);
  void EvictToCapacity();

  const int dim_;
  const int slots_;
  const size_t stride_;  // bytes per row
  const std::shared_ptr<const RowOptimizer> optimizer_;
  const RowInitializer initializer_;
  const uint32_t admit_min_count_;
  const double admit_probability_;
  const uint64_t idle_updates_;
  const uint64_t capacity_rows_;
  const uint64_t max_pending_keys_;
  const bool admit_on_first_touch_;

  std::vector<std::unique_ptr<char[]>> chunks_;
  uint64_t rows_ = 0;
  std::vector<uint64_t> index_;  // (tag << 32) | row, or kEmpty
  size_t index_mask_ = 0;
  absl::flat_hash_map<uint64_t, uint32_t> pending_;  // key -> times pushed
  uint64_t rng_;                                     // splitmix state for the admission probability
  uint64_t sweep_ = 0;                               // next row the idle sweep looks at
  // Checkpoint baseline: rows whose last_update is after clean_mark_ have
  // changed; keys removed since are in removed_ (tracked once marked).
  bool marked_ = false;
  uint32_t clean_mark_ = 0;
  std::vector<uint64_t> removed_;
  SparseTableStats stats_;
};

}  // namespace strata::pserver

#endif  // STRATA_PSERVER_SPARSE_TABLE_H_
