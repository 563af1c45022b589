// What the options' tests share: moe_rt's command line parsed as main() parses it, and a config
// file written into a test's temporary folder.
#pragma once

#include <fstream>
#include <string>
#include <vector>

#include "runtime/options/options.hpp"
#include "test_tempdir.hpp"

namespace moe::testing_options {

// Writes `text` to the file `name` in `dir`; returns its path.
inline std::string write_file(const testing_util::TempDir& dir, const std::string& name,
                              const std::string& text) {
  const std::string path = dir.file(name);
  std::ofstream(path) << text;
  return path;
}

// options_parse of "moe_rt" followed by `args`.
inline RunConfig parse(const std::vector<std::string>& args) {
  std::vector<const char*> argv = {"moe_rt"};
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  return options_parse(static_cast<int>(argv.size()), argv.data());
}

// The ConfigError message parse(args) throws, or "no ConfigError".
inline std::string config_error(const std::vector<std::string>& args) {
  try {
    parse(args);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no ConfigError";
}

}  // namespace moe::testing_options
