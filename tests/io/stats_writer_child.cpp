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
//   stats_writer_child stream PATH         with small chunks, says when the file is published,
//                                          then appends rows (and traces) until killed
//   stats_writer_child journal PATH N J B R
//                                          with chunks of at most B bytes and R rows, appends rows
//                                          0..N-1 (and a trace row after every even one), then
//                                          closes, journalling to file J the file as published and
//                                          every write to it after (below)
// Exit status: 0 done, 2 error (printed), 64 bad usage. It dies with the process that started it.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iterator>
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

// A journal of the statistics file, for the test that opens the file as a kill at any moment
// would leave it: the file as it was published, then every pwrite() and ftruncate() HDF5 made to
// it, in order, and a mark after every append that returned. Records: a byte, then two unsigned
// 64-bit little-endian numbers, then for 'W' the bytes written:
//   'W' offset count    a write of `count` bytes at `offset`
//   'T' size 0          the file truncated (or extended) to `size` bytes
//   'S' step 0          append(step) returned
//   'R' step 0          append_trace(step) returned
struct Journal {
  int fd = -1;
  dev_t dev = 0;
  ino_t ino = 0;
} journal;

bool is_file(int fd, dev_t dev, ino_t ino) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 && st.st_dev == dev && st.st_ino == ino;
}

void journal_put(const void* bytes, size_t count) {
  const char* at = static_cast<const char*>(bytes);
  while (count > 0) {
    const ssize_t done = ::write(journal.fd, at, count);
    if (done <= 0) std::abort();  // a journal with a gap would test nothing
    at += done;
    count -= static_cast<size_t>(done);
  }
}

void journal_record(char kind, uint64_t offset, const void* bytes, uint64_t count) {
  unsigned char head[17];
  head[0] = static_cast<unsigned char>(kind);
  for (int b = 0; b < 8; ++b) {
    head[1 + b] = static_cast<unsigned char>(offset >> (8 * b));
    head[9 + b] = static_cast<unsigned char>(count >> (8 * b));
  }
  journal_put(head, sizeof head);
  if (bytes != nullptr) journal_put(bytes, count);
}
}  // namespace

extern "C" ssize_t pwrite(int fd, const void* buf, size_t count, off_t offset) {
  if (full_disk.full && is_file(fd, full_disk.dev, full_disk.ino) &&
      offset + static_cast<off_t>(count) > full_disk.size) {
    errno = ENOSPC;
    return -1;
  }
  const ssize_t done = ::syscall(SYS_pwrite64, fd, buf, count, offset);
  if (done > 0 && journal.fd >= 0 && is_file(fd, journal.dev, journal.ino)) {
    journal_record('W', static_cast<uint64_t>(offset), buf, static_cast<uint64_t>(done));
  }
  return done;
}

extern "C" int ftruncate(int fd, off_t length) noexcept {
  const int done = static_cast<int>(::syscall(SYS_ftruncate, fd, length));
  if (done == 0 && journal.fd >= 0 && is_file(fd, journal.dev, journal.ino)) {
    journal_record('T', static_cast<uint64_t>(length), nullptr, 0);
  }
  return done;
}

extern "C" int ftruncate64(int fd, off64_t length) {
  return ftruncate(fd, length);
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

// Starts the journal `journal_path` of the published file `path` with the file as it is now.
void journal_start(const std::string& path, const std::string& journal_path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw std::runtime_error("stat " + path + " failed");
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) throw std::runtime_error("cannot read " + path);
  journal.fd = ::open(journal_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (journal.fd < 0) throw std::runtime_error("cannot create " + journal_path);
  journal_record('W', 0, bytes.data(), bytes.size());
  journal_record('T', bytes.size(), nullptr, 0);
  journal.dev = st.st_dev;
  journal.ino = st.st_ino;
}

int run(const std::string& mode, const std::string& path, int64_t n,
        const std::string& journal_path, int64_t chunk_bytes, int64_t chunk_rows) {
  StatsStorage storage;
  if (mode == "stream") {  // chunks of 1 to 4 rows: many fill up quickly
    storage.chunk_bytes = 512;
    storage.max_chunk_rows = 4;
  } else if (mode == "journal") {
    storage.chunk_bytes = chunk_bytes;
    storage.max_chunk_rows = chunk_rows;
  }
  StatsWriter w(path, false, test_header(), storage);
  w.publish();
  if (mode == "journal") {
    journal_start(path, journal_path);
    for (int64_t s = 0; s < n; ++s) {
      w.append(RowData(s).row());
      journal_record('S', static_cast<uint64_t>(s), nullptr, 0);
      if (s % 2 == 0) {
        w.append_trace(TraceData(s).row());
        journal_record('R', static_cast<uint64_t>(s), nullptr, 0);
      }
    }
    w.close();
  } else if (mode == "stream") {
    say();
    for (int64_t s = 0;; ++s) {
      w.append(RowData(s).row());
      if (s % 2 == 0) w.append_trace(TraceData(s).row());
    }
  } else if (mode == "kill-after") {
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
  int64_t n = 0, chunk_bytes = 0, chunk_rows = 0;
  bool ok = false;
  if (mode == "kill-during" || mode == "stream") {
    ok = argc == 3;
  } else if (mode == "journal") {
    ok = argc == 7 && parse_count(argv[3], &n) && parse_count(argv[5], &chunk_bytes) &&
         parse_count(argv[6], &chunk_rows) && chunk_bytes > 0 && chunk_rows > 0;
  } else if (mode == "kill-after" || mode == "lock-step" || mode == "full-disk") {
    ok = argc == 4 && parse_count(argv[3], &n);
  }
  if (!ok) {
    std::fprintf(stderr,
                 "usage: %s kill-after PATH N | kill-during PATH | lock-step PATH N | "
                 "full-disk PATH N | stream PATH | journal PATH N JOURNAL BYTES ROWS\n",
                 argv[0]);
    return 64;
  }
  // A test that dies leaves no writer behind (the destructor that would kill it never runs).
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  try {
    return run(mode, argv[2], n, mode == "journal" ? argv[4] : "", chunk_bytes, chunk_rows);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "stats_writer_child: %s\n", e.what());
    return 2;
  }
}
