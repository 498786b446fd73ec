// The pool-to-pool KV hand-off between two processes of one machine (model::KvCache::Share,
// OpenPeer and CopyBlocksFromPeer of the CUDA pool: CUDA IPC, no host tier between), on a
// Llama-3-8B-shaped pool (32 layers, 8 KV heads of 128, F16, blocks of 16 tokens: 32 KiB per
// layer's K or V of a block, 2 MiB a block) of 512 blocks: 1 GiB, an 8,192-token prompt.
//  1. This process starts itself again (`--serve`, exec'd: no CUDA context is inherited); the
//     server fills its pool with a pattern of (block, byte), prints its Share() on one line and
//     holds the pool until its stdin closes.
//  2. This process opens that pool (OpenPeer) and copies every block of it into its own pool
//     of the same shape, to shuffled destination blocks (CopyBlocksFromPeer), timed by the wall
//     clock (the call waits for its copies): the first copy, and the median of kRuns after it.
//  3. The limit, measured in the same run: one device-to-device cudaMemcpyAsync of the same
//     bytes in this process and its wait, the median of kRuns; GB/s of pool bytes moved each,
//     and their ratio.
//  4. Every destination block is read back (SaveBlocks) and compared with its source block's
//     pattern; any mismatch exits 1.
// --quick: fewer timed runs (the same pool). Writes kv_pool_transfer_bench.json to --out FILE,
// else into $OUT when set, else bench/results/gpu/ under LOOM_SOURCE_DIR (or the current
// directory). Exits 0 with a message where no GPU is (and a JSON saying skipped where --out or
// $OUT names a place for it).
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "bench/gpu_bench_support.h"
#include "bench/machine_limits.h"
#include "bench/model_shapes.h"
#include "common/formats/model_config.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/random_fill.h"
#include "kernels/cuda_device.h"
#include "model/cuda_device.h"
#include "model/device.h"
#include "model/kv_pool_share.h"

extern char** environ;

namespace loom::bench {
namespace {

constexpr int64_t kBlockSize = 16;
constexpr int64_t kPoolBlocks = 512;  // 2 MiB each: 1 GiB
constexpr int64_t kChunkBlocks = 64;  // host slots filled or checked at once (128 MiB)
constexpr uint64_t kPatternSeed = 0x6b76706f6f6cull;
constexpr int kRuns = 15, kQuickRuns = 5;
constexpr int kServerStartSeconds = 120;  // to print its share
constexpr const char* kName = "kv_pool_transfer_bench";

// The pattern's 8-byte word `word` of `block`'s host slot (SplitMix64 of both).
uint64_t PatternWord(int64_t block, int64_t word) {
  uint64_t z = kPatternSeed + (static_cast<uint64_t>(block) << 32) + static_cast<uint64_t>(word);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void FillPattern(int64_t block, uint8_t* slot, int64_t slot_bytes) {
  uint64_t* words = reinterpret_cast<uint64_t*>(slot);
  for (int64_t w = 0; w < slot_bytes / 8; ++w) words[w] = PatternWord(block, w);
}

bool MatchesPattern(int64_t block, const uint8_t* slot, int64_t slot_bytes) {
  const uint64_t* words = reinterpret_cast<const uint64_t*>(slot);
  for (int64_t w = 0; w < slot_bytes / 8; ++w) {
    if (words[w] != PatternWord(block, w)) return false;
  }
  return true;
}

// `text` as a JSON string's contents (quotes and backslashes escaped, control characters
// dropped).
std::string JsonText(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) out += c;
  }
  return out;
}

std::string Hex(std::string_view bytes) {
  std::string text;
  for (char c : bytes) absl::StrAppendFormat(&text, "%02x", static_cast<uint8_t>(c));
  return text;
}

bool Unhex(std::string_view text, std::string& bytes) {
  if (text.size() % 2 != 0) return false;
  bytes.clear();
  for (size_t i = 0; i < text.size(); i += 2) {
    const std::string pair(text.substr(i, 2));
    char* end = nullptr;
    const long value = std::strtol(pair.c_str(), &end, 16);
    if (end != pair.c_str() + 2) return false;
    bytes.push_back(static_cast<char>(value));
  }
  return true;
}

// One line: "share <num_blocks> <uuid hex> <handles> <handle hex>... <parts> (<allocation>
// <offset> <block bytes>)...".
std::string ShareLine(const model::KvPoolShare& share) {
  std::string line = absl::StrFormat("share %d %s %d", share.num_blocks,
                                     Hex(share.cuda_device_uuid), share.cuda_ipc_handles.size());
  for (const std::string& handle : share.cuda_ipc_handles) line += " " + Hex(handle);
  absl::StrAppendFormat(&line, " %d", share.parts.size());
  for (const model::KvPoolPart& part : share.parts) {
    absl::StrAppendFormat(&line, " %d %d %d", part.allocation, part.offset, part.block_bytes);
  }
  return line;
}

absl::StatusOr<model::KvPoolShare> ParseShare(const std::string& line) {
  std::istringstream in(line);
  std::string word, uuid;
  size_t handles = 0, parts = 0;
  model::KvPoolShare share;
  share.kind = model::KvPoolShare::Kind::kCudaIpc;
  if (!(in >> word >> share.num_blocks >> uuid >> handles) || word != "share" ||
      !Unhex(uuid, share.cuda_device_uuid)) {
    return absl::InvalidArgumentError("the server's share line: " + line.substr(0, 200));
  }
  for (size_t i = 0; i < handles; ++i) {
    std::string hex, handle;
    if (!(in >> hex) || !Unhex(hex, handle)) return absl::InvalidArgumentError("a handle");
    share.cuda_ipc_handles.push_back(handle);
  }
  if (!(in >> parts)) return absl::InvalidArgumentError("the part count");
  for (size_t i = 0; i < parts; ++i) {
    model::KvPoolPart part;
    if (!(in >> part.allocation >> part.offset >> part.block_bytes)) {
      return absl::InvalidArgumentError("a part");
    }
    share.parts.push_back(part);
  }
  return share;
}

std::unique_ptr<model::KvCache> MakePool(std::unique_ptr<model::CudaDevice>& device) {
  absl::StatusOr<std::unique_ptr<model::CudaDevice>> created = model::CudaDevice::Create({});
  CheckOk(created.status(), "CudaDevice::Create");
  device = std::move(*created);
  absl::StatusOr<std::unique_ptr<model::KvCache>> pool =
      device->CreateKvCache(Llama3_8BShape(), kPoolBlocks, kBlockSize);
  CheckOk(pool.status(), "CreateKvCache");
  return std::move(*pool);
}

// --serve: the source pool, its pattern, its share on stdout; held until stdin closes.
int Serve() {
  std::unique_ptr<model::CudaDevice> device;
  std::unique_ptr<model::KvCache> pool = MakePool(device);
  const int64_t slot = pool->block_bytes();
  std::vector<uint8_t> host(kChunkBlocks * slot);
  for (int64_t first = 0; first < kPoolBlocks; first += kChunkBlocks) {
    std::vector<const uint8_t*> slots;
    std::vector<int32_t> blocks;
    for (int64_t b = first; b < std::min(kPoolBlocks, first + kChunkBlocks); ++b) {
      uint8_t* at = host.data() + (b - first) * slot;
      FillPattern(b, at, slot);
      slots.push_back(at);
      blocks.push_back(static_cast<int32_t>(b));
    }
    CheckOk(pool->LoadBlocks(slots, blocks), "LoadBlocks (the pattern)");
  }
  absl::StatusOr<model::KvPoolShare> share = pool->Share();
  if (!share.ok()) {
    std::printf("error Share: %s\n", share.status().ToString().c_str());
    std::fflush(stdout);
    return 1;
  }
  std::printf("%s\n", ShareLine(*share).c_str());
  std::fflush(stdout);
  char buffer[256];
  while (read(STDIN_FILENO, buffer, sizeof(buffer)) > 0) {
  }
  return 0;
}

// The server process: its stdin (closed to end it), its stdout (open while it serves: a write
// to a closed pipe would end it with its pool mapped here) and its share (or error) line.
struct Server {
  pid_t pid = -1;
  int to_server = -1;
  int from_server = -1;
  std::string line;
};

Server StartServer() {
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) {
    std::perror("pipe2");
    std::exit(1);
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  char arg0[] = "kv_pool_transfer_bench", arg1[] = "--serve";
  char* argv[] = {arg0, arg1, nullptr};
  Server server;
  const int spawned = posix_spawn(&server.pid, "/proc/self/exe", &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  close(in[0]);
  close(out[1]);
  if (spawned != 0) {
    std::fprintf(stderr, "posix_spawn of /proc/self/exe: %s\n", std::strerror(spawned));
    std::exit(1);
  }
  server.to_server = in[1];
  // Its "share" (or "error") line, within kServerStartSeconds; it may exit before writing one.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(kServerStartSeconds);
  std::string line;
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd ready = {out[0], POLLIN, 0};
    if (poll(&ready, 1, 1000) <= 0) continue;
    char c = 0;
    if (read(out[0], &c, 1) != 1) break;
    if (c != '\n') {
      line += c;
      continue;
    }
    if (line.rfind("share ", 0) == 0 || line.rfind("error ", 0) == 0) {
      server.line = line;
      break;
    }
    line.clear();  // something else the server printed
  }
  server.from_server = out[0];
  return server;
}

int StopServer(Server& server) {
  if (server.to_server >= 0) close(server.to_server);
  server.to_server = -1;
  // What it prints while it exits (nothing is expected) is drained, not a reason to block it.
  char buffer[256];
  while (server.from_server >= 0 && read(server.from_server, buffer, sizeof(buffer)) > 0) {
  }
  if (server.from_server >= 0) close(server.from_server);
  server.from_server = -1;
  int status = 0;
  if (server.pid > 0 && waitpid(server.pid, &status, 0) == server.pid) {
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  return -1;
}

double Seconds(const std::function<void()>& work) {
  const auto start = std::chrono::steady_clock::now();
  work();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The limit: one device-to-device copy of `bytes` on `stream` and its wait, median of `runs`.
double MemcpySeconds(size_t bytes, cudaStream_t stream, int runs) {
  kernels::cuda::DeviceBuffer src = AllocateOrExit(bytes), dst = AllocateOrExit(bytes);
  kernels::cuda::RandomFillParams fill;
  fill.out = src.data();
  fill.count = static_cast<int64_t>(bytes / 2);
  fill.seed = 3;
  CheckOk(kernels::cuda::LaunchRandomFill(fill, stream), "random fill");
  auto copy = [&] {
    BENCH_CHECK_CUDA(
        cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, stream));
    BENCH_CHECK_CUDA(cudaStreamSynchronize(stream));
  };
  copy();  // warm-up
  std::vector<double> samples;
  for (int r = 0; r < runs; ++r) samples.push_back(Seconds(copy));
  return Median(std::move(samples));
}

// Destination blocks whose bytes are not their source block's pattern.
int64_t CountMismatches(const model::KvCache& pool, const std::vector<int32_t>& src,
                        const std::vector<int32_t>& dest) {
  const int64_t slot = pool.block_bytes();
  std::vector<uint8_t> host(kChunkBlocks * slot);
  int64_t mismatched = 0;
  for (size_t first = 0; first < dest.size(); first += kChunkBlocks) {
    const size_t count = std::min<size_t>(kChunkBlocks, dest.size() - first);
    std::vector<uint8_t*> slots;
    for (size_t i = 0; i < count; ++i) slots.push_back(host.data() + i * slot);
    CheckOk(pool.SaveBlocks(absl::MakeConstSpan(dest).subspan(first, count), slots),
            "SaveBlocks (the check)");
    for (size_t i = 0; i < count; ++i) {
      if (!MatchesPattern(src[first + i], slots[i], slot)) {
        if (++mismatched <= 5) {
          std::fprintf(stderr, "block %d -> %d: not the source's bytes\n", src[first + i],
                       dest[first + i]);
        }
      }
    }
  }
  return mismatched;
}

void WriteJson(const std::string& out_path, const std::string& json) {
  if (out_path.empty()) {
    if (!WriteGpuResult(kName, json)) std::exit(1);
    return;
  }
  std::error_code error;
  const std::filesystem::path path(out_path);
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), error);
  std::ofstream file(out_path);
  file << WithProvenance(json);
  std::printf("wrote %s\n", file ? out_path.c_str() : "(failed to write the result)");
  if (!file) std::exit(1);
}

// A run that measured nothing (no device, no IPC): its reason in the JSON, where one is wanted.
void WriteReason(const std::string& out_path, const char* key, const std::string& reason) {
  const char* out = std::getenv("OUT");
  if (out_path.empty() && (out == nullptr || *out == '\0')) return;
  WriteJson(out_path, absl::StrFormat("{\n  \"bench\": \"%s\",\n  \"date\": \"%s\",\n"
                                      "  \"%s\": true,\n  \"reason\": \"%s\"\n}\n",
                                      kName, UtcNow(), key, JsonText(reason)));
}

struct Figures {
  int64_t bytes = 0, block_bytes = 0;
  double first_seconds = 0, copy_seconds = 0, memcpy_seconds = 0;
  int runs = 0;
  int64_t mismatched = 0;
  bool peer_device = false;
};

std::string FiguresJson(const Figures& f, const std::string& device, bool quick) {
  const double copy_gbs = f.bytes / f.copy_seconds / 1e9;
  const double memcpy_gbs = f.bytes / f.memcpy_seconds / 1e9;
  const common::ModelConfig c = Llama3_8BShape();
  return absl::StrFormat(
      "{\n  \"bench\": \"%s\",\n  \"date\": \"%s\",\n  \"device\": \"%s\",\n  \"quick\": %s,\n"
      "  \"pool\": {\"shape\": \"Llama-3-8B\", \"layers\": %d, \"num_kv_heads\": %d, "
      "\"head_dim\": %d, \"kv_dtype\": \"F16\", \"block_size\": %d, \"blocks\": %d, "
      "\"block_bytes\": %d, \"bytes\": %d},\n"
      "  \"path\": \"%s\",\n  \"runs\": %d,\n"
      "  \"transfer_gbs\": %.2f,\n  \"transfer_ms\": %.3f,\n  \"first_transfer_ms\": %.3f,\n"
      "  \"d2d_memcpy_gbs\": %.2f,\n  \"d2d_memcpy_ms\": %.3f,\n  \"ratio\": %.3f,\n"
      "  \"verified_blocks\": %d,\n  \"mismatched_blocks\": %d\n}\n",
      kName, UtcNow(), device, quick ? "true" : "false", c.num_layers, c.num_kv_heads, c.head_dim,
      kBlockSize, kPoolBlocks, f.block_bytes, f.bytes,
      f.peer_device ? "CUDA IPC, a peer device" : "CUDA IPC, this device", f.runs, copy_gbs,
      f.copy_seconds * 1e3, f.first_seconds * 1e3, memcpy_gbs, f.memcpy_seconds * 1e3,
      copy_gbs / memcpy_gbs, kPoolBlocks, f.mismatched);
}

// Parts 2-4 against the server's pool; exits 1 where its share cannot be opened.
Figures Measure(model::CudaDevice& device, const model::KvCache& pool,
                const model::KvPoolShare& share, int runs, const std::string& out_path) {
  absl::StatusOr<model::PeerKvPool> peer = pool.OpenPeer(share);
  if (!peer.ok()) {
    std::printf("%s: OpenPeer: %s\n", kName, peer.status().ToString().c_str());
    WriteReason(out_path, "failed", "OpenPeer: " + peer.status().ToString());
    std::exit(1);
  }
  std::vector<int32_t> src(kPoolBlocks), dest(kPoolBlocks);
  for (int64_t b = 0; b < kPoolBlocks; ++b) src[b] = dest[b] = static_cast<int32_t>(b);
  std::mt19937 rng(17);
  std::shuffle(dest.begin(), dest.end(), rng);
  Figures f;
  f.block_bytes = pool.block_bytes();
  f.bytes = kPoolBlocks * f.block_bytes;
  f.runs = runs;
  int current = 0;
  BENCH_CHECK_CUDA(cudaGetDevice(&current));
  cudaDeviceProp properties;
  BENCH_CHECK_CUDA(cudaGetDeviceProperties(&properties, current));
  f.peer_device = share.cuda_device_uuid != std::string(properties.uuid.bytes, 16);
  auto transfer = [&] {
    CheckOk(pool.CopyBlocksFromPeer(*peer, src, dest, {}), "CopyBlocksFromPeer");
  };
  f.first_seconds = Seconds(transfer);
  std::vector<double> samples;
  for (int r = 0; r < runs; ++r) samples.push_back(Seconds(transfer));
  f.copy_seconds = Median(std::move(samples));
  f.memcpy_seconds = MemcpySeconds(static_cast<size_t>(f.bytes), device.stream(), runs);
  f.mismatched = CountMismatches(pool, src, dest);
  return f;
}

int Run(bool quick, const std::string& out_path) {
  if (kernels::CudaDeviceCount() == 0) {
    const std::string why = kernels::CudaDeviceDescription(0);
    std::printf("%s: no CUDA device (%s): nothing measured\n", kName, why.c_str());
    WriteReason(out_path, "skipped", "no CUDA device: " + why);
    return 0;
  }
  const std::string device_name = kernels::CudaDeviceDescription(0);
  std::printf("%s on %s\n", kName, device_name.c_str());
  Server server = StartServer();
  absl::StatusOr<model::KvPoolShare> share = ParseShare(server.line);
  if (!share.ok()) {
    const int code = StopServer(server);
    const std::string reason =
        absl::StrFormat("the server (exit %d) gave no share: %s", code,
                        server.line.empty() ? "(nothing)" : server.line.substr(0, 300));
    std::printf("%s: %s\n", kName, reason.c_str());
    WriteReason(out_path, "failed", reason);
    return 1;
  }
  std::unique_ptr<model::CudaDevice> device;
  std::unique_ptr<model::KvCache> pool = MakePool(device);
  const Figures f = Measure(*device, *pool, *share, quick ? kQuickRuns : kRuns, out_path);
  StopServer(server);

  const double copy_gbs = f.bytes / f.copy_seconds / 1e9;
  const double memcpy_gbs = f.bytes / f.memcpy_seconds / 1e9;
  std::printf(
      "pool-to-pool, %ld blocks of %.1f MiB (%.2f GiB, %s): %.3f ms (first %.3f ms), %.1f GB/s; "
      "same-process device-to-device cudaMemcpy of the same bytes %.3f ms, %.1f GB/s; "
      "ratio %.3f; %ld of %ld blocks mismatched\n",
      static_cast<long>(kPoolBlocks), f.block_bytes / 1048576.0, f.bytes / 1073741824.0,
      f.peer_device ? "a peer device" : "this device", f.copy_seconds * 1e3, f.first_seconds * 1e3,
      copy_gbs, f.memcpy_seconds * 1e3, memcpy_gbs, copy_gbs / memcpy_gbs,
      static_cast<long>(f.mismatched), static_cast<long>(kPoolBlocks));
  WriteJson(out_path, FiguresJson(f, device_name, quick));
  return f.mismatched == 0 ? 0 : 1;
}

}  // namespace
}  // namespace loom::bench

int main(int argc, char** argv) {
  bool quick = false, serve = false;
  std::string out_path;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--quick") {
      quick = true;
    } else if (arg == "--serve") {
      serve = true;
    } else if (arg == "--out" && i + 1 < argc) {
      out_path = argv[++i];
    } else {
      std::fprintf(stderr, "%s: unknown argument %s (--quick, --out FILE)\n", argv[0], argv[i]);
      return 2;
    }
  }
  return serve ? loom::bench::Serve() : loom::bench::Run(quick, out_path);
}
