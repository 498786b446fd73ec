#include "worker/coordinator_store.h"

#include <stdexcept>
#include <utility>

#include "absl/strings/str_format.h"

namespace loom::worker {

CoordinatorStore::CoordinatorStore(std::shared_ptr<grpc::Channel> channel, std::string prefix,
                                   std::chrono::milliseconds timeout)
    : stub_(loom::v1::Coordinator::NewStub(std::move(channel))),
      prefix_(std::move(prefix)),
      timeout_(timeout) {}

void CoordinatorStore::set(const std::string& key, const std::vector<char>& data) {
  loom::v1::StoreSetRequest request;
  request.set_key(prefix_ + key);
  request.set_value(std::string(data.begin(), data.end()));
  loom::v1::StoreSetResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout_);
  // A coordinator that is not listening yet (ranks started beside it, as in one pod) is
  // waited for until the deadline instead of failing the rendezvous at once.
  context.set_wait_for_ready(true);
  const grpc::Status status = stub_->StoreSet(&context, request, &response);
  if (!status.ok()) {
    throw std::runtime_error(absl::StrFormat("rendezvous: setting %s%s on the coordinator: %s",
                                             prefix_, key, status.error_message()));
  }
}

std::vector<std::string> CoordinatorStore::Get(const std::vector<std::string>& keys,
                                               std::chrono::milliseconds timeout) {
  loom::v1::StoreGetRequest request;
  for (const std::string& key : keys) request.add_keys(prefix_ + key);
  request.set_timeout_ms(static_cast<int32_t>(timeout.count()));
  loom::v1::StoreGetResponse response;
  grpc::ClientContext context;
  // The RPC's own deadline leaves the coordinator time to answer DEADLINE_EXCEEDED itself.
  context.set_deadline(std::chrono::system_clock::now() + timeout + std::chrono::seconds(5));
  context.set_wait_for_ready(true);
  const grpc::Status status = stub_->StoreGet(&context, request, &response);
  if (!status.ok()) {
    // gloo recognises timeouts by this wording (see GlooCommunicator).
    throw std::runtime_error(absl::StrFormat(
        "rendezvous: %s waiting for %s%s on the coordinator: %s",
        status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ? "Timed out" : "failed",
        prefix_, keys.empty() ? "" : keys.front(), status.error_message()));
  }
  return {response.values().begin(), response.values().end()};
}

std::vector<char> CoordinatorStore::get(const std::string& key) {
  const std::string value = Get({key}, timeout_).front();
  return {value.begin(), value.end()};
}

void CoordinatorStore::wait(const std::vector<std::string>& keys) { Get(keys, timeout_); }

void CoordinatorStore::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  Get(keys, timeout);
}

}  // namespace loom::worker
