// Input-file checks shared by the data, hash-table and config-file readers.
#include "io/input_file.hpp"

#include <filesystem>
#include <system_error>

namespace moe {

std::string input_file_problem(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status)) {
    if (ec && ec != std::errc::no_such_file_or_directory) {
      return "cannot be inspected: " + ec.message();
    }
    return fs::is_symlink(fs::symlink_status(path, ec)) ? "missing: a link to no file"
                                                         : "missing: no such file";
  }
  if (fs::is_directory(status)) return "not a regular file (a directory)";
  if (!fs::is_regular_file(status)) return "not a regular file";
  return "";
}

}  // namespace moe
