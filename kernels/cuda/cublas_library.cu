#include "kernels/cuda/cublas_library.h"

#include <dlfcn.h>

namespace loom::kernels::cuda::detail {
namespace {

void* Open(const char* const* names) {
  for (const char* const* name = names; *name != nullptr; ++name) {
    if (void* handle = dlopen(*name, RTLD_NOW | RTLD_LOCAL)) return handle;
  }
  return nullptr;
}

}  // namespace

void* OpenCublasLibrary(CublasLibrary library) {
  static const char* const kCublas[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so",
                                        nullptr};
  static const char* const kCublasLt[] = {"libcublasLt.so.13", "libcublasLt.so.12",
                                          "libcublasLt.so", nullptr};
  static void* const cublas = Open(kCublas);
  static void* const cublas_lt = Open(kCublasLt);
  return library == CublasLibrary::kCublas ? cublas : cublas_lt;
}

void* CublasSymbol(CublasLibrary library, const char* name) {
  void* handle = OpenCublasLibrary(library);
  return handle == nullptr ? nullptr : dlsym(handle, name);
}

}  // namespace loom::kernels::cuda::detail
