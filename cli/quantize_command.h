#pragma once

#include <cstdint>
#include <vector>

namespace loom::cli {

/// `count` calibration sequences of `length` tokens spread evenly over `tokens` without
/// overlapping (fewer when the text is shorter than count * length; one shorter sequence
/// when it is shorter than `length`). Deterministic.
std::vector<std::vector<int32_t>> CalibrationSequences(const std::vector<int32_t>& tokens,
                                                       int64_t count, int64_t length);

/// `loom quantize --model IN.gguf --out OUT.gguf --format int8|int4|f16|bf16|f32
/// [--group-size N] [--method rtn|awq] [--calibration FILE] [--calibration-samples N]
/// [--calibration-length L] [--awq-grid G] [--awq-samples S] [--threads T]`: writes a
/// GGUF with the linear layers in Loom's formats (docs/quantization.md). argv[0] is
/// "quantize". Returns the exit code.
int RunQuantizeCommand(int argc, char** argv);

}  // namespace loom::cli
