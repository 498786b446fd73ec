#pragma once

#include <string>

#include "common/formats/gguf_file.h"

namespace loom::common {

/// A 32-hex-digit digest of a GGUF's metadata (keys, value types and values, in file
/// order) and tensor table (names, shapes, types, offsets), but not of the tensor data,
/// so it takes milliseconds. Two processes that open the same file get the same digest;
/// any change to the metadata or the tensor table changes it. The coordinator and its
/// workers compare it to make sure they serve the same model. Thread-safe.
std::string ModelFingerprint(const GgufFile& gguf);

}  // namespace loom::common
