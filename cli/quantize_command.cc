#include "cli/quantize_command.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "common/gguf_file.h"
#include "common/hf_model.h"
#include "common/gguf_writer.h"
#include "common/tokenizer.h"
#include "worker/model_quantizer.h"

namespace loom::worker {
namespace {

constexpr char kUsage[] =
    "usage: loom quantize --model IN.gguf --out OUT.gguf --format int8|int4|f16|f32\n"
    "                     [--group-size 32|64|128] [--method rtn|awq] [--calibration FILE]\n"
    "                     [--calibration-samples N] [--calibration-length L]\n"
    "                     [--awq-grid G] [--awq-samples S] [--awq-clip on|off] [--threads T]\n"
    "  --group-size N          columns per scale (int8 default: per output channel;\n"
    "                          int4 default 128)\n"
    "  --method awq            activation-aware scaling searched on --calibration text\n"
    "  --calibration-samples   sequences taken from the text (default 128)\n"
    "  --calibration-length    tokens per sequence (default 512)\n"
    "  --awq-grid G            alphas searched: 0, 1/G, ..., (G-1)/G (default 20)\n"
    "  --awq-samples S         token rows per layer input the search measures (default 1024)\n"
    "  --awq-clip on|off       int4: also search each group's clipping range (default on)\n";

struct Options {
  std::string model_path;
  std::string out_path;
  std::string calibration_path;
  bool has_format = false;
  int64_t calibration_samples = 128;
  int64_t calibration_length = 512;
  QuantizerOptions quantizer;
};

bool ParseOptions(int argc, char** argv, Options& options) {
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "loom quantize: %s needs a value\n", flag.c_str());
      return false;
    }
    const std::string value = argv[++i];
    int64_t number = 0;
    if (flag == "--model") {
      options.model_path = value;
    } else if (flag == "--out") {
      options.out_path = value;
    } else if (flag == "--calibration") {
      options.calibration_path = value;
    } else if (flag == "--format") {
      options.has_format = true;
      if (value == "int8") {
        options.quantizer.format = QuantizeFormat::kInt8;
      } else if (value == "int4") {
        options.quantizer.format = QuantizeFormat::kInt4;
      } else if (value == "f16") {
        options.quantizer.format = QuantizeFormat::kF16;
      } else if (value == "f32") {
        options.quantizer.format = QuantizeFormat::kF32;
      } else {
        std::fprintf(stderr, "loom quantize: --format must be int8, int4, f16 or f32, got '%s'\n",
                     value.c_str());
        return false;
      }
    } else if (flag == "--method") {
      if (value == "rtn") {
        options.quantizer.method = QuantizeMethod::kRtn;
      } else if (value == "awq") {
        options.quantizer.method = QuantizeMethod::kAwq;
      } else {
        std::fprintf(stderr, "loom quantize: --method must be rtn or awq, got '%s'\n",
                     value.c_str());
        return false;
      }
    } else if (flag == "--awq-clip") {
      if (value != "on" && value != "off") {
        std::fprintf(stderr, "loom quantize: --awq-clip must be on or off, got '%s'\n",
                     value.c_str());
        return false;
      }
      options.quantizer.awq_clip = value == "on";
    } else if (!absl::SimpleAtoi(value, &number) || number < 1) {
      std::fprintf(stderr, "loom quantize: bad value '%s' for %s\n", value.c_str(), flag.c_str());
      return false;
    } else if (flag == "--group-size") {
      options.quantizer.group_size = number;
    } else if (flag == "--calibration-samples") {
      options.calibration_samples = number;
    } else if (flag == "--calibration-length") {
      options.calibration_length = number;
    } else if (flag == "--awq-grid") {
      options.quantizer.awq_grid = static_cast<int>(number);
    } else if (flag == "--awq-samples") {
      options.quantizer.awq_max_samples = number;
    } else if (flag == "--threads") {
      options.quantizer.num_threads = static_cast<int>(number);
    } else {
      std::fprintf(stderr, "loom quantize: unknown flag %s\n", flag.c_str());
      return false;
    }
  }
  if (options.model_path.empty() || options.out_path.empty() || !options.has_format) {
    std::fputs("loom quantize: --model, --out and --format are required\n", stderr);
    return false;
  }
  if (options.quantizer.method == QuantizeMethod::kAwq && options.calibration_path.empty()) {
    std::fputs("loom quantize: --method awq needs --calibration FILE\n", stderr);
    return false;
  }
  if (options.model_path == options.out_path) {
    std::fputs("loom quantize: --out must differ from --model\n", stderr);
    return false;
  }
  return true;
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
  if (!ParseOptions(argc, argv, options)) {
    std::fputs(kUsage, stderr);
    return 2;
  }
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

}  // namespace loom::worker
