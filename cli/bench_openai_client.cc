#include "cli/bench_openai_client.h"

#include <chrono>
#include <optional>
#include <utility>

#include "absl/strings/str_format.h"
#include "httplib.h"
#include "nlohmann/json.hpp"

namespace loom::cli {

void SseDataReader::Feed(std::string_view bytes,
                         const std::function<void(std::string_view)>& on_data) {
  pending_.append(bytes);
  size_t start = 0;
  for (size_t end = pending_.find('\n', start); end != std::string::npos;
       end = pending_.find('\n', start)) {
    std::string_view line(pending_.data() + start, end - start);
    start = end + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) {  // the event ends
      if (has_data_) on_data(data_);
      data_.clear();
      has_data_ = false;
      continue;
    }
    if (line.substr(0, 5) != "data:") continue;  // comments, event:, id:, retry:
    line.remove_prefix(5);
    if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
    if (has_data_) data_.push_back('\n');
    data_.append(line);
    has_data_ = true;
  }
  pending_.erase(0, start);
}

namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

constexpr size_t kMaxErrorBodyBytes = 2048;

// "http://host:port[/prefix]" -> ("http://host:port", "/prefix/v1"); a prefix that already
// ends in /v1 (the form OpenAI clients take) is kept.
std::pair<std::string, std::string> SplitBaseUrl(std::string url) {
  while (!url.empty() && url.back() == '/') url.pop_back();
  const size_t scheme = url.find("://");
  const size_t slash = url.find('/', scheme == std::string::npos ? 0 : scheme + 3);
  std::string host = slash == std::string::npos ? url : url.substr(0, slash);
  std::string prefix = slash == std::string::npos ? "" : url.substr(slash);
  if (prefix.size() < 3 || prefix.compare(prefix.size() - 3, 3, "/v1") != 0) prefix += "/v1";
  return {std::move(host), std::move(prefix)};
}

httplib::Headers AuthHeaders(const std::string& api_key) {
  httplib::Headers headers;
  if (!api_key.empty()) headers.emplace("Authorization", "Bearer " + api_key);
  return headers;
}

void SetTimeouts(httplib::Client& client, double timeout_s) {
  const auto timeout = std::chrono::microseconds(static_cast<int64_t>(timeout_s * 1e6));
  client.set_connection_timeout(timeout);
  client.set_read_timeout(timeout);
  client.set_write_timeout(timeout);
}

// The message of an OpenAI error body ({"error": {"message": ...}}), else the body itself.
std::string ErrorMessage(const std::string& body) {
  const Json parsed = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_object() && parsed.contains("error")) {
    const Json& error = parsed["error"];
    if (error.is_object() && error.contains("message") && error["message"].is_string()) {
      return error["message"].get<std::string>();
    }
    if (error.is_string()) return error.get<std::string>();
  }
  return body;
}

class OpenAiBenchClient final : public BenchClient {
 public:
  OpenAiBenchClient(const std::string& base_url, std::string model, std::string api_key,
                    int64_t num_speculative_tokens)
      : model_(std::move(model)),
        api_key_(std::move(api_key)),
        num_speculative_tokens_(num_speculative_tokens) {
    std::tie(host_, prefix_) = SplitBaseUrl(base_url);
  }

  bool ReturnsTokenIds() const override { return false; }

  std::vector<int32_t> Run(const std::vector<int32_t>& prompt, int32_t max_tokens, double timeout_s,
                           RequestSample& sample) override {
    Json body = {{"model", model_},
                 {"prompt", prompt},
                 {"max_tokens", max_tokens},
                 {"temperature", 0},
                 {"ignore_eos", true},
                 {"stream", true},
                 {"stream_options", {{"include_usage", true}}}};
    if (num_speculative_tokens_ >= 0) body["num_speculative_tokens"] = num_speculative_tokens_;
    httplib::Client client(host_);
    SetTimeouts(client, timeout_s);
    httplib::Request request;
    request.method = "POST";
    request.path = prefix_ + "/completions";
    request.headers = AuthHeaders(api_key_);
    request.headers.emplace("Accept", "text/event-stream");
    request.set_header("Content-Type", "application/json");
    request.body = body.dump();

    sample.prompt_tokens = static_cast<int64_t>(prompt.size());
    int64_t text_chunks = 0;
    std::optional<int64_t> usage_tokens;
    std::string raw;  // the body's first bytes, for an error status
    SseDataReader reader;
    const auto start = Clock::now();
    auto previous = start;
    auto on_event = [&](std::string_view data) {
      if (data == "[DONE]") return;
      const Json event = Json::parse(data, nullptr, /*allow_exceptions=*/false);
      if (!event.is_object()) return;
      if (event.contains("error")) {
        sample.error = ErrorMessage(std::string(data));
        return;
      }
      const auto now = Clock::now();
      if (auto choices = event.find("choices");
          choices != event.end() && choices->is_array() && !choices->empty()) {
        const Json& choice = (*choices)[0];
        const auto text = choice.find("text");
        if (text != choice.end() && text->is_string() &&
            !text->get_ref<const std::string&>().empty()) {
          if (text_chunks == 0) {
            sample.ttft = std::chrono::duration<double>(now - start).count();
          } else {
            sample.itl.push_back(std::chrono::duration<double>(now - previous).count());
          }
          previous = now;
          ++text_chunks;
        }
      }
      if (auto usage = event.find("usage"); usage != event.end() && usage->is_object()) {
        if (usage->contains("completion_tokens") &&
            (*usage)["completion_tokens"].is_number_integer()) {
          usage_tokens = (*usage)["completion_tokens"].get<int64_t>();
        }
        const auto details = usage->find("prompt_tokens_details");
        if (details != usage->end() && details->is_object() && details->contains("cached_tokens") &&
            (*details)["cached_tokens"].is_number_integer()) {
          sample.cached_prompt_tokens = (*details)["cached_tokens"].get<int64_t>();
        }
      }
    };
    const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(timeout_s));
    bool past_deadline = false;
    request.content_receiver = [&](const char* data, size_t length, uint64_t, uint64_t) {
      if (raw.size() < kMaxErrorBodyBytes) {
        raw.append(data, std::min(length, kMaxErrorBodyBytes - raw.size()));
      }
      reader.Feed(std::string_view(data, length), on_event);
      // The read timeout bounds each wait; this bounds the whole request, as gRPC's deadline.
      past_deadline = Clock::now() > deadline;
      return !past_deadline;
    };
    const httplib::Result result = client.send(request);
    sample.e2e = std::chrono::duration<double>(Clock::now() - start).count();
    if (past_deadline) {
      sample.error = absl::StrFormat("deadline of %g s exceeded", timeout_s);
    } else if (!result) {
      sample.error =
          absl::StrFormat("POST %s%s: %s", host_, request.path, httplib::to_string(result.error()));
    } else if (result->status != 200) {
      sample.error = absl::StrFormat("HTTP %d: %s", result->status, ErrorMessage(raw));
    }
    sample.output_tokens = usage_tokens.value_or(text_chunks);
    sample.ok = sample.error.empty() && sample.output_tokens > 0 && text_chunks > 0;
    return {};
  }

 private:
  std::string model_;
  std::string api_key_;
  int64_t num_speculative_tokens_ = -1;  // -1: not sent
  std::string host_;    // scheme://host:port
  std::string prefix_;  // the API root's path, ending in /v1
};

}  // namespace

absl::StatusOr<OpenAiServedModel> FetchOpenAiModel(const std::string& base_url,
                                                   const std::string& api_key, double timeout_s) {
  const auto [host, prefix] = SplitBaseUrl(base_url);
  httplib::Client client(host);
  if (!client.is_valid()) {
    return absl::InvalidArgumentError(absl::StrFormat("bad base URL '%s'", base_url));
  }
  SetTimeouts(client, timeout_s);
  const httplib::Result result = client.Get(prefix + "/models", AuthHeaders(api_key));
  if (!result) {
    return absl::UnavailableError(
        absl::StrFormat("GET %s%s/models: %s", host, prefix, httplib::to_string(result.error())));
  }
  if (result->status != 200) {
    return absl::UnavailableError(absl::StrFormat("GET %s%s/models: HTTP %d: %s", host, prefix,
                                                  result->status, ErrorMessage(result->body)));
  }
  const Json list = Json::parse(result->body, nullptr, /*allow_exceptions=*/false);
  if (!list.is_object() || !list.contains("data") || !list["data"].is_array() ||
      list["data"].empty() || !list["data"][0].is_object() || !list["data"][0].contains("id") ||
      !list["data"][0]["id"].is_string()) {
    return absl::UnavailableError(
        absl::StrFormat("GET %s%s/models: no model in the answer", host, prefix));
  }
  const Json& first = list["data"][0];
  OpenAiServedModel model;
  model.id = first["id"].get<std::string>();
  if (auto meta = first.find("meta"); meta != first.end() && meta->is_object() &&
                                      meta->contains("n_vocab") &&
                                      (*meta)["n_vocab"].is_number_integer()) {
    model.vocab_size = (*meta)["n_vocab"].get<int64_t>();
  }
  return model;
}

std::unique_ptr<BenchClient> MakeOpenAiBenchClient(const std::string& base_url,
                                                   const std::string& model,
                                                   const std::string& api_key,
                                                   int64_t num_speculative_tokens) {
  return std::make_unique<OpenAiBenchClient>(base_url, model, api_key, num_speculative_tokens);
}

}  // namespace loom::cli
