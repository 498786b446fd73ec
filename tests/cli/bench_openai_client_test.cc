#include "cli/bench_openai_client.h"

#include <string>
#include <string_view>
#include <vector>

#include "gtest/gtest.h"

namespace loom::cli {
namespace {

std::vector<std::string> FeedAll(SseDataReader& reader, const std::vector<std::string>& pieces) {
  std::vector<std::string> events;
  for (const std::string& piece : pieces) {
    reader.Feed(piece, [&](std::string_view data) { events.emplace_back(data); });
  }
  return events;
}

TEST(SseDataReaderTest, DeliversEachEventWhenItsBlankLineArrives) {
  SseDataReader reader;
  std::vector<std::string> events = FeedAll(reader, {"data: {\"a\":1}\n", "\n", "data: [DONE]\n"});
  EXPECT_EQ(events, (std::vector<std::string>{"{\"a\":1}"}));
  events = FeedAll(reader, {"\n"});
  EXPECT_EQ(events, (std::vector<std::string>{"[DONE]"}));
}

TEST(SseDataReaderTest, JoinsEventsSplitAnywhereAcrossReads) {
  const std::string stream =
      "data: {\"text\":\"x\"}\r\n\r\n: keep-alive comment\n\ndata:{\"text\":\"y\"}\n\n"
      "event: message\nid: 7\ndata: first\ndata: second\n\n";
  const std::vector<std::string> expected = {"{\"text\":\"x\"}", "{\"text\":\"y\"}",
                                             "first\nsecond"};
  for (size_t piece = 1; piece <= stream.size(); ++piece) {
    SseDataReader reader;
    std::vector<std::string> pieces;
    for (size_t at = 0; at < stream.size(); at += piece) pieces.push_back(stream.substr(at, piece));
    EXPECT_EQ(FeedAll(reader, pieces), expected) << "pieces of " << piece << " bytes";
  }
}

TEST(SseDataReaderTest, IgnoresBlankLinesWithoutDataAndHoldsAnUnfinishedEvent) {
  SseDataReader reader;
  EXPECT_TRUE(FeedAll(reader, {"\n\n\r\n", ": ping\n\n", "data: partial"}).empty());
  EXPECT_TRUE(FeedAll(reader, {" more\n"}).empty());
  EXPECT_EQ(FeedAll(reader, {"\n"}), (std::vector<std::string>{"partial more"}));
}

TEST(FetchOpenAiModelTest, AnUnreachableServerIsUnavailable) {
  absl::StatusOr<OpenAiServedModel> model =
      FetchOpenAiModel("http://127.0.0.1:1", /*api_key=*/"", /*timeout_s=*/5);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(model.status().message().find("127.0.0.1:1/v1/models"), std::string_view::npos)
      << model.status();
}

}  // namespace
}  // namespace loom::cli
