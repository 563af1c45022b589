// A writer program run by the crash tests (stats_writer_child, checkpoint_writer_child): started
// with posix_spawn, because a fork of an MPI process, where MPI's threads run, is not guaranteed to
// give a child that works. Its stdin and stdout are pipes to the test, one byte a message. Every
// wait is bounded at 60 s, so a writer that died or got stuck fails the test instead of hanging
// it; the destructor kills and reaps a writer still running.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

extern char** environ;

namespace moe::testing_util {

class ChildProcess {
 public:
  ChildProcess(std::string program, std::vector<std::string> args) {
    // A write to a writer that died fails with EPIPE (and the test with it) instead of killing
    // this process with SIGPIPE.
    ::signal(SIGPIPE, SIG_IGN);
    int to_child[2] = {-1, -1}, from_child[2] = {-1, -1};
    if (::pipe2(to_child, O_CLOEXEC) != 0 || ::pipe2(from_child, O_CLOEXEC) != 0) {
      for (int fd : {to_child[0], to_child[1]}) ::close(fd);
      throw std::runtime_error(std::string("pipe2: ") + std::strerror(errno));
    }
    args.insert(args.begin(), std::move(program));
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, to_child[0], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions, from_child[1], STDOUT_FILENO);
    const int rc = ::posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(to_child[0]), ::close(from_child[1]);  // the child's ends: its exit gives EOF here
    to_child_ = to_child[1], from_child_ = from_child[0];
    if (rc != 0) {
      pid_ = -1;
      ::close(to_child_), ::close(from_child_);
      throw std::runtime_error(std::string("posix_spawn: ") + std::strerror(rc));
    }
  }
  ~ChildProcess() {
    if (pid_ > 0) {
      kill();
      ::waitpid(pid_, nullptr, 0);
    }
    ::close(to_child_), ::close(from_child_);
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  void send() {
    const char c = 'x';
    if (::write(to_child_, &c, 1) != 1) throw std::runtime_error("pipe write failed");
  }
  // The next message byte, waiting at most 60 s; 0 at end of output or when none came.
  char receive() {
    pollfd p{from_child_, POLLIN, 0};
    if (::poll(&p, 1, 60'000) != 1) {
      ADD_FAILURE() << "no message from the writer within 60 s";
      return 0;
    }
    char c = 0;
    return ::read(from_child_, &c, 1) == 1 ? c : 0;
  }
  // Everything the writer writes until it exits; at most 60 s between two reads.
  std::string read_all() {
    std::string text;
    char buffer[4096];
    for (;;) {
      pollfd p{from_child_, POLLIN, 0};
      if (::poll(&p, 1, 60'000) != 1) {
        ADD_FAILURE() << "the writer said nothing within 60 s";
        return text;
      }
      const ssize_t n = ::read(from_child_, buffer, sizeof buffer);
      if (n <= 0) return text;
      text.append(buffer, static_cast<size_t>(n));
    }
  }
  void kill() {
    if (pid_ > 0) ::kill(pid_, SIGKILL);
  }
  // The writer's wait status; waits at most 60 s: a writer still running then is killed and
  // reported. Once only.
  int wait() {
    if (pid_ <= 0) throw std::logic_error("ChildProcess::wait: no writer to wait for");
    int status = 0;
    pid_t done = 0;
    for (int i = 0; i < 6000 && done == 0; ++i) {
      done = ::waitpid(pid_, &status, WNOHANG);
      if (done == 0) ::usleep(10000);
    }
    if (done == 0) {
      ADD_FAILURE() << "writer " << pid_ << " still running after 60 s: killed";
      kill();
      done = ::waitpid(pid_, &status, 0);
    }
    const int err = errno;
    pid_ = -1;
    if (done < 0) throw std::runtime_error(std::string("waitpid: ") + std::strerror(err));
    return status;
  }
  // Kills the writer, waits for it and returns the messages it sent that were not received yet.
  std::string kill_and_drain() {
    kill();
    const int status = wait();
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
        << "the writer ended by itself (status " << status << "), not by the kill";
    std::string rest;
    for (char c; (c = receive()) != 0;) rest += c;
    return rest;
  }

 private:
  pid_t pid_ = -1;
  int to_child_ = -1, from_child_ = -1;
};

}  // namespace moe::testing_util
