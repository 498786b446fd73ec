// Row gather, weighted scatter-add and the column split. The gather takes one block per
// (row, 2048-column chunk), so a single wide row (a 14,336-wide activation converted before a
// GEMM at m = 1) spreads over several multiprocessors; the scatter-add one block per row; the
// split one thread per element, every part in one launch.
#include "common/status_macros.h"
#include "kernels/cuda/gather.h"
#include "kernels/cuda/launch_internal.cuh"

namespace loom::kernels::cuda {
namespace {

using internal::FromFloat;
using internal::ToFloat;

// Columns one gather block covers.
constexpr int64_t kGatherChunk = 2048;

template <typename Src, typename Dst>
__global__ void GatherRowsKernel(const Src* __restrict__ table, const int32_t* __restrict__ indices,
                                 Dst* __restrict__ out, int64_t num_rows, int64_t row_size,
                                 int64_t index_offset, float scale) {
  const int64_t row = static_cast<int64_t>(indices[blockIdx.x]) - index_offset;
  Dst* dst = out + blockIdx.x * row_size;
  const int64_t begin = blockIdx.y * kGatherChunk;
  const int64_t end = min(row_size, begin + kGatherChunk);
  if (row < 0 || row >= num_rows) {
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) dst[i] = FromFloat<Dst>(0.0f);
    return;
  }
  const Src* src = table + row * row_size;
  if (scale == 1.0f) {
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
      dst[i] = FromFloat<Dst>(ToFloat(src[i]));
    return;
  }
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
    dst[i] = FromFloat<Dst>(ToFloat(src[i]) * scale);
}

__global__ void ScatterAddRowsKernel(const float* __restrict__ rows,
                                     const int32_t* __restrict__ indices,
                                     const float* __restrict__ weights, float* __restrict__ out,
                                     int64_t num_out_rows, int64_t row_size) {
  const int64_t row = indices[blockIdx.x];
  if (row < 0 || row >= num_out_rows) return;
  const float weight = weights[blockIdx.x];
  const float* src = rows + static_cast<int64_t>(blockIdx.x) * row_size;
  float* dst = out + row * row_size;
  // Rounded product, then sum (no fused multiply-add): the CPU's order and rounding.
  for (int64_t i = threadIdx.x; i < row_size; i += blockDim.x) {
    dst[i] = __fadd_rn(dst[i], __fmul_rn(weight, src[i]));
  }
}

// One element a thread (grid-stride): its row and column of x, the part holding that column.
struct SplitArgs {
  const float* x;
  float* parts[kSplitColumnsMaxParts];
  int64_t ends[kSplitColumnsMaxParts];  // part j holds columns [ends[j - 1], ends[j])
  int num_parts;
  int64_t width;     // the parts' columns together
  int64_t x_stride;  // x's row length
  int64_t count;     // rows * width
};

__global__ void SplitColumnsKernel(SplitArgs args) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < args.count;
       i += stride) {
    const int64_t row = i / args.width, col = i % args.width;
    int64_t begin = 0;
#pragma unroll
    for (int j = 0; j < kSplitColumnsMaxParts; ++j) {
      if (j < args.num_parts && col >= begin && col < args.ends[j]) {
        args.parts[j][row * (args.ends[j] - begin) + (col - begin)] =
            args.x[row * args.x_stride + col];
      }
      if (j < args.num_parts) begin = args.ends[j];
    }
  }
}

int ThreadsFor(int64_t row_size) {
  return row_size >= 256 ? 256 : static_cast<int>((row_size + 31) / 32) * 32;
}

}  // namespace

absl::Status LaunchScatterAddRows(const ScatterAddRowsParams& p, cudaStream_t stream) {
  LOOM_RETURN_IF_ERROR(CheckScatterAddRowsParams(p));
  if (p.num_indices == 0) return absl::OkStatus();
  ScatterAddRowsKernel<<<static_cast<unsigned>(p.num_indices), ThreadsFor(p.row_size), 0,
                         stream>>>(p.rows, p.indices, p.weights, p.out, p.num_out_rows,
                                   p.row_size);
  return internal::CheckLaunch("ScatterAddRows");
}

absl::Status LaunchSplitColumns(const SplitColumnsParams& p, cudaStream_t stream) {
  LOOM_RETURN_IF_ERROR(CheckSplitColumnsParams(p));
  if (p.rows == 0) return absl::OkStatus();
  SplitArgs args{};
  args.x = p.x;
  args.num_parts = p.num_parts;
  int64_t end = 0;
  for (int j = 0; j < p.num_parts; ++j) {
    args.parts[j] = p.parts[j];
    end += p.cols[j];
    args.ends[j] = end;
  }
  args.width = end;
  args.x_stride = p.x_stride != 0 ? p.x_stride : end;
  args.count = p.rows * end;
  SplitColumnsKernel<<<internal::GridFor(args.count, 256), 256, 0, stream>>>(args);
  return internal::CheckLaunch("SplitColumns");
}

absl::Status LaunchGatherRows(const GatherRowsParams& p, cudaStream_t stream) {
  LOOM_RETURN_IF_ERROR(CheckGatherRowsParams(p));
  if (p.num_indices == 0) return absl::OkStatus();
  const int threads = ThreadsFor(p.row_size);
  internal::DispatchDataType(p.src_dtype, [&]<typename Src>() {
    internal::DispatchDataType(p.dst_dtype, [&]<typename Dst>() {
      const dim3 grid(static_cast<unsigned>(p.num_indices),
                      static_cast<unsigned>((p.row_size + kGatherChunk - 1) / kGatherChunk));
      GatherRowsKernel<Src, Dst><<<grid, threads, 0, stream>>>(
          static_cast<const Src*>(p.table), p.indices, static_cast<Dst*>(p.out), p.num_rows,
          p.row_size, p.index_offset, p.scale);
    });
  });
  return internal::CheckLaunch("GatherRows");
}

}  // namespace loom::kernels::cuda
