#pragma once

#include "absl/status/status.h"
#include "nlohmann/json.hpp"
#include "loom/v1/worker.pb.h"

namespace loom::api {

/// Reads a request body's output constraint into `sampling.grammar`: OpenAI's
/// `response_format` (`text`, `json_object`, `json_schema` with `schema` and `strict`),
/// vLLM's `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar` (top-level, as
/// the openai client's `extra_body` sends them) and `structured_outputs` (`json`,
/// `regex`, `choice`, `grammar`, `json_object`). The grammar is compiled here (cached),
/// so InvalidArgument with the OpenAI error param names the field for a malformed value,
/// for more than one constraint, and for a construct the engine cannot compile.
/// `body` is the request object, parsed once with its key order kept (a schema's property
/// order is the order the grammar generates). Thread-safe.
absl::Status ParseStructuredOutput(const nlohmann::ordered_json& body,
                                   loom::v1::SamplingParams& sampling);

}  // namespace loom::api
