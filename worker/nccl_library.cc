#include "worker/nccl_library.h"

#ifdef LOOM_HAVE_NCCL
#include <dlfcn.h>

#include <cstdlib>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace loom::worker::detail {
absl::StatusOr<NcclApi> OpenNcclLibrary(const std::vector<std::string>& candidates) {
  std::vector<std::string> errors;
  for (const std::string& name : candidates) {
    void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* error = dlerror();
      errors.push_back(error != nullptr ? error : name);
      continue;
    }
    NcclApi api;
    api.path = name;
    std::vector<std::string> missing;
    auto resolve = [&]<typename Fn>(Fn& fn, const char* symbol) {
      fn = reinterpret_cast<Fn>(dlsym(handle, symbol));
      if (fn == nullptr) missing.push_back(symbol);
    };
    resolve(api.GetUniqueId, "ncclGetUniqueId");
    resolve(api.CommInitRankConfig, "ncclCommInitRankConfig");
    resolve(api.CommGetAsyncError, "ncclCommGetAsyncError");
    resolve(api.CommAbort, "ncclCommAbort");
    resolve(api.CommDestroy, "ncclCommDestroy");
    resolve(api.GetErrorString, "ncclGetErrorString");
    resolve(api.AllReduce, "ncclAllReduce");
    resolve(api.AllGather, "ncclAllGather");
    resolve(api.Broadcast, "ncclBroadcast");
    if (missing.empty()) return api;
    errors.push_back(absl::StrCat(name, " lacks ", absl::StrJoin(missing, ", "),
                                  " (NCCL 2.14 or newer is needed)"));
    dlclose(handle);
  }
  return absl::FailedPreconditionError(
      absl::StrCat("NCCL not found: ", absl::StrJoin(errors, "; "),
                   " (install NCCL, e.g. the nvidia-nccl-cu13 wheel, and put its lib/ on "
                   "LD_LIBRARY_PATH, or set LOOM_NCCL_LIBRARY)"));
}

absl::StatusOr<const NcclApi*> LoadNccl() {
  static const absl::StatusOr<NcclApi>* const api = [] {
    const char* forced = std::getenv("LOOM_NCCL_LIBRARY");
    return new absl::StatusOr<NcclApi>(OpenNcclLibrary(
        forced != nullptr && *forced ? std::vector<std::string>{forced}
                                     : std::vector<std::string>{"libnccl.so.2", "libnccl.so"}));
  }();
  if (!api->ok()) return api->status();
  return &**api;
}

}  // namespace loom::worker::detail
#endif  // LOOM_HAVE_NCCL
