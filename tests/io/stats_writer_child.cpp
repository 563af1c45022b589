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
// Exit status: 0 done, 2 error (printed), 64 bad usage. It dies with the process that started it.
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>

#include "io/stats_writer.hpp"
#include "stats_test_data.hpp"

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
                      : (mode == "kill-after" || mode == "lock-step") && argc == 4 &&
                            parse_count(argv[3], &n);
  if (!ok) {
    std::fprintf(stderr, "usage: %s kill-after PATH N | kill-during PATH | lock-step PATH N\n",
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
