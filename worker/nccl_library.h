#pragma once

// NCCL loaded at first use (dlopen) instead of linked, as cuBLAS is: a worker binary then
// starts on a machine without NCCL (a single-GPU node, or the GPU verification machine
// whose NCCL comes from a pip wheel found at run time), and only tensor parallelism over
// CUDA asks for it. Include after <nccl.h>; inside worker/ only.

#include <string>
#include <vector>

#include "absl/status/statusor.h"

#ifdef LOOM_HAVE_NCCL
#include <nccl.h>

namespace loom::worker::detail {

/// The NCCL entry points Loom calls, resolved from one loaded library.
struct NcclApi {
  std::string path;  // the library that was loaded (what dlopen was given)
  decltype(&ncclGetUniqueId) GetUniqueId;
  decltype(&ncclCommInitRankConfig) CommInitRankConfig;
  decltype(&ncclCommGetAsyncError) CommGetAsyncError;
  decltype(&ncclCommAbort) CommAbort;
  decltype(&ncclCommDestroy) CommDestroy;
  decltype(&ncclGetErrorString) GetErrorString;
  decltype(&ncclAllReduce) AllReduce;
  decltype(&ncclAllGather) AllGather;
  decltype(&ncclBroadcast) Broadcast;
};

/// Loads the first of `candidates` (dlopen names or paths) that opens and has every entry
/// point; not cached (LoadNccl is). FailedPrecondition "NCCL not found: ..." naming each
/// failure otherwise.
absl::StatusOr<NcclApi> OpenNcclLibrary(const std::vector<std::string>& candidates);

/// NCCL, loaded once (thread-safe): `LOOM_NCCL_LIBRARY` when set, else libnccl.so.2 then
/// libnccl.so from the loader's search path (LD_LIBRARY_PATH, the CUDA toolkit's lib64 via
/// ld.so.conf). FailedPrecondition naming what was tried when none loads or a symbol is
/// missing (an NCCL older than 2.14, which added ncclCommInitRankConfig).
absl::StatusOr<const NcclApi*> LoadNccl();

}  // namespace loom::worker::detail
#endif  // LOOM_HAVE_NCCL
