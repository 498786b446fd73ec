#pragma once
// What the NCCL tests share: the skip for a machine without a GPU or NCCL (tests/gpu/quick.sh
// reports "NCCL not found" as such, not as a failure), and a communicator of one rank.

#include <chrono>
#include <memory>

#include "gloo/rendezvous/hash_store.h"
#include "gtest/gtest.h"
#include "kernels/cuda_device.h"
#include "worker/nccl_communicator.h"

#ifdef LOOM_HAVE_NCCL
#include "worker/nccl_library.h"

#define SKIP_WITHOUT_GPU_OR_NCCL()                                                         \
  do {                                                                                     \
    if (::loom::kernels::CudaDeviceCount() == 0) {                                         \
      GTEST_SKIP() << "no CUDA device: " << ::loom::kernels::CudaDeviceDescription(0);     \
    }                                                                                      \
    if (absl::StatusOr<const ::loom::worker::detail::NcclApi*> api =                       \
            ::loom::worker::detail::LoadNccl();                                            \
        !api.ok()) {                                                                       \
      GTEST_SKIP() << api.status().message();                                              \
    }                                                                                      \
  } while (0)

namespace loom::worker {

/// An NCCL communicator of one rank on GPU 0 (a test failure, and null, if it cannot connect).
inline std::unique_ptr<NcclCommunicator> ConnectWorldOfOne() {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  auto communicator =
      NcclCommunicator::Connect(store, 0, 1, 0, std::chrono::milliseconds(30000));
  EXPECT_TRUE(communicator.ok()) << communicator.status();
  return communicator.ok() ? *std::move(communicator) : nullptr;
}

}  // namespace loom::worker
#endif  // LOOM_HAVE_NCCL
