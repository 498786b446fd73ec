#pragma once

#include <string>

#include "absl/status/status.h"
#include "loom/v1/worker.pb.h"

namespace loom::api {

/// Reads a request body's output constraint into `sampling.grammar`: OpenAI's
/// `response_format` (`text`, `json_object`, `json_schema` with `schema` and `strict`),
/// vLLM's `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar` (top-level, as
/// the openai client's `extra_body` sends them) and `structured_outputs` (`json`,
/// `regex`, `choice`, `grammar`, `json_object`). The grammar is compiled here (cached),
/// so InvalidArgument with the OpenAI error param names the field for a malformed value,
/// for more than one constraint, and for a construct the engine cannot compile.
/// `body` is the raw request (re-read with the schema's key order kept). Thread-safe.
absl::Status ParseStructuredOutput(const std::string& body, loom::v1::SamplingParams& sampling);

}  // namespace loom::api
