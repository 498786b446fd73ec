#pragma once

#include <string>

// CUDA's own spelling of a stream handle, so launch signatures compile without the
// CUDA headers on machines and in folders that have none.
typedef struct CUstream_st* cudaStream_t;

namespace loom::kernels {

/// True when Loom was built with CUDA (LOOM_CUDA=AUTO found nvcc, or ON).
bool CudaCompiledIn();

/// Number of usable CUDA devices; 0 when CUDA is not compiled in, there is no driver or
/// no device. Never fails, so CPU-only machines run the same binaries. Thread-safe.
int CudaDeviceCount();

/// "NVIDIA H100 80GB HBM3 (sm_90)" for device `index`, or why none is available.
std::string CudaDeviceDescription(int index);

}  // namespace loom::kernels
