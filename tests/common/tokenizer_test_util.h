#pragma once

// Locating and loading the tokenizer test data (../shared/testdata/tokenizer) and the
// default model for the tokenizer tests.

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common/formats/gguf_file.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/test_paths.h"

namespace loom::common::testing {

using loom::test_env::EnvOr;
using loom::test_env::ModelPath;
using loom::test_env::SourceDir;

inline std::string TokenizerDataDir() { return loom::test_env::SharedDir() + "/testdata/tokenizer"; }

inline std::string ReadFileOrEmpty(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

/// Loads the tokenizer of the GGUF at `path`; records a failure and returns null on error.
inline std::unique_ptr<Tokenizer> LoadTokenizer(const std::string& path) {
  auto gguf = GgufFile::Open(path);
  if (!gguf.ok()) {
    ADD_FAILURE() << "cannot open " << path << ": " << gguf.status();
    return nullptr;
  }
  auto tokenizer = Tokenizer::FromGguf(**gguf);
  if (!tokenizer.ok()) {
    ADD_FAILURE() << "cannot build the tokenizer of " << path << ": " << tokenizer.status();
    return nullptr;
  }
  return std::move(*tokenizer);
}

/// Loads `ggml-vocab-<name>.gguf` from the shared test data.
inline std::unique_ptr<Tokenizer> LoadVocab(const std::string& name) {
  return LoadTokenizer(TokenizerDataDir() + "/ggml-vocab-" + name + ".gguf");
}

}  // namespace loom::common::testing
