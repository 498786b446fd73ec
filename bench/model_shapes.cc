#include "bench/model_shapes.h"

namespace loom::bench {

common::ModelConfig Llama3_8BShape() {
  common::ModelConfig c;
  c.architecture = "llama";
  c.name = "random Llama-3-8B shape";
  c.vocab_size = 128256;
  c.context_length = 8192;
  c.hidden_size = 4096;
  c.intermediate_size = 14336;
  c.num_layers = 32;
  c.num_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 500000.0;
  c.rope_dim = 128;
  return c;
}

}  // namespace loom::bench
