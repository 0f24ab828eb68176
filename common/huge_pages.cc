#include "common/huge_pages.h"

#include <sys/mman.h>

#include <cstdint>

namespace strata {

void AdviseHugePages(void* p, size_t n) {
  constexpr uintptr_t kHuge = 2u << 20;
  const auto begin = reinterpret_cast<uintptr_t>(p);
  const uintptr_t first = (begin + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (begin + n) & ~(kHuge - 1);
  if (end <= first) return;
#ifdef MADV_HUGEPAGE
  madvise(reinterpret_cast<void*>(first), end - first, MADV_HUGEPAGE);
#endif
}

void ResizeLargeString(std::string* s, size_t n) {
  constexpr size_t kLarge = 8u << 20;
  s->clear();
  if (n >= kLarge && s->capacity() < n) {
    std::string fresh;
    fresh.reserve(n);  // not touched yet but for its first bytes
    AdviseHugePages(fresh.data(), n);
    s->swap(fresh);
  }
  s->resize(n);
}

}  // namespace strata
