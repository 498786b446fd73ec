#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/formats/gguf_file.h"
#include "common/formats/gguf_writer.h"

namespace loom::quant {

/// What `loom quantize` writes the linear layers as.
enum class QuantizeFormat { kF32, kF16, kBf16, kInt8, kInt4 };
enum class QuantizeMethod { kRtn, kAwq };

struct QuantizerOptions {
  QuantizeFormat format = QuantizeFormat::kInt4;
  /// Columns per scale. 0: INT8 per output channel (one scale per row), INT4 128.
  /// A matrix whose width the group does not divide takes the largest power of two
  /// >= 32 below it that does (GroupSizeFor).
  int64_t group_size = 0;
  QuantizeMethod method = QuantizeMethod::kRtn;
  int awq_grid = 20;               // alphas 0, 1/grid, ..., (grid - 1)/grid
  int64_t awq_max_samples = 1024;  // token rows per linear input kept for the error search
  /// INT4 + AWQ: also search each (row, group)'s clipping range (AWQ's auto_clip),
  /// shrinking it by up to awq_max_shrink in steps of 1 / awq_grid.
  bool awq_clip = true;
  double awq_max_shrink = 0.5;
  int num_threads = 2;
  std::string calibration_description;  // recorded as loom.quantization.calibration
};

/// One layer group's AWQ outcome (for the report and the tests).
struct AwqLayerReport {
  int64_t layer = 0;
  std::string group;  // "qkv", "gate_up", "down"
  double alpha = 0;
  double error = 0;
  double rtn_error = 0;
  // Clipping (INT4): output error summed over the group's matrices before and after.
  double unclipped_error = 0;
  double clipped_error = 0;
};

struct QuantizerReport {
  std::vector<AwqLayerReport> awq;
  std::string log;  // one line per distinct conversion
};

/// The group size a [rows, cols] matrix gets when `requested` is asked for (0: the
/// format's default): `requested` when it divides cols, else the largest power of two
/// >= 32 below it that does. INT8 with requested 0 is per channel (cols).
/// InvalidArgument when nothing fits (cols not a multiple of 32).
absl::StatusOr<int64_t> GroupSizeFor(QuantizeFormat format, int64_t requested, int64_t cols);

/// Converts the llama-family model `in` into `out`: every metadata key copied verbatim
/// (general.file_type adjusted; loom.quantization.* describing the result), the linear
/// layers (attn_q/k/v/output, ffn_gate/up/down) in `options.format`, everything else as
/// it was (F32/F16: every matrix converted). AWQ needs `calibration` (token sequences,
/// run through CpuForwardPass to observe each layer's inputs) and folds its scales into the
/// RMSNorm weights and `up` rows, so `out` is a plain model. `out` may refer to `in`'s
/// bytes: keep `in` alive until it is written.
absl::StatusOr<QuantizerReport> QuantizeModel(const common::GgufFile& in,
                                              const QuantizerOptions& options,
                                              const std::vector<std::vector<int32_t>>& calibration,
                                              common::GgufWriter& out);

/// `in` quantized in memory (QuantizeModel with RTN and no calibration, then parsed back):
/// what `--quantization int8|int4` serves. Holds the whole quantized image; `in` may be
/// released afterwards.
absl::StatusOr<std::unique_ptr<common::GgufFile>> QuantizeInMemory(const common::GgufFile& in,
                                                                   QuantizeFormat format);

}  // namespace loom::quant
