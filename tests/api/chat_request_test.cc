#include "api/chat_request.h"

#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "common/formats/gguf_file.h"
#include "api/openai_request.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_paths.h"
#include "tests/common/tokenizer_test_util.h"

namespace loom::api {
namespace {

using ::testing::HasSubstr;

constexpr char kWeatherSchema[] =
    R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})";

// The Hugging Face templates of shared/testdata/chat_templates; "" when absent.
std::string SharedTemplate(const std::string& name) {
  std::ifstream file(loom::test_env::SharedDir() + "/testdata/chat_templates/" +
                     name + ".jinja");
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

class ChatRequestTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto gguf = common::GgufFile::Open(common::testing::ModelPath());
    ASSERT_TRUE(gguf.ok()) << gguf.status();
    gguf_ = std::move(gguf).value().release();
    tokenizer_ = common::Tokenizer::FromGguf(*gguf_).value().release();
  }

  // A gRPC chat: the round trip of a weather call, with tools.
  static loom::v1::GenerateRequest GrpcChat() {
    loom::v1::GenerateRequest request;
    request.set_max_tokens(32);
    loom::v1::ChatMessage* user = request.add_messages();
    user->set_role("user");
    user->set_content("Weather in Paris?");
    loom::v1::ChatMessage* assistant = request.add_messages();
    assistant->set_role("assistant");
    loom::v1::ToolCall* call = assistant->add_tool_calls();
    call->set_id("call_1");
    call->set_name("get_weather");
    call->set_arguments(R"({"city": "Paris"})");
    loom::v1::ChatMessage* tool = request.add_messages();
    tool->set_role("tool");
    tool->set_tool_call_id("call_1");
    tool->set_content("18 C, sunny");
    loom::v1::Tool* weather = request.add_tools();
    weather->set_name("get_weather");
    weather->set_description("Current weather");
    weather->set_parameters(kWeatherSchema);
    request.set_tool_choice("function");
    request.set_tool_choice_function("get_weather");
    return request;
  }

  // The same chat as an OpenAI body.
  static std::string HttpChat() {
    return std::string(R"({"model": "m", "max_tokens": 32, "messages": [
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}],
      "tools": [{"type": "function", "function": {"name": "get_weather",
        "description": "Current weather", "parameters": )") +
           kWeatherSchema + R"(}}],
      "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})";
  }

  static common::GgufFile* gguf_;
  static common::Tokenizer* tokenizer_;
};

common::GgufFile* ChatRequestTest::gguf_ = nullptr;
common::Tokenizer* ChatRequestTest::tokenizer_ = nullptr;

// gRPC and HTTP share one path: the same conversation gives the same prompt and grammar,
// for a template with tool support (Hermes) and one without (the default model's).
TEST_F(ChatRequestTest, GrpcChatEqualsTheOpenAiChat) {
  const std::string qwen = SharedTemplate("Qwen-Qwen2.5-7B-Instruct");
  ASSERT_FALSE(qwen.empty()) << "shared/testdata missing";
  auto source = gguf_->GetString("tokenizer.chat_template");
  ASSERT_TRUE(source.ok()) << source.status();
  for (const std::string& text : {qwen, std::string(*source)}) {
    auto chat_template = common::ChatTemplate::Parse(text);
    ASSERT_TRUE(chat_template.ok()) << chat_template.status();
    loom::v1::GenerateRequest grpc = GrpcChat();
    absl::StatusOr<ToolsRequest> tools =
        PrepareChatRequest(grpc, *tokenizer_, chat_template->get());
    ASSERT_TRUE(tools.ok()) << tools.status();
    absl::StatusOr<OpenAiRequest> http = ParseOpenAiRequest(
        OpenAiEndpoint::kChatCompletions, HttpChat(), *tokenizer_, chat_template->get());
    ASSERT_TRUE(http.ok()) << http.status();
    ASSERT_EQ(http->prompts.size(), 1u);
    const loom::v1::GenerateRequest& expected = http->prompts[0];
    EXPECT_EQ(tools->format, http->tools.format);
    EXPECT_EQ(tools->choice, ToolChoice::kNamed);
    EXPECT_EQ(grpc.token_ids().ids_size(), expected.token_ids().ids_size());
    EXPECT_TRUE(std::equal(grpc.token_ids().ids().begin(), grpc.token_ids().ids().end(),
                           expected.token_ids().ids().begin()));
    EXPECT_EQ(grpc.sampling().grammar().kind(), expected.sampling().grammar().kind());
    EXPECT_EQ(grpc.sampling().grammar().text(), expected.sampling().grammar().text());
    EXPECT_FALSE(grpc.sampling().grammar().kind().empty());
    EXPECT_EQ(grpc.messages_size(), 0);  // the chat fields became the prompt
    EXPECT_EQ(grpc.tools_size(), 0);
  }
}

TEST_F(ChatRequestTest, BadChatsAreInvalidArgumentNamingTheProblem) {
  auto chat_template = common::ChatTemplate::Parse(*gguf_->GetString("tokenizer.chat_template"));
  ASSERT_TRUE(chat_template.ok());
  const common::ChatTemplate* t = chat_template->get();
  auto error = [&](loom::v1::GenerateRequest request) {
    return PrepareChatRequest(request, *tokenizer_, t).status();
  };
  loom::v1::GenerateRequest both = GrpcChat();
  both.set_text("Hello");
  EXPECT_EQ(error(both).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(error(both).message(), HasSubstr("not both"));

  loom::v1::GenerateRequest tools_only;
  tools_only.set_text("Hello");
  tools_only.add_tools()->set_name("f");
  EXPECT_THAT(error(tools_only).message(), HasSubstr("need messages"));

  loom::v1::GenerateRequest not_json = GrpcChat();
  not_json.mutable_tools(0)->set_parameters("{oops");
  EXPECT_THAT(error(not_json).message(), HasSubstr("not valid JSON"));

  loom::v1::GenerateRequest bad_schema = GrpcChat();
  bad_schema.mutable_tools(0)->set_parameters(R"({"type":"object","properties":{"a":{"not":{}}}})");
  EXPECT_EQ(error(bad_schema).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(error(bad_schema).message(), HasSubstr("'not'"));

  loom::v1::GenerateRequest unknown = GrpcChat();
  unknown.set_tool_choice_function("nope");
  EXPECT_THAT(error(unknown).message(), HasSubstr("nope"));

  loom::v1::GenerateRequest function_without_choice = GrpcChat();
  function_without_choice.set_tool_choice("required");
  EXPECT_THAT(error(function_without_choice).message(), HasSubstr("tool_choice_function"));

  loom::v1::GenerateRequest no_template = GrpcChat();
  EXPECT_EQ(PrepareChatRequest(no_template, *tokenizer_, nullptr).status().code(),
            absl::StatusCode::kFailedPrecondition);

  // No chat fields: the request is left alone.
  loom::v1::GenerateRequest plain;
  plain.set_text("Hello");
  absl::StatusOr<ToolsRequest> none = PrepareChatRequest(plain, *tokenizer_, t);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->active());
  EXPECT_EQ(plain.text(), "Hello");
}

// vLLM's add_generation_prompt and continue_final_message: a prefilled assistant reply is
// left open (cut after its text, keeping trailing whitespace only where the template kept
// it), the same over gRPC and HTTP; both true, or a final message the template drops, is
// InvalidArgument naming continue_final_message.
TEST_F(ChatRequestTest, ContinuesTheFinalMessageOrEndsWithoutAGenerationPrompt) {
  auto chat_template = common::ChatTemplate::Parse(*gguf_->GetString("tokenizer.chat_template"));
  ASSERT_TRUE(chat_template.ok());
  const common::ChatTemplate& t = **chat_template;
  const auto messages = nlohmann::ordered_json::parse(
      R"([{"role": "user", "content": "Name a color."},
          {"role": "assistant", "content": "The color is "}])");
  auto render = [&](const nlohmann::ordered_json& chat, ChatRenderOptions options,
                    const nlohmann::ordered_json* kwargs = nullptr) {
    return RenderChatPrompt(chat, ToolsRequest{}, *tokenizer_, t, kwargs, options);
  };
  const auto user_only = nlohmann::ordered_json::array({messages[0]});
  absl::StatusOr<std::string> with_prompt = render(user_only, {});
  absl::StatusOr<std::string> without_prompt = render(user_only, {false, false});
  ASSERT_TRUE(with_prompt.ok() && without_prompt.ok());
  EXPECT_EQ(*with_prompt, *without_prompt + "<|im_start|>assistant\n");
  const auto kwargs = nlohmann::ordered_json::parse(R"({"add_generation_prompt": false})");
  EXPECT_EQ(*render(user_only, {}, &kwargs), *without_prompt);

  // The default template keeps the message's trailing space; the cut keeps it too.
  absl::StatusOr<std::string> open = render(messages, {false, true});
  ASSERT_TRUE(open.ok()) << open.status();
  EXPECT_EQ(*open, *without_prompt + "<|im_start|>assistant\nThe color is ");
  // Content parts: the last text part is continued.
  auto parts = messages;
  parts[1]["content"] =
      nlohmann::ordered_json::parse(R"([{"type": "text", "text": "The color is "}])");
  EXPECT_EQ(*render(parts, {false, true}), *open);

  // A template that trims the content: the cut drops the trailing space it dropped.
  auto trimming = common::ChatTemplate::Parse(
      "{% for m in messages %}[{{ m.role }}] {{ m.content | trim }}</s>{% endfor %}"
      "{% if add_generation_prompt %}[assistant] {% endif %}");
  ASSERT_TRUE(trimming.ok()) << trimming.status();
  absl::StatusOr<std::string> trimmed =
      RenderChatPrompt(messages, ToolsRequest{}, *tokenizer_, **trimming, nullptr, {false, true});
  ASSERT_TRUE(trimmed.ok()) << trimmed.status();
  EXPECT_EQ(*trimmed, "[user] Name a color.</s>[assistant] The color is");

  // gRPC: the same fields give the same prompt.
  loom::v1::GenerateRequest grpc;
  grpc.set_max_tokens(4);
  for (const auto& message : messages) {
    loom::v1::ChatMessage* added = grpc.add_messages();
    added->set_role(message["role"].get<std::string>());
    added->set_content(message["content"].get<std::string>());
  }
  grpc.set_add_generation_prompt(false);
  grpc.set_continue_final_message(true);
  ASSERT_TRUE(PrepareChatRequest(grpc, *tokenizer_, &t).ok());
  const std::vector<int32_t> expected = EncodeChatPrompt(*open, *tokenizer_);
  EXPECT_EQ(std::vector<int32_t>(grpc.token_ids().ids().begin(), grpc.token_ids().ids().end()),
            expected);
  EXPECT_FALSE(grpc.has_add_generation_prompt() || grpc.continue_final_message());

  auto code_and_param = [](const absl::Status& status) {
    return std::make_pair(status.code(), OpenAiErrorParam(status));
  };
  const auto invalid =
      std::make_pair(absl::StatusCode::kInvalidArgument, std::string("continue_final_message"));
  EXPECT_EQ(code_and_param(render(messages, {true, true}).status()), invalid);
  auto no_text = messages;
  no_text[1]["content"] = nlohmann::ordered_json::array();
  EXPECT_EQ(code_and_param(render(no_text, {false, true}).status()), invalid);
  no_text[1]["content"] = " \n";
  EXPECT_EQ(code_and_param(render(no_text, {false, true}).status()), invalid);
  auto dropping = common::ChatTemplate::Parse("{% for m in messages %}[{{ m.role }}]{% endfor %}");
  ASSERT_TRUE(dropping.ok());
  EXPECT_EQ(code_and_param(RenderChatPrompt(messages, ToolsRequest{}, *tokenizer_, **dropping,
                                            nullptr, {false, true})
                               .status()),
            invalid);
  loom::v1::GenerateRequest without_messages;
  without_messages.set_text("Hello");
  without_messages.set_continue_final_message(true);
  EXPECT_THAT(PrepareChatRequest(without_messages, *tokenizer_, &t).status().message(),
              HasSubstr("need messages"));
}

// gRPC's chat_template_kwargs (JSON text) and reasoning_effort reach the template as the
// HTTP fields do: the effort as the variable `reasoning_effort`, the kwargs over it; both
// need messages, kwargs must be a JSON object and the effort one of OpenAI's four.
TEST_F(ChatRequestTest, GrpcTemplateKwargsAndReasoningEffortReachTheTemplate) {
  auto chat_template = common::ChatTemplate::Parse(
      "{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}"
      "|effort={{ reasoning_effort | default('none') }}|thinking={{ enable_thinking | "
      "default(true) }}");
  ASSERT_TRUE(chat_template.ok()) << chat_template.status();
  auto prompt = [&](const std::string& kwargs, const std::string& effort) {
    loom::v1::GenerateRequest request;
    request.add_messages()->set_role("user");
    request.mutable_messages(0)->set_content("Hi");
    request.set_chat_template_kwargs(kwargs);
    request.set_reasoning_effort(effort);
    absl::StatusOr<ToolsRequest> prepared =
        PrepareChatRequest(request, *tokenizer_, &**chat_template);
    if (!prepared.ok()) return std::make_pair(prepared.status(), std::vector<int32_t>());
    EXPECT_TRUE(request.chat_template_kwargs().empty() && request.reasoning_effort().empty());
    return std::make_pair(absl::OkStatus(), std::vector<int32_t>(request.token_ids().ids().begin(),
                                                                 request.token_ids().ids().end()));
  };
  auto ids = [&](const char* text) { return EncodeChatPrompt(text, *tokenizer_); };
  EXPECT_EQ(prompt("", "").second, ids("[user] Hi|effort=none|thinking=True"));
  EXPECT_EQ(prompt("", "high").second, ids("[user] Hi|effort=high|thinking=True"));
  EXPECT_EQ(prompt(R"({"enable_thinking": false})", "low").second,
            ids("[user] Hi|effort=low|thinking=False"));
  EXPECT_EQ(prompt(R"({"reasoning_effort": "medium"})", "low").second,
            ids("[user] Hi|effort=medium|thinking=True"));
  for (auto [kwargs, effort, param] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"{not json", "", "chat_template_kwargs"},
           {"[1, 2]", "", "chat_template_kwargs"},
           {R"({"messages": []})", "", "chat_template_kwargs"},
           {"", "extreme", "reasoning_effort"}}) {
    const absl::Status status = prompt(kwargs, effort).first;
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << kwargs << effort;
    EXPECT_EQ(OpenAiErrorParam(status), param) << status;
  }
  loom::v1::GenerateRequest without_messages;
  without_messages.set_text("Hello");
  without_messages.set_reasoning_effort("high");
  EXPECT_THAT(
      PrepareChatRequest(without_messages, *tokenizer_, &**chat_template).status().message(),
      HasSubstr("need messages"));
}

TEST(ChatReplyTest, SplitsContentAndCutsToOneCallWithoutParallelCalls) {
  ToolsRequest tools;
  tools.format = ToolCallFormat::kHermes;
  const std::string text =
      "Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": 1}}\n</tool_call>";
  ChatReply both = ParseChatReply(tools, text);
  EXPECT_EQ(both.content, "Let me check.");
  ASSERT_EQ(both.calls.size(), 2u);
  EXPECT_EQ(both.calls[1].name, "b");
  tools.parallel = false;
  ChatReply one = ParseChatReply(tools, text);
  ASSERT_EQ(one.calls.size(), 1u);
  EXPECT_EQ(one.calls[0].name, "a");
  ChatReply plain = ParseChatReply(tools, "Just text.  ");
  EXPECT_EQ(plain.content, "Just text.  ");
  EXPECT_TRUE(plain.calls.empty());
}

}  // namespace
}  // namespace loom::api
