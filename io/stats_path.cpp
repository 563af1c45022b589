// Where the statistics file goes: StatsWriter::check_path (every problem with an output path,
// found before anything is created), the default file name under runs/, and the creation time
// in ISO 8601. docs/hdf5-schema.md, "Errors" and "Default file name".
#include "io/stats_writer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>

namespace moe {
namespace {

namespace fs = std::filesystem;

StatsPathError path_error(const std::string& path, const std::string& problem) {
  return StatsPathError("statistics file '" + path + "': " + problem);
}

// Local time formatted by strftime.
std::string local_time_text(const char* format) {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char text[64] = {0};
  std::strftime(text, sizeof text, format, &local);
  return text;
}

}  // namespace

void StatsWriter::check_path(const std::string& path, bool overwrite) {
  if (path.empty()) throw path_error(path, "the path is empty");
  const fs::path file(path);
  const fs::path dir = file.parent_path().empty() ? fs::path(".") : file.parent_path();
  std::error_code ec;
  const fs::file_status dir_status = fs::status(dir, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) {
    throw path_error(path, "directory '" + dir.string() + "' cannot be inspected: " + ec.message());
  }
  if (!fs::exists(dir_status)) {
    throw path_error(path, "directory '" + dir.string() + "' does not exist");
  }
  if (!fs::is_directory(dir_status)) {
    throw path_error(path, "'" + dir.string() + "' is not a directory");
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    throw path_error(
        path, "directory '" + dir.string() + "' is not writable (" + std::strerror(errno) + ")");
  }
  const fs::file_status status = fs::status(file, ec);
  if (fs::is_directory(status)) throw path_error(path, "is a directory");
  if (!fs::exists(status)) {
    // HDF5 creates exclusively (O_EXCL), which refuses a link to nothing.
    if (fs::is_symlink(fs::symlink_status(file, ec))) {
      throw path_error(path, "is a link to '" + fs::read_symlink(file, ec).string() +
                                 "', which does not exist");
    }
    return;
  }
  if (!fs::is_regular_file(status)) throw path_error(path, "exists and is not a regular file");
  if (!overwrite && fs::file_size(file, ec) != 0) {
    throw path_error(path, "already exists; pass --overwrite to replace it");
  }
  if (::access(path.c_str(), W_OK) != 0) {
    throw path_error(path,
                     "exists and is not writable (" + std::string(std::strerror(errno)) + ")");
  }
}

std::string stats_default_path(const std::string& runs_dir, const std::string& model) {
  const fs::path dir = runs_dir.empty() ? fs::path(".") : fs::path(runs_dir);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    throw StatsPathError("runs directory '" + dir.string() +
                         "': cannot create it: " + ec.message());
  }
  std::string name = model;
  std::replace(name.begin(), name.end(), '/', '_');
  const std::string stem = (dir / (name + "-" + local_time_text("%Y%m%d-%H%M%S"))).string();
  for (int n = 1;; ++n) {
    std::string candidate = stem;
    if (n > 1) candidate.append("-").append(std::to_string(n));
    candidate.append(".h5");
    const int fd = ::open(candidate.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) {
      ::close(fd);
      return candidate;
    }
    if (errno != EEXIST)
      throw path_error(candidate, std::string("cannot create: ") + std::strerror(errno));
  }
}

std::string stats_now_iso8601() {
  const std::string text = local_time_text("%Y-%m-%dT%H:%M:%S%z");  // offset as +hhmm
  if (text.size() < 5) return text;
  const size_t split = text.size() - 2;  // ISO-8601 extended offset: +hh:mm
  return text.substr(0, split).append(":").append(text.substr(split));
}

}  // namespace moe
