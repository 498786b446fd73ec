#include "coordinator/leader_election.h"

#include <string>

#include "absl/strings/str_format.h"

namespace loom::coordinator {

grpc::Status FollowingStatus(const LeaderElection* election, grpc::ServerContextBase& context) {
  if (election == nullptr || election->leading()) return grpc::Status::OK;
  const std::string leader = election->LeaderAddress();
  if (!leader.empty()) context.AddTrailingMetadata("loom-leader", leader);
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      absl::StrFormat("this coordinator follows (%s); the leader is at %s",
                                      election->Describe(), leader.empty() ? "?" : leader));
}

}  // namespace loom::coordinator
