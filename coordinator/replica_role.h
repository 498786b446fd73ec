#pragma once

#include <string_view>

#include "absl/status/statusor.h"

namespace loom::coordinator {

/// What the coordinator places on a replica (loom-worker --role): disaggregated prefill
/// and decode (docs/ARCHITECTURE.md, "Disaggregated prefill and decode").
enum class ReplicaRole {
  kMixed,    // every request (the default)
  kPrefill,  // long prompts, handed to a decode replica with their KV after the first token
  kDecode,   // the hand-offs, and the prompts too short to hand off
};

/// "mixed" (or ""), "prefill", "decode"; InvalidArgument naming the value otherwise.
absl::StatusOr<ReplicaRole> ParseReplicaRole(std::string_view name);
std::string_view ReplicaRoleName(ReplicaRole role);

}  // namespace loom::coordinator
