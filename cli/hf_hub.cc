#include "cli/hf_hub.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/formats/hf_model.h"
#include "common/status_macros.h"
#include "httplib.h"
#include "nlohmann/json.hpp"

namespace loom::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The files of a model directory Loom reads (weights: every top-level *.safetensors).
constexpr const char* kDirectoryFiles[] = {"config.json",
                                           "generation_config.json",
                                           "tokenizer.json",
                                           "tokenizer_config.json",
                                           "special_tokens_map.json",
                                           "chat_template.jinja",
                                           "model.safetensors.index.json"};

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

// "org/name" and the file inside it ("" for the whole repository).
struct HubId {
  std::string repo;
  std::string file;
};

HubId SplitId(const std::string& model) {
  std::vector<std::string> parts = absl::StrSplit(model, '/');
  HubId id{absl::StrCat(parts[0], "/", parts[1]), ""};
  if (parts.size() > 2) {
    id.file = absl::StrJoin(std::vector<std::string>(parts.begin() + 2, parts.end()), "/");
  }
  return id;
}

fs::path RepoDir(const HubOptions& options, const HubId& id) {
  std::string folder = "models--" + id.repo;
  absl::StrReplaceAll({{"/", "--"}}, &folder);
  return fs::path(options.cache_dir) / folder;
}

bool IsCommitHash(const std::string& revision) {
  if (revision.size() != 40) return false;
  for (char c : revision) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

void Log(const HubOptions& options, const std::string& line) {
  if (options.log) {
    options.log(line);
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

// The snapshot (or file in it) the cache holds for the revision, without the network.
absl::StatusOr<std::string> FromCache(const HubOptions& options, const HubId& id) {
  const fs::path repo = RepoDir(options, id);
  std::string commit = options.revision;
  if (!IsCommitHash(commit)) {
    std::ifstream ref(repo / "refs" / options.revision);
    if (!(ref >> commit)) {
      return absl::NotFoundError(
          absl::StrCat(id.repo, " (revision ", options.revision,
                       ") is not in the Hugging Face cache ", options.cache_dir,
                       options.offline ? " and HF_HUB_OFFLINE is set: nothing is downloaded" : ""));
    }
  }
  const fs::path snapshot = repo / "snapshots" / commit;
  const fs::path wanted = id.file.empty() ? snapshot / "config.json" : snapshot / id.file;
  std::error_code error;
  if (!fs::exists(wanted, error)) {
    return absl::NotFoundError(absl::StrCat("the Hugging Face cache has no ", wanted.string()));
  }
  return id.file.empty() ? snapshot.string() : wanted.string();
}

// A client for the endpoint, following redirects (the Hub sends weights from a CDN).
std::unique_ptr<httplib::Client> Connect(const HubOptions& options) {
  auto client = std::make_unique<httplib::Client>(options.endpoint);
  client->set_follow_location(true);
  client->set_connection_timeout(10, 0);
  client->set_read_timeout(60, 0);
  return client;
}

httplib::Headers AuthHeaders(const HubOptions& options) {
  httplib::Headers headers = {{"User-Agent", "loom"}};
  if (!options.token.empty()) headers.emplace("Authorization", "Bearer " + options.token);
  return headers;
}

// The error a Hub response means for `what`.
absl::Status HttpError(const HubOptions& options, const std::string& what, int status) {
  const std::string text = absl::StrCat(what, ": HTTP ", status, " from ", options.endpoint);
  if (status == 401 || status == 403) {
    return absl::PermissionDeniedError(
        absl::StrCat(text, " (a gated or private repository: set HF_TOKEN to a token with access",
                     options.token.empty() ? "" : "; the token given was refused", ")"));
  }
  if (status == 404) return absl::NotFoundError(text);
  return absl::UnavailableError(text);
}

// The revision's commit and file names, from the Hub's API.
struct RepoInfo {
  std::string commit;
  std::vector<std::string> files;
};

absl::StatusOr<RepoInfo> FetchRepoInfo(httplib::Client& client, const HubOptions& options,
                                       const HubId& id) {
  const std::string path = absl::StrCat("/api/models/", id.repo, "/revision/", options.revision);
  httplib::Result result = client.Get(path, AuthHeaders(options));
  if (!result) {
    return absl::UnavailableError(
        absl::StrCat("cannot reach ", options.endpoint, " for ", id.repo, " (",
                     httplib::to_string(result.error()),
                     "); with HF_HUB_OFFLINE=1 models are read from the cache only"));
  }
  if (result->status != 200) return HttpError(options, id.repo, result->status);
  const json info = json::parse(result->body, nullptr, /*allow_exceptions=*/false);
  if (info.is_discarded() || !info.is_object() || !info.contains("sha") ||
      !info["sha"].is_string() || !IsCommitHash(info["sha"].get<std::string>())) {
    return absl::InternalError(absl::StrCat(options.endpoint, path, " answered no commit"));
  }
  RepoInfo repo{info["sha"].get<std::string>(), {}};
  if (auto siblings = info.find("siblings"); siblings != info.end() && siblings->is_array()) {
    for (const json& sibling : *siblings) {
      if (sibling.is_object() && sibling.contains("rfilename") &&
          sibling["rfilename"].is_string()) {
        repo.files.push_back(sibling["rfilename"].get<std::string>());
      }
    }
  }
  return repo;
}

// The files of the repository Loom needs: `file`, or a model directory's.
absl::StatusOr<std::vector<std::string>> WantedFiles(const HubId& id, const RepoInfo& repo) {
  if (!id.file.empty()) {
    if (std::find(repo.files.begin(), repo.files.end(), id.file) == repo.files.end()) {
      return absl::NotFoundError(absl::StrCat(id.repo, " has no file ", id.file));
    }
    return std::vector<std::string>{id.file};
  }
  std::vector<std::string> wanted;
  std::vector<std::string> gguf;
  for (const std::string& file : repo.files) {
    const bool top_level = file.find('/') == std::string::npos;
    const bool listed =
        std::find_if(std::begin(kDirectoryFiles), std::end(kDirectoryFiles),
                     [&](const char* name) { return file == name; }) != std::end(kDirectoryFiles);
    if (listed || (top_level && absl::EndsWith(file, ".safetensors"))) wanted.push_back(file);
    if (absl::EndsWith(file, ".gguf")) gguf.push_back(file);
  }
  if (std::find(wanted.begin(), wanted.end(), "config.json") == wanted.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(id.repo, " has no config.json, so it is not a Hugging Face model directory",
                     gguf.empty() ? ""
                                  : absl::StrCat("; name one of its GGUF files instead: ", id.repo,
                                                 "/", absl::StrJoin(gguf, ", " + id.repo + "/"))));
  }
  return wanted;
}

// Downloads `file` of the commit into `target` (through target.incomplete), logging progress.
absl::Status Download(httplib::Client& client, const HubOptions& options, const HubId& id,
                      const std::string& commit, const std::string& file, const fs::path& target) {
  std::error_code error;
  fs::create_directories(target.parent_path(), error);
  const fs::path partial = target.string() + ".incomplete";
  std::ofstream out(partial, std::ios::binary | std::ios::trunc);
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", partial.string()));
  uint64_t total = 0, received = 0;
  int status = 0;
  auto last_log = std::chrono::steady_clock::now();
  const std::string label = absl::StrCat(id.repo, "/", file);
  httplib::Result result = client.Get(
      absl::StrCat("/", id.repo, "/resolve/", commit, "/", file), AuthHeaders(options),
      [&](const httplib::Response& response) {
        status = response.status;
        if (response.has_header("Content-Length")) {
          total = std::strtoull(response.get_header_value("Content-Length").c_str(), nullptr, 10);
        }
        return status == 200;
      },
      [&](const char* data, size_t length) {
        out.write(data, static_cast<std::streamsize>(length));
        received += length;
        const auto now = std::chrono::steady_clock::now();
        if (now - last_log > std::chrono::seconds(2)) {
          last_log = now;
          Log(options, absl::StrCat("downloading ", label, ": ", received >> 20, " of ",
                                    total >> 20, " MiB"));
        }
        return out.good();
      });
  out.close();
  if (!result && status == 0) {
    fs::remove(partial, error);
    return absl::UnavailableError(absl::StrCat("downloading ", label, " from ", options.endpoint,
                                               ": ", httplib::to_string(result.error())));
  }
  if (status != 200) {
    fs::remove(partial, error);
    return HttpError(options, label, status);
  }
  if (!result || !out || (total != 0 && received != total)) {
    return absl::UnavailableError(absl::StrCat("downloading ", label, ": got ", received, " of ",
                                               total, " bytes (the partial file stays as ",
                                               partial.string(), ")"));
  }
  fs::rename(partial, target, error);
  if (error)
    return absl::InternalError(
        absl::StrCat("cannot rename ", partial.string(), ": ", error.message()));
  Log(options, absl::StrCat("downloaded ", label, " (", received >> 20, " MiB)"));
  return absl::OkStatus();
}

// Holds an exclusive lock on the repository's cache folder while alive.
class RepoLock {
 public:
  explicit RepoLock(const fs::path& repo) {
    std::error_code error;
    fs::create_directories(repo, error);
    fd_ = ::open((repo / ".loom.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ >= 0) ::flock(fd_, LOCK_EX);
  }
  ~RepoLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  RepoLock(const RepoLock&) = delete;
  RepoLock& operator=(const RepoLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace

HubOptions HubOptionsFromEnvironment() {
  HubOptions options;
  if (std::string endpoint = Env("HF_ENDPOINT"); !endpoint.empty()) {
    while (absl::EndsWith(endpoint, "/")) endpoint.pop_back();
    options.endpoint = endpoint;
  }
  std::string home = Env("HF_HOME");
  if (home.empty()) {
    const std::string cache = Env("XDG_CACHE_HOME");
    home = (cache.empty() ? Env("HOME") + "/.cache" : cache) + "/huggingface";
  }
  options.cache_dir = Env("HF_HUB_CACHE").empty() ? home + "/hub" : Env("HF_HUB_CACHE");
  options.token = Env("HF_TOKEN");
  if (options.token.empty()) {
    std::ifstream token_file(home + "/token");
    std::getline(token_file, options.token);
    options.token = std::string(absl::StripAsciiWhitespace(options.token));
  }
  const std::string offline = absl::AsciiStrToLower(Env("HF_HUB_OFFLINE"));
  options.offline = offline == "1" || offline == "true" || offline == "yes" || offline == "on";
  if (std::string revision = Env("LOOM_HF_REVISION"); !revision.empty()) {
    options.revision = revision;
  }
  return options;
}

bool LooksLikeHubId(const std::string& model) {
  std::vector<std::string> parts = absl::StrSplit(model, '/');
  if (parts.size() < 2) return false;
  for (const std::string& part : parts) {
    if (part.empty() || part.front() == '.') return false;
    for (char c : part) {
      if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') {
        return false;
      }
    }
  }
  // A local path mistyped is not sent to the Hub: its first part is a directory here, or it
  // is dir/FILE.gguf.
  std::error_code error;
  if (fs::is_directory(parts[0], error)) return false;
  // More than two parts name a file of the repository: a GGUF.
  return parts.size() == 2 ? !absl::EndsWith(model, ".gguf") : absl::EndsWith(model, ".gguf");
}

absl::StatusOr<std::string> ResolveHubModel(const std::string& model, const HubOptions& options) {
  if (!LooksLikeHubId(model)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", model, "' is neither a local path nor a Hugging Face model id (org/name)"));
  }
  const HubId id = SplitId(model);
  if (options.offline) return FromCache(options, id);
  const fs::path repo = RepoDir(options, id);
  RepoLock lock(repo);
  std::unique_ptr<httplib::Client> client = Connect(options);
  absl::StatusOr<RepoInfo> info = FetchRepoInfo(*client, options, id);
  if (!info.ok()) {
    // As huggingface_hub: when the Hub cannot be reached, a cached snapshot still serves.
    if (absl::IsUnavailable(info.status())) {
      absl::StatusOr<std::string> cached = FromCache(options, id);
      if (cached.ok()) {
        Log(options, absl::StrCat(info.status().message(), "; using the cached ", *cached));
        return cached;
      }
    }
    return info.status();
  }
  LOOM_ASSIGN_OR_RETURN(std::vector<std::string> files, WantedFiles(id, *info));
  const fs::path snapshot = repo / "snapshots" / info->commit;
  for (const std::string& file : files) {
    std::error_code error;
    if (fs::exists(snapshot / file, error)) continue;
    LOOM_RETURN_IF_ERROR(Download(*client, options, id, info->commit, file, snapshot / file));
  }
  if (!IsCommitHash(options.revision)) {
    std::error_code error;
    fs::create_directories(repo / "refs", error);
    std::ofstream(repo / "refs" / options.revision, std::ios::trunc) << info->commit;
  }
  return id.file.empty() ? snapshot.string() : (snapshot / id.file).string();
}

void InstallHubModelLocator() {
  common::SetModelLocator([](const std::string& model) -> absl::StatusOr<std::string> {
    if (!LooksLikeHubId(model)) return model;
    return ResolveHubModel(model, HubOptionsFromEnvironment());
  });
}

}  // namespace loom::cli
