#include "pserver/sparse_table.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "glog/logging.h"

namespace strata::pserver {
namespace {

// The 32 hash bits an index slot keeps; the home slot is taken from them
// too, so a slot's home is known without touching its row (removal).
uint32_t TagOf(uint64_t key) { return static_cast<uint32_t>(SplitMix64(key) >> 32); }

constexpr size_t kMinIndexSlots = 64;

}  // namespace

absl::StatusOr<std::unique_ptr<SparseTable>> SparseTable::Create(const SparseTableOptions& o) {
  if (o.dim < 1)
    return absl::InvalidArgumentError(absl::StrCat("sparse table dim must be >= 1, got ", o.dim));
  if (o.optimizer == nullptr)
    return absl::InvalidArgumentError("sparse table without an optimizer");
  if (o.initializer == nullptr)
    return absl::InvalidArgumentError("sparse table without an initializer");
  if (o.admit_min_count < 1) return absl::InvalidArgumentError("admission min_count must be >= 1");
  if (!(o.admit_probability > 0 && o.admit_probability <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("admission probability must be in (0, 1], got ", o.admit_probability));
  }
  return std::unique_ptr<SparseTable>(new SparseTable(o, *o.initializer));
}

SparseTable::SparseTable(const SparseTableOptions& o, RowInitializer initializer)
    : dim_(o.dim),
      slots_(o.optimizer->slots()),
      stride_(RowStride(o.dim, o.optimizer->slots())),
      optimizer_(o.optimizer),
      initializer_(initializer),
      admit_min_count_(o.admit_min_count),
      admit_probability_(o.admit_probability),
      idle_updates_(o.idle_updates),
      capacity_rows_(o.capacity_rows),
      max_pending_keys_(std::max<uint64_t>(o.max_pending_keys, 1)),
      admit_on_first_touch_(o.admit_min_count <= 1 && o.admit_probability >= 1.0),
      index_(kMinIndexSlots, kEmpty),
      index_mask_(kMinIndexSlots - 1),
      rng_(SplitMix64(o.seed ^ 0xad315510ull)) {}

size_t SparseTable::RowStride(int dim, int slots) {
  // Rounded up to 8 bytes, so that every row's 8-byte key is aligned.
  const size_t data = sizeof(float) * static_cast<size_t>(dim) * (1 + slots);
  return sizeof(RowHeader) + (data + 7) / 8 * 8;
}

size_t SparseTable::stated_bytes_per_row() const {
  return stride_ - sizeof(RowHeader) + kRowOverheadBytes;
}

size_t SparseTable::FindSlot(uint64_t key, uint32_t tag, bool* found) const {
  size_t i = tag & index_mask_;
  while (true) {
    const uint64_t e = index_[i];
    if (e == kEmpty) {
      *found = false;
      return i;
    }
    if (static_cast<uint32_t>(e >> 32) == tag && Header(e & 0xffffffffu)->key == key) {
      *found = true;
      return i;
    }
    i = (i + 1) & index_mask_;
  }
}

const float* SparseTable::Find(uint64_t key) const {
  bool found;
  const size_t slot = FindSlot(key, TagOf(key), &found);
  return found ? Values(index_[slot] & 0xffffffffu) : nullptr;
}

uint32_t SparseTable::UpdateCountForTesting(uint64_t key) const {
  bool found;
  const size_t slot = FindSlot(key, TagOf(key), &found);
  return found ? Header(index_[slot] & 0xffffffffu)->updates : 0;
}

void SparseTable::Candidates(const uint64_t* keys, size_t m, size_t row_bytes,
                             uint64_t* rows) const {
  uint32_t tags[kGroup];
  for (size_t i = 0; i < m; ++i) {
    tags[i] = TagOf(keys[i]);
    __builtin_prefetch(&index_[tags[i] & index_mask_]);
  }
  for (size_t i = 0; i < m; ++i) {
    rows[i] = kNoRow;
    for (size_t slot = tags[i] & index_mask_;; slot = (slot + 1) & index_mask_) {
      const uint64_t e = index_[slot];
      if (e == kEmpty) break;
      if (static_cast<uint32_t>(e >> 32) == tags[i]) {
        rows[i] = e & 0xffffffffu;
        const char* p = RowPtr(rows[i]);
        for (size_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(p + b);
        __builtin_prefetch(p + row_bytes - 1);
        break;
      }
    }
  }
}

void SparseTable::Lookup(const uint64_t* keys, size_t n, float* out) const {
  const size_t row_bytes = sizeof(float) * dim_;
  uint64_t rows[kGroup];
  for (size_t base = 0; base < n; base += kGroup) {
    const size_t m = std::min(kGroup, n - base);
    Candidates(keys + base, m, sizeof(RowHeader) + row_bytes, rows);
    for (size_t i = 0; i < m; ++i, out += dim_) {
      const uint64_t key = keys[base + i];
      const float* v =
          rows[i] != kNoRow && Header(rows[i])->key == key ? Values(rows[i]) : Find(key);
      if (v != nullptr) {
        std::memcpy(out, v, row_bytes);
      } else if (admit_on_first_touch_) {
        initializer_.Fill(key, dim_, out);
      } else {
        std::memset(out, 0, row_bytes);
      }
    }
  }
}

void SparseTable::Grow() {
  std::vector<uint64_t> old(index_.size() * 2, kEmpty);
  old.swap(index_);
  index_mask_ = index_.size() - 1;
  for (uint64_t e : old) {
    if (e == kEmpty) continue;
    size_t i = (e >> 32) & index_mask_;
    while (index_[i] != kEmpty) i = (i + 1) & index_mask_;
    index_[i] = e;
  }
}

uint64_t SparseTable::AddRow(uint64_t key) {
  // Grow at 3/4 full: then the index is 3/8 full.
  if ((rows_ + 1) * 4 > index_.size() * 3) Grow();
  const uint64_t row = rows_;
  if (row / kChunkRows == chunks_.size()) {
    chunks_.emplace_back(new char[kChunkRows * stride_]);
  }
  ++rows_;
  RowHeader* h = Header(row);
  h->key = key;
  h->updates = 0;
  h->last_update = static_cast<uint32_t>(stats_.updates);
  float* v = Values(row);
  initializer_.Fill(key, dim_, v);
  optimizer_->InitState(v + dim_, dim_);
  const uint32_t tag = TagOf(key);
  bool found;
  const size_t slot = FindSlot(key, tag, &found);
  DCHECK(!found);
  index_[slot] = (static_cast<uint64_t>(tag) << 32) | row;
  return row;
}

void SparseTable::RemoveRow(uint64_t key) {
  bool found;
  size_t hole = FindSlot(key, TagOf(key), &found);
  CHECK(found) << "removing a key with no row";
  const uint64_t row = index_[hole] & 0xffffffffu;
  // Backward-shift deletion: move later entries of the probe run into the
  // hole when the hole lies between their home and where they are.
  index_[hole] = kEmpty;
  for (size_t j = (hole + 1) & index_mask_; index_[j] != kEmpty; j = (j + 1) & index_mask_) {
    const size_t home = (index_[j] >> 32) & index_mask_;
    const bool movable = hole <= j ? (home <= hole || home > j) : (home <= hole && home > j);
    if (movable) {
      index_[hole] = index_[j];
      index_[j] = kEmpty;
      hole = j;
    }
  }
  if (marked_) removed_.push_back(key);
  // The last row moves into the freed place.
  const uint64_t last = rows_ - 1;
  if (row != last) {
    std::memcpy(RowPtr(row), RowPtr(last), stride_);
    const uint64_t moved = Header(row)->key;
    const size_t slot = FindSlot(moved, TagOf(moved), &found);
    CHECK(found);
    index_[slot] = (index_[slot] & ~0xffffffffull) | row;
  }
  --rows_;
  if (rows_ % kChunkRows == 0 && chunks_.size() > rows_ / kChunkRows) chunks_.pop_back();
}

bool SparseTable::Admit(uint64_t key) {
  if (admit_min_count_ > 1) {
    if (pending_.size() >= max_pending_keys_ && pending_.count(key) == 0) {
      // Forget every count rather than grow without bound.
      pending_.clear();
    }
    uint32_t& seen = pending_[key];
    if (++seen < admit_min_count_) return false;
  }
  if (admit_probability_ < 1.0) {
    rng_ += 0x9e3779b97f4a7c15ull;
    const double u = static_cast<double>(SplitMix64(rng_) >> 11) * 0x1.0p-53;
    if (u >= admit_probability_) return false;
  }
  if (admit_min_count_ > 1) pending_.erase(key);
  return true;
}

void SparseTable::Update(const uint64_t* keys, size_t n, const float* grad, float grad_scale) {
  ++stats_.updates;
  const uint32_t now = static_cast<uint32_t>(stats_.updates);
  uint64_t hints[kGroup];
  for (size_t base = 0; base < n; base += kGroup) {
    const size_t m = std::min(kGroup, n - base);
    // Rows do not move within this loop (AddRow appends; nothing is
    // removed before the evictions below), so the hints stay valid.
    Candidates(keys + base, m, stride_, hints);
    for (size_t i = 0; i < m; ++i, grad += dim_) {
      const uint64_t key = keys[base + i];
      uint64_t row = hints[i];
      if (row == kNoRow || Header(row)->key != key) {
        bool found;
        const size_t slot = FindSlot(key, TagOf(key), &found);
        if (found) {
          row = index_[slot] & 0xffffffffu;
        } else if (Admit(key)) {
          row = AddRow(key);
          ++stats_.admitted;
        } else {
          ++stats_.rejected;
          continue;
        }
      }
      RowHeader* h = Header(row);
      if (h->updates != ~0u) ++h->updates;
      h->last_update = now;
      float* v = Values(row);
      optimizer_->Apply(v, v + dim_, grad, grad_scale, dim_, h->updates);
    }
  }
  if (idle_updates_ > 0) EvictIdle(std::max<size_t>(64, 2 * n));
  if (capacity_rows_ > 0 && rows_ > capacity_rows_) EvictToCapacity();
}

void SparseTable::EvictIdle(size_t budget) {
  const uint32_t now = static_cast<uint32_t>(stats_.updates);
  for (size_t k = 0; k < budget && rows_ > 0; ++k) {
    if (sweep_ >= rows_) sweep_ = 0;
    const RowHeader* h = Header(sweep_);
    if (static_cast<uint32_t>(now - h->last_update) > idle_updates_) {
      // The last row moves here: look at this place again.
      RemoveRow(h->key);
      ++stats_.evicted_idle;
    } else {
      ++sweep_;
    }
  }
}

void SparseTable::EvictToCapacity() {
  // Down to 95% of the capacity, so that a full table does not select
  // victims on every update.
  const uint64_t target = capacity_rows_ - capacity_rows_ / 20;
  const uint64_t victims = rows_ - std::min(rows_, target);
  struct Candidate {
    uint32_t updates, idle;
    uint64_t key;
  };
  const uint32_t now = static_cast<uint32_t>(stats_.updates);
  std::vector<Candidate> all;
  all.reserve(rows_);
  for (uint64_t r = 0; r < rows_; ++r) {
    const RowHeader* h = Header(r);
    all.push_back({h->updates, now - h->last_update, h->key});
  }
  // Least frequently updated first; among equals, the longest idle. Rows
  // this very update touched go last: a key just admitted is not dropped
  // before it had a chance to gather updates.
  // Ties go by key, so the victims do not depend on the rows' order in
  // memory (which a restore from checkpoint does not reproduce).
  auto before = [](const Candidate& a, const Candidate& b) {
    if ((a.idle == 0) != (b.idle == 0)) return b.idle == 0;
    if (a.updates != b.updates) return a.updates < b.updates;
    return a.idle != b.idle ? a.idle > b.idle : a.key < b.key;
  };
  std::nth_element(all.begin(), all.begin() + (victims - 1), all.end(), before);
  for (uint64_t i = 0; i < victims; ++i) RemoveRow(all[i].key);
  stats_.evicted_capacity += victims;
  sweep_ = 0;
}

void SparseTable::SetClock(const Clock& c) {
  stats_.updates = c.updates;
  rng_ = c.rng;
  sweep_ = c.sweep;
}

void SparseTable::ExportRows(bool all, std::string* out) const {
  const uint32_t now = static_cast<uint32_t>(stats_.updates);
  all = all || !marked_;
  for (uint64_t r = 0; r < rows_; ++r) {
    // Updated after the mark: fewer updates ago than the mark was.
    if (all || static_cast<uint32_t>(now - Header(r)->last_update) <
                   static_cast<uint32_t>(now - clean_mark_)) {
      out->append(RowPtr(r), stride_);
    }
  }
}

void SparseTable::ExportRemoved(std::string* out) const {
  out->append(reinterpret_cast<const char*>(removed_.data()), removed_.size() * sizeof(uint64_t));
}

void SparseTable::ExportPending(std::string* out) const {
  for (const auto& [key, count] : pending_) {
    out->append(reinterpret_cast<const char*>(&key), sizeof(key));
    out->append(reinterpret_cast<const char*>(&count), sizeof(count));
  }
}

void SparseTable::MarkClean() {
  marked_ = true;
  clean_mark_ = static_cast<uint32_t>(stats_.updates);
  removed_.clear();
}

absl::Status SparseTable::ImportRows(absl::string_view records) {
  if (records.size() % stride_ != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        records.size(), " bytes of rows is not a whole number of ", stride_, "-byte rows"));
  }
  for (size_t off = 0; off < records.size(); off += stride_) {
    uint64_t key;
    std::memcpy(&key, records.data() + off, sizeof(key));
    bool found;
    const size_t slot = FindSlot(key, TagOf(key), &found);
    const uint64_t row = found ? (index_[slot] & 0xffffffffu) : AddRow(key);
    std::memcpy(RowPtr(row), records.data() + off, stride_);
  }
  return absl::OkStatus();
}

absl::Status SparseTable::RemoveKeys(absl::string_view keys) {
  if (keys.size() % sizeof(uint64_t) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(keys.size(), " bytes of removed keys is not a whole number of 8-byte keys"));
  }
  for (size_t off = 0; off < keys.size(); off += sizeof(uint64_t)) {
    uint64_t key;
    std::memcpy(&key, keys.data() + off, sizeof(key));
    if (Find(key) != nullptr) RemoveRow(key);
  }
  return absl::OkStatus();
}

absl::Status SparseTable::ImportPending(absl::string_view pairs) {
  constexpr size_t kPair = sizeof(uint64_t) + sizeof(uint32_t);
  if (pairs.size() % kPair != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        pairs.size(), " bytes of admission counts is not a whole number of 12-byte pairs"));
  }
  pending_.clear();
  for (size_t off = 0; off < pairs.size(); off += kPair) {
    uint64_t key;
    uint32_t count;
    std::memcpy(&key, pairs.data() + off, sizeof(key));
    std::memcpy(&count, pairs.data() + off + sizeof(key), sizeof(count));
    pending_[key] = count;
  }
  return absl::OkStatus();
}

SparseTableStats SparseTable::stats() const {
  SparseTableStats s = stats_;
  s.rows = rows_;
  s.pending_keys = pending_.size();
  s.memory_bytes = chunks_.size() * kChunkRows * stride_ + index_.capacity() * sizeof(uint64_t) +
                   pending_.capacity() * (sizeof(std::pair<uint64_t, uint32_t>) + 1);
  return s;
}

}  // namespace strata::pserver
