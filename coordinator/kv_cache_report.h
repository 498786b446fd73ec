#pragma once

#include <string_view>
#include <vector>

#include "absl/types/span.h"
#include "engine/block_manager.h"
#include "loom/v1/worker.pb.h"

namespace loom::coordinator {

/// The KV blocks a replica's workers still hold when they register (a failover, or a
/// reconnect; RegisterRequest.cached_kv_blocks), as the replica's new block table adopts
/// them: the blocks every rank reports with the same content (a rank that missed a step,
/// or a pipeline stage behind the others, limits what counts), in rank 0's order (parents
/// first), each hashed by this process from its chain (the workers send no hashes:
/// PrefixHashSeed's secret is this process's). A block with the wrong number of tokens,
/// reported twice, or whose parent does not come before it is left out, and so are its
/// descendants.
std::vector<engine::AdoptedBlock> AdoptableBlocks(
    absl::Span<const loom::v1::RegisterRequest* const> ranks, std::string_view model_fingerprint,
    int32_t block_size);

}  // namespace loom::coordinator
