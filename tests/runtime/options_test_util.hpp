// What the options' tests share: moe_rt's command line parsed as main() parses it, and a config
// file written into a test's temporary folder.
#pragma once

#include <fstream>
#include <string>
#include <vector>

#include "io/checkpoint_file.hpp"
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

// The header of a checkpoint of `cfg` after step 2 of a one-rank run with a global batch of 1
// (its data description left to the caller).
inline CheckpointHeader step2_header(const RunConfig& cfg) {
  CheckpointHeader h;
  h.step = 2;
  h.global_batch = 1;
  h.world_size = 1;
  h.ep_size = 1;
  h.seed = cfg.seed;
  h.model = cfg.model_name;
  h.config_text = run_config_to_text(cfg);
  h.program_version = "moe_rt test";
  h.created = "2026-01-01T00:00:00+00:00";
  return h;
}

}  // namespace moe::testing_options
