#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>

namespace loom::model {

/// Element types a device tensor holds.
enum class DType : uint8_t { kF32, kF16, kBF16, kI32 };

/// Bytes of one element of `dtype`.
constexpr int64_t DTypeBytes(DType dtype) {
  return dtype == DType::kF16 || dtype == DType::kBF16 ? 2 : 4;
}

/// Where a tensor's bytes live.
enum class DeviceType : uint8_t { kCpu, kCuda };

/// A view of a dense row-major tensor in one device's memory: pointer, element type,
/// shape (at most 4 dimensions) and device. Does not own its bytes; the Buffer (or the
/// host data) it views must outlive it. Copyable, trivially cheap.
struct Tensor {
  static constexpr int kMaxRank = 4;

  void* data = nullptr;
  DType dtype = DType::kF32;
  DeviceType device = DeviceType::kCpu;
  int rank = 0;
  std::array<int64_t, kMaxRank> shape{};  // shape[0..rank)

  /// A view of `data` with `shape` (row-major, contiguous).
  static Tensor Of(void* data, DType dtype, DeviceType device,
                   std::initializer_list<int64_t> shape) {
    Tensor t;
    t.data = data;
    t.dtype = dtype;
    t.device = device;
    for (int64_t d : shape) t.shape[t.rank++] = d;
    return t;
  }

  int64_t dim(int i) const { return shape[i]; }
  /// The last dimension (a row's length); 1 for a scalar.
  int64_t cols() const { return rank == 0 ? 1 : shape[rank - 1]; }
  /// Elements in all but the last dimension.
  int64_t rows() const { return rank == 0 ? 1 : numel() / cols(); }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= shape[i];
    return n;
  }
  int64_t bytes() const { return numel() * DTypeBytes(dtype); }
  bool empty() const { return data == nullptr; }

  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

/// Device memory a Device handed out: owns `bytes()` bytes at `data()` (or, for a device
/// that computes in host memory, may view host data it was given, see Device::UploadF32).
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual void* data() const = 0;
  virtual int64_t bytes() const = 0;
};

}  // namespace loom::model
