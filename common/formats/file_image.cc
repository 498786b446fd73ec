#include "common/formats/file_image.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace loom::common {

absl::StatusOr<FileImage> FileImage::Map(const std::string& path, absl::string_view kind) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    std::string message = absl::StrCat("cannot open ", kind, " '", path, "': ", std::strerror(error));
    return error == ENOENT ? absl::NotFoundError(message) : absl::InvalidArgumentError(message);
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int error = errno;
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("cannot stat ", kind, " '", path, "': ", std::strerror(error)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not a regular file"));
  }
  FileImage image;
  if (st.st_size > 0) {
    void* mapped = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    if (mapped == MAP_FAILED) {
      const int error = errno;
      ::close(fd);
      return absl::InvalidArgumentError(
          absl::StrCat("cannot mmap ", kind, " '", path, "': ", std::strerror(error)));
    }
    image.mapped_ = mapped;
    image.mapped_size_ = static_cast<size_t>(st.st_size);
  }
  ::close(fd);
  return image;
}

FileImage FileImage::FromBytes(std::string bytes) {
  FileImage image;
  image.owned_ = std::move(bytes);
  return image;
}

FileImage::FileImage(FileImage&& other) noexcept
    : mapped_(std::exchange(other.mapped_, nullptr)),
      mapped_size_(std::exchange(other.mapped_size_, 0)),
      owned_(std::move(other.owned_)) {}

FileImage& FileImage::operator=(FileImage&& other) noexcept {
  if (this != &other) {
    if (mapped_ != nullptr) munmap(mapped_, mapped_size_);
    mapped_ = std::exchange(other.mapped_, nullptr);
    mapped_size_ = std::exchange(other.mapped_size_, 0);
    owned_ = std::move(other.owned_);
  }
  return *this;
}

FileImage::~FileImage() {
  if (mapped_ != nullptr) munmap(mapped_, mapped_size_);
}

}  // namespace loom::common
