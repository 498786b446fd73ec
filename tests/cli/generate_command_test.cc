#include "cli/generate_command.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda_device.h"

namespace loom::cli {
namespace {

// Runs the command's entry point in-process with `args`, returning (exit code, stderr).
std::pair<int, std::string> RunGenerate(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  testing::internal::CaptureStderr();
  const int code = RunGenerateCommand(static_cast<int>(args.size()), argv.data());
  return {code, testing::internal::GetCapturedStderr()};
}

TEST(GenerateCommandTest, DeviceCudaWithoutGpuFailsWithClearError) {
  if (kernels::CudaDeviceCount() > 0) GTEST_SKIP() << "a CUDA device is present";
  auto [code, err] =
      RunGenerate({"generate", "--model", "/nonexistent.gguf", "--prompt", "hi", "--device", "cuda"});
  EXPECT_EQ(code, 1) << err;
  EXPECT_NE(err.find("--device cuda: no usable CUDA device"), std::string::npos) << err;
  auto [bad_code, bad_err] =
      RunGenerate({"generate", "--model", "m", "--prompt", "hi", "--cuda-graphs", "maybe"});
  EXPECT_EQ(bad_code, 2) << bad_err;
  EXPECT_NE(bad_err.find("--cuda-graphs"), std::string::npos) << bad_err;
}

}  // namespace
}  // namespace loom::cli
