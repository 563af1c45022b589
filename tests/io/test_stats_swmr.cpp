// Tests of the HDF5 statistics file while it is being written: a writer killed by SIGKILL (after
// its rows, or in the middle of appending) leaves a file whose completed rows all read back, and
// a SWMR reader in another process sees each appended row appear (SPEC §6, docs/hdf5-schema.md).
// The writer runs in a forked child that makes no MPI calls; pipes keep the two in lock-step.
// Legend: N rows, L layers, E experts, K top-k, V vocabulary, W ranks, T traced tokens.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/stats_writer.hpp"
#include "stats_test_util.hpp"
#include "test_tempdir.hpp"

namespace moe {
namespace {

using namespace stats_test;
using testing_util::TempDir;

// Runs `body` in a forked child that never returns into GoogleTest: it exits 0 when `body`
// returns, 2 when it throws (after printing why). The child makes no MPI calls.
template <typename Body>
pid_t run_child(Body body) {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  try {
    body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "child: %s\n", e.what());
    ::_exit(2);
  }
  ::_exit(0);
}

// waitpid, but at most 60 s: a child still running then is killed and reported.
pid_t wait_child(pid_t pid, int* status) {
  for (int i = 0; i < 6000; ++i) {
    const pid_t done = ::waitpid(pid, status, WNOHANG);
    if (done != 0) return done;
    ::usleep(10000);
  }
  ADD_FAILURE() << "child " << pid << " still running after 60 s: killed";
  ::kill(pid, SIGKILL);
  return ::waitpid(pid, status, 0);
}

// One byte through a pipe, for lock-step between the processes.
void send_byte(int fd) {
  const char c = 'x';
  if (::write(fd, &c, 1) != 1) throw std::runtime_error("pipe write failed");
}
// Waits at most 60 s: a child that died or got stuck (fork from a process with MPI's threads
// running is not guaranteed to give a working child) fails the test instead of hanging it.
bool receive_byte(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 60'000) != 1) {
    ADD_FAILURE() << "no answer from the other process within 60 s";
    return false;
  }
  char c = 0;
  return ::read(fd, &c, 1) == 1;
}

// Rows a reader may trust after a crash: those of /steps/step, less a last row still holding the
// fill value -1 (its index was extended but not written), per docs/hdf5-schema.md.
size_t committed_rows(hid_t f) {
  H5Id dset(MOE_H5_CHECK(H5Dopen2(f, "/steps/step", H5P_DEFAULT)), H5Dclose);
  const size_t n = dataset_dims(dset.get())[0];
  const std::vector<int64_t> steps = read_rows<int64_t>(f, "/steps/step", n, {}, true);
  return (n > 0 && steps.back() == -1) ? n - 1 : n;
}

TEST(StatsCrash, SigkillAfterFiveRowsKeepsAllFive) {
  TempDir dir;
  const std::string path = dir.file("run.h5");
  const pid_t pid = run_child([&] {
    StatsWriter w(path, false, test_header());
    write_rows(w, 0, 5);
    ::raise(SIGKILL);  // no close, no destructor
  });
  int status = 0;
  ASSERT_EQ(wait_child(pid, &status), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;
  const H5Id file = open_file(path);  // SWMR read: the superblock still says "being written"
  EXPECT_EQ(committed_rows(file.get()), 5u);
  expect_step_rows(file.get(), 5, true);
}

TEST(StatsCrash, SigkillDuringAppendsKeepsEveryCompletedRow) {
  TempDir dir;
  const std::string path = dir.file("run.h5");
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t pid = run_child([&] {
    StatsWriter w(path, false, test_header());
    write_rows(w, 0, 5);
    send_byte(ready[1]);
    write_rows(w, 5, 1000000);  // until killed, most likely inside an append
  });
  ::close(ready[1]);  // the child's end: a child that dies early gives EOF, not a wait
  const bool child_ready = receive_byte(ready[0]);
  if (!child_ready) ::kill(pid, SIGKILL);
  ASSERT_TRUE(child_ready);
  ::usleep(20000 + std::random_device{}() % 20000);
  ::kill(pid, SIGKILL);
  int status = 0;
  ASSERT_EQ(wait_child(pid, &status), pid);
  ::close(ready[0]);
  const H5Id file = open_file(path);
  const size_t n = committed_rows(file.get());
  EXPECT_GE(n, 5u);
  expect_step_rows(file.get(), n);  // every dataset has >= n rows, all n complete
}

// The writer (a child) appends one row per request; the reader (this process) refreshes and
// sees each row appear. The reader must be another process: a second H5Fopen in the writer's
// process succeeds but shares the writer's open file (HDF5 matches the inode), so it would see
// rows through the writer's caches rather than through the file.
TEST(StatsSwmr, ReaderSeesRowsAppearWhileTheWriterRuns) {
  TempDir dir;
  const std::string path = dir.file("run.h5");
  int to_child[2], to_parent[2];
  ASSERT_EQ(::pipe(to_child), 0);
  ASSERT_EQ(::pipe(to_parent), 0);
  constexpr int kRows = 5;
  const pid_t pid = run_child([&] {
    StatsWriter w(path, false, test_header());
    send_byte(to_parent[1]);  // created, SWMR write mode on
    for (int s = 0; s < kRows; ++s) {
      if (!receive_byte(to_child[0])) return;
      w.append(RowData(s).row());
      send_byte(to_parent[1]);
    }
    receive_byte(to_child[0]);  // stay open until the reader is done
  });
  ::close(to_parent[1]), ::close(to_child[0]);  // the child's ends
  if (!receive_byte(to_parent[0])) {
    ::kill(pid, SIGKILL);
    FAIL() << "the writer did not start";
  }
  {
    const H5Id file = open_file(path);
    H5Id step(MOE_H5_CHECK(H5Dopen2(file.get(), "/steps/step", H5P_DEFAULT)), H5Dclose);
    H5Id load(MOE_H5_CHECK(H5Dopen2(file.get(), "/routing/expert_load", H5P_DEFAULT)), H5Dclose);
    EXPECT_EQ(dataset_dims(step.get())[0], 0u);
    for (int s = 0; s < kRows; ++s) {
      send_byte(to_child[1]);
      if (!receive_byte(to_parent[0])) {
        ::kill(pid, SIGKILL);
        FAIL() << "the writer did not append row " << s;
      }
      MOE_H5_CHECK(H5Drefresh(step.get()));
      MOE_H5_CHECK(H5Drefresh(load.get()));
      EXPECT_EQ(dataset_dims(step.get())[0], hsize_t(s + 1));
      EXPECT_EQ(dataset_dims(load.get()), (std::vector<hsize_t>{hsize_t(s + 1), kL, kE}));
    }
    expect_step_rows(file.get(), kRows);
  }
  send_byte(to_child[1]);
  int status = 0;
  ASSERT_EQ(wait_child(pid, &status), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  for (int fd : {to_child[1], to_parent[0]}) ::close(fd);
}

}  // namespace
}  // namespace moe
