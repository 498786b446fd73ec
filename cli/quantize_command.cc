#include "cli/quantize_command.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "cli/command_line.h"
#include "common/formats/gguf_file.h"
#include "common/formats/hf_model.h"
#include "common/formats/gguf_writer.h"
#include "common/tokenizer/tokenizer.h"
#include "quant/model_quantizer.h"

namespace loom::cli {

using quant::AwqLayerReport;
using quant::QuantizeFormat;
using quant::QuantizeMethod;

using quant::QuantizeModel;
using quant::QuantizerOptions;
using quant::QuantizerReport;
namespace {

struct Options {
  std::string model_path;
  std::string out_path;
  std::string calibration_path;
  bool has_format = false;
  int64_t calibration_samples = 128;
  int64_t calibration_length = 512;
  QuantizerOptions quantizer;
};

// Parses the command line into `options`; nullopt to go on, else the exit code.
std::optional<int> ParseOptions(int argc, char** argv, Options& options) {
  cli::CommandLine command_line(
      "loom quantize",
      "loom quantize MODEL --out OUT.gguf --format int8|int4|f16|bf16|f32: "
      "write a model with INT8/INT4 (RTN or AWQ), F16, BF16 or F32 linear layers");
  CLI::App& app = command_line.app();
  QuantizerOptions& quantizer = options.quantizer;
  cli::AddString(app, "model,--model", options.model_path, "the input model; required");
  cli::AddString(app, "--out", options.out_path, "the GGUF file to write; required");
  app.add_option_function<std::string>(
         "--format",
         [&options](const std::string& text) {
           options.has_format = true;
           options.quantizer.format = text == "int8"   ? QuantizeFormat::kInt8
                                      : text == "int4" ? QuantizeFormat::kInt4
                                      : text == "f16"  ? QuantizeFormat::kF16
                                      : text == "bf16" ? QuantizeFormat::kBf16
                                                       : QuantizeFormat::kF32;
         },
         "the linear layers' format; required")
      ->check(cli::OneOf({"int8", "int4", "f16", "bf16", "f32"}))
      ->default_str("required");
  app.add_option_function<std::string>(
         "--method",
         [&options](const std::string& text) {
           options.quantizer.method = text == "awq" ? QuantizeMethod::kAwq : QuantizeMethod::kRtn;
         },
         "round-to-nearest, or activation-aware scaling searched on --calibration text")
      ->check(cli::OneOf({"rtn", "awq"}))
      ->default_str("rtn");
  cli::AddString(app, "--calibration", options.calibration_path, "the text --method awq calibrates on");
  cli::AddInt(app, "--group-size", quantizer.group_size, 1, 1 << 20,
              "columns per scale (default 0: int8 per output channel, int4 128)");
  cli::AddInt(app, "--calibration-samples", options.calibration_samples, 1, 1 << 20,
              "sequences taken from the calibration text");
  cli::AddInt(app, "--calibration-length", options.calibration_length, 1, 1 << 20,
              "tokens per calibration sequence");
  cli::AddInt(app, "--awq-grid", quantizer.awq_grid, 1, 1 << 20,
              "alphas searched: 0, 1/G, ..., (G-1)/G");
  cli::AddInt(app, "--awq-samples", quantizer.awq_max_samples, 1, int64_t{1} << 30,
              "token rows per layer input the search measures");
  cli::AddBool(app, "--awq-clip", quantizer.awq_clip,
               "int4: also search each group's clipping range");
  cli::AddInt(app, "--threads", quantizer.num_threads, 1, 1024, "CPU threads");
  if (std::optional<int> exit_code = command_line.Parse(argc, argv)) return exit_code;
  if (options.model_path.empty() || options.out_path.empty() || !options.has_format) {
    return command_line.Fail("the model, --out and --format are required");
  }
  if (options.quantizer.method == QuantizeMethod::kAwq && options.calibration_path.empty()) {
    return command_line.Fail("--method awq needs --calibration FILE");
  }
  if (options.model_path == options.out_path) {
    return command_line.Fail("--out must differ from the model");
  }
  return std::nullopt;
}

}  // namespace

std::vector<std::vector<int32_t>> CalibrationSequences(const std::vector<int32_t>& tokens,
                                                       int64_t count, int64_t length) {
  std::vector<std::vector<int32_t>> sequences;
  const int64_t total = static_cast<int64_t>(tokens.size());
  if (total == 0 || count < 1 || length < 1) return sequences;
  if (total <= length) {
    sequences.push_back(tokens);
    return sequences;
  }
  const int64_t n = std::min(count, total / length);
  for (int64_t i = 0; i < n; ++i) {
    // Starts spread over the whole text; n <= total / length keeps them disjoint.
    const int64_t start = n == 1 ? 0 : i * (total - length) / (n - 1);
    sequences.emplace_back(tokens.begin() + start, tokens.begin() + start + length);
  }
  return sequences;
}

int RunQuantizeCommand(int argc, char** argv) {
  Options options;
  if (std::optional<int> exit_code = ParseOptions(argc, argv, options)) return *exit_code;
  auto fail = [](const absl::Status& status) {
    std::fprintf(stderr, "loom quantize: %s\n", status.ToString().c_str());
    return 1;
  };
  const auto start = std::chrono::steady_clock::now();
  auto gguf = common::OpenModelFile(options.model_path);
  if (!gguf.ok()) return fail(gguf.status());

  std::vector<std::vector<int32_t>> calibration;
  if (options.quantizer.method == QuantizeMethod::kAwq) {
    std::ifstream in(options.calibration_path, std::ios::binary);
    if (!in) {
      return fail(absl::NotFoundError(
          absl::StrFormat("cannot read --calibration %s", options.calibration_path)));
    }
    std::stringstream buffer;
    buffer << in.rdbuf();
    auto tokenizer = common::Tokenizer::FromGguf(**gguf);
    if (!tokenizer.ok()) return fail(tokenizer.status());
    const std::vector<int32_t> tokens =
        (*tokenizer)->Encode(buffer.str(), /*add_special=*/false, /*parse_special=*/false);
    calibration =
        CalibrationSequences(tokens, options.calibration_samples, options.calibration_length);
    if (calibration.empty()) {
      return fail(absl::InvalidArgumentError(
          absl::StrFormat("--calibration %s has no tokens", options.calibration_path)));
    }
    int64_t used = 0;
    for (const auto& sequence : calibration) used += static_cast<int64_t>(sequence.size());
    options.quantizer.calibration_description = absl::StrFormat(
        "%s: %d sequences of %d tokens (%d tokens)",
        options.calibration_path.substr(options.calibration_path.find_last_of('/') + 1),
        calibration.size(), calibration[0].size(), used);
    std::fprintf(stderr, "calibration: %s\n", options.quantizer.calibration_description.c_str());
  }

  common::GgufWriter writer;
  absl::StatusOr<QuantizerReport> report =
      QuantizeModel(**gguf, options.quantizer, calibration, writer);
  if (!report.ok()) return fail(report.status());
  std::fprintf(stderr, "converted:\n%s", report->log.c_str());
  if (!report->awq.empty()) {
    double error = 0, rtn_error = 0, clipped = 0, unclipped = 0;
    for (const AwqLayerReport& layer : report->awq) {
      std::fprintf(stderr,
                   "  awq layer %2lld %-8s alpha %.2f  output MSE %.4g (rtn %.4g, %.3fx)  "
                   "clip %.3fx\n",
                   static_cast<long long>(layer.layer), layer.group.c_str(), layer.alpha,
                   layer.error, layer.rtn_error,
                   layer.rtn_error > 0 ? layer.error / layer.rtn_error : 1.0,
                   layer.unclipped_error > 0 ? layer.clipped_error / layer.unclipped_error : 1.0);
      error += layer.error;
      rtn_error += layer.rtn_error;
      clipped += layer.clipped_error;
      unclipped += layer.unclipped_error;
    }
    std::fprintf(stderr, "awq: summed output MSE %.4g vs %.4g for rtn (%.3fx)\n", error, rtn_error,
                 rtn_error > 0 ? error / rtn_error : 1.0);
    if (unclipped > 0) {
      std::fprintf(stderr, "awq clip: summed group output error %.4g vs %.4g unclipped (%.3fx)\n",
                   clipped, unclipped, clipped / unclipped);
    }
  }
  if (absl::Status written = writer.WriteFile(options.out_path); !written.ok()) {
    return fail(written);
  }
  std::fprintf(stderr, "wrote %s (%zu tensors) in %.1f s\n", options.out_path.c_str(),
               writer.num_tensors(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return 0;
}

}  // namespace loom::cli
