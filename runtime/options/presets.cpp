// The built-in model presets. Every field of each is spelled out, so a change of ModelConfig's
// defaults cannot move a preset.
#include "runtime/options/presets.hpp"

#include "model/config.hpp"
#include "runtime/options/config_file.hpp"

namespace moe {
namespace {

// DeepSeek-V4's MoE stack shrunk for a CPU (docs/architecture.md, "The model").
constexpr ModelConfig kDeepseek4Tiny{.vocab = 2048,
                                     .d_model = 128,
                                     .layers = 7,
                                     .hash_layers = 3,
                                     .heads = 4,
                                     .kv_heads = 1,
                                     .head_dim = 32,
                                     .experts = 8,
                                     .top_k = 3,
                                     .shared_experts = 1,
                                     .ffn_dim = 128,
                                     .seq_len = 256,
                                     .batch_per_rank = 1,
                                     .score_func = ScoreFunc::kSqrtSoftplus,
                                     .route_scale = 1.5f,
                                     .swiglu_limit = 10.0f,
                                     .rope_theta = 10000.0f,
                                     .sliding_window = 128,
                                     .norm_eps = 1e-6f};

// Small enough for unit tests at 8 ranks; the window is below S so the sliding path is exercised.
constexpr ModelConfig kMicro{.vocab = 64,
                             .d_model = 16,
                             .layers = 3,
                             .hash_layers = 1,
                             .heads = 2,
                             .kv_heads = 1,
                             .head_dim = 8,
                             .experts = 4,
                             .top_k = 2,
                             .shared_experts = 1,
                             .ffn_dim = 16,
                             .seq_len = 16,
                             .batch_per_rank = 1,
                             .score_func = ScoreFunc::kSqrtSoftplus,
                             .route_scale = 1.5f,
                             .swiglu_limit = 10.0f,
                             .rope_theta = 10000.0f,
                             .sliding_window = 8,
                             .norm_eps = 1e-6f};

}  // namespace

const std::vector<ModelPreset>& preset_table() {
  static const std::vector<ModelPreset> table = {
      {"deepseek4-tiny",
       "a tiny DeepSeek-V4-style MoE: V=2048 D=128 L=7 (3 hash) E=8 K=3 shared=1 F=128 S=256",
       kDeepseek4Tiny},
      {"micro", "for tests: V=64 D=16 L=3 (1 hash) E=4 K=2 shared=1 F=16 S=16 window=8", kMicro},
  };
  return table;
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const ModelPreset& p : preset_table()) names.emplace_back(p.name);
  return names;
}

ModelConfig preset_model(std::string_view name) {
  std::string valid;
  for (const ModelPreset& p : preset_table()) {
    if (name == p.name) return p.model;
    valid += (valid.empty() ? "" : ", ") + std::string(p.name);
  }
  throw ConfigError("--model: unknown preset '" + text_excerpt(name) + "' (valid: " + valid + ")");
}

}  // namespace moe
