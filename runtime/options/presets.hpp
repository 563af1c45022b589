// The built-in model presets: `--model NAME` starts the configuration from one of them.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "model/config.hpp"

namespace moe {

struct ModelPreset {
  const char* name;     // the value of --model
  const char* summary;  // one line for --help
  ModelConfig model;
};

// Every preset, in the order of --help: `deepseek4-tiny` (docs/architecture.md, "The model") and
// `micro` (a few thousand parameters, for tests).
const std::vector<ModelPreset>& preset_table();

// The names of preset_table(), in the same order.
std::vector<std::string> preset_names();

// The model of the preset called `name`. Throws ConfigError naming --model and listing the
// valid presets.
ModelConfig preset_model(std::string_view name);

}  // namespace moe
