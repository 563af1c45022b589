// FileLock: open-file-description write locks that mark a file as written by a live process
// (io/file_lock.hpp).
#include "io/file_lock.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

namespace moe {
namespace {

// Enough for any honest race (each retry means another process renamed or removed the file
// between two system calls); a path that changes more often than this is an error.
constexpr int kAttempts = 100;

FileLockError lock_error(const std::string& path, const char* call) {
  return FileLockError("'" + path + "': " + call + " failed: " + std::strerror(errno));
}

// A write lock on the whole file, byte 0 to any length it may grow to.
struct flock whole_file(short type) {
  struct flock range {};
  range.l_type = type;
  range.l_whence = SEEK_SET;
  range.l_start = 0;
  range.l_len = 0;
  range.l_pid = 0;  // must be 0 for OFD locks
  return range;
}

// File systems without locks (ENOLCK: an NFS mount without a lock service; EINVAL: a kernel
// before 3.15, which has no OFD locks) are written unlocked, as HDF5 does with its own lock
// there, after one warning.
bool locks_unsupported(int err) {
  return err == ENOLCK || err == EOPNOTSUPP || err == EINVAL;
}

void warn_unsupported(const std::string& path) {
  static bool warned = false;
  if (warned) return;
  warned = true;
  std::fprintf(stderr,
               "warning: '%s' cannot be locked (%s): nothing keeps another run from replacing "
               "it while it is written\n",
               path.c_str(), std::strerror(errno));
}

// True when the lock was taken (or locks are unsupported), false when another holds it.
bool try_lock(int fd, const std::string& path) {
  struct flock range = whole_file(F_WRLCK);
  if (::fcntl(fd, F_OFD_SETLK, &range) == 0) return true;
  if (errno == EAGAIN || errno == EACCES) return false;
  if (locks_unsupported(errno)) {
    warn_unsupported(path);
    return true;
  }
  throw lock_error(path, "fcntl(F_OFD_SETLK)");
}

// Closes a descriptor that was only used to lock or test a lock: nothing was written through it,
// so a failing close() loses nothing (and the descriptor is gone either way on Linux).
struct Descriptor {
  int fd;
  ~Descriptor() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

FileLock::FileLock(FileLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}

FileLock& FileLock::operator=(FileLock&& other) noexcept {
  if (this != &other) {
    release();
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

void FileLock::release() noexcept {
  if (fd_ >= 0) ::close(std::exchange(fd_, -1));  // see Descriptor: nothing to lose
}

bool FileLock::names(const std::string& path) const {
  struct stat mine {};
  struct stat there {};
  if (::fstat(fd_, &mine) != 0) throw lock_error(path, "fstat");
  if (::stat(path.c_str(), &there) != 0) {
    if (errno == ENOENT) return false;
    throw lock_error(path, "stat");
  }
  return mine.st_dev == there.st_dev && mine.st_ino == there.st_ino;
}

void FileLock::remove(const std::string& path) const {
  if (names(path) && ::unlink(path.c_str()) != 0 && errno != ENOENT) {
    throw lock_error(path, "unlink");
  }
}

void FileLock::write_text(const std::string& text) const {
  if (::ftruncate(fd_, 0) != 0)
    throw FileLockError(std::string("lock file: ftruncate failed: ") + std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n =
        ::pwrite(fd_, text.data() + done, text.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw FileLockError(std::string("lock file: write failed: ") + std::strerror(errno));
    done += static_cast<size_t>(n);
  }
}

FileLock::Outcome FileLock::lock_existing(const std::string& path, FileLock& out) {
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    // O_NONBLOCK: opening a FIFO must not wait for a reader (it is refused just below).
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
      if (errno == ENOENT) return Outcome::kMissing;
      throw lock_error(path, "open");
    }
    FileLock lock(fd);
    struct stat st {};
    if (::fstat(fd, &st) != 0) throw lock_error(path, "fstat");
    if (!S_ISREG(st.st_mode)) throw FileLockError("'" + path + "' is not a regular file");
    if (!try_lock(fd, path)) return Outcome::kBusy;
    if (lock.names(path)) {
      out = std::move(lock);
      return Outcome::kLocked;
    }
    // Renamed or removed between the open and the lock: lock whatever the path names now.
  }
  throw FileLockError("'" + path + "' kept changing while it was being locked");
}

FileLock::Outcome FileLock::create(const std::string& path, FileLock& out) {
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY, 0644);
    if (fd >= 0) {
      FileLock lock(fd);
      // Between the creation and the lock, another process may have taken this empty file for a
      // leftover and removed it: then the path no longer names it, and creation starts again.
      if (try_lock(fd, path) && lock.names(path)) {
        out = std::move(lock);
        return Outcome::kLocked;
      }
      continue;
    }
    if (errno != EEXIST) throw lock_error(path, "open(O_CREAT | O_EXCL)");
    FileLock stale;
    const Outcome there = lock_existing(path, stale);
    if (there == Outcome::kBusy) return Outcome::kBusy;
    if (there == Outcome::kLocked) stale.remove(path);  // a killed writer's leftover
  }
  throw FileLockError("'" + path + "' kept changing while it was being created");
}

bool FileLock::is_held(const std::string& path) {
  const Descriptor file{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK)};
  if (file.fd < 0) {
    if (errno == ENOENT) return false;
    throw lock_error(path, "open");
  }
  struct flock range = whole_file(F_WRLCK);
  if (::fcntl(file.fd, F_OFD_GETLK, &range) != 0) {
    if (locks_unsupported(errno)) return false;
    throw lock_error(path, "fcntl(F_OFD_GETLK)");
  }
  return range.l_type != F_UNLCK;
}

bool FileLock::remove_leftover(const std::string& path) {
  FileLock stale;
  if (lock_existing(path, stale) != Outcome::kLocked) return false;
  stale.remove(path);
  return true;
}

}  // namespace moe
