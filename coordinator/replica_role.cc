#include "coordinator/replica_role.h"

#include "absl/strings/str_format.h"

namespace loom::coordinator {

absl::StatusOr<ReplicaRole> ParseReplicaRole(std::string_view name) {
  if (name.empty() || name == "mixed") return ReplicaRole::kMixed;
  if (name == "prefill") return ReplicaRole::kPrefill;
  if (name == "decode") return ReplicaRole::kDecode;
  return absl::InvalidArgumentError(
      absl::StrFormat("unknown replica role '%s' (mixed, prefill or decode)", name));
}

std::string_view ReplicaRoleName(ReplicaRole role) {
  switch (role) {
    case ReplicaRole::kPrefill:
      return "prefill";
    case ReplicaRole::kDecode:
      return "decode";
    case ReplicaRole::kMixed:
      break;
  }
  return "mixed";
}

}  // namespace loom::coordinator
