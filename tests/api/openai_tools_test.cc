#include "api/openai_tools.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "common/jinja/chat_template.h"
#include "api/openai_request.h"
#include "gtest/gtest.h"
#include "tests/test_paths.h"
#include "tests/common/grammar_test_util.h"

namespace loom::api {
namespace {

using Json = nlohmann::ordered_json;

// The Hugging Face templates of shared/testdata/chat_templates; "" when absent.
std::string SharedTemplate(const std::string& name) {
  std::ifstream file(loom::test_env::SharedDir() + "/testdata/chat_templates/" +
                     name + ".jinja");
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

const Json kWeatherTool = Json::parse(R"({"type": "function", "function": {
  "name": "get_weather", "description": "Current weather",
  "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                 "required": ["city"]}}})");

Json Body(Json tool_choice) {
  Json body{{"messages", Json::array()}, {"tools", Json::array({kWeatherTool})}};
  if (!tool_choice.is_null()) body["tool_choice"] = tool_choice;
  return body;
}

// A conversation with a finished tool call: what an agent sends after running the tool.
const Json kRoundTrip = Json::parse(R"([
  {"role": "user", "content": "Weather in Paris?"},
  {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
    "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
  {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}])");

TEST(OpenAiToolsTest, FormatsOfTheServedFamilies) {
  const std::string qwen = SharedTemplate("Qwen-Qwen2.5-7B-Instruct");
  const std::string llama = SharedTemplate("meta-llama-Llama-3.1-8B-Instruct");
  const std::string mistral = SharedTemplate("mistralai-Mistral-Nemo-Instruct-2407");
  ASSERT_FALSE(qwen.empty() || llama.empty() || mistral.empty()) << "shared/testdata missing";
  EXPECT_EQ(ToolCallFormatOf(qwen), ToolCallFormat::kHermes);
  EXPECT_EQ(ToolCallFormatOf(llama), ToolCallFormat::kLlama3Json);
  EXPECT_EQ(ToolCallFormatOf(mistral), ToolCallFormat::kMistral);
  EXPECT_TRUE(TemplateRendersTools(qwen));
  EXPECT_EQ(ToolCallFormatOf(SharedTemplate("google-gemma-2-2b-it")), ToolCallFormat::kGeneric);
}

TEST(OpenAiToolsTest, RoundTripRendersThroughAToolTemplate) {
  const std::string source = SharedTemplate("Qwen-Qwen2.5-7B-Instruct");
  auto chat_template = common::ChatTemplate::Parse(source);
  ASSERT_TRUE(chat_template.ok()) << chat_template.status();
  absl::StatusOr<ToolsRequest> tools = ParseToolsRequest(Body(nullptr), source);
  ASSERT_TRUE(tools.ok()) << tools.status();
  absl::StatusOr<Json> messages = TemplateMessages(kRoundTrip, *tools);
  ASSERT_TRUE(messages.ok()) << messages.status();
  Json context{{"messages", *messages}, {"tools", tools->tools}, {"add_generation_prompt", true}};
  absl::StatusOr<std::string> text = (*chat_template)->RenderJson(context);
  ASSERT_TRUE(text.ok()) << text.status();
  // The tools in the system turn, the call as the model writes it, the tool's answer.
  EXPECT_NE(
      text->find("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\""),
      std::string::npos)
      << *text;
  EXPECT_NE(text->find("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                       "\"Paris\"}}\n</tool_call>"),
            std::string::npos)
      << *text;
  EXPECT_NE(text->find("<tool_response>\n18 C, sunny\n</tool_response>"), std::string::npos)
      << *text;
}

// The parts of GLM-4.5's chat template that write the tools, a call and a tool's answer.
constexpr char kGlm45Template[] = R"({%- if tools -%}<|system|>
# Tools
<tools>
{% for tool in tools %}{{ tool | tojson(ensure_ascii=False) }}
{% endfor %}</tools>
Call a function as:
<tool_call>{function-name}
<arg_key>{arg-key-1}</arg_key>
<arg_value>{arg-value-1}</arg_value>
</tool_call>{%- endif -%}
{%- for m in messages -%}
{%- if m.role == 'user' -%}<|user|>
{{ m.content }}
{%- elif m.role == 'assistant' -%}<|assistant|>
{%- if m.tool_calls %}{% for tc in m.tool_calls %}{%- if tc.function %}{%- set tc = tc.function %}{%- endif %}
{{ '\n<tool_call>' + tc.name }}
{% set _args = tc.arguments %}{% for k, v in _args.items() %}<arg_key>{{ k }}</arg_key>
<arg_value>{{ v | tojson(ensure_ascii=False) if v is not string else v }}</arg_value>
{% endfor %}</tool_call>{% endfor %}{% endif %}
{%- elif m.role == 'tool' -%}<|observation|>
<tool_response>
{{ m.content }}
</tool_response>
{%- endif -%}{%- endfor -%}<|assistant|>)";

// A call rendered by GLM-4.5's template parses back to the same call: a string parameter
// whose text reads as a number (a zip code) stays a string because the tool says so.
TEST(OpenAiToolsTest, Glm45CallsRenderAndParseBack) {
  EXPECT_EQ(ToolCallFormatOf(kGlm45Template), ToolCallFormat::kGlm45);
  auto chat_template = common::ChatTemplate::Parse(kGlm45Template);
  ASSERT_TRUE(chat_template.ok()) << chat_template.status();
  Json body = Body(nullptr);
  body["tools"][0]["function"]["parameters"]["properties"]["zip"] = {
      {"type", Json::array({"string", "null"})}};
  body["tools"][0]["function"]["parameters"]["properties"]["days"] = {{"type", "integer"}};
  absl::StatusOr<ToolsRequest> tools = ParseToolsRequest(body, kGlm45Template);
  ASSERT_TRUE(tools.ok()) << tools.status();
  EXPECT_TRUE(tools->template_renders_tools);
  EXPECT_TRUE(tools->string_parameters.at("get_weather").contains("zip"));
  EXPECT_FALSE(tools->string_parameters.at("get_weather").contains("days"));
  const std::string arguments = R"({"city":"Saint-Étienne","zip":"42000","days":3,"o":{"a":[1]}})";
  Json conversation = kRoundTrip;
  conversation[1]["tool_calls"][0]["function"]["arguments"] = arguments;
  absl::StatusOr<Json> messages = TemplateMessages(conversation, *tools);
  ASSERT_TRUE(messages.ok()) << messages.status();
  Json context{{"messages", *messages}, {"tools", tools->tools}, {"add_generation_prompt", true}};
  absl::StatusOr<std::string> text = (*chat_template)->RenderJson(context);
  ASSERT_TRUE(text.ok()) << text.status();
  const size_t call = text->find(
      "<|assistant|>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
      "<arg_value>Saint-Étienne</arg_value>");
  ASSERT_NE(call, std::string::npos) << *text;
  EXPECT_NE(text->find("<tool_response>\n18 C, sunny\n</tool_response>"), std::string::npos)
      << *text;
  const std::string reply = text->substr(call + 13, text->find("<|observation|>") - call - 13);
  const ParsedReply parsed =
      ParseToolCalls(ToolCallFormat::kGlm45, reply, tools->string_parameters);
  ASSERT_EQ(parsed.calls.size(), 1u) << reply;
  EXPECT_EQ(parsed.calls[0].name, "get_weather");
  EXPECT_EQ(parsed.calls[0].arguments, arguments);
}

TEST(OpenAiToolsTest, GenericFallbackAddsTheSystemPromptAndRewritesToolTurns) {
  const std::string source = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}";
  absl::StatusOr<ToolsRequest> tools = ParseToolsRequest(Body(nullptr), source);
  ASSERT_TRUE(tools.ok());
  EXPECT_FALSE(tools->template_renders_tools);
  absl::StatusOr<Json> messages = TemplateMessages(kRoundTrip, *tools);
  ASSERT_TRUE(messages.ok()) << messages.status();
  ASSERT_EQ(messages->size(), 4u);
  EXPECT_EQ((*messages)[0]["role"], "system");
  EXPECT_NE((*messages)[0]["content"].get<std::string>().find("\"name\":\"get_weather\""),
            std::string::npos);
  EXPECT_EQ((*messages)[2]["content"],
            R"({"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}}]})");
  EXPECT_EQ((*messages)[3]["role"], "user");
  EXPECT_EQ(
      (*messages)[3]["content"],
      R"({"tool_response":{"tool_call_id":"call_1","name":"get_weather","content":"18 C, sunny"}})");
}

TEST(OpenAiToolsTest, ConstraintAcceptsExactlyAValidCallInEachFormat) {
  struct Case {
    ToolCallFormat format;
    std::string valid, invalid;
  };
  const Case cases[] = {
      {ToolCallFormat::kGeneric,
       R"({"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]})",
       R"({"tool_calls": [{"name": "get_weather", "arguments": {}}]})"},
      {ToolCallFormat::kLlama3Json, R"({"name": "get_weather", "parameters": {"city": "Paris"}})",
       R"({"name": "get_weather", "arguments": {"city": "Paris"}})"},
      {ToolCallFormat::kHermes,
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
       "\"Paris\"}}\n</tool_call>",
       "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}"},
      {ToolCallFormat::kMistral,
       R"([TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}])",
       R"([TOOL_CALLS][{"name": "get_time", "arguments": {"city": "Paris"}}])"},
      {ToolCallFormat::kGranite,
       R"(<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}])",
       R"([TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}])"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<ToolsRequest> tools = ParseToolsRequest(Body("required"), "");
    ASSERT_TRUE(tools.ok());
    tools->format = c.format;
    std::optional<common::GrammarSpec> spec = ToolCallConstraint(*tools);
    ASSERT_TRUE(spec.has_value());
    EXPECT_TRUE(common::testing::Accepts(*spec, c.valid)) << ToolCallFormatName(c.format);
    EXPECT_FALSE(common::testing::Accepts(*spec, c.invalid)) << ToolCallFormatName(c.format);
  }
  // "auto": the same calls, or text that does not start one; a started call that breaks
  // the schema is refused. Formats whose calls are not JSON documents stay free.
  for (const Case& c : cases) {
    absl::StatusOr<ToolsRequest> automatic = ParseToolsRequest(Body("auto"), "");
    ASSERT_TRUE(automatic.ok());
    automatic->format = c.format;
    std::optional<common::GrammarSpec> spec = ToolCallConstraint(*automatic);
    ASSERT_TRUE(spec.has_value()) << ToolCallFormatName(c.format);
    const char* name = ToolCallFormatName(c.format);
    EXPECT_TRUE(common::testing::Accepts(*spec, c.valid)) << name;
    EXPECT_TRUE(common::testing::Accepts(*spec, "It is sunny in Paris today.")) << name;
    EXPECT_TRUE(common::testing::Accepts(*spec, "")) << name;
  }
  for (const Case& c : {cases[0], cases[1], cases[3]}) {  // Hermes' "invalid" is content
    absl::StatusOr<ToolsRequest> automatic = ParseToolsRequest(Body("auto"), "");
    automatic->format = c.format;
    EXPECT_FALSE(common::testing::Accepts(*ToolCallConstraint(*automatic), c.invalid))
        << ToolCallFormatName(c.format);
  }
  for (ToolCallFormat free : {ToolCallFormat::kPythonic, ToolCallFormat::kDeepSeekV3}) {
    absl::StatusOr<ToolsRequest> automatic = ParseToolsRequest(Body("auto"), "");
    automatic->format = free;
    EXPECT_FALSE(ToolCallConstraint(*automatic).has_value()) << ToolCallFormatName(free);
  }
  absl::StatusOr<ToolsRequest> none = ParseToolsRequest(Body("none"), "");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(ToolCallConstraint(*none).has_value());
}

// tool_choice "auto" with the weather tool taking a city (a string) and days (an integer),
// in `format`.
ToolsRequest AutoWithCityAndDays(ToolCallFormat format) {
  Json tool = kWeatherTool;
  tool["function"]["parameters"]["properties"]["days"] = Json{{"type", "integer"}};
  Json body = Body("auto");
  body["tools"] = Json::array({tool});
  absl::StatusOr<ToolsRequest> automatic = ParseToolsRequest(body, "");
  EXPECT_TRUE(automatic.ok()) << automatic.status();
  automatic->format = format;
  return *automatic;
}

// Qwen3-Coder under "auto": its chat template's layout of a call, each value typed by the
// tool's schema; what the grammar lets through, the format's parser reads back.
TEST(OpenAiToolsTest, Qwen3CoderAutoHoldsTheTagsAndTheValuesToTheSchemas) {
  const ToolsRequest automatic = AutoWithCityAndDays(ToolCallFormat::kQwen3Coder);
  std::optional<common::GrammarSpec> spec = ToolCallConstraint(automatic);
  ASSERT_TRUE(spec.has_value());
  const std::string call =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
      "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
  EXPECT_TRUE(common::testing::Accepts(*spec, "Let me check.\n" + call));
  EXPECT_TRUE(common::testing::Accepts(*spec, "No tool needed: it is <b>sunny</b>."));
  EXPECT_FALSE(common::testing::Accepts(
      *spec,
      "<tool_call>\n<function=get_weather>\n<parameter=days>\nthree\n</parameter>\n"
      "</function>\n</tool_call>"));
  EXPECT_FALSE(common::testing::Accepts(*spec, "<tool_call>\n<function=get_time>\n"));
  const ParsedReply parsed = ParseToolCalls(ToolCallFormat::kQwen3Coder, "Let me check.\n" + call,
                                            automatic.string_parameters);
  ASSERT_EQ(parsed.calls.size(), 1u);
  EXPECT_EQ(parsed.calls[0].name, "get_weather");
  EXPECT_EQ(Json::parse(parsed.calls[0].arguments),
            Json::parse(R"({"city": "New York", "days": 3})"));
}

// GLM-4.5 and GLM-4.7 under "auto": the same tags with and without GLM-4.5's newlines; a
// postal code stays the string its schema says, and each layout parses back.
TEST(OpenAiToolsTest, Glm45AutoHoldsBothLayoutsToTheSchemas) {
  const ToolsRequest automatic = AutoWithCityAndDays(ToolCallFormat::kGlm45);
  std::optional<common::GrammarSpec> spec = ToolCallConstraint(automatic);
  ASSERT_TRUE(spec.has_value());
  for (const std::string& call :
       {std::string("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>75001"
                    "</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n"
                    "</tool_call>"),
        std::string("<tool_call>get_weather<arg_key>city</arg_key><arg_value>75001</arg_value>"
                    "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>")}) {
    EXPECT_TRUE(common::testing::Accepts(*spec, "Checking.\n" + call)) << call;
    const ParsedReply parsed =
        ParseToolCalls(ToolCallFormat::kGlm45, "Checking.\n" + call, automatic.string_parameters);
    ASSERT_EQ(parsed.calls.size(), 1u) << call;
    EXPECT_EQ(Json::parse(parsed.calls[0].arguments),
              Json::parse(R"({"city": "75001", "days": 3})"));
  }
  EXPECT_FALSE(common::testing::Accepts(
      *spec,
      "<tool_call>get_weather<arg_key>days</arg_key><arg_value>soon</arg_value></tool_call>"));
}

TEST(OpenAiToolsTest, NamedChoiceAndParallelCallsShapeTheConstraint) {
  Json body = Body(Json{{"type", "function"}, {"function", {{"name", "get_time"}}}});
  body["tools"].push_back(Json::parse(R"({"type": "function", "function": {"name": "get_time"}})"));
  body["parallel_tool_calls"] = false;
  absl::StatusOr<ToolsRequest> tools = ParseToolsRequest(body, "");
  ASSERT_TRUE(tools.ok()) << tools.status();
  EXPECT_EQ(tools->choice, ToolChoice::kNamed);
  std::optional<common::GrammarSpec> spec = ToolCallConstraint(*tools);
  ASSERT_TRUE(spec.has_value());
  EXPECT_TRUE(common::testing::Accepts(
      *spec, R"({"tool_calls": [{"name": "get_time", "arguments": {}}]})"));
  EXPECT_FALSE(common::testing::Accepts(
      *spec, R"({"tool_calls": [{"name": "get_weather", "arguments": {"city": "x"}}]})"));
  EXPECT_FALSE(common::testing::Accepts(
      *spec,
      R"({"tool_calls": [{"name": "get_time", "arguments": {}}, {"name": "get_time", "arguments": {}}]})"));
}

TEST(OpenAiToolsTest, BadToolFieldsNameTheirParam) {
  struct Case {
    std::string body;
    std::string param;
  };
  const Case cases[] = {
      {R"({"tools": {"type": "function"}})", "tools"},
      {R"({"tools": [{"type": "retrieval"}]})", "tools"},
      {R"({"tools": [{"type": "function", "function": {"name": ""}}]})", "tools"},
      {R"({"tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]})", "tools"},
      {R"({"tools": [{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}]})",
       "tools"},
      {R"({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "always"})",
       "tool_choice"},
      {R"({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}})",
       "tool_choice"},
      {R"({"tool_choice": "required"})", "tool_choice"},
      {R"({"tools": [{"type": "function", "function": {"name": "f"}}], "parallel_tool_calls": 1})",
       "parallel_tool_calls"},
      {R"({"tools": [], "functions": []})", "functions"},
      {R"({"function_call": "auto"})", "function_call"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<ToolsRequest> tools = ParseToolsRequest(Json::parse(c.body), "");
    ASSERT_FALSE(tools.ok()) << c.body;
    EXPECT_EQ(OpenAiErrorParam(tools.status()), c.param) << c.body << ": " << tools.status();
  }
  // The legacy API maps onto tools.
  absl::StatusOr<ToolsRequest> legacy = ParseToolsRequest(
      Json::parse(R"({"functions": [{"name": "f"}], "function_call": {"name": "f"}})"), "");
  ASSERT_TRUE(legacy.ok()) << legacy.status();
  EXPECT_TRUE(legacy->legacy);
  EXPECT_EQ(legacy->choice, ToolChoice::kNamed);
  EXPECT_FALSE(legacy->parallel);
}

}  // namespace
}  // namespace loom::api
