// "A live process is writing this file": an open-file-description lock (fcntl F_OFD_SETLK, a
// write lock on the whole file) held through a descriptor of its own for as long as the writer
// lives. The statistics writer holds one on its file (docs/hdf5-schema.md, "Locks").
//
// Why this kind of lock: it belongs to the open file description, not to the process, so HDF5
// closing its own descriptor of the same file does not drop it (a process-associated POSIX lock
// would be released by any close() of the file in the process). It does not interact with
// flock(), which HDF5 and h5py take, so readers are unaffected. The kernel drops it when the
// process dies, however it dies: a SIGKILLed writer leaves no stale lock. Two descriptions
// conflict even inside one process, so tests can play both sides in one process.
//
// Every lock is taken, then the path is checked to still name the locked file; whoever holds the
// lock on the file a path names may replace or remove it, no one else.
#pragma once

#include <stdexcept>
#include <string>

namespace moe {

// A failed system call while locking: the message names the file, the call and the system's
// reason.
class FileLockError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class FileLock {
 public:
  enum class Outcome {
    kLocked,   // this FileLock now holds the file the path names
    kBusy,     // another open file (a live writer, maybe in this process) holds it
    kMissing,  // no file at the path
  };

  FileLock() = default;
  ~FileLock() { release(); }
  FileLock(FileLock&& other) noexcept;
  FileLock& operator=(FileLock&& other) noexcept;
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

  // Write-locks the regular file `path` names now (opened for writing, not truncated); retries
  // when the path was renamed or removed between the open and the lock. Throws FileLockError
  // (a directory, a FIFO, no permission, ...).
  static Outcome lock_existing(const std::string& path, FileLock& out);

  // Creates `path` (O_EXCL, mode 0644 less the umask) and write-locks it. A file already there
  // that no one holds is the leftover of a killed writer: it is removed and creation retried.
  // Returns kLocked or kBusy. Throws FileLockError.
  static Outcome create(const std::string& path, FileLock& out);

  // Whether another open file description holds a lock on the file `path` names (F_OFD_GETLK);
  // false when there is no file. Throws FileLockError.
  static bool is_held(const std::string& path);

  // Removes the locked file's leftover at `path`: whether a stale file was there, false when
  // there was no file or a live writer holds it. Throws FileLockError.
  static bool remove_leftover(const std::string& path);

  bool held() const { return fd_ >= 0; }
  // Whether `path` names the locked file now (same device and inode). Throws FileLockError.
  bool names(const std::string& path) const;
  // Unlinks `path` if it names the locked file (the lock stays until release). Throws
  // FileLockError.
  void remove(const std::string& path) const;
  // Replaces the locked file's contents with `text` (who holds it, for the message of a process
  // that finds it busy). Throws FileLockError.
  void write_text(const std::string& text) const;
  // Closes the descriptor, and the lock goes with it. Never throws.
  void release() noexcept;

 private:
  explicit FileLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace moe
