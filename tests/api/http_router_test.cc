#include "api/http_router.h"

#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace loom::api {
namespace {

// Keeps what a handler answered (the first answer only, like the server's responder).
class RecordingResponder : public HttpResponder {
 public:
  void Respond(HttpResponse response) override {
    if (!answered) answer = std::move(response);
    answered = true;
  }
  void StartStream(HttpResponse head) override { Respond(std::move(head)); }
  bool Write(std::string data) override {
    written += data;
    return true;
  }
  void End() override {}
  bool Busy() const override { return false; }
  bool Closed() const override { return false; }
  void SetWakeup(std::function<void()>) override {}

  bool answered = false;
  HttpResponse answer;
  std::string written;
};

HttpRequest Request(std::string method, std::string path) {
  HttpRequest request;
  request.method = std::move(method);
  request.path = std::move(path);
  return request;
}

nlohmann::json Error(const HttpResponse& response) {
  EXPECT_EQ(response.content_type, "application/json");
  return nlohmann::json::parse(response.body).at("error");
}

TEST(HttpRouterTest, RunsTheRouteOfTheMethodAndPath) {
  HttpRouter router;
  router.Add("GET", "/a", [](const HttpRequest&, std::shared_ptr<HttpResponder> responder) {
    HttpResponse response;
    response.set_content("get a", "text/plain");
    responder->Respond(std::move(response));
  });
  router.Add("POST", "/a", [](const HttpRequest& request, std::shared_ptr<HttpResponder> r) {
    HttpResponse response;
    response.set_content("post " + request.body, "text/plain");
    r->Respond(std::move(response));
  });
  auto get = std::make_shared<RecordingResponder>();
  router.Dispatch(Request("GET", "/a"), get);
  EXPECT_EQ(get->answer.body, "get a");
  auto post = std::make_shared<RecordingResponder>();
  HttpRequest request = Request("POST", "/a");
  request.body = "x";
  router.Dispatch(request, post);
  EXPECT_EQ(post->answer.status, 200);
  EXPECT_EQ(post->answer.body, "post x");
}

// A handler meeting a client's JSON field of another type than it reads (nlohmann's
// type_error) answers 400, not 500.
TEST(HttpRouterTest, ATypeErrorFromAHandlerIsA400) {
  HttpRouter router;
  router.Add("POST", "/v1/x", [](const HttpRequest& request, std::shared_ptr<HttpResponder>) {
    (void)nlohmann::json::parse(request.body).value("type", std::string());  // a number
  });
  auto answer = std::make_shared<RecordingResponder>();
  HttpRequest request = Request("POST", "/v1/x");
  request.body = R"({"type": 5})";
  router.Dispatch(request, answer);
  EXPECT_EQ(answer->answer.status, 400);
  EXPECT_NE(Error(answer->answer).at("message").get<std::string>().find("wrong JSON type"),
            std::string::npos);
}

TEST(HttpRouterTest, UnknownPathsAre404AndOtherMethods405WithJsonErrors) {
  HttpRouter router;
  router.Add("POST", "/v1/completions", [](const HttpRequest&, std::shared_ptr<HttpResponder>) {
    FAIL() << "not this route";
  });
  auto missing = std::make_shared<RecordingResponder>();
  router.Dispatch(Request("GET", "/v1/nothing"), missing);
  EXPECT_EQ(missing->answer.status, 404);
  EXPECT_EQ(Error(missing->answer).at("type"), "not_found_error");
  EXPECT_NE(Error(missing->answer).at("message").get<std::string>().find("/v1/nothing"),
            std::string::npos);
  auto wrong = std::make_shared<RecordingResponder>();
  router.Dispatch(Request("GET", "/v1/completions"), wrong);
  EXPECT_EQ(wrong->answer.status, 405);
  EXPECT_EQ(Error(wrong->answer).at("type"), "invalid_request_error");
  // The 405 names the path's methods (a GET route brings HEAD).
  EXPECT_EQ(wrong->answer.headers,
            (std::vector<std::pair<std::string, std::string>>{{"Allow", "POST"}}));
  router.Add("GET", "/v1/completions", [](const HttpRequest&, std::shared_ptr<HttpResponder>) {});
  auto put = std::make_shared<RecordingResponder>();
  router.Dispatch(Request("PUT", "/v1/completions"), put);
  EXPECT_EQ(put->answer.headers,
            (std::vector<std::pair<std::string, std::string>>{{"Allow", "GET, HEAD, POST"}}));
  // A path that sorts right after a known one is still unknown.
  auto longer = std::make_shared<RecordingResponder>();
  router.Dispatch(Request("GET", "/v1/completions2"), longer);
  EXPECT_EQ(longer->answer.status, 404);
}

// A POST body nested deeper than any handler's JSON code may recurse is a 400 before the
// handler runs; GET requests and bodies within the limit reach their handlers.
TEST(HttpRouterTest, PostBodiesNestedTooDeepAre400BeforeTheHandler) {
  HttpRouter router;
  int handled = 0;
  auto handler = [&handled](const HttpRequest&, std::shared_ptr<HttpResponder> responder) {
    ++handled;
    responder->Respond(HttpResponse());
  };
  router.Add("POST", "/v1/completions", handler);
  router.Add("GET", "/v1/completions", handler);
  const auto nested = [](int depth) { return std::string(depth, '[') + std::string(depth, ']'); };
  HttpRequest deep = Request("POST", "/v1/completions");
  deep.body = R"({"prompt": "x", "junk": )" + nested(100'000) + "}";
  auto refused = std::make_shared<RecordingResponder>();
  router.Dispatch(deep, refused);
  EXPECT_EQ(refused->answer.status, 400);
  EXPECT_EQ(Error(refused->answer).at("message"),
            "the request body nests arrays and objects deeper than 256 levels");
  EXPECT_EQ(handled, 0);
  HttpRequest fine = Request("POST", "/v1/completions");
  fine.body = R"({"junk": )" + nested(255) + "}";  // 256 levels with the body's object
  auto accepted = std::make_shared<RecordingResponder>();
  router.Dispatch(fine, accepted);
  EXPECT_EQ(accepted->answer.status, 200);
  deep.method = "GET";
  router.Dispatch(deep, std::make_shared<RecordingResponder>());
  EXPECT_EQ(handled, 2);
}

TEST(HttpRouterTest, PrefixRoutesTakeLongerPathsTheLongestPrefixFirst) {
  HttpRouter router;
  auto answer = [](std::string text) {
    return [text](const HttpRequest& request, std::shared_ptr<HttpResponder> responder) {
      HttpResponse response;
      response.set_content(text + " " + request.path, "text/plain");
      responder->Respond(std::move(response));
    };
  };
  router.Add("GET", "/v1/models", answer("list"));
  router.AddPrefix("GET", "/v1/models/", answer("one"));
  router.AddPrefix("GET", "/v1/models/special/", answer("special"));
  const auto body = [&](const std::string& method, const std::string& path) {
    auto recorded = std::make_shared<RecordingResponder>();
    router.Dispatch(Request(method, path), recorded);
    return std::to_string(recorded->answer.status) + " " + recorded->answer.body;
  };
  EXPECT_EQ(body("GET", "/v1/models"), "200 list /v1/models");
  EXPECT_EQ(body("GET", "/v1/models/org/name"), "200 one /v1/models/org/name");
  EXPECT_EQ(body("GET", "/v1/models/special/x"), "200 special /v1/models/special/x");
  EXPECT_EQ(body("GET", "/v1/models/").substr(0, 3), "404");  // the prefix alone is no id
  EXPECT_EQ(body("POST", "/v1/models/x").substr(0, 3), "404");
}

TEST(HttpRouterTest, AHandlerThatThrowsAnswers500UnlessItAnswered) {
  HttpRouter router;
  router.Add("GET", "/bug", [](const HttpRequest&, std::shared_ptr<HttpResponder>) {
    throw std::runtime_error("a bug");
  });
  router.Add("GET", "/late", [](const HttpRequest&, std::shared_ptr<HttpResponder> responder) {
    responder->Respond(HttpResponse());
    throw std::runtime_error("after the answer");
  });
  auto bug = std::make_shared<RecordingResponder>();
  router.Dispatch(Request("GET", "/bug"), bug);
  EXPECT_EQ(bug->answer.status, 500);
  EXPECT_EQ(Error(bug->answer).at("message"), "a bug");
  auto late = std::make_shared<RecordingResponder>();
  router.Dispatch(Request("GET", "/late"), late);
  EXPECT_EQ(late->answer.status, 200);
}

TEST(HttpRouterTest, HeadersAreFoundWhateverTheirCase) {
  HttpRequest request;
  request.headers = {{"content-type", "application/json"}, {"X-Twice", "1"}, {"x-twice", "2"}};
  EXPECT_EQ(request.Header("Content-Type"), "application/json");
  EXPECT_EQ(request.Header("X-TWICE"), "1");
  EXPECT_EQ(request.Header("Authorization"), "");
}

}  // namespace
}  // namespace loom::api
