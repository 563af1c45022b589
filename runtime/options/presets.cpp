// The built-in model presets. Every field of each is spelled out, so a change of ModelConfig's
// defaults cannot move a preset.
#include "runtime/options/presets.hpp"

#include <string>
#include <vector>

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

// deepseek4-tiny with DeepSeek-V3's fine-grained experts: 64 routed experts of width F = 56, 8
// chosen per token among the experts of 4 of 8 groups (a group scores by its best 8/4 = 2 experts),
// 1 shared expert of width F. The routed and shared widths a token passes through, (K + shared)·F =
// 9·56 = 504, are deepseek4-tiny's (3 + 1)·128 = 512 within 2%.
constexpr ModelConfig kDeepseek4Fine{.vocab = 2048,
                                     .d_model = 128,
                                     .layers = 7,
                                     .hash_layers = 3,
                                     .heads = 4,
                                     .kv_heads = 1,
                                     .head_dim = 32,
                                     .experts = 64,
                                     .top_k = 8,
                                     .shared_experts = 1,
                                     .ffn_dim = 56,
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
      {"deepseek4-fine",
       "deepseek4-tiny with fine-grained experts: E=64 K=8 in 8 groups (4 chosen) shared=1 F=56",
       kDeepseek4Fine, 8, 4},
      {"micro", "for tests: V=64 D=16 L=3 (1 hash) E=4 K=2 shared=1 F=16 S=16 window=8", kMicro},
  };
  return table;
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const ModelPreset& p : preset_table()) names.emplace_back(p.name);
  return names;
}

namespace {

const ModelPreset& preset_find(std::string_view name) {
  std::string valid;
  std::vector<std::string> names;
  for (const ModelPreset& p : preset_table()) {
    if (name == p.name) return p;
    valid += (valid.empty() ? "" : ", ") + std::string(p.name);
    names.emplace_back(p.name);
  }
  const std::string near = nearest_name(name, names);
  throw ConfigError("--model: unknown preset '" + text_excerpt(name) + "'" +
                    (near.empty() ? "" : " (did you mean " + near + "?)") + " (valid: " + valid +
                    ")");
}

}  // namespace

ModelConfig preset_model(std::string_view name) {
  return preset_find(name).model;
}

void preset_apply(std::string_view name, ModelConfig& model, RoutingConfig& routing) {
  const ModelPreset& p = preset_find(name);
  model = p.model;
  routing.routing_groups = p.routing_groups;
  routing.group_topk = p.group_topk;
}

}  // namespace moe
