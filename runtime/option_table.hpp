// The option table: every configuration option once, with its help text and how to read and
// write its value. --help, the config-file keys, parsing, run_config_to_text and the rules of
// --resume are all generated from it (runtime/options.cpp), so they cannot disagree.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/options.hpp"

namespace moe {

struct OptionField {
  const char* name;        // long name without "--"; also the config-file key
  const char* value_name;  // N, X, NAME, PATH, SOURCE, MODE
  const char* help;
  std::function<std::string(const RunConfig&)> get;
  std::function<void(RunConfig&, const std::string&)> set;  // throws ConfigError naming it
  bool is_flag = false;  // boolean: `--name` alone means true; `name = false` in a file
  char kind = 's';       // the value's type: 'b' bool, 'i' int, 'u' unsigned, 'f' real, 's' text
};

// Every configuration option, in --help order.
const std::vector<OptionField>& option_fields();

// The option named `name` (without "--"), or nullptr.
const OptionField* option_find(std::string_view name);

}  // namespace moe
