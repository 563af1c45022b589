// The stop-signal flag and its handlers (stop_signal.hpp).
#include "runtime/run/stop_signal.hpp"

#include <fcntl.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

namespace moe {
namespace {

std::atomic<int> g_pending{0};
bool g_under_launcher = false;  // started by mpirun or srun: set once, before the handlers
static_assert(std::atomic<int>::is_always_lock_free, "the handler needs a lock-free flag");

constexpr int kStopSignals[] = {SIGTERM, SIGINT, SIGUSR1};

extern "C" void on_stop_signal(int signal_number) {
  int expected = 0;
  if (g_pending.compare_exchange_strong(expected, signal_number)) {
    // Once Open MPI's mpirun is told to stop it no longer reads the ranks' output: a rank
    // writing its step line would block on the full pipe until mpirun kills it. Non-blocking
    // standard streams turn that write into a lost line, and the handler (installed without
    // SA_RESTART) interrupts a write that is blocked already, so the rank reaches the step
    // boundary, its checkpoint and the statistics file's close. Only under a launcher, whose
    // pipes or pseudo-terminals these are: a process started on its own may write to the user's
    // terminal, whose open file the shell shares and must not find non-blocking.
    for (int fd : {1, 2}) {
      if (!g_under_launcher) break;
      const int flags = fcntl(fd, F_GETFL);
      if (flags >= 0) fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    }
    return;
  }
  // A second signal: the user (or the scheduler) means it. The default action ends the process.
  struct sigaction action = {};
  action.sa_handler = SIG_DFL;
  sigemptyset(&action.sa_mask);
  sigaction(signal_number, &action, nullptr);
  raise(signal_number);
}

}  // namespace

void stop_signal_install() {
  // Open MPI's launcher sets OMPI_COMM_WORLD_SIZE, PMIx-based ones (srun) PMIX_RANK or PMI_RANK.
  g_under_launcher = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr ||
                     std::getenv("PMIX_RANK") != nullptr || std::getenv("PMI_RANK") != nullptr;
  for (int s : kStopSignals) {
    struct sigaction action = {};
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = 0;  // no SA_RESTART: a write blocked on a full pipe returns (see above)
    if (sigaction(s, &action, nullptr) != 0) {
      std::perror("moe_rt: warning: cannot install a stop-signal handler");
    }
  }
}

int stop_signal_pending() {
  return g_pending.load(std::memory_order_relaxed);
}

bool stop_signal_under_launcher() {
  return g_under_launcher;
}

const char* stop_signal_name(int signal_number) {
  switch (signal_number) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGUSR1:
      return "SIGUSR1";
    default:
      return "a signal";
  }
}

void stop_signal_reset() {
  g_pending.store(0);
}

}  // namespace moe
