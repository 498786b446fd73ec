#pragma once

// cuBLAS / cuBLASLt loaded at first use (dlopen) instead of linked: loading libcublasLt at
// start-up puts its large static TLS into every thread, and threads created with small
// stacks (civetweb's, behind the metrics endpoints) then fail to start. CPU-only runs
// never load it. Include after <cublas_v2.h> / <cublasLt.h>; inside kernels/ only.

#include <cstddef>

namespace loom::kernels::cuda::detail {

enum class CublasLibrary { kCublas, kCublasLt };

/// The library's handle, opened once (thread-safe); nullptr when it cannot be loaded.
void* OpenCublasLibrary(CublasLibrary library);
/// The symbol `name` of `library`; nullptr when the library or the symbol is missing.
void* CublasSymbol(CublasLibrary library, const char* name);

template <typename Fn>
Fn ResolveCublas(CublasLibrary library, const char* name) {
  return reinterpret_cast<Fn>(CublasSymbol(library, name));
}

}  // namespace loom::kernels::cuda::detail

#define LOOM_CUBLAS_STR2(x) #x
#define LOOM_CUBLAS_STR(x) LOOM_CUBLAS_STR2(x)
// The function pointer of a cuBLAS / cuBLASLt entry point (its macro alias resolved, e.g.
// cublasCreate -> cublasCreate_v2). Callers check OpenCublasLibrary first.
#define LOOM_CUBLAS(fn)                                                        \
  (::loom::kernels::cuda::detail::ResolveCublas<decltype(&fn)>(                \
      ::loom::kernels::cuda::detail::CublasLibrary::kCublas, LOOM_CUBLAS_STR(fn)))
#define LOOM_CUBLAS_LT(fn)                                                     \
  (::loom::kernels::cuda::detail::ResolveCublas<decltype(&fn)>(                \
      ::loom::kernels::cuda::detail::CublasLibrary::kCublasLt, LOOM_CUBLAS_STR(fn)))
