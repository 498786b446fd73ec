// Driver for tests/worker/forward_pass_test.py: loads a model once, then answers one
// JSON request per stdin line with one JSON line on stdout. Errors are answered as
// {"error": "..."} and the process keeps serving, so bad-input tests can check that the
// forward pass survives them.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>

#include "cli/local_engine.h"
#include "common/formats/gguf_file.h"
#include "common/formats/hf_model.h"
#include "common/status_macros.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "worker/cpu_forward_pass.h"
#include "worker/model_step_backend.h"

namespace {

using loom::worker::StepBatch;
using nlohmann::json;

struct Tool {
  std::unique_ptr<loom::common::GgufFile> gguf;
  std::unique_ptr<loom::common::Tokenizer> tokenizer;
  std::unique_ptr<loom::worker::ModelStepBackend> backend;  // owns the forward pass
  loom::worker::CpuForwardPass* forward_pass = nullptr;     // forward passes straight

  int64_t vocab() const { return forward_pass->config().vocab_size; }
  int32_t block_size() const { return static_cast<int32_t>(forward_pass->block_size()); }

  // Consecutive block ids for sequences laid out one after another from block `first`.
  std::vector<int32_t> Blocks(int32_t& first, int64_t tokens) const {
    std::vector<int32_t> blocks;
    for (int64_t i = 0; i < (tokens + block_size() - 1) / block_size(); ++i) blocks.push_back(first++);
    return blocks;
  }

  absl::StatusOr<json> Logits(const std::vector<std::vector<int32_t>>& prompts) {
    StepBatch batch;
    int32_t next_block = 0;
    for (const auto& prompt : prompts) {
      LOOM_RETURN_IF_ERROR(loom::worker::AppendSequence(
          batch, prompt, 0, Blocks(next_block, prompt.size()), block_size(), true));
    }
    std::vector<float> logits;
    LOOM_RETURN_IF_ERROR(forward_pass->Step(batch, logits));
    json rows = json::array();
    for (size_t s = 0; s < prompts.size(); ++s) {
      rows.push_back(std::vector<float>(logits.begin() + s * vocab(), logits.begin() + (s + 1) * vocab()));
    }
    return json{{"logits", rows}};
  }

  absl::StatusOr<json> Greedy(const std::vector<std::vector<int32_t>>& prompts, int32_t max_tokens,
                              bool batched, bool stop_at_eos) {
    std::vector<loom::cli::EngineRequest> requests;
    for (const auto& prompt : prompts) {
      loom::cli::EngineRequest request;
      request.prompt_ids = prompt;
      request.sampling.temperature = 0.0f;
      request.max_tokens = max_tokens;
      request.ignore_eos = !stop_at_eos;
      requests.push_back(std::move(request));
    }
    if (!tokenizer) return absl::FailedPreconditionError("generation needs the model's tokenizer");
    // The serving engine (scheduler, block manager, step executor) over the same forward pass.
    loom::cli::LocalEngine engine(*backend, *tokenizer);
    LOOM_ASSIGN_OR_RETURN(auto results, engine.Generate(requests, nullptr, batched));
    json tokens = json::array();
    for (const auto& result : results) tokens.push_back(result.token_ids());
    return json{{"tokens", tokens}};
  }

  // A's decode mixed with B's prefill in one step vs the two in separate steps.
  absl::StatusOr<json> MixedStepCheck(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
    int32_t next_block = 0;
    const std::vector<int32_t> a_blocks = Blocks(next_block, a.size() + 1);
    const std::vector<int32_t> b_blocks = Blocks(next_block, b.size());
    std::vector<float> logits;
    StepBatch prefill;
    LOOM_RETURN_IF_ERROR(loom::worker::AppendSequence(prefill, a, 0, a_blocks, block_size(), true));
    LOOM_RETURN_IF_ERROR(forward_pass->Step(prefill, logits));
    int32_t a_next = 0;
    for (int64_t i = 1; i < vocab(); ++i) if (logits[i] > logits[a_next]) a_next = static_cast<int32_t>(i);
    const std::vector<int32_t> decode_token{a_next};
    const int32_t a_len = static_cast<int32_t>(a.size());

    StepBatch mixed;
    LOOM_RETURN_IF_ERROR(loom::worker::AppendSequence(mixed, decode_token, a_len, a_blocks, block_size(), true));
    LOOM_RETURN_IF_ERROR(loom::worker::AppendSequence(mixed, b, 0, b_blocks, block_size(), true));
    std::vector<float> mixed_logits;
    LOOM_RETURN_IF_ERROR(forward_pass->Step(mixed, mixed_logits));

    StepBatch decode_only, prefill_only;
    LOOM_RETURN_IF_ERROR(loom::worker::AppendSequence(decode_only, decode_token, a_len, a_blocks, block_size(), true));
    LOOM_RETURN_IF_ERROR(loom::worker::AppendSequence(prefill_only, b, 0, b_blocks, block_size(), true));
    std::vector<float> separate, b_logits;
    LOOM_RETURN_IF_ERROR(forward_pass->Step(decode_only, separate));
    LOOM_RETURN_IF_ERROR(forward_pass->Step(prefill_only, b_logits));
    separate.insert(separate.end(), b_logits.begin(), b_logits.end());
    double max_diff = 0;
    for (size_t i = 0; i < separate.size(); ++i) {
      max_diff = std::max(max_diff, static_cast<double>(std::fabs(separate[i] - mixed_logits[i])));
    }
    return json{{"max_abs_diff", max_diff}};
  }

  // A single-sequence step built verbatim from the request (for bad-input tests).
  absl::StatusOr<json> RawStep(const json& request) {
    StepBatch batch;
    batch.token_ids = request.at("tokens").get<std::vector<int32_t>>();
    batch.positions = request.at("positions").get<std::vector<int32_t>>();
    batch.block_indices = request.at("block_ids").get<std::vector<int32_t>>();
    int32_t context = 0;
    for (size_t t = 0; t < batch.positions.size(); ++t) {
      const int32_t position = batch.positions[t];
      context = std::max(context, position + 1);
      const size_t block = position >= 0 ? position / block_size() : 0;
      const int32_t id = block < batch.block_indices.size() ? batch.block_indices[block] : 0;
      batch.slots.push_back(id * block_size() + (position >= 0 ? position % block_size() : 0));
    }
    batch.query_start.push_back(static_cast<int32_t>(batch.token_ids.size()));
    batch.context_len.push_back(context);
    batch.block_indptr.push_back(static_cast<int32_t>(batch.block_indices.size()));
    batch.sample_rows.push_back(static_cast<int32_t>(batch.token_ids.size()) - 1);
    std::vector<float> logits;
    LOOM_RETURN_IF_ERROR(forward_pass->Step(batch, logits));
    return json{{"ok", true}};
  }

  absl::StatusOr<json> Handle(const json& request) {
    const std::string op = request.at("op").get<std::string>();
    if (op == "tokenize") {
      if (!tokenizer) return absl::FailedPreconditionError("model has no tokenizer");
      return json{{"ids", tokenizer->Encode(request.at("text").get<std::string>(),
                                            request.value("add_special", false), true)}};
    }
    if (op == "detokenize") {
      if (!tokenizer) return absl::FailedPreconditionError("model has no tokenizer");
      LOOM_ASSIGN_OR_RETURN(std::string text,
                            tokenizer->Decode(request.at("ids").get<std::vector<int32_t>>(), false));
      return json{{"text", text}};
    }
    if (op == "logits") return Logits(request.at("prompts").get<std::vector<std::vector<int32_t>>>());
    if (op == "greedy") {
      return Greedy(request.at("prompts").get<std::vector<std::vector<int32_t>>>(),
                    request.value("max_tokens", 32), request.value("batched", true),
                    request.value("stop_at_eos", false));
    }
    if (op == "mixed_step_check") {
      const auto prompts = request.at("prompts").get<std::vector<std::vector<int32_t>>>();
      if (prompts.size() != 2) return absl::InvalidArgumentError("mixed_step_check needs 2 prompts");
      return MixedStepCheck(prompts[0], prompts[1]);
    }
    if (op == "raw_step") return RawStep(request);
    return absl::InvalidArgumentError("unknown op " + op);
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::string model_path;
  loom::worker::CpuForwardPassOptions options;
  options.num_kv_blocks = 256;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--model") model_path = argv[i + 1];
    else if (flag == "--kv-dtype") {
      using loom::kernels::cpu::KvDtype;
      const std::string name = argv[i + 1];
      if (name == "f32") options.kv_dtype = KvDtype::kF32;
      else if (name == "f16") options.kv_dtype = KvDtype::kF16;
      else if (name == "int8") options.kv_dtype = KvDtype::kInt8;
      else if (name == "fp8_e4m3") options.kv_dtype = KvDtype::kFp8E4m3;
      else {
        std::fprintf(stderr, "--kv-dtype %s: expected f32, f16, int8 or fp8_e4m3\n", name.c_str());
        return 1;
      }
    }
    else if (flag == "--threads") options.num_threads = std::atoi(argv[i + 1]);
    else if (flag == "--num-blocks") options.num_kv_blocks = std::atoi(argv[i + 1]);
    else if (flag == "--activations") {
      auto precision = loom::kernels::cpu::ParseActivationPrecision(argv[i + 1]);
      if (!precision.ok()) {
        std::fprintf(stderr, "%s\n", precision.status().ToString().c_str());
        return 1;
      }
      options.activations = *precision;
    }
  }
  Tool tool;
  auto gguf = loom::common::OpenModelFile(model_path);
  if (!gguf.ok()) {
    std::fprintf(stderr, "%s\n", gguf.status().ToString().c_str());
    return 1;
  }
  tool.gguf = std::move(*gguf);
  auto tokenizer = loom::common::Tokenizer::FromGguf(*tool.gguf);
  if (tokenizer.ok()) tool.tokenizer = std::move(*tokenizer);
  auto forward_pass = loom::worker::CpuForwardPass::Create(*tool.gguf, options);
  if (!forward_pass.ok()) {
    std::fprintf(stderr, "%s\n", forward_pass.status().ToString().c_str());
    return 1;
  }
  tool.forward_pass = forward_pass->get();
  tool.backend = std::make_unique<loom::worker::ModelStepBackend>(std::move(*forward_pass));
  std::string line;
  while (std::getline(std::cin, line)) {
    json reply;
    try {
      absl::StatusOr<json> result = tool.Handle(json::parse(line));
      reply = result.ok() ? *result : json{{"error", result.status().ToString()}};
    } catch (const json::exception& e) {
      reply = json{{"error", std::string("bad request: ") + e.what()}};
    }
    std::cout << reply.dump(-1, ' ', false, json::error_handler_t::replace) << std::endl;
  }
  return 0;
}
