#include "api/api_keys.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::api {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string TempFile(const std::string& text) {
  std::string path = ::testing::TempDir() + "/api_keys_" + std::to_string(::getpid()) + "_" +
                     std::to_string(std::hash<std::string>()(text));
  std::ofstream(path) << text;
  return path;
}

TEST(ApiKeysTest, NoKeysAuthorizesEverything) {
  const ApiKeys keys;
  EXPECT_FALSE(keys.enabled());
  EXPECT_TRUE(keys.Authorizes(""));
  EXPECT_TRUE(keys.Authorizes("Bearer anything"));
}

TEST(ApiKeysTest, OnlyABearerTokenEqualToAKeyIsAuthorized) {
  absl::StatusOr<ApiKeys> keys = ApiKeys::Load({"sk-first", "sk-second"}, {}, nullptr);
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_TRUE(keys->enabled());
  EXPECT_EQ(keys->size(), 2u);
  EXPECT_TRUE(keys->Authorizes("Bearer sk-first"));
  EXPECT_TRUE(keys->Authorizes("Bearer sk-second"));
  EXPECT_TRUE(keys->Authorizes("bearer sk-second"));  // the scheme is case-insensitive
  EXPECT_FALSE(keys->Authorizes(""));
  EXPECT_FALSE(keys->Authorizes("sk-first"));           // no scheme
  EXPECT_FALSE(keys->Authorizes("Basic sk-first"));     // another scheme
  EXPECT_FALSE(keys->Authorizes("Bearer sk-firs"));     // a prefix of a key
  EXPECT_FALSE(keys->Authorizes("Bearer sk-first2"));   // a key as a prefix
  EXPECT_FALSE(keys->Authorizes("Bearer SK-FIRST"));    // keys are case-sensitive
  EXPECT_FALSE(keys->Authorizes("Bearer "));
}

TEST(ApiKeysTest, FilesAddKeysAndTheEnvironmentOnlyCountsWithoutOthers) {
  const std::string file = TempFile("# operators' keys\nsk-from-file\n\n  sk-padded  \n");
  absl::StatusOr<ApiKeys> keys = ApiKeys::Load({"sk-flag"}, {file}, "sk-env");
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_EQ(keys->size(), 3u);
  EXPECT_TRUE(keys->Authorizes("Bearer sk-from-file"));
  EXPECT_TRUE(keys->Authorizes("Bearer sk-padded"));
  EXPECT_TRUE(keys->Authorizes("Bearer sk-flag"));
  EXPECT_FALSE(keys->Authorizes("Bearer sk-env"));  // the command line wins
  EXPECT_FALSE(keys->Authorizes("Bearer # operators' keys"));

  absl::StatusOr<ApiKeys> env_only = ApiKeys::Load({}, {}, "sk-env");
  ASSERT_TRUE(env_only.ok());
  EXPECT_TRUE(env_only->Authorizes("Bearer sk-env"));
  absl::StatusOr<ApiKeys> empty_env = ApiKeys::Load({}, {}, "");
  ASSERT_TRUE(empty_env.ok());
  EXPECT_FALSE(empty_env->enabled());
  std::remove(file.c_str());
}

TEST(ApiKeysTest, BadSourcesAreRefusedWithoutEchoingAKey) {
  EXPECT_EQ(ApiKeys::Load({""}, {}, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  const absl::Status missing = ApiKeys::Load({"sk-secret"}, {"/nonexistent/keys"}, nullptr).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr("/nonexistent/keys"));
  EXPECT_THAT(missing.message(), Not(HasSubstr("sk-secret")));
  const std::string blank = TempFile("# nothing here\n\n");
  EXPECT_EQ(ApiKeys::Load({}, {blank}, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::remove(blank.c_str());
  EXPECT_EQ(ApiKeys::Refusal().code(), absl::StatusCode::kUnauthenticated);
}

}  // namespace
}  // namespace loom::api
