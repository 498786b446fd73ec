#include "cli/worker_options.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "kernels/cuda_device.h"

namespace loom::worker {

const char kWorkerUsage[] =
    "usage: loom-worker --model PATH --coordinator HOST:PORT [--listen HOST:PORT]\n"
    "                   [--advertise-address HOST:PORT] [--replica-id ID] [--rank 0]\n"
    "                   [--world-size 1] [--backend cpu|noop] [--device cuda|cpu|auto]\n"
    "                   [--cuda-graphs on|off] [--threads N]\n"
    "                   [--kv-cache-memory SIZE | --kv-cache-fraction F] [--block-size 16]\n"
    "                   [--kv-dtype f16|f32] [--metrics-port N] [--rendezvous-id ID]\n"
    "                   [--rendezvous-timeout-ms MS] [--activations f32|int8]\n"
    "                   [--quantization int8|int4]\n"
    "                   [--draft-model PATH] [--drain-timeout-s S]\n"
    "                   [--debug-step-delay-ms MS] [--debug-hang-at-step N]\n"
    "  --listen             where the Worker service listens (default 127.0.0.1:0, any free port)\n"
    "  --advertise-address  the address registered with the coordinator (default: the listen\n"
    "                       host with the bound port)\n"
    "  --kv-cache-memory    KV pool budget in bytes, suffixes KiB/MiB/GiB (default 512MiB)\n"
    "  --kv-cache-fraction  KV pool budget as a fraction of MemAvailable (cpu) or of the GPU\n"
    "                       memory free after loading the weights (cuda; default 0.9 there)\n"
    "  --backend            cpu (the model runner) or noop (no math: coordinator benchmarks)\n"
    "  --device             where the model runner runs: cuda, cpu or auto (default: cuda when\n"
    "                       a CUDA device is present, --kv-dtype is f16 and --world-size is 1)\n"
    "  --cuda-graphs        replay decode steps from CUDA graphs (default on)\n"
    "  --activations        CPU backend, INT8/INT4 weights: f32 (default) keeps each layer's\n"
    "                       input exact; int8 quantizes it per 32 values for integer dot\n"
    "                       products (about 1.5x faster decode, +0.1% perplexity on SmolLM2,\n"
    "                       but near-tied greedy choices can flip)\n"
    "  --world-size/--rank  tensor parallelism: this worker is rank R of W ranks of its replica;\n"
    "                       the ranks meet through the coordinator and each loads its shard\n"
    "  --rendezvous-id      the same for every rank of one start of a replica (default 0)\n"
    "  --drain-timeout-s    on SIGTERM, ask the coordinator to drain this worker's replica (no\n"
    "                       new requests; those in flight finish) and wait up to S seconds\n"
    "                       before stopping (default 30; 0: stop at once)\n"
    "  --metrics-port       serve Prometheus metrics on the listen host at this port (0: any\n"
    "                       free port; default: off)\n"
    "  --draft-model        speculative decoding proposes with this GGUF (the target's\n"
    "                       vocabulary, CPU backend, one rank) instead of n-gram lookup; its\n"
    "                       KV pool has as many blocks as the target's. The coordinator's\n"
    "                       --speculative-tokens turns speculation on\n"
    "  --debug-step-delay-ms  tests only: every step first sleeps MS, reporting progress (a\n"
    "                       slow worker that is not stuck)\n"
    "  --debug-hang-at-step tests only: the Nth step this process runs stops making progress\n"
    "                       (the heartbeat goes on): a worker stuck inside a step\n";

namespace {

absl::Status BadValue(absl::string_view flag, absl::string_view value, absl::string_view expected) {
  return absl::InvalidArgumentError(
      absl::StrFormat("%s: bad value '%s' (%s)", flag, value, expected));
}

absl::StatusOr<int64_t> ParseInt(absl::string_view flag, absl::string_view value, int64_t min,
                                 int64_t max) {
  int64_t number = 0;
  if (!absl::SimpleAtoi(value, &number) || number < min || number > max) {
    return BadValue(flag, value, absl::StrFormat("an integer in [%d, %d]", min, max));
  }
  return number;
}

}  // namespace

absl::StatusOr<int64_t> ParseByteSize(absl::string_view text) {
  const absl::string_view trimmed = absl::StripAsciiWhitespace(text);
  size_t number_end = 0;
  while (number_end < trimmed.size() &&
         (std::isdigit(static_cast<unsigned char>(trimmed[number_end])) ||
          trimmed[number_end] == '.')) {
    ++number_end;
  }
  double number = 0;
  if (number_end == 0 || !absl::SimpleAtod(trimmed.substr(0, number_end), &number)) {
    return absl::InvalidArgumentError(absl::StrFormat("'%s' is not a byte size", text));
  }
  const std::string suffix = absl::AsciiStrToLower(trimmed.substr(number_end));
  double scale = 0;
  if (suffix.empty() || suffix == "b") {
    scale = 1;
  } else if (suffix == "k" || suffix == "kb" || suffix == "kib") {
    scale = 1024.0;
  } else if (suffix == "m" || suffix == "mb" || suffix == "mib") {
    scale = 1024.0 * 1024;
  } else if (suffix == "g" || suffix == "gb" || suffix == "gib") {
    scale = 1024.0 * 1024 * 1024;
  } else if (suffix == "t" || suffix == "tb" || suffix == "tib") {
    scale = 1024.0 * 1024 * 1024 * 1024;
  } else {
    return absl::InvalidArgumentError(absl::StrFormat(
        "'%s': unknown size suffix '%s' (use B, KiB, MiB, GiB or TiB)", text, suffix));
  }
  const double bytes = number * scale;
  if (!std::isfinite(bytes) || bytes > 4.611686018427388e18) {
    return absl::InvalidArgumentError(absl::StrFormat("'%s' is too large", text));
  }
  return static_cast<int64_t>(bytes);
}

absl::StatusOr<std::pair<std::string, int>> SplitHostPort(absl::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) {
    return absl::InvalidArgumentError(absl::StrFormat("'%s' is not HOST:PORT", address));
  }
  int port = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrFormat("'%s': the port must be a number in [0, 65535]", address));
  }
  return std::make_pair(std::string(address.substr(0, colon)), port);
}

absl::StatusOr<int64_t> MemAvailableBytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return absl::UnavailableError("cannot read MemAvailable from /proc/meminfo");
}

absl::StatusOr<int64_t> KvCacheBudgetBytes(const WorkerOptions& options) {
  if (options.kv_cache_bytes.has_value()) return *options.kv_cache_bytes;
  if (options.kv_cache_fraction.has_value()) {
    absl::StatusOr<int64_t> available = MemAvailableBytes();
    if (!available.ok()) return available.status();
    return static_cast<int64_t>(static_cast<double>(*available) * *options.kv_cache_fraction);
  }
  return int64_t{512} << 20;
}

absl::StatusOr<std::string> ResolveDevice(absl::string_view device, kernels::cpu::KvDtype kv_dtype,
                                          int world_size, int cuda_device_count) {
  if (device == "cpu") return std::string("cpu");
  const bool f32_kv = kv_dtype == kernels::cpu::KvDtype::kF32;
  if (device == "auto") {
    return std::string(cuda_device_count > 0 && !f32_kv && world_size == 1 ? "cuda" : "cpu");
  }
  if (device != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrFormat("--device: bad value '%s' (cuda, cpu or auto)", device));
  }
  if (cuda_device_count == 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "--device cuda: no usable CUDA device (%s); use --device cpu or auto",
        kernels::CudaDeviceDescription(0)));
  }
  if (f32_kv) {
    return absl::InvalidArgumentError("--device cuda: --kv-dtype f32 is CPU-only (use f16)");
  }
  if (world_size > 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--device cuda: tensor parallelism (--world-size %d) is not implemented on CUDA yet",
        world_size));
  }
  return std::string("cuda");
}

absl::StatusOr<WorkerOptions> ParseWorkerFlags(int argc, const char* const* argv) {
  WorkerOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      return absl::InvalidArgumentError(absl::StrFormat("%s needs a value", flag));
    }
    const std::string value = argv[++i];
    if (flag == "--model") {
      options.model_path = value;
    } else if (flag == "--draft-model") {
      if (value.empty()) return BadValue(flag, value, "a GGUF path");
      options.draft_model_path = value;
    } else if (flag == "--coordinator") {
      if (absl::Status status = SplitHostPort(value).status(); !status.ok()) {
        return BadValue(flag, value, "HOST:PORT");
      }
      options.coordinator_address = value;
    } else if (flag == "--listen") {
      if (absl::Status status = SplitHostPort(value).status(); !status.ok()) {
        return BadValue(flag, value, "HOST:PORT");
      }
      options.listen_address = value;
    } else if (flag == "--advertise-address") {
      absl::StatusOr<std::pair<std::string, int>> parts = SplitHostPort(value);
      if (!parts.ok() || parts->second == 0) return BadValue(flag, value, "HOST:PORT, port > 0");
      options.advertise_address = value;
    } else if (flag == "--replica-id") {
      if (value.empty()) return BadValue(flag, value, "a non-empty id");
      options.replica_id = value;
    } else if (flag == "--rank") {
      absl::StatusOr<int64_t> rank = ParseInt(flag, value, 0, 1 << 20);
      if (!rank.ok()) return rank.status();
      options.rank = static_cast<int32_t>(*rank);
    } else if (flag == "--world-size") {
      absl::StatusOr<int64_t> world_size = ParseInt(flag, value, 1, 1 << 20);
      if (!world_size.ok()) return world_size.status();
      options.world_size = static_cast<int32_t>(*world_size);
    } else if (flag == "--backend") {
      if (value != "cpu" && value != "noop") return BadValue(flag, value, "cpu or noop");
      options.backend = value;
    } else if (flag == "--device") {
      if (value != "cuda" && value != "cpu" && value != "auto") {
        return BadValue(flag, value, "cuda, cpu or auto");
      }
      options.device = value;
    } else if (flag == "--cuda-graphs") {
      if (value != "on" && value != "off") return BadValue(flag, value, "on or off");
      options.cuda_graphs = value == "on";
    } else if (flag == "--threads") {
      absl::StatusOr<int64_t> threads = ParseInt(flag, value, 1, 1024);
      if (!threads.ok()) return threads.status();
      options.num_threads = static_cast<int>(*threads);
    } else if (flag == "--kv-cache-memory") {
      absl::StatusOr<int64_t> bytes = ParseByteSize(value);
      if (!bytes.ok()) return BadValue(flag, value, bytes.status().message());
      options.kv_cache_bytes = *bytes;
    } else if (flag == "--kv-cache-fraction") {
      double fraction = 0;
      if (!absl::SimpleAtod(value, &fraction) || !(fraction > 0 && fraction <= 1)) {
        return BadValue(flag, value, "a fraction in (0, 1]");
      }
      options.kv_cache_fraction = fraction;
    } else if (flag == "--rendezvous-id") {
      if (value.empty()) return BadValue(flag, value, "a non-empty id");
      options.rendezvous_id = std::string(value);
    } else if (flag == "--rendezvous-timeout-ms") {
      absl::StatusOr<int64_t> timeout = ParseInt(flag, value, 1, 86400000);
      if (!timeout.ok()) return timeout.status();
      options.rendezvous_timeout_ms = static_cast<int>(*timeout);
    } else if (flag == "--drain-timeout-s") {
      absl::StatusOr<int64_t> seconds = ParseInt(flag, value, 0, 86400);
      if (!seconds.ok()) return seconds.status();
      options.drain_timeout_s = static_cast<int>(*seconds);
    } else if (flag == "--debug-step-delay-ms") {
      absl::StatusOr<int64_t> delay = ParseInt(flag, value, 0, 3600000);
      if (!delay.ok()) return delay.status();
      options.debug_step_delay_ms = *delay;
    } else if (flag == "--debug-hang-at-step") {
      absl::StatusOr<int64_t> step = ParseInt(flag, value, 0, int64_t{1} << 40);
      if (!step.ok()) return step.status();
      options.debug_hang_at_step = *step;
    } else if (flag == "--metrics-port") {
      absl::StatusOr<int64_t> port = ParseInt(flag, value, 0, 65535);
      if (!port.ok()) return port.status();
      options.metrics_port = static_cast<int>(*port);
    } else if (flag == "--block-size") {
      absl::StatusOr<int64_t> block_size = ParseInt(flag, value, 1, 1024);
      if (!block_size.ok()) return block_size.status();
      options.block_size = *block_size;
    } else if (flag == "--activations") {
      absl::StatusOr<kernels::cpu::ActivationPrecision> precision =
          kernels::cpu::ParseActivationPrecision(value);
      if (!precision.ok()) return BadValue(flag, value, "f32 or int8");
      options.activations = *precision;
    } else if (flag == "--quantization") {
      if (value != "int8" && value != "int4") return BadValue(flag, value, "int8 or int4");
      options.quantization = std::string(value);
    } else if (flag == "--kv-dtype") {
      if (value != "f16" && value != "f32") return BadValue(flag, value, "f16 or f32");
      options.kv_dtype = value == "f16" ? kernels::cpu::KvDtype::kF16 : kernels::cpu::KvDtype::kF32;
    } else {
      return absl::InvalidArgumentError(absl::StrFormat("unknown flag %s", flag));
    }
  }
  if (options.model_path.empty()) return absl::InvalidArgumentError("--model is required");
  if (options.coordinator_address.empty()) {
    return absl::InvalidArgumentError("--coordinator is required");
  }
  if (options.kv_cache_bytes.has_value() && options.kv_cache_fraction.has_value()) {
    return absl::InvalidArgumentError("give --kv-cache-memory or --kv-cache-fraction, not both");
  }
  return options;
}

}  // namespace loom::worker
