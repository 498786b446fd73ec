#pragma once

namespace loom::common {

/// The Step call's metadata naming its stream: a decimal uint64 the coordinator picks at
/// random per connection to a worker (coordinator/replica_connection). Pool-to-pool
/// transfers into the worker name it (FetchKvBlocksRequest.dest_stream_id) and write only
/// while it is the worker's current stream (worker/kv_pool_transfer).
inline constexpr char kStepStreamIdMetadata[] = "loom-step-stream-id";

}  // namespace loom::common
