// The built-in model presets: `--model NAME` starts the configuration from one of them.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "model/config.hpp"
#include "model/routing_config.hpp"

namespace moe {

struct ModelPreset {
  const char* name;     // the value of --model
  const char* summary;  // one line for --help
  ModelConfig model;
  int routing_groups = 1;  // --routing-groups: G of group-limited top-k (1 = off)
  int group_topk = 1;      // --group-topk: M
};

// Every preset, in the order of --help: `deepseek4-tiny` (docs/architecture.md, "The model"),
// `deepseek4-fine` (the same widths with DeepSeek-V3's fine-grained, group-limited routing) and
// `micro` (a few thousand parameters, for tests).
const std::vector<ModelPreset>& preset_table();

// The names of preset_table(), in the same order.
std::vector<std::string> preset_names();

// The model of the preset called `name`. Throws ConfigError naming --model and listing the
// valid presets.
ModelConfig preset_model(std::string_view name);

// The preset called `name` into `model` and the routing options it sets (the expert groups);
// the other routing options keep their values. Throws as preset_model does.
void preset_apply(std::string_view name, ModelConfig& model, RoutingConfig& routing);

}  // namespace moe
