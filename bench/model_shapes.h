#pragma once

// Model shapes the GPU benchmarks build random models and pools of.

#include "common/formats/model_config.h"

namespace loom::bench {

/// Llama-3-8B: hidden 4096, 32 layers, 32 query / 8 KV heads, head dim 128, FFN 14336, vocab
/// 128256, rope theta 500000, context 8192.
common::ModelConfig Llama3_8BShape();

}  // namespace loom::bench
