#pragma once

// For CUDA builds only (LOOM_HAVE_CUDA): it names the CUDA runtime's error type.
#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "common/status_macros.h"

namespace loom::model {

/// OkStatus for cudaSuccess; otherwise Internal "<call>: <CUDA's error string>", the error
/// cleared first when it is not sticky (so the next check does not report it again).
absl::Status CudaStatus(cudaError_t error, const char* call);

}  // namespace loom::model

/// Returns from the enclosing function with CudaStatus's error when the CUDA runtime call
/// `call` fails, naming the call as written.
#define LOOM_CUDA_CALL(call) LOOM_RETURN_IF_ERROR(::loom::model::CudaStatus((call), #call))
