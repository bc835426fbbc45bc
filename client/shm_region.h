// A POSIX shared-memory object this process creates, maps and unlinks: the
// host side of a host region (RegisterHostRegion) for indexer-cli bench and
// the tests. Not part of the client library's public header: a front-end
// brings its own shared memory (e.g. Python's multiprocessing.shared_memory).
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace indexer::client {

class ShmRegion {
 public:
  // Creates `name` ("/indexer-..."; must not exist), sized `bytes`, mapped
  // read-write. The destructor unmaps and unlinks it.
  static absl::StatusOr<ShmRegion> Create(const std::string& name, size_t bytes) {
    const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
      return absl::InternalError(
          absl::StrCat("shm_open(\"", name, "\"): ", std::strerror(errno)));
    }
    ShmRegion r;
    r.name_ = name;
    if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      const int err = errno;
      close(fd);
      shm_unlink(name.c_str());
      return absl::InternalError(absl::StrCat("ftruncate(\"", name, "\", ", bytes,
                                              "): ", std::strerror(err)));
    }
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int err = errno;
    close(fd);
    if (p == MAP_FAILED) {
      shm_unlink(name.c_str());
      return absl::InternalError(
          absl::StrCat("mmap of \"", name, "\": ", std::strerror(err)));
    }
    r.data_ = static_cast<uint8_t*>(p);
    r.bytes_ = bytes;
    return r;
  }

  ShmRegion() = default;
  ShmRegion(ShmRegion&& o) noexcept { *this = std::move(o); }
  ShmRegion& operator=(ShmRegion&& o) noexcept {
    if (this != &o) {
      Reset();
      name_ = std::move(o.name_);
      data_ = std::exchange(o.data_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
      o.name_.clear();
    }
    return *this;
  }
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;
  ~ShmRegion() { Reset(); }

  const std::string& name() const { return name_; }
  uint8_t* data() const { return data_; }
  size_t size() const { return bytes_; }

 private:
  void Reset() {
    if (data_ != nullptr) munmap(data_, bytes_);
    if (!name_.empty()) shm_unlink(name_.c_str());
    data_ = nullptr;
    bytes_ = 0;
    name_.clear();
  }

  std::string name_;
  uint8_t* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace indexer::client
