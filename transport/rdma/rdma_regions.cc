#include "transport/rdma/rdma_regions.h"

namespace strata::transport::rdma {

absl::Status Registry::Register(void* addr, size_t size, bool remote_write) {
  absl::MutexLock l(&mu_);
  const char* base;
  size_t bytes;
  if (FindLocked(static_cast<const char*>(addr), size, remote_write, &base, &bytes)) {
    return absl::OkStatus();
  }
  regions_.emplace(reinterpret_cast<uintptr_t>(addr), Region{size, remote_write});
  return absl::OkStatus();
}

bool Registry::Find(const char* addr, size_t size, bool remote_write, const char** base,
                    size_t* bytes) {
  absl::MutexLock l(&mu_);
  return FindLocked(addr, size, remote_write, base, bytes);
}

bool Registry::FindLocked(const char* addr, size_t size, bool remote_write, const char** base,
                          size_t* bytes) {
  const auto a = reinterpret_cast<uintptr_t>(addr);
  // Regions starting at or before `addr`, nearest first (few: a worker
  // registers one per table).
  for (auto it = regions_.upper_bound(a); it != regions_.begin();) {
    --it;
    if (a + size <= it->first + it->second.size && (!remote_write || it->second.remote_write)) {
      *base = reinterpret_cast<const char*>(it->first);
      *bytes = it->second.size;
      return true;
    }
  }
  return false;
}

}  // namespace strata::transport::rdma
