#pragma once

// Where the GoogleTest binaries find the checkout, the shared test data and the default
// model. ctest sets LOOM_SOURCE_DIR (tests/CMakeLists.txt); the other variables override
// what is derived from it. Paths never come from __FILE__: ccache's base_dir makes it
// relative to the build directory.

#include <cstdlib>
#include <string>

namespace loom::test_env {

inline std::string EnvOr(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::string(value) : fallback;
}

/// The checkout: LOOM_SOURCE_DIR, else the current directory.
inline std::string SourceDir() { return EnvOr("LOOM_SOURCE_DIR", "."); }

/// The shared/ folder beside the checkout (LOOM_SHARED_DIR overrides).
inline std::string SharedDir() { return EnvOr("LOOM_SHARED_DIR", SourceDir() + "/../shared"); }

/// The bundled default model (LOOM_MODEL_PATH overrides).
inline std::string ModelPath() {
  return EnvOr("LOOM_MODEL_PATH", SourceDir() + "/models/SmolLM2-135M-Instruct.Q4_1.gguf");
}

}  // namespace loom::test_env
