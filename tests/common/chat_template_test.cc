// Unit tests for Loom's Jinja chat-template engine. Every expected string below was
// produced by Python's jinja2 configured as Hugging Face does for apply_chat_template
// (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, HF tojson).

#include "common/jinja/chat_template.h"

#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace loom::common {
namespace {

using ::testing::HasSubstr;

// The rendered text, or "ERROR: <message>" so that failures show what went wrong.
std::string RenderOrError(const std::string& source, const std::string& context_json) {
  auto tmpl = ChatTemplate::Parse(source);
  if (!tmpl.ok()) return "ERROR: " + std::string(tmpl.status().message());
  auto text = (*tmpl)->RenderJson(nlohmann::ordered_json::parse(context_json));
  if (!text.ok()) return "ERROR: " + std::string(text.status().message());
  return *text;
}

TEST(ChatTemplateTest, PrintsLiteralText) {
  EXPECT_EQ(RenderOrError("Hello, world!", "{}"), "Hello, world!");
}

TEST(ChatTemplateTest, DropsOneTrailingNewline) { EXPECT_EQ(RenderOrError("a\n", "{}"), "a"); }

TEST(ChatTemplateTest, KeepsInnerCrlfAsNewline) {
  EXPECT_EQ(RenderOrError("a\r\nb\rc", "{}"), "a\nb\nc");
}

TEST(ChatTemplateTest, PrintsVariable) {
  EXPECT_EQ(RenderOrError("{{ name }}!", "{\"name\": \"Loom\"}"), "Loom!");
}

TEST(ChatTemplateTest, UndefinedPrintsEmpty) {
  EXPECT_EQ(RenderOrError("[{{ missing }}]", "{}"), "[]");
}

TEST(ChatTemplateTest, PrintsPythonReprOfValues) {
  EXPECT_EQ(RenderOrError("{{ none }} {{ true }} {{ 1.0 }} {{ 1e16 }} {{ 0.00001 }} {{ [1, 'a', "
                          "none, false] }} {{ {'k': \"it's\"} }} {{ (1,) }}",
                          "{}"),
            "None True 1.0 1e+16 1e-05 [1, 'a', None, False] {'k': \"it's\"} (1,)");
}

TEST(ChatTemplateTest, IntegerArithmeticMatchesPython) {
  EXPECT_EQ(RenderOrError("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 2 "
                          "** -1 }} {{ 1 + 2.5 }} {{ 10 - 3 * 2 }}",
                          "{}"),
            "3 -4 2 3.5 1024 0.5 3.5 4");
}

TEST(ChatTemplateTest, ConcatenatesWithTilde) {
  EXPECT_EQ(RenderOrError("{{ 'a' ~ 1 ~ none ~ missing }}", "{}"), "a1None");
}

TEST(ChatTemplateTest, StringRepetitionAndListConcat) {
  EXPECT_EQ(RenderOrError("{{ 'ab' * 3 }} {{ [1] + [2] }}", "{}"), "ababab [1, 2]");
}

TEST(ChatTemplateTest, ComparisonsAndChains) {
  EXPECT_EQ(
      RenderOrError("{{ 1 < 2 < 3 }} {{ 1 == 1.0 }} {{ 'a' != 'b' }} {{ [1, 2] < [1, 3] }}", "{}"),
      "True True True True");
}

TEST(ChatTemplateTest, InAndNotIn) {
  EXPECT_EQ(RenderOrError(
                "{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'abc' }}",
                "{}"),
            "True True True True");
}

TEST(ChatTemplateTest, AndOrReturnOperands) {
  EXPECT_EQ(RenderOrError("{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ none or [] }} {{ not 0 }}", "{}"),
            "x b [] True");
}

TEST(ChatTemplateTest, TernaryWithoutElseIsUndefined) {
  EXPECT_EQ(RenderOrError("[{{ 'y' if false }}] [{{ 'y' if true else 'n' }}]", "{}"), "[] [y]");
}

TEST(ChatTemplateTest, SubscriptsAndSlices) {
  EXPECT_EQ(RenderOrError("{{ xs[0] }} {{ xs[-1] }} {{ xs[1:] }} {{ xs[::-1] }} {{ xs[:2] }} {{ "
                          "'héllo'[1] }} {{ 'héllo'[::-1] }} [{{ xs[10] }}]",
                          "{\"xs\": [1, 2, 3]}"),
            "1 3 [2, 3] [3, 2, 1] [1, 2] é olléh []");
}

TEST(ChatTemplateTest, AttributeFallsBackToItem) {
  EXPECT_EQ(RenderOrError("{{ m.role }} {{ m['content'] }} [{{ m.missing }}]",
                          "{\"m\": {\"role\": \"user\", \"content\": \"hi\"}}"),
            "user hi []");
}

TEST(ChatTemplateTest, TrimBlocksAndLstripBlocks) {
  EXPECT_EQ(
      RenderOrError("<ul>\n    {% for x in xs %}\n    <li>{{ x }}</li>\n    {% endfor %}\n</ul>",
                    "{\"xs\": [1, 2]}"),
      "<ul>\n    <li>1</li>\n    <li>2</li>\n</ul>");
}

TEST(ChatTemplateTest, MinusStripsWhitespace) {
  EXPECT_EQ(RenderOrError("a  \n  {%- if true -%}  \n  b  \n  {%- endif %}\nc", "{}"), "abc");
}

TEST(ChatTemplateTest, PlusDisablesLstrip) {
  EXPECT_EQ(RenderOrError("  {%+ if true %}x{% endif %}\n  {%- if true +%}\ny{% endif %}", "{}"),
            "  x\ny");
}

TEST(ChatTemplateTest, CommentsAreDroppedAndTrimmed) {
  EXPECT_EQ(RenderOrError("a\n  {# note #}\nb{#- x -#}  c", "{}"), "a\nbc");
}

TEST(ChatTemplateTest, VariableTagsAreNotLstripped) {
  EXPECT_EQ(RenderOrError("  {{ 'x' }}\n  {{- 'y' }}", "{}"), "  xy");
}

TEST(ChatTemplateTest, ForLoopVariables) {
  EXPECT_EQ(
      RenderOrError("{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ "
                    "loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}|{% endfor %}",
                    "{}"),
      "103TrueFalse3|212FalseFalse3a|321FalseTrue3b|");
}

TEST(ChatTemplateTest, ForElseAndFilter) {
  EXPECT_EQ(RenderOrError("{% for x in xs if x > 1 %}{{ x }}/{{ loop.length }} {% else %}none{% "
                          "endfor %}|{% for x in [] %}x{% else %}empty{% endfor %}",
                          "{\"xs\": [1, 2, 3]}"),
            "2/2 3/2 |empty");
}

TEST(ChatTemplateTest, ForUnpacksItems) {
  EXPECT_EQ(RenderOrError("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d "
                          "%}{{ k }}{% endfor %}",
                          "{\"d\": {\"b\": 1, \"a\": 2}}"),
            "b=1;a=2;ba");
}

TEST(ChatTemplateTest, BreakAndContinue) {
  EXPECT_EQ(RenderOrError("{% for i in range(10) %}{% if i == 5 %}{% break %}{% endif %}{% if i is "
                          "odd %}{% continue %}{% endif %}{{ i }}{% endfor %}",
                          "{}"),
            "024");
}

TEST(ChatTemplateTest, IfElifElse) {
  EXPECT_EQ(RenderOrError("{% for x in [1, 2, 3] %}{% if x == 1 %}one{% elif x == 2 %}two{% else "
                          "%}many{% endif %} {% endfor %}",
                          "{}"),
            "one two many ");
}

TEST(ChatTemplateTest, SetInsideLoopDoesNotLeak) {
  EXPECT_EQ(RenderOrError("{% set x = 'outer' %}{% for i in [1, 2] %}{{ x }}{% set x = i %}{{ x }} "
                          "{% endfor %}{{ x }}",
                          "{}"),
            "outer1 outer2 outer");
}

TEST(ChatTemplateTest, NamespaceCarriesStateOutOfLoop) {
  EXPECT_EQ(
      RenderOrError("{% set ns = namespace(count=0, last='') %}{% for m in ms %}{% set ns.count = "
                    "ns.count + 1 %}{% set ns.last = m %}{% endfor %}{{ ns.count }} {{ ns.last }}",
                    "{\"ms\": [\"a\", \"b\", \"c\"]}"),
      "3 c");
}

TEST(ChatTemplateTest, BlockSetCapturesText) {
  EXPECT_EQ(RenderOrError("{% set greeting %}Hi {{ name }}{% endset %}[{{ greeting | upper }}]",
                          "{\"name\": \"bo\"}"),
            "[HI BO]");
}

TEST(ChatTemplateTest, MacroWithDefaults) {
  EXPECT_EQ(RenderOrError("{% macro tag(name, value='x') %}<{{ name }}={{ value }}>{% endmacro "
                          "%}{{ tag('a') }}{{ tag('b', value='y') }}{{ tag('c', 'z') }}",
                          "{}"),
            "<a=x><b=y><c=z>");
}

TEST(ChatTemplateTest, WithScopesVariables) {
  EXPECT_EQ(RenderOrError("{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]", "{}"), "3[]");
}

TEST(ChatTemplateTest, FilterBlock) {
  EXPECT_EQ(RenderOrError("{% filter upper %}hello {{ 'world' }}{% endfilter %}", "{}"),
            "HELLO WORLD");
}

TEST(ChatTemplateTest, Tests) {
  EXPECT_EQ(RenderOrError("{{ x is defined }} {{ y is undefined }} {{ none is none }} {{ 'a' is "
                          "string }} {{ 1 is number }} {{ {} is mapping }} {{ [] is iterable }} {{ "
                          "'a' is sequence }} {{ true is boolean }} {{ false is false }} {{ 4 is "
                          "even }} {{ 9 is divisibleby 3 }} {{ 3 is not odd }} {{ 1 is true }}",
                          "{\"x\": 1}"),
            "True True True True True True True True True True True True False False");
}

TEST(ChatTemplateTest, StringMethods) {
  EXPECT_EQ(
      RenderOrError(
          "{{ '  a b  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ ' a'.lstrip() }}|{{ 'a '.rstrip() "
          "}}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'abc'.startswith('ab') }}|{{ "
          "'abc'.endswith(('x', 'c')) }}|{{ 'mIxEd'.upper() }}{{ 'mIxEd'.lower() }}|{{ 'hello "
          "world'.title() }}|{{ 'hELLO'.capitalize() }}|{{ 'aaa'.replace('a', 'b', 2) }}",
          "{}"),
      "a b|hi|a|a|['a', 'b', '', 'c']|['a', 'b']|True|True|MIXEDmixed|Hello World|Hello|bba");
}

TEST(ChatTemplateTest, DictMethods) {
  EXPECT_EQ(RenderOrError("{{ d.keys() | list }} {{ d.values() | list }} {{ d.get('a') }} {{ "
                          "d.get('z') }} {{ d.get('z', 0) }} {{ d.items() | list }}",
                          "{\"d\": {\"a\": 1, \"b\": [2]}}"),
            "['a', 'b'] [1, [2]] 1 None 0 [('a', 1), ('b', [2])]");
}

TEST(ChatTemplateTest, StringFilters) {
  EXPECT_EQ(RenderOrError("{{ '  x  ' | trim }}|{{ 'ab' | upper }}|{{ 'AB' | lower }}|{{ 'hello "
                          "there-you' | title }}|{{ 'hI' | capitalize }}|{{ 'a-b' | replace('-', "
                          "'+') }}|{{ 3 | string }}{{ '<a>' | e }}{{ '<b>' | safe }}",
                          "{}"),
            "x|AB|ab|Hello There-You|Hi|a+b|3&lt;a&gt;<b>");
}

TEST(ChatTemplateTest, SequenceFilters) {
  EXPECT_EQ(
      RenderOrError("{{ xs | length }} {{ xs | count }} {{ xs | first }} {{ xs | last }} {{ xs | "
                    "join(', ') }} {{ xs | reverse | list }} {{ xs | sort | list }} {{ xs | unique "
                    "| list }} {{ xs | min }} {{ xs | max }} {{ xs | sum }} {{ 'abc' | list }}",
                    "{\"xs\": [3, 1, 2, 3]}"),
      "4 4 3 3 3, 1, 2, 3 [3, 2, 1, 3] [1, 2, 3, 3] [3, 1, 2] 1 3 9 ['a', 'b', 'c']");
}

TEST(ChatTemplateTest, DefaultFilter) {
  EXPECT_EQ(RenderOrError("{{ missing | default('d') }} {{ '' | default('e') }} {{ '' | "
                          "default('f', true) }} {{ none | d('g') }}",
                          "{}"),
            "d  f None");
}

TEST(ChatTemplateTest, NumberFilters) {
  EXPECT_EQ(RenderOrError("{{ '42' | int }} {{ '4.7' | int }} {{ 'x' | int(7) }} {{ '2.5' | float "
                          "}} {{ -3 | abs }} {{ 2.5 | round }} {{ 3.14159 | round(2) }} {{ 2.7 | "
                          "round(0, 'floor') }} {{ 3 | round }}",
                          "{}"),
            "42 4 7 2.5 3 2.0 3.14 2.0 3");
}

TEST(ChatTemplateTest, SelectAndMap) {
  EXPECT_EQ(RenderOrError(
                "{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='content') | "
                "join(',') }}|{{ ms | rejectattr('role', 'eq', 'user') | list | length }}|{{ [0, "
                "1, 2, none] | select | list }}|{{ [1, 2, 3] | reject('odd') | list }}|{{ ['a', "
                "'b'] | map('upper') | join }}|{{ ms | map(attribute='x', default='?') | join }}",
                "{\"ms\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", "
                "\"content\": \"b\"}, {\"role\": \"user\", \"content\": \"c\"}]}"),
            "a,c|1|[1, 2]|[2]|AB|???");
}

TEST(ChatTemplateTest, GeneratorsAreAlwaysTrue) {
  EXPECT_EQ(RenderOrError("{% if [] | select %}yes{% else %}no{% endif %}", "{}"), "yes");
}

TEST(ChatTemplateTest, DictFilters) {
  EXPECT_EQ(RenderOrError("{{ d | items | list }} {{ d | dictsort }} {{ d | tojson }}",
                          "{\"d\": {\"b\": 1, \"a\": \"é\"}}"),
            "[('b', 1), ('a', 'é')] [('a', 'é'), ('b', 1)] {\"b\": 1, \"a\": \"é\"}");
}

TEST(ChatTemplateTest, ToJsonMatchesHuggingFace) {
  EXPECT_EQ(RenderOrError("{{ x | tojson }}\n{{ x | tojson(indent=2) }}",
                          "{\"x\": {\"name\": \"f\", \"args\": [1, 2.5, null, true, "
                          "\"a\\\"b\\n</s>\"], \"empty\": {}}}"),
            "{\"name\": \"f\", \"args\": [1, 2.5, null, true, \"a\\\"b\\n</s>\"], \"empty\": "
            "{}}\n{\n  \"name\": \"f\",\n  \"args\": [\n    1,\n    2.5,\n    null,\n    true,\n   "
            " \"a\\\"b\\n</s>\"\n  ],\n  \"empty\": {}\n}");
}

TEST(ChatTemplateTest, IndentFilter) {
  EXPECT_EQ(RenderOrError("{{ 'a\nb\n\nc' | indent }}|{{ 'a\nb' | indent(2, true) }}|{{ 'a\n\nb' | "
                          "indent('> ', blank=true) }}",
                          "{}"),
            "a\n    b\n\n    c|  a\n  b|a\n> \n> b");
}

TEST(ChatTemplateTest, StringEscapesInLiterals) {
  EXPECT_EQ(
      RenderOrError(
          "{{ 'tab\\there' }}|{{ \"q\\\"uote\" }}|{{ 'nl\\n' }}|{{ '\\u00e9\\x41' }}|{{ 'a' 'b' }}",
          "{}"),
      "tab\there|q\"uote|nl\n|éA|ab");
}

TEST(ChatTemplateTest, RangeAndDict) {
  EXPECT_EQ(RenderOrError(
                "{{ range(3) | list }} {{ range(1, 10, 3) | list }} {{ dict(a=1, b='x') }}", "{}"),
            "[0, 1, 2] [1, 4, 7] {'a': 1, 'b': 'x'}");
}

TEST(ChatTemplateTest, RaiseExceptionInBranchNotTaken) {
  EXPECT_EQ(RenderOrError("{% if false %}{{ raise_exception('no') }}{% endif %}ok", "{}"), "ok");
}

TEST(ChatTemplateTest, MarkupConcatEscapesPlainOperand) {
  EXPECT_EQ(RenderOrError("{{ ('<a>' | safe) + '<b>' }}", "{}"), "<a>&lt;b&gt;");
}

TEST(ChatTemplateTest, RaiseExceptionReportsItsMessage) {
  EXPECT_THAT(RenderOrError("{{ raise_exception('Roles must alternate') }}", "{}"),
              HasSubstr("Roles must alternate"));
}

TEST(ChatTemplateTest, UnsupportedIncludeTag) {
  EXPECT_THAT(RenderOrError("{% include 'other.jinja' %}", "{}"),
              HasSubstr("line 1, column 4: unsupported tag 'include'"));
}

TEST(ChatTemplateTest, UnsupportedExtendsTag) {
  EXPECT_THAT(RenderOrError("\n{% extends 'base' %}", "{}"),
              HasSubstr("line 2, column 4: unsupported tag 'extends'"));
}

TEST(ChatTemplateTest, UnknownTag) {
  EXPECT_THAT(RenderOrError("{% frobnicate %}", "{}"),
              HasSubstr("Encountered unknown tag 'frobnicate'"));
}

TEST(ChatTemplateTest, UnterminatedFor) {
  EXPECT_THAT(RenderOrError("{% for x in xs %}{{ x }}", "{}"),
              HasSubstr("Jinja was looking for the following tags: 'endfor' or 'else'"));
}

TEST(ChatTemplateTest, UnterminatedVariableTag) {
  EXPECT_THAT(RenderOrError("{{ x ", "{}"), HasSubstr("'{{' is not closed"));
}

TEST(ChatTemplateTest, UnterminatedComment) {
  EXPECT_THAT(RenderOrError("{# never closed", "{}"), HasSubstr("Missing end of comment tag"));
}

TEST(ChatTemplateTest, UnknownFilter) {
  EXPECT_THAT(RenderOrError("{{ x | shout }}", "{}"),
              HasSubstr("line 1, column 8: No filter named 'shout'."));
}

TEST(ChatTemplateTest, UnknownTest) {
  EXPECT_THAT(RenderOrError("{{ x is shouty }}", "{}"), HasSubstr("No test named 'shouty'."));
}

TEST(ChatTemplateTest, AttributeOfUndefinedIsError) {
  EXPECT_THAT(RenderOrError("{{ missing.attr }}", "{}"), HasSubstr("'missing' is undefined"));
}

TEST(ChatTemplateTest, AddingStringAndIntIsError) {
  EXPECT_THAT(RenderOrError("{{ 'a' + 1 }}", "{}"),
              HasSubstr("can only concatenate str (not \"int\") to str"));
}

TEST(ChatTemplateTest, DivisionByZeroIsError) {
  EXPECT_THAT(RenderOrError("{{ 1 // 0 }}", "{}"), HasSubstr("division or modulo by zero"));
}

TEST(ChatTemplateTest, BreakOutsideLoopIsError) {
  EXPECT_THAT(RenderOrError("{% break %}", "{}"), HasSubstr("'break' outside loop"));
}

TEST(ChatTemplateTest, CallingUndefinedIsError) {
  EXPECT_THAT(RenderOrError("{{ nothing() }}", "{}"), HasSubstr("'nothing' is undefined"));
}

TEST(ChatTemplateTest, TooBigRangeIsError) {
  EXPECT_THAT(RenderOrError("{{ range(1000000) | length }}", "{}"), HasSubstr("Range too big"));
}

TEST(ChatTemplateTest, StrftimeNowFormatsLocalTime) {
  std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char year[16];
  std::strftime(year, sizeof(year), "%Y", &local);
  EXPECT_EQ(RenderOrError("{{ strftime_now('%Y') }}", "{}"), year);
}

TEST(ChatTemplateTest, RenderFillsMessagesAndSpecialTokens) {
  auto tmpl = ChatTemplate::Parse(
      "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{{ eos_token }}"
      "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}{{ tools | length }}");
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  ChatTemplateInputs inputs;
  inputs.messages = {{"system", "s"}, {"user", "u"}};
  inputs.bos_token = "<s>";
  inputs.eos_token = "</s>";
  inputs.extra_context["tools"] = nlohmann::json::array({1, 2});
  auto text = (*tmpl)->Render(inputs);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "<s><system>s</s><user>u</s><assistant>2");
  inputs.add_generation_prompt = false;
  EXPECT_EQ(*(*tmpl)->Render(inputs), "<s><system>s</s><user>u</s>2");
}

TEST(ChatTemplateTest, ParseErrorsAreInvalidArgument) {
  auto tmpl = ChatTemplate::Parse("{% import 'macros' as m %}");
  ASSERT_FALSE(tmpl.ok());
  EXPECT_EQ(tmpl.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tmpl.status().message(), HasSubstr("unsupported tag 'import'"));
}

TEST(ChatTemplateTest, RaiseExceptionIsInvalidArgumentWithExactMessage) {
  auto tmpl = ChatTemplate::Parse(
      "{% if messages | length == 0 %}{{ raise_exception('No messages') }}{% endif %}");
  ASSERT_TRUE(tmpl.ok());
  auto text = (*tmpl)->Render(ChatTemplateInputs{});
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(text.status().message(), "No messages");
}

TEST(ChatTemplateTest, RuntimeErrorsCarryLineAndColumn) {
  EXPECT_EQ(RenderOrError("line one\n{{ 1 + 'a' }}", "{}"),
            "ERROR: line 2, column 6: unsupported operand type(s) for +: 'int' and 'str'");
}

TEST(ChatTemplateTest, UnboundedMacroRecursionIsAnError) {
  EXPECT_THAT(RenderOrError("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "{}"),
              HasSubstr("macro calls nested deeper than"));
}

TEST(ChatTemplateTest, RunawayOutputIsAnError) {
  EXPECT_THAT(RenderOrError("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}"
                            "{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
                            "{}"),
              HasSubstr("exceeds the limit"));
}

TEST(ChatTemplateTest, RunawayLoopsAreAnError) {
  EXPECT_THAT(RenderOrError("{% for i in range(100000) %}{% for j in range(100000) %}"
                            "{% endfor %}{% endfor %}",
                            "{}"),
              HasSubstr("steps"));
}

TEST(ChatTemplateTest, DeeplyNestedExpressionIsAnErrorNotACrash) {
  std::string source = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  EXPECT_THAT(RenderOrError(source, "{}"), HasSubstr("nested deeper than"));
}

TEST(ChatTemplateTest, RendersConcurrentlyFromOneParsedTemplate) {
  auto tmpl = ChatTemplate::Parse(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
      "{% endfor %}{{ ns.n }}");
  ASSERT_TRUE(tmpl.ok());
  std::vector<std::thread> threads;
  std::vector<std::string> results(8);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      ChatTemplateInputs inputs;
      inputs.messages.assign(t + 1, ChatMessage{"user", "x"});
      results[t] = *(*tmpl)->Render(inputs);
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < 8; ++t) EXPECT_EQ(results[t], std::to_string(t + 1));
}

}  // namespace
}  // namespace loom::common
