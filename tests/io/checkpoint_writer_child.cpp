// The checkpoint writer as a program of its own, for the crash test in test_checkpoint_crash.cpp,
// which kills it with SIGKILL at random moments. It is started with posix_spawn rather than a fork
// of the test (a forked copy of an MPI process may hang in malloc or HDF5), makes no MPI calls,
// and reports its progress on stdout, one byte a message:
//
//   checkpoint_writer_child DIR FIRST_STEP
//     for s = FIRST_STEP, FIRST_STEP + 1, ... until killed:
//       'b'  about to create DIR/step-s.h5.tmp
//            writes the checkpoint of step s (checkpoint_test_data.hpp) and commits it
//       'c'  commit() returned: DIR/step-s.h5 is complete
//            checkpoint_prune(DIR, 2)
//       'p'  pruned
//
// Exit status: 2 error (printed), 64 bad usage. It dies with the process that started it.
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

#include "checkpoint_test_data.hpp"
#include "io/checkpoint_file.hpp"

namespace {

void say(char c) {
  if (::write(STDOUT_FILENO, &c, 1) != 1) throw std::runtime_error("stdout write failed");
}

bool parse_step(std::string_view text, int64_t* n) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *n);
  return ec == std::errc() && end == text.data() + text.size() && *n >= 0;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t first = 0;
  if (argc != 3 || !parse_step(argv[2], &first)) {
    std::fprintf(stderr, "usage: %s DIR FIRST_STEP\n", argv[0]);
    return 64;
  }
  // A test that dies leaves no writer behind.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  const std::string dir = argv[1];
  try {
    for (int64_t s = first;; ++s) {
      say('b');
      moe::checkpoint_test::write_checkpoint(dir, s);
      say('c');
      for (const std::string& w : moe::checkpoint_prune(dir, 2, moe::checkpoint_test::kRunId, "")) {
        std::fprintf(stderr, "checkpoint_writer_child: %s\n", w.c_str());
      }
      say('p');
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint_writer_child: %s\n", e.what());
    return 2;
  }
}
