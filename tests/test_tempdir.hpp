// A scratch directory for tests that write files: TempDir creates a fresh, uniquely named
// directory under the system temp path and removes it, with everything in it, at scope exit.
// The name joins the process id (every MPI rank gets its own), a per-process counter (several
// directories alive at once) and a random number (a reused pid after a crashed run), so
// concurrent test processes and ranks never share one.
#pragma once

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <random>
#include <string>
#include <system_error>

namespace moe::testing_util {

class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    const std::string name = "moe_test_" + std::to_string(::getpid()) + "_" +
                             std::to_string(counter++) + "_" +
                             std::to_string(std::random_device{}());
    path_ = std::filesystem::temp_directory_path() / name;
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;  // best effort: a destructor must not throw
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // The path of `name` inside the directory (which need not exist yet).
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace moe::testing_util
