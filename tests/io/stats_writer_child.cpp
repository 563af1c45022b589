// The statistics writer as a program of its own, for the crash and SWMR tests in
// test_stats_swmr.cpp. Those tests need the writer in another process; they start this program
// (posix_spawn) rather than fork themselves, since a forked copy of an MPI process, with MPI's
// threads stopped wherever they were, may hang in malloc or HDF5 before it writes a row.
// It makes no MPI calls. It talks to the test over its stdin and stdout, one byte a message.
//
//   stats_writer_child kill-after PATH N   appends rows 0..N-1, then kills itself (SIGKILL)
//   stats_writer_child kill-during PATH    appends rows 0..4, says so, then appends until killed
//   stats_writer_child lock-step PATH N    says when the file is open, then for each of N bytes
//                                          read appends a row and answers; stays open until one
//                                          more byte (or end of input) arrives
//   stats_writer_child full-disk PATH N    appends rows 0..N-1, then fills the disk (below) and
//                                          appends until an append fails; prints that error's
//                                          message
// Exit status: 0 done, 2 error (printed), 64 bad usage. It dies with the process that started it.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>

#include "io/stats_writer.hpp"
#include "stats_test_data.hpp"

// A full disk, for the statistics file only. HDF5 writes its files with pwrite(); this program's
// own pwrite() takes the place of the C library's for HDF5 too (the executable's definition comes
// first in symbol lookup). Once the disk is full, a write that would take new space (end past the
// file's size at that moment) fails with ENOSPC, as the file system would fail it; writes inside
// the file and growing it without data (ftruncate, a sparse extension) still work, as on a full
// disk. A file-size limit (RLIMIT_FSIZE) is no substitute: it refuses that ftruncate as well, so
// HDF5 can never close the file, which a full disk allows.
namespace {
struct FullDisk {
  bool full = false;
  dev_t dev = 0;
  ino_t ino = 0;
  off_t size = 0;  // the file's size when the disk filled
} full_disk;
}  // namespace

extern "C" ssize_t pwrite(int fd, const void* buf, size_t count, off_t offset) {
  struct stat st {};
  if (full_disk.full && ::fstat(fd, &st) == 0 && st.st_dev == full_disk.dev &&
      st.st_ino == full_disk.ino && offset + static_cast<off_t>(count) > full_disk.size) {
    errno = ENOSPC;
    return -1;
  }
  return ::syscall(SYS_pwrite64, fd, buf, count, offset);
}

namespace {

using namespace moe;
using namespace moe::stats_test;

void say() {
  const char c = 'x';
  if (::write(STDOUT_FILENO, &c, 1) != 1) throw std::runtime_error("stdout write failed");
}

// False at end of input: the test is gone or done.
bool hear() {
  char c = 0;
  return ::read(STDIN_FILENO, &c, 1) == 1;
}

// A whole non-negative decimal number.
bool parse_count(std::string_view text, int64_t* n) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *n);
  return ec == std::errc() && end == text.data() + text.size() && *n >= 0;
}

int run(const std::string& mode, const std::string& path, int64_t n) {
  StatsWriter w(path, false, test_header());
  w.publish();
  if (mode == "kill-after") {
    write_rows(w, 0, n);
    ::raise(SIGKILL);  // no close, no destructor
  } else if (mode == "kill-during") {
    write_rows(w, 0, 5);
    say();
    write_rows(w, 5, 1'000'000);  // until killed, most likely inside an append
  } else if (mode == "full-disk") {
    write_rows(w, 0, n);
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) throw std::runtime_error("stat " + path + " failed");
    full_disk = FullDisk{true, st.st_dev, st.st_ino, st.st_size};
    try {
      write_rows(w, n, n + 1'000'000);
    } catch (const Hdf5Error& e) {
      std::printf("%s", e.what());
      return 0;
    }
    throw std::runtime_error("no append failed on the full disk");
  } else {
    say();  // created, SWMR write mode on
    for (int64_t s = 0; s < n && hear(); ++s) {
      w.append(RowData(s).row());
      say();
    }
    hear();
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  int64_t n = 0;
  const bool ok = mode == "kill-during"
                      ? argc == 3
                      : (mode == "kill-after" || mode == "lock-step" || mode == "full-disk") &&
                            argc == 4 && parse_count(argv[3], &n);
  if (!ok) {
    std::fprintf(stderr,
                 "usage: %s kill-after PATH N | kill-during PATH | lock-step PATH N | "
                 "full-disk PATH N\n",
                 argv[0]);
    return 64;
  }
  // A test that dies leaves no writer behind (the destructor that would kill it never runs).
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  try {
    return run(mode, argv[2], n);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "stats_writer_child: %s\n", e.what());
    return 2;
  }
}
