#include "worker/host_aggregator.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstring>
#include <map>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/aggregation.h"
#include "common/status_macros.h"
#include "common/vector_ops.h"
#include "glog/logging.h"

namespace strata::worker {
namespace {

constexpr uint64_t kMagic = 0x5354524154414732ull;  // "STRATAG2"
constexpr size_t kHeaderBytes = 256;
constexpr size_t kSlotHeaderBytes = 64;

size_t RoundUp64(size_t n) { return (n + 63) / 64 * 64; }

// Bytes of a slot's sparse area for `sparse`: its keys, then each table's
// rows.
size_t SparseBytes(const SparseLayout& sparse) {
  if (sparse.empty()) return 0;
  size_t bytes = RoundUp64(sparse.max_keys * sizeof(uint64_t));
  for (int dim : sparse.dims) bytes += RoundUp64(sparse.max_keys * dim * sizeof(float));
  return bytes;
}

// The whole segment: its header and the parameters, then `slots` slots of
// a header, a gradient of `floats` and `sparse_bytes` of rows.
size_t SegmentBytes(size_t floats, uint32_t slots, size_t sparse_bytes) {
  return kHeaderBytes + RoundUp64(floats * sizeof(float)) +
         static_cast<size_t>(slots) *
             (kSlotHeaderBytes + RoundUp64(floats * sizeof(float)) + sparse_bytes);
}

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

}  // namespace

// (Every field a process reads while another writes is atomic; the
// gradients and parameters themselves are read under their slot's and the
// parameters' sequence words.)
struct HostSegment::Header {
  std::atomic<uint64_t> magic;  // kMagic once the creator has set it up
  uint64_t floats;
  uint32_t slots;
  std::atomic<uint32_t> attached;  // processes that have it mapped
  std::atomic<uint32_t> generation;
  uint32_t unused;
  std::atomic<uint64_t> params_seq;      // odd while parameters are written
  std::atomic<uint64_t> params_version;  // version + 1 of those published; 0 = none
  std::atomic<int32_t> publisher;        // the pid writing them (while params_seq is odd)
  uint64_t sparse_keys;                  // keys a slot holds (the sparse layout's max_keys)
  uint64_t sparse_floats;                // floats of a key's rows, over the sparse tables
};

struct HostSegment::Slot {
  std::atomic<uint32_t> owner;  // node id; 0 = free
  uint32_t unused;
  std::atomic<uint64_t> posted;  // step + 1 of the gradient in it; 0 = none (or being written)
  uint64_t count;
  uint64_t keys;  // sparse rows in it
};

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) &&
                  std::atomic<uint32_t>::is_always_lock_free &&
                  std::atomic<uint64_t>::is_always_lock_free,
              "the segment's atomics are shared between processes");

std::string HostSegment::NameFor(uint64_t key, const std::string& host) {
  std::string h;
  for (char c : host.substr(0, 100)) {
    h += std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' ? c : '_';
  }
  return absl::StrFormat("/strata-agg-%016x-%s", key, h);
}

absl::StatusOr<std::unique_ptr<HostSegment>> HostSegment::Open(
    const std::string& name, const std::vector<size_t>& table_sizes, uint32_t slots,
    SparseLayout sparse) {
  if (sparse.tables.size() != sparse.dims.size() || (!sparse.empty() && sparse.max_keys == 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shared memory segment ", name, ": ", sparse.tables.size(), " sparse tables and ",
        sparse.dims.size(), " row widths, at most ", sparse.max_keys, " keys a step"));
  }
  const size_t floats = std::accumulate(table_sizes.begin(), table_sizes.end(), size_t{0});
  size_t sparse_bytes = SparseBytes(sparse);
  const size_t row_floats = std::accumulate(sparse.dims.begin(), sparse.dims.end(), size_t{0});
  size_t size = SegmentBytes(floats, slots, sparse_bytes);
  bool creator = true;
  int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0 && errno == EEXIST) {
    creator = false;
    fd = shm_open(name.c_str(), O_RDWR, 0);
  }
  if (fd < 0) return Errno(absl::StrCat("shared memory segment ", name));
  // The header and the parameters get their pages now, a slot when it is
  // claimed: a /dev/shm too small is an error naming the segment, not a
  // SIGBUS on a write into the mapping.
  int err = 0;
  if (creator) {
    err = ftruncate(fd, static_cast<off_t>(size)) != 0
              ? errno
              : posix_fallocate(
                    fd, 0, static_cast<off_t>(kHeaderBytes + RoundUp64(floats * sizeof(float))));
  }
  if (err != 0) {
    absl::Status s =
        absl::ResourceExhaustedError(absl::StrCat("sizing shared memory segment ", name, " (", size,
                                                  " bytes in /dev/shm): ", std::strerror(err)));
    close(fd);
    shm_unlink(name.c_str());
    return s;
  }
  // Another worker of the host made it: wait (briefly) for its size.
  struct stat st {};
  for (int i = 0; i < 2000; ++i) {
    if (fstat(fd, &st) != 0 || st.st_size != 0) break;
    usleep(1000);
  }
  if (!creator && !sparse.empty() && static_cast<size_t>(st.st_size) >= kHeaderBytes) {
    // The keys a slot holds are the creator's (its view of the job's
    // workers may differ from this worker's).
    void* head = mmap(nullptr, kHeaderBytes, PROT_READ, MAP_SHARED, fd, 0);
    if (head != MAP_FAILED) {
      const Header* h = static_cast<const Header*>(head);
      for (int i = 0; i < 2000 && h->magic.load(std::memory_order_acquire) != kMagic; ++i) {
        usleep(1000);
      }
      if (h->magic.load(std::memory_order_acquire) == kMagic && h->sparse_keys > 0) {
        sparse.max_keys = h->sparse_keys;
        sparse_bytes = SparseBytes(sparse);
        size = SegmentBytes(floats, slots, sparse_bytes);
      }
      munmap(head, kHeaderBytes);
    }
  }
  if (static_cast<size_t>(st.st_size) != size) {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("shared memory segment ", name, " (/dev/shm) has ", st.st_size, " bytes, ",
                     size, " expected for a model of ", floats, " floats",
                     sparse.empty() ? "" : absl::StrCat(" and ", sparse.max_keys, " sparse keys"),
                     " and ", slots, " workers: another model's (remove it if no job uses it)"));
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    absl::Status s = Errno(absl::StrCat("mapping shared memory segment ", name));
    close(fd);
    return s;
  }
  std::unique_ptr<HostSegment> seg(
      new HostSegment(name, fd, static_cast<char*>(base), size, table_sizes, slots, sparse));
  Header* h = seg->header();
  if (creator) {
    h->floats = floats;
    h->slots = slots;
    h->sparse_keys = sparse.max_keys;
    h->sparse_floats = row_floats;
    h->magic.store(kMagic, std::memory_order_release);
  } else {
    for (int i = 0; i < 2000 && h->magic.load(std::memory_order_acquire) != kMagic; ++i) {
      usleep(1000);
    }
    if (h->magic.load(std::memory_order_acquire) != kMagic || h->floats != floats ||
        h->slots != slots || h->sparse_keys != sparse.max_keys || h->sparse_floats != row_floats) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shared memory segment ", name, " was set up for another model: ", h->floats, " floats, ",
          h->sparse_keys, " sparse keys of ", h->sparse_floats, " floats and ", h->slots,
          " workers, not ", floats, ", ", sparse.max_keys, " of ", row_floats, " and ", slots,
          " (remove it from /dev/shm if no job uses it)"));
    }
  }
  h->attached.fetch_add(1);
  seg->attached_ = true;
  return seg;
}

HostSegment::HostSegment(std::string name, int fd, char* base, size_t size,
                         std::vector<size_t> table_sizes, uint32_t slots, SparseLayout sparse)
    : name_(std::move(name)),
      fd_(fd),
      base_(base),
      size_(size),
      table_sizes_(std::move(table_sizes)),
      floats_(std::accumulate(table_sizes_.begin(), table_sizes_.end(), size_t{0})),
      slots_(slots),
      sparse_(std::move(sparse)),
      keys_ready_(slots, 0) {}

HostSegment::~HostSegment() {
  if (attached_ && header()->attached.fetch_sub(1) == 1) shm_unlink(name_.c_str());
  munmap(base_, size_);
  close(fd_);
}

void HostSegment::Unlink() const { shm_unlink(name_.c_str()); }

HostSegment::Header* HostSegment::header() const { return reinterpret_cast<Header*>(base_); }

float* HostSegment::params() const { return reinterpret_cast<float*>(base_ + kHeaderBytes); }

size_t HostSegment::slot_data_bytes() const {
  return RoundUp64(floats_ * sizeof(float)) + SparseBytes(sparse_);
}

HostSegment::Slot* HostSegment::slot(uint32_t i) const {
  return reinterpret_cast<Slot*>(base_ + kHeaderBytes + RoundUp64(floats_ * sizeof(float)) +
                                 i * (kSlotHeaderBytes + slot_data_bytes()));
}

float* HostSegment::slot_floats(uint32_t i) const {
  return reinterpret_cast<float*>(reinterpret_cast<char*>(slot(i)) + kSlotHeaderBytes);
}

uint64_t* HostSegment::slot_keys(uint32_t i) const {
  return reinterpret_cast<uint64_t*>(reinterpret_cast<char*>(slot(i)) + kSlotHeaderBytes +
                                     RoundUp64(floats_ * sizeof(float)));
}

float* HostSegment::slot_rows(uint32_t i, size_t t) const {
  char* at = reinterpret_cast<char*>(slot_keys(i)) + RoundUp64(sparse_.max_keys * sizeof(uint64_t));
  for (size_t u = 0; u < t; ++u)
    at += RoundUp64(sparse_.max_keys * sparse_.dims[u] * sizeof(float));
  return reinterpret_cast<float*>(at);
}

int HostSegment::FindSlot(uint32_t worker) const {
  for (uint32_t i = 0; i < slots_; ++i) {
    if (slot(i)->owner.load(std::memory_order_acquire) == worker) return static_cast<int>(i);
  }
  return -1;
}

void HostSegment::Wake() {
  std::atomic<uint32_t>& g = header()->generation;
  g.fetch_add(1, std::memory_order_release);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&g), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

uint32_t HostSegment::generation() const {
  return header()->generation.load(std::memory_order_acquire);
}

void HostSegment::WaitChange(uint32_t seen, absl::Duration timeout) const {
  std::atomic<uint32_t>& g = header()->generation;
  if (g.load(std::memory_order_acquire) != seen) return;
  const struct timespec ts = absl::ToTimespec(timeout);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&g), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

absl::Status HostSegment::Post(uint32_t worker, uint64_t step, uint64_t count,
                               const std::vector<std::vector<float>>& grads,
                               const SparseGrads* sparse) {
  const size_t n_keys = sparse == nullptr ? 0 : sparse->n;
  if (n_keys > sparse_.max_keys ||
      (sparse != nullptr && sparse->rows.size() != sparse_.tables.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shared memory segment ", name_, ": worker ", worker, "'s step ", step, " has ", n_keys,
        " distinct keys of ", sparse == nullptr ? 0 : sparse->rows.size(),
        " sparse tables; its slots hold ", sparse_.max_keys, " keys of ", sparse_.tables.size(),
        " (job.batch_size x the job's workers x the model's fields, as the segment's creator "
        "saw them)"));
  }
  int i = FindSlot(worker);
  for (uint32_t k = 0; i < 0 && k < slots_; ++k) {
    uint32_t free = 0;
    if (!slot(k)->owner.compare_exchange_strong(free, worker)) continue;
    const char* at = reinterpret_cast<const char*>(slot(k));
    // (The sparse rows' pages are taken as keys come: ReserveKeys.)
    const size_t bytes = kSlotHeaderBytes + RoundUp64(floats_ * sizeof(float));
    if (const int err = posix_fallocate(fd_, at - base_, static_cast<off_t>(bytes)); err != 0) {
      slot(k)->owner.store(0, std::memory_order_release);
      return absl::ResourceExhaustedError(
          absl::StrCat("shared memory segment ", name_, ": ", bytes, " bytes for worker ", worker,
                       "'s slot in /dev/shm: ", std::strerror(err)));
    }
    i = static_cast<int>(k);
    keys_ready_[k] = 0;
  }
  if (i < 0) {
    return absl::ResourceExhaustedError(absl::StrCat("shared memory segment ", name_, ": all ",
                                                     slots_, " worker slots of the host taken"));
  }
  Slot* s = slot(i);
  s->posted.store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  float* out = slot_floats(i);
  for (size_t t = 0; t < grads.size() && t < table_sizes_.size(); ++t) {
    std::memcpy(out, grads[t].data(), table_sizes_[t] * sizeof(float));
    out += table_sizes_[t];
  }
  if (n_keys > keys_ready_[i]) STRATA_RETURN_IF_ERROR(ReserveKeys(i, n_keys, worker));
  if (n_keys > 0) {
    std::memcpy(slot_keys(i), sparse->keys, n_keys * sizeof(uint64_t));
    for (size_t t = 0; t < sparse_.tables.size(); ++t) {
      std::memcpy(slot_rows(i, t), sparse->rows[t], n_keys * sparse_.dims[t] * sizeof(float));
    }
  }
  s->count = count;
  s->keys = n_keys;
  // (A worker the view has let go of, still running, finds its slot
  // freed, perhaps taken: it stamps nothing.)
  if (s->owner.load(std::memory_order_acquire) != worker) {
    return absl::AbortedError(absl::StrCat("shared memory segment ", name_, ": worker ", worker,
                                           "'s slot was freed: it has left the job"));
  }
  s->posted.store(step + 1, std::memory_order_release);
  Wake();
  return absl::OkStatus();
}

std::optional<uint64_t> HostSegment::published() const {
  const uint64_t v = header()->params_version.load(std::memory_order_acquire);
  if (v == 0) return std::nullopt;
  return v - 1;
}

std::optional<uint64_t> HostSegment::ReadParams(uint64_t want,
                                                std::vector<std::vector<float>>* params) const {
  Header* h = header();
  params->resize(table_sizes_.size());
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const uint64_t s1 = h->params_seq.load(std::memory_order_acquire);
    if (s1 % 2 == 1) {
      sched_yield();
      continue;
    }
    const uint64_t v = h->params_version.load(std::memory_order_relaxed);
    if (v == 0 || v - 1 < want) return std::nullopt;
    const float* in = this->params();
    for (size_t t = 0; t < table_sizes_.size(); ++t) {
      (*params)[t].resize(table_sizes_[t]);
      std::memcpy((*params)[t].data(), in, table_sizes_[t] * sizeof(float));
      in += table_sizes_[t];
    }
    std::atomic_thread_fence(std::memory_order_acquire);
    if (h->params_seq.load(std::memory_order_relaxed) == s1) return v - 1;
  }
  return std::nullopt;
}

absl::Status HostSegment::ReserveKeys(uint32_t i, size_t n, uint32_t worker) {
  auto reserve = [&](const void* at, size_t bytes) {
    return posix_fallocate(fd_, static_cast<const char*>(at) - base_, static_cast<off_t>(bytes));
  };
  int err = reserve(slot_keys(i), n * sizeof(uint64_t));
  for (size_t t = 0; err == 0 && t < sparse_.tables.size(); ++t) {
    err = reserve(slot_rows(i, t), n * sparse_.dims[t] * sizeof(float));
  }
  if (err != 0) {
    return absl::ResourceExhaustedError(absl::StrCat("shared memory segment ", name_, ": room for ",
                                                     n, " sparse rows of worker ", worker,
                                                     " in /dev/shm: ", std::strerror(err)));
  }
  keys_ready_[i] = n;
  return absl::OkStatus();
}

void HostSegment::MergeRows(uint32_t i, size_t n, MergedRows* merged) const {
  const uint64_t* keys = slot_keys(i);
  for (size_t k = 0; k < n; ++k) {
    const auto [it, added] =
        merged->index.try_emplace(keys[k], static_cast<uint32_t>(merged->keys.size()));
    if (added) merged->keys.push_back(keys[k]);
    for (size_t t = 0; t < sparse_.tables.size(); ++t) {
      const size_t dim = sparse_.dims[t];
      std::vector<float>& rows = merged->rows[t];
      const float* in = slot_rows(i, t) + k * dim;
      if (added) {
        rows.insert(rows.end(), in, in + dim);
      } else {
        AddInto(rows.data() + static_cast<size_t>(it->second) * dim, in, dim);
      }
    }
  }
}

std::optional<uint64_t> HostSegment::Sum(uint64_t step, const std::vector<uint32_t>& workers,
                                         std::vector<std::vector<float>>* sum,
                                         MergedRows* merged) const {
  if (workers.empty()) return std::nullopt;
  if (merged != nullptr) {
    merged->keys.clear();
    merged->index.clear();
    merged->rows.resize(sparse_.tables.size());
    for (std::vector<float>& rows : merged->rows) rows.clear();
  }
  sum->resize(table_sizes_.size());
  for (size_t t = 0; t < table_sizes_.size(); ++t) (*sum)[t].resize(table_sizes_[t]);
  uint64_t total = 0;
  bool first = true;
  for (uint32_t w : workers) {
    const int i = FindSlot(w);
    if (i < 0) return std::nullopt;
    const Slot* s = slot(i);
    const uint64_t p1 = s->posted.load(std::memory_order_acquire);
    if (p1 != step + 1) return std::nullopt;
    const float* in = slot_floats(i);
    for (size_t t = 0; t < table_sizes_.size(); ++t) {
      float* out = (*sum)[t].data();
      if (first) {
        std::memcpy(out, in, table_sizes_[t] * sizeof(float));
      } else {
        AddInto(out, in, table_sizes_[t]);
      }
      in += table_sizes_[t];
    }
    const uint64_t count = s->count;
    if (merged != nullptr) MergeRows(i, std::min<uint64_t>(s->keys, sparse_.max_keys), merged);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s->posted.load(std::memory_order_relaxed) != p1) return std::nullopt;  // rewritten
    total += count;
    first = false;
  }
  return total;
}

bool HostSegment::Publish(uint64_t version, const std::vector<std::vector<float>>& params) {
  Header* h = header();
  uint64_t s = h->params_seq.load(std::memory_order_acquire);
  uint64_t mine = s + 1;
  if (s % 2 == 1) {
    // Another process is publishing; taken over only when it died doing so.
    const int32_t pid = h->publisher.load(std::memory_order_acquire);
    if (pid <= 0 || pid == getpid() || kill(pid, 0) == 0 || errno != ESRCH) return false;
    mine = s + 2;
  }
  if (!h->params_seq.compare_exchange_strong(s, mine)) return false;
  h->publisher.store(getpid(), std::memory_order_release);
  // Never back: two processes that both took themselves for the host's
  // aggregating worker (views arrive at different times) may finish out
  // of order. (The same version again: new values of it, as a host with
  // no step of its own publishes the ring's; the word holds version + 1.)
  if (h->params_version.load(std::memory_order_relaxed) > version + 1) {
    h->params_seq.compare_exchange_strong(mine, mine + 1);
    return true;
  }
  std::atomic_thread_fence(std::memory_order_release);
  float* out = this->params();
  for (size_t t = 0; t < params.size() && t < table_sizes_.size(); ++t) {
    std::memcpy(out, params[t].data(), table_sizes_[t] * sizeof(float));
    out += table_sizes_[t];
  }
  h->params_version.store(version + 1, std::memory_order_relaxed);
  // (A CAS: if the word was taken over meanwhile, the taker's stands.)
  h->params_seq.compare_exchange_strong(mine, mine + 1, std::memory_order_release);
  Wake();
  return true;
}

void HostSegment::Release(uint32_t worker) {
  const int i = FindSlot(worker);
  if (i < 0) return;
  slot(i)->posted.store(0, std::memory_order_relaxed);
  slot(i)->owner.store(0, std::memory_order_release);
  Wake();
}

HostAggregator::HostAggregator(std::unique_ptr<HostSegment> segment, ParamClient* params,
                               Options options, std::vector<size_t> table_sizes)
    : segment_(std::move(segment)),
      params_(params),
      options_(std::move(options)),
      table_sizes_(std::move(table_sizes)) {}

HostAggregator::~HostAggregator() { Stop(); }

void HostAggregator::Start() {
  thread_ = std::thread([this] { Loop(); });
}

absl::Status HostAggregator::fatal() const {
  absl::MutexLock l(&fatal_mu_);
  return fatal_;
}

void HostAggregator::Stop() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

void HostAggregator::Loop() {
  while (!stop_.HasBeenNotified()) {
    if (options_.ring != nullptr && options_.ring->over()) {
      // The job is over: its ring has ended; the worker stops this thread.
      stop_.WaitForNotificationWithTimeout(absl::Milliseconds(100));
      continue;
    }
    const uint32_t seen = segment_->generation();
    const std::vector<uint32_t> workers = params_->HostWorkers(options_.host);
    const bool lead = Leads(workers);
    if (lead != leading_) {
      leading_ = lead;
      LOG(INFO) << "node " << options_.self << (lead ? " now aggregates" : " no longer aggregates")
                << " the gradients of host " << options_.host << " (" << workers.size()
                << " workers; " << segment_->name() << ")";
    }
    if (!lead && options_.ring != nullptr && options_.ring->in_ring()) {
      // No longer the host's member of the ring, but in the ring still:
      // the others learn of the new view in a step, all at the same one,
      // and form its ring there. Until then this worker steps with them,
      // with no samples (its host's next sum is the new member's).
      if (absl::Status s = options_.ring->IdleFor(absl::Milliseconds(20)); !s.ok()) {
        LOG(WARNING) << "host " << options_.host << ": leaving the ring: " << s;
      }
      continue;
    }
    if (!lead) {
      segment_->WaitChange(seen, absl::Milliseconds(100));
      continue;
    }
    for (uint32_t gone : params_->WorkersGone()) segment_->Release(gone);
    absl::StatusOr<bool> did = options_.ring != nullptr ? LeadRingOnce(workers) : LeadOnce(workers);
    if (!did.ok()) {
      if (stop_.HasBeenNotified()) break;
      if (options_.ring != nullptr && options_.ring->gave_up()) {
        LOG(ERROR) << "host " << options_.host << ": " << did.status();
        absl::MutexLock l(&fatal_mu_);
        fatal_ = did.status();
        failed_ = true;
        break;
      }
      // (Cancelled: the job is over, the ring ended; the worker stops this.)
      LOG_IF(WARNING, !absl::IsCancelled(did.status()))
          << "host " << options_.host << ": aggregated step: " << did.status();
      stop_.WaitForNotificationWithTimeout(absl::Milliseconds(100));
    } else if (!*did) {
      segment_->WaitChange(seen, absl::Milliseconds(20));
    }
  }
}

bool HostAggregator::Leads(const std::vector<uint32_t>& workers) const {
  if (options_.ring == nullptr) return !workers.empty() && workers.front() == options_.self;
  // (A host whose workers have all finished is still the ring's member:
  // they evaluate with its parameters.)
  const std::map<std::string, uint32_t> leaders = RingLeadersByHost(params_->Members());
  auto it = leaders.find(options_.host);
  return it != leaders.end() && it->second == options_.self;
}

void HostAggregator::PublishOrStop(uint64_t version,
                                   const std::vector<std::vector<float>>& params) {
  while (!segment_->Publish(version, params)) {
    if (stop_.WaitForNotificationWithTimeout(absl::Milliseconds(1))) break;
  }
}

absl::StatusOr<bool> HostAggregator::LeadRingOnce(const std::vector<uint32_t>& workers) {
  // The host's version is the ring's updates, its steps with samples at
  // any host: the same at every host, and the pservers' version (a CTR
  // model's sparse rows go there at it; a host whose workers all
  // finished is out of the pservers' step set meanwhile), so that a host
  // that idles keeps up with the job's steps (its workers evaluate at the
  // version after the job's last, and a task it gets again pushes at the
  // pservers' step). The ring numbers its own steps.
  DenseRing* const ring = options_.ring;
  const std::vector<std::vector<float>>& tables = *options_.ring_tables;
  const std::optional<uint64_t> at = segment_->published();
  if (!at.has_value()) {
    // The host's first version: the ring's updates (0, or those of the
    // checkpoint it resumed from, where the pservers are) and parameters
    // (Form agrees on them).
    STRATA_RETURN_IF_ERROR(ring->Join());
    if (!ring->in_ring()) return false;  // (the view has no ring with it yet)
    PublishOrStop(ring->updates(), tables);
    return true;
  }
  if (workers.empty()) {
    // Every worker of the host has finished: the ring's other members go
    // on meanwhile, and its workers evaluate with the ring's parameters.
    STRATA_RETURN_IF_ERROR(ring->IdleFor(absl::Milliseconds(100)));
    PublishOrStop(ring->updates(), tables);
    return true;
  }
  const bool sparse = !segment_->sparse().empty();
  const std::optional<uint64_t> count =
      segment_->Sum(*at, workers, &sum_, sparse ? &merged_ : nullptr);
  if (!count.has_value()) return false;
  // The sparse rows go out first and are settled after the ring's step:
  // the pservers' step waits for every host's rows, the ring's for every
  // host's aggregating worker, and neither may wait on the other (a
  // worker taking over forms a ring with the others while their rows wait
  // for its host's). The pservers drop a second push of a step from the
  // host. (None with no samples: every live worker of the host is between
  // tasks.)
  RowsInFlight rows;
  if (sparse && *count > 0) {
    STRATA_ASSIGN_OR_RETURN(rows, StartRows(*at, *count));
  }
  absl::Status stepped = RingStep(*at, *count, &rows);
  if (absl::Status settled = FinishRows(&rows); stepped.ok()) stepped = settled;
  return stepped.ok() ? absl::StatusOr<bool>(true) : stepped;
}

absl::Status HostAggregator::RingStep(uint64_t at, uint64_t count, RowsInFlight* rows) {
  DenseRing* const ring = options_.ring;
  const std::vector<std::vector<float>>& tables = *options_.ring_tables;
  if (!ring->in_ring()) {
    // Taking over: the ring's parameters. The host's sum, computed on them
    // as the aggregating worker before published them, counts; unless
    // that worker stepped the ring after it last published (it stepped
    // the host's sum, or none, and went before publishing): the host's
    // version is the ring's updates as last published, so the ring's
    // updates are past it then, and the ring's parameters are published
    // at them. (The ring cannot step without this host's member.)
    STRATA_RETURN_IF_ERROR(ring->Join());
    if (!ring->in_ring())
      return absl::UnavailableError("the view has no ring with this worker yet");
    if (ring->updates() > at) {
      STRATA_RETURN_IF_ERROR(FinishRows(rows));
      PublishOrStop(ring->updates(), tables);
      return absl::OkStatus();
    }
  }
  // A retry of a step whose rows failed to settle after its ring step: the
  // ring has the sum already (the pservers drop a second push of the
  // rows; the ring would apply the sum twice).
  DenseRing::Done done;
  if (count == 0 || ring_stepped_ != at) {
    STRATA_ASSIGN_OR_RETURN(done, ring->TrainStep(sum_, count));
    if (count > 0) ring_stepped_ = at;
  }
  // (What is published is applied everywhere: the rows too.)
  STRATA_RETURN_IF_ERROR(FinishRows(rows));
  if (count == 0) {
    // A ring step with no samples of the host's: the version moves on
    // when another host's had some (its workers are between tasks, so
    // the master has them FINISHED: out of the pservers' step set once
    // the view reaches them).
    PublishOrStop(ring->updates(), tables);
    if (done.samples == 0) stop_.WaitForNotificationWithTimeout(absl::Milliseconds(5));
    return absl::OkStatus();
  }
  steps_pushed_.fetch_add(1);
  LOG_IF(WARNING, ring->updates() != at + 1)
      << "host " << options_.host << ": the ring's updates are " << ring->updates()
      << " after the host's step of version " << at << "; published at them";
  PublishOrStop(ring->updates(), tables);
  return absl::OkStatus();
}

void HostAggregator::IdleFor(absl::Duration duration, const std::vector<std::vector<float>>& zeros,
                             const std::function<bool()>& stopping) {
  const absl::Time until = absl::Now() + duration;
  do {
    const uint32_t seen = segment_->generation();
    if (const std::optional<uint64_t> at = segment_->published(); at.has_value()) {
      if (absl::Status s = segment_->Post(options_.self, *at, 0, zeros); !s.ok()) {
        LOG_EVERY_N(WARNING, 10) << "host " << options_.host << ": idle post: " << s;
      }
    }
    segment_->WaitChange(seen, std::min(absl::Milliseconds(20), until - absl::Now()));
  } while (absl::Now() < until && !stopping());
}

absl::StatusOr<bool> HostAggregator::LeadOnce(const std::vector<uint32_t>& workers) {
  uint64_t version = 0;
  const std::optional<uint64_t> at = segment_->published();
  if (!at.has_value()) {
    STRATA_ASSIGN_OR_RETURN(version, params_->PullAll(0, &pulled_));
  } else {
    const bool sparse = !segment_->sparse().empty();
    const std::optional<uint64_t> count =
        segment_->Sum(*at, workers, &sum_, sparse ? &merged_ : nullptr);
    if (!count.has_value()) return false;
    // Each partition's pull right behind its push: its answer comes back
    // while the later pushes are still going out.
    PushResult pushed;
    ParamClient::PushPull exchange(params_, &sum_, *at, *count, *at + 1, &pulled_);
    exchange.IssueInterleaved();
    // The sparse rows go meanwhile; the pulls of their next version are
    // each worker's own (the keys of its next batch are its own).
    absl::Status rows = sparse ? PushRows(*at, *count) : absl::OkStatus();
    absl::StatusOr<uint64_t> dense = exchange.Finish(&pushed);
    STRATA_RETURN_IF_ERROR(rows);
    STRATA_ASSIGN_OR_RETURN(version, std::move(dense));
    steps_pushed_.fetch_add(1);
    if (pushed.stale_partitions > 0) {
      VLOG(1) << "host " << options_.host << " step " << *at << ": " << pushed.stale_partitions
              << " partitions had the host's gradient already";
    }
  }
  PublishOrStop(version, pulled_);
  return true;
}

absl::Status HostAggregator::PushRows(uint64_t step, uint64_t count) {
  STRATA_ASSIGN_OR_RETURN(RowsInFlight rows, StartRows(step, count));
  return FinishRows(&rows);
}

absl::StatusOr<HostAggregator::RowsInFlight> HostAggregator::StartRows(uint64_t step,
                                                                       uint64_t count) {
  const SparseLayout& layout = segment_->sparse();
  STRATA_RETURN_IF_ERROR(params_->GroupKeys(merged_.keys, &grouped_, &perm_));
  push_rows_.resize(layout.tables.size());
  RowsInFlight rows;
  rows.results.resize(layout.tables.size());
  for (size_t t = 0; t < layout.tables.size(); ++t) {
    const size_t dim = layout.dims[t];
    push_rows_[t].resize(merged_.keys.size() * dim);
    for (size_t u = 0; u < merged_.keys.size(); ++u) {
      std::memcpy(push_rows_[t].data() + static_cast<size_t>(perm_[u]) * dim,
                  merged_.rows[t].data() + u * dim, sizeof(float) * dim);
    }
    // (bsp: every virtual partition, with keys or not, so that each
    // partition's step completes.)
    rows.pushes.push_back(params_->StartSparsePush(layout.tables[t], &grouped_,
                                                   push_rows_[t].data(), step, count,
                                                   /*every_partition=*/true, &rows.results[t]));
    rows.pushes.back()->IssueAll();
  }
  // Right behind the pushes, a pull of no keys at the next version from
  // every virtual partition: answered once the step is applied there, so
  // that what is published next is applied on every partition, sparse
  // ones included (a worker's task is done then).
  std::vector<uint32_t> unused;
  STRATA_RETURN_IF_ERROR(params_->GroupKeys({}, &no_keys_, &unused));
  for (uint32_t table : layout.tables) {
    rows.barriers.push_back(params_->StartSparsePull(table, &no_keys_, nullptr, step + 1,
                                                     /*every_partition=*/true));
    rows.barriers.back()->IssueAll();
  }
  return rows;
}

absl::Status HostAggregator::FinishRows(RowsInFlight* rows) {
  absl::Status status;
  for (auto& push : rows->pushes) status.Update(push->Finish());
  for (auto& barrier : rows->barriers) status.Update(barrier->Finish());
  rows->pushes.clear();
  rows->barriers.clear();
  return status;
}

absl::StatusOr<uint64_t> HostAggregator::AwaitParams(uint64_t want,
                                                     std::vector<std::vector<float>>* params,
                                                     const std::function<bool()>& stopping) {
  return Await(want, params, stopping, nullptr);
}

absl::StatusOr<uint64_t> HostAggregator::AwaitFinalParams(
    uint64_t want, std::vector<std::vector<float>>* params,
    const std::vector<std::vector<float>>& zeros, const std::function<bool()>& stopping) {
  absl::StatusOr<uint64_t> v = Await(want, params, stopping, &zeros);
  if (!absl::IsDeadlineExceeded(v.status())) return v;
  std::optional<uint64_t> published = segment_->ReadParams(0, params);
  if (!published.has_value()) return v;
  LOG(WARNING) << "host " << options_.host << ": evaluating the parameters of version "
               << *published << ", not those after the job's last step (" << want
               << "): " << v.status().message();
  return *published;
}

absl::StatusOr<uint64_t> HostAggregator::Await(uint64_t want,
                                               std::vector<std::vector<float>>* params,
                                               const std::function<bool()>& stopping,
                                               const std::vector<std::vector<float>>* idle) {
  std::optional<uint64_t> last = segment_->published(), posted;
  absl::Time moved = absl::Now();
  while (true) {
    const uint32_t seen = segment_->generation();
    if (std::optional<uint64_t> v = segment_->ReadParams(want, params)) return *v;
    if (stopping()) return absl::CancelledError("worker shut down");
    const std::optional<uint64_t> now = segment_->published();
    if (idle != nullptr && now.has_value() && now != posted) {
      if (absl::Status s = segment_->Post(options_.self, *now, 0, *idle); !s.ok()) {
        LOG(WARNING) << "host " << options_.host << ": idle post: " << s;
      }
      posted = now;
    }
    if (now != last) {
      last = now;
      moved = absl::Now();
    } else if (absl::Now() - moved > options_.request_timeout) {
      const std::vector<uint32_t> workers = params_->HostWorkers(options_.host);
      // A live worker of the host with no slot here never posted: another
      // /dev/shm (a container), or it has not trained yet.
      std::vector<uint32_t> absent;
      for (uint32_t w : workers) {
        if (!segment_->HasSlot(w)) absent.push_back(w);
      }
      return absl::DeadlineExceededError(absl::StrCat(
          "host ", options_.host, ": no parameters of version >= ", want, " published in ",
          segment_->name(), " for ", absl::FormatDuration(options_.request_timeout),
          " (the host's aggregating worker: node ",
          workers.empty() ? std::string("none") : absl::StrCat(workers.front()),
          absent.empty() ? std::string()
                         : absl::StrCat("; never posted here: nodes ", absl::StrJoin(absent, ", "),
                                        ", which must share this host's /dev/shm"),
          ")"));
    }
    segment_->WaitChange(seen, absl::Milliseconds(50));
  }
}

}  // namespace strata::worker
