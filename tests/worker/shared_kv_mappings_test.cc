// SharedKvMappings: another process's host tier stays mapped between fetches, and a mapping
// whose file is gone or replaced is neither reused nor kept alive. Memory files of this
// process stand in for another worker's (/proc/self is /proc/PID).
#include "worker/shared_kv_mappings.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "gtest/gtest.h"

namespace loom::worker {
namespace {

constexpr int64_t kSize = 1 << 16;

// A memory file of kSize bytes, each `fill`.
int MemoryFile(uint8_t fill) {
  const int fd = memfd_create("shared-kv-mappings-test", 0);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(ftruncate(fd, kSize), 0);
  void* data = mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  EXPECT_NE(data, MAP_FAILED);
  std::memset(data, fill, kSize);
  munmap(data, kSize);
  return fd;
}

TEST(SharedKvMappingsTest, AMappingIsReusedWhileItsFileIsTheSame) {
  SharedKvMappings& mappings = SharedKvMappings::Get();
  const int fd = MemoryFile(7);
  auto first = mappings.Map(getpid(), fd, kSize);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ((*first)->data()[kSize - 1], 7);
  auto again = mappings.Map(getpid(), fd, kSize);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->data(), (*first)->data());  // the same mapping, its pages warm
  // The source writes on: the reader sees the bytes of now.
  ASSERT_EQ(pwrite(fd, "\x09", 1, 0), 1);
  EXPECT_EQ((*again)->data()[0], 9);
  close(fd);
}

TEST(SharedKvMappingsTest, AReplacedOrVanishedFileIsMappedAfreshAndTheOldMappingDropped) {
  SharedKvMappings& mappings = SharedKvMappings::Get();
  const int fd = MemoryFile(1);
  auto old = mappings.Map(getpid(), fd, kSize);
  ASSERT_TRUE(old.ok());
  const size_t held = mappings.size();
  // The source restarted: the same descriptor number now names another memory file.
  const int other = MemoryFile(2);
  ASSERT_GE(dup2(other, fd), 0);
  close(other);
  auto fresh = mappings.Map(getpid(), fd, kSize);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ((*fresh)->data()[0], 2);
  EXPECT_EQ((*old)->data()[0], 1);   // a holder's mapping stays valid until it lets go
  EXPECT_EQ(mappings.size(), held);  // replaced, not added
  // The source exited: nothing opens, and the next Map drops its mapping.
  close(fd);
  EXPECT_EQ(mappings.Map(getpid(), fd, kSize).status().code(), absl::StatusCode::kUnavailable);
  const int another = MemoryFile(3);
  ASSERT_TRUE(mappings.Map(getpid(), another, kSize).ok());
  EXPECT_EQ(mappings.size(), held);  // the vanished one gone, this one added
  close(another);
}

TEST(SharedKvMappingsTest, AFileSmallerThanAskedIsRefused) {
  const int fd = MemoryFile(0);
  // Reading past its end would fault: Unavailable (the fetch streams over TCP instead).
  EXPECT_EQ(SharedKvMappings::Get().Map(getpid(), fd, 2 * kSize).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(SharedKvMappings::Get().Map(getpid(), fd, 0).status().code(),
            absl::StatusCode::kUnavailable);
  close(fd);
}

}  // namespace
}  // namespace loom::worker
