#include "kernels/cuda/cublas_library.h"

#include <cublas_api.h>  // CUBLAS_VER_MAJOR: the version this build was compiled against
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

#define LOOM_CUBLAS_SONAME_STR2(x) #x
#define LOOM_CUBLAS_SONAME_STR(x) LOOM_CUBLAS_SONAME_STR2(x)

void* OpenCublasLibrary(CublasLibrary library) {
  // The major version the build's headers declare first (its ABI), then the unversioned
  // name a toolkit's lib64 also has; never another major's library before our own.
  static const char* const kCublas[] = {
      "libcublas.so." LOOM_CUBLAS_SONAME_STR(CUBLAS_VER_MAJOR), "libcublas.so", nullptr};
  static const char* const kCublasLt[] = {
      "libcublasLt.so." LOOM_CUBLAS_SONAME_STR(CUBLAS_VER_MAJOR), "libcublasLt.so", nullptr};
  static void* const cublas = Open(kCublas);
  static void* const cublas_lt = Open(kCublasLt);
  return library == CublasLibrary::kCublas ? cublas : cublas_lt;
}

void* CublasSymbol(CublasLibrary library, const char* name) {
  void* handle = OpenCublasLibrary(library);
  return handle == nullptr ? nullptr : dlsym(handle, name);
}

}  // namespace loom::kernels::cuda::detail
