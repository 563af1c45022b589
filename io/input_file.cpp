// Input-file checks shared by the data, hash-table and config-file readers, and the read-only
// file and mapping the data readers use.
#include "io/input_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

namespace moe {

std::string input_file_problem(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status)) {
    if (ec && ec != std::errc::no_such_file_or_directory) {
      return "cannot be inspected: " + ec.message();
    }
    return fs::is_symlink(fs::symlink_status(path, ec)) ? "missing: a link to no file"
                                                        : "missing: no such file";
  }
  if (fs::is_directory(status)) return "not a regular file (a directory)";
  if (!fs::is_regular_file(status)) return "not a regular file";
  return "";
}

FileMapping::FileMapping(FileMapping&& other) noexcept
    : addr_(std::exchange(other.addr_, nullptr)), num_bytes_(std::exchange(other.num_bytes_, 0)) {}

FileMapping& FileMapping::operator=(FileMapping&& other) noexcept {
  if (this != &other) {
    if (addr_ != nullptr) ::munmap(addr_, static_cast<size_t>(num_bytes_));
    addr_ = std::exchange(other.addr_, nullptr);
    num_bytes_ = std::exchange(other.num_bytes_, 0);
  }
  return *this;
}

FileMapping::~FileMapping() {
  if (addr_ != nullptr) ::munmap(addr_, static_cast<size_t>(num_bytes_));
}

void FileMapping::release(int64_t begin, int64_t end) const {
  const int64_t page = ::sysconf(_SC_PAGE_SIZE);
  const int64_t first = (begin + page - 1) / page * page;  // whole pages only: a page shared
  const int64_t last = end / page * page;                  // with the next range stays
  if (addr_ == nullptr || last <= first) return;
  // Advice only: a failure leaves the pages resident, which costs memory, never correctness.
  ::madvise(static_cast<char*>(addr_) + first, static_cast<size_t>(last - first), MADV_DONTNEED);
}

InputFile::InputFile(const std::string& path) {
  if (std::string problem = input_file_problem(path); !problem.empty()) {
    throw InputFileError(problem);
  }
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) {
    throw InputFileError(std::string("unreadable: cannot open for reading (") +
                         std::strerror(errno) + ")");
  }
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const std::string reason = std::strerror(errno);
    ::close(fd_);
    throw InputFileError("unreadable: cannot determine the file size (" + reason + ")");
  }
  num_bytes_ = static_cast<int64_t>(st.st_size);
  if (num_bytes_ == 0) {
    // procfs and sysfs files report size 0 and produce their text when read: one byte tells
    // them from a truly empty file.
    char byte = 0;
    if (::pread(fd_, &byte, 1, 0) > 0) {
      ::close(fd_);
      throw InputFileError("reports size 0 but is not empty (a special file, e.g. under /proc?)");
    }
  }
}

InputFile::~InputFile() {
  ::close(fd_);
}

int64_t InputFile::read_at(int64_t offset, std::span<char> out) const {
  size_t num_read = 0;
  while (num_read < out.size()) {
    const ssize_t n = ::pread(fd_, out.data() + num_read, out.size() - num_read,
                              static_cast<off_t>(offset + static_cast<int64_t>(num_read)));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      throw InputFileError("unreadable: read failed at byte " +
                           std::to_string(offset + static_cast<int64_t>(num_read)) + " (" +
                           std::strerror(errno) + ")");
    }
    if (n == 0) break;  // end of file
    num_read += static_cast<size_t>(n);
  }
  return static_cast<int64_t>(num_read);
}

FileMapping InputFile::map() const {
  if (num_bytes_ == 0) throw InputFileError("empty: nothing to map");
  void* addr = ::mmap(nullptr, static_cast<size_t>(num_bytes_), PROT_READ, MAP_SHARED, fd_, 0);
  if (addr == MAP_FAILED) {
    throw InputFileError("cannot be mapped (" + std::string(std::strerror(errno)) + ")");
  }
  return FileMapping(addr, num_bytes_);
}

}  // namespace moe
