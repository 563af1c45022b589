// Where the statistics file goes and how it gets there (io/stats_path.hpp): the output-path check
// (every problem with an output path, found before anything is created, including a live run
// writing it), the staging file and its publication, the default file name under runs/, and the
// creation time in ISO 8601. docs/hdf5-schema.md, "Paths", "Locks", "Errors" and "Default file
// name".
#include "io/stats_path.hpp"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>

namespace moe {
namespace {

namespace fs = std::filesystem;

StatsPathError path_error(const std::string& path, const std::string& problem) {
  return StatsPathError(stats_path_message(path, problem));
}

// The system's reason for the last failed call.
std::string system_reason() {
  return std::strerror(errno);
}

const char* const kBeingWritten =
    "is being written by another running moe_rt (it holds the file's lock); choose another "
    "--stats";

std::string being_created(const StatsFiles& files) {
  return "is being created by another running moe_rt (it holds '" + files.staging +
         "'); choose another --stats";
}

// Runs a FileLock call, turning its FileLockError into a StatsPathError naming the path.
template <typename Call> auto with_path(const std::string& path, Call call) {
  try {
    return call();
  } catch (const FileLockError& e) {
    throw path_error(path, e.what());
  }
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

std::string stats_path_message(const std::string& path, const std::string& problem) {
  return "statistics file '" + path + "': " + problem;
}

StatsFiles stats_files(const std::string& path) {
  StatsFiles f;
  f.path = path;
  f.target = path;
  // A link to a file: the file is replaced, the link kept (as writing through it did). A link to
  // nothing stays as it is, for check_path to refuse.
  std::error_code ec;
  if (fs::is_symlink(fs::symlink_status(path, ec))) {
    const fs::path resolved = fs::canonical(path, ec);
    if (!ec) f.target = resolved.string();
  }
  f.staging = f.target + ".new";
  f.compact = f.target + ".compact";
  return f;
}

void stats_check_path(const std::string& path, bool overwrite) {
  if (path.empty()) throw path_error(path, "the path is empty");
  const StatsFiles files = stats_files(path);
  const fs::path file(files.target);
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
    throw path_error(path,
                     "directory '" + dir.string() + "' is not writable (" + system_reason() + ")");
  }
  const fs::file_status status = fs::status(file, ec);
  if (fs::is_directory(status)) throw path_error(path, "is a directory");
  if (!fs::exists(status)) {
    // Publishing would replace the link itself instead of creating the file it points to.
    if (fs::is_symlink(fs::symlink_status(file, ec))) {
      throw path_error(
          path, "is a link to '" + fs::read_symlink(file, ec).string() + "', which does not exist");
    }
  } else if (!fs::is_regular_file(status)) {
    throw path_error(path, "exists and is not a regular file");
  }
  // Before --overwrite is even considered: a file a live run writes is never touched.
  if (with_path(path, [&] { return FileLock::is_held(files.target); })) {
    throw path_error(path, kBeingWritten);
  }
  if (with_path(path, [&] { return FileLock::is_held(files.staging); })) {
    throw path_error(path, being_created(files));
  }
  if (!fs::exists(status)) return;
  if (!overwrite && fs::file_size(file, ec) != 0) {
    throw path_error(path, "already exists; pass --overwrite to replace it");
  }
  if (::access(files.target.c_str(), W_OK) != 0) {
    throw path_error(path, "exists and is not writable (" + system_reason() + ")");
  }
}

void stats_staging_create(const StatsFiles& files, FileLock& lock) {
  with_path(files.path, [&] {
    // A compaction copy left by a writer killed while closing; a live writer's is its own.
    FileLock::remove_leftover(files.compact);
    if (FileLock::create(files.staging, lock) == FileLock::Outcome::kBusy) {
      throw path_error(files.path, being_created(files));
    }
  });
}

void stats_publish(const StatsFiles& files, bool overwrite) {
  const char* staging = files.staging.c_str();
  const char* target = files.target.c_str();
  for (int attempt = 0; attempt < 100; ++attempt) {
    FileLock there;  // the file at the target, held until it has been replaced
    switch (with_path(files.path, [&] { return FileLock::lock_existing(files.target, there); })) {
      case FileLock::Outcome::kBusy:
        throw path_error(files.path, kBeingWritten);
      case FileLock::Outcome::kLocked: {
        std::error_code ec;
        if (!overwrite && fs::file_size(files.target, ec) != 0) {
          throw path_error(files.path, "already exists; pass --overwrite to replace it");
        }
        if (::rename(staging, target) != 0) {
          throw path_error(files.path,
                           "cannot rename '" + files.staging + "' to it: " + system_reason());
        }
        return;
      }
      case FileLock::Outcome::kMissing:
        // No file to lock: rename only if none appeared since (RENAME_NOREPLACE); a file that did
        // is locked first, on the next attempt. A file system without the flag (EINVAL) gets a
        // plain rename: every moe_rt run takes the staging file's lock before it publishes, so
        // no other run can publish in between.
        if (::renameat2(AT_FDCWD, staging, AT_FDCWD, target, RENAME_NOREPLACE) == 0) return;
        if (errno == EEXIST) continue;
        if (errno == EINVAL && ::rename(staging, target) == 0) return;
        throw path_error(files.path,
                         "cannot rename '" + files.staging + "' to it: " + system_reason());
    }
  }
  throw path_error(files.path, "kept changing while the new file was put in its place");
}

void stats_compact(const StatsFiles& files, FileLock& lock, hid_t fcpl, hid_t fapl,
                   const H5CopyFilters& filters, void (*after_copy)(hid_t)) {
  const std::string& path = files.target;
  // The copy is at most the file's size. Without room for it, HDF5 1.10.8's H5Ocopy was seen to
  // crash (SIGSEGV) when the disk filled, rather than fail.
  std::error_code size_ec, space_ec;
  const uintmax_t need = fs::file_size(path, size_ec) + (1u << 20);
  const fs::path dir = fs::path(path).parent_path();
  const fs::space_info space = fs::space(dir.empty() ? fs::path(".") : dir, space_ec);
  if (!size_ec && !space_ec && space.available < need) {
    std::fprintf(stderr,
                 "warning: statistics file '%s' is complete but was not compacted: %ju bytes "
                 "free, the copy needs up to %ju\n",
                 files.path.c_str(), space.available, need);
    return;
  }
  FileLock copy_lock;
  try {
    if (FileLock::create(files.compact, copy_lock) == FileLock::Outcome::kBusy) {
      throw FileLockError("'" + files.compact + "' is held by another process");
    }
    h5_copy_file(path, files.compact, fcpl, fapl, filters, after_copy);
    fs::rename(files.compact, path);
    lock = std::move(copy_lock);
  } catch (const std::exception& e) {
    if (copy_lock.held()) {
      try {
        copy_lock.remove(files.compact);
      } catch (const FileLockError&) {
        // Left for the next run to remove (FileLock::remove_leftover); the warning follows.
      }
    }
    std::fprintf(stderr, "warning: statistics file '%s' is complete but was not compacted: %s\n",
                 files.path.c_str(), e.what());
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

std::string stats_link_latest(const std::string& path) {
  const fs::path file(path);
  const fs::path link = file.parent_path() / kLatestStatsName;
  // Appended piece by piece: GCC 12 warns wrongly (-Wrestrict) on a chain of "'" + string.
  std::string problem = "'";
  problem.append(link.string()).append("' ");
  std::error_code ec;
  const fs::file_status status = fs::symlink_status(link, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) {
    return problem.append("cannot be inspected: ").append(ec.message());
  }
  if (fs::exists(status) && !fs::is_symlink(status)) {
    return problem.append("exists and is not a link; left as it is");
  }
  // The temporary name is this process's own, also in a folder that several hosts share; one left
  // by a killed process of the same host and id goes.
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  const fs::path staging = file.parent_path() / (std::string(kLatestStatsName) + "." + host + "." +
                                                 std::to_string(::getpid()));
  fs::remove(staging, ec);
  fs::create_symlink(file.filename(), staging, ec);
  if (!ec) fs::rename(staging, link, ec);
  if (ec) {
    problem.append("cannot be made: ").append(ec.message());
    fs::remove(staging, ec);
    return problem;
  }
  return "";
}

std::string stats_now_iso8601() {
  const std::string text = local_time_text("%Y-%m-%dT%H:%M:%S%z");  // offset as +hhmm
  if (text.size() < 5) return text;
  const size_t split = text.size() - 2;  // ISO-8601 extended offset: +hh:mm
  return text.substr(0, split).append(":").append(text.substr(split));
}

}  // namespace moe
