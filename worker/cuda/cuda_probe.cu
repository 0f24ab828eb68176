// Placeholder for the CUDA device: reports the number of visible GPUs.
// Compiled in every build with STRATA_WITH_CUDA so the toolchain stays tested.
#include <cuda_runtime.h>

namespace strata::worker::cuda {

int VisibleGpuCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

}  // namespace strata::worker::cuda
