#include "client/endpoints.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "grpcpp/create_channel.h"

namespace loom::client {
namespace {

std::vector<std::string> SplitAddresses(const std::string& addresses) {
  std::vector<std::string> out;
  for (absl::string_view address : absl::StrSplit(addresses, ',')) {
    address = absl::StripAsciiWhitespace(address);
    if (!address.empty()) out.emplace_back(address);
  }
  return out;
}

}  // namespace

Endpoints::Endpoints(const std::string& addresses,
                     std::shared_ptr<grpc::ChannelCredentials> credentials,
                     grpc::ChannelArguments args)
    : addresses_(SplitAddresses(addresses)),
      credentials_(std::move(credentials)),
      args_(std::move(args)) {
  current_ = addresses_.empty() ? addresses : addresses_.front();
}

std::shared_ptr<loom::v1::Inference::Stub> Endpoints::Stub() {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<loom::v1::Inference::Stub>& stub = stubs_[current_];
  if (stub == nullptr) {
    stub = loom::v1::Inference::NewStub(grpc::CreateCustomChannel(current_, credentials_, args_));
  }
  return stub;
}

void Endpoints::Turn(const grpc::ClientContext& context, const grpc::Status& status) {
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return;
  std::string leader;
  const auto& trailing = context.GetServerTrailingMetadata();
  if (auto it = trailing.find("loom-leader"); it != trailing.end()) {
    leader.assign(it->second.data(), it->second.size());
  }
  absl::MutexLock lock(&mu_);
  if (!leader.empty()) {
    current_ = leader;
  } else if (addresses_.size() > 1) {
    auto it = std::find(addresses_.begin(), addresses_.end(), current_);
    const size_t at = it == addresses_.end()
                          ? addresses_.size() - 1
                          : static_cast<size_t>(std::distance(addresses_.begin(), it));
    current_ = addresses_[(at + 1) % addresses_.size()];
  }
}

}  // namespace loom::client
