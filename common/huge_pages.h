// Large buffers filled once (a checkpoint file read back, a data file):
// each fresh page costs a fault, and in a VM a fault is dear. Asking for
// transparent huge pages before the first touch makes it one fault per
// 2 MiB instead of per 4 KiB (docs/performance.md: restore reads).
#ifndef STRATA_COMMON_HUGE_PAGES_H_
#define STRATA_COMMON_HUGE_PAGES_H_

#include <cstddef>
#include <string>

namespace strata {

// madvise(MADV_HUGEPAGE) on the whole 2 MiB pages inside [p, p + n).
// Best effort: does nothing where the kernel says no.
void AdviseHugePages(void* p, size_t n);

// Makes `s` `n` zero bytes, its memory advised for huge pages before it is
// touched when `n` is large (>= 8 MiB). Any previous contents are dropped.
void ResizeLargeString(std::string* s, size_t n);

}  // namespace strata

#endif  // STRATA_COMMON_HUGE_PAGES_H_
