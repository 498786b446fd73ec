#pragma once

// Internal to loom::client (not installed): how Client starts a GenerateStream.

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "client/client_options.h"
#include "client/endpoints.h"
#include "client/generate_stream.h"
#include "loom/v1/inference.grpc.pb.h"

namespace loom::client {

/// A stream that has not called yet: the first Next() makes the call (on the endpoints'
/// current coordinator; a retry turns as Endpoints::Turn says). `endpoints` is shared so a
/// stream may outlive its Client. `deadline`: InfiniteFuture for none. `api_key`: sent as
/// `authorization: Bearer` metadata on every attempt (empty: none).
std::unique_ptr<GenerateStream> StartGenerateCall(std::shared_ptr<Endpoints> endpoints,
                                                  loom::v1::GenerateRequest request,
                                                  absl::Time deadline, RetryPolicy retry,
                                                  std::string api_key = "");

}  // namespace loom::client
