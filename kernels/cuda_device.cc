#include "kernels/cuda_device.h"

#if LOOM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace loom::kernels {

bool CudaCompiledIn() {
#if LOOM_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

int CudaDeviceCount() {
#if LOOM_HAVE_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" / "no device" error
    return 0;
  }
  return count;
#else
  return 0;
#endif
}

std::string CudaDeviceDescription(int index) {
#if LOOM_HAVE_CUDA
  if (index < 0 || index >= CudaDeviceCount()) return "no CUDA device " + std::to_string(index);
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, index) != cudaSuccess) {
    return std::string("cudaGetDeviceProperties failed: ") + cudaGetErrorString(cudaGetLastError());
  }
  return std::string(prop.name) + " (sm_" + std::to_string(prop.major) +
         std::to_string(prop.minor) + ")";
#else
  (void)index;
  return "built without CUDA";
#endif
}

}  // namespace loom::kernels
