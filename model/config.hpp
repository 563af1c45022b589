// The model's shape and routing details as one validated value type (docs/architecture.md,
// "The model" and "Ranks and groups").
// Legend: V vocab, D model width, L layers, L_h hash layers, E routed experts, K experts per token,
// F expert FFN width, S sequence length, B sequences per rank, W ranks, P expert-parallel group
// size.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace moe {

// A configuration value that cannot run; the message names the offending option.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class ScoreFunc { kSqrtSoftplus, kSigmoid, kSoftmax };

// How a layer picks its K experts.
enum class RoutingMode {
  kHash,        // fixed V×K table lookup by token id
  kTopK,        // K largest of score + bias
  kRoundRobin,  // forced: (global token index · K + j) mod E
  kRandom,      // forced: K distinct uniformly random experts per token, seeded
};

const char* score_func_name(ScoreFunc f);
ScoreFunc score_func_from_name(std::string_view name);  // throws ConfigError naming --score-func
const char* routing_mode_name(RoutingMode m);           // "hash", "topk", "forced" (both forced)

struct ModelConfig {
  int vocab = 2048;     // V
  int d_model = 128;    // D
  int layers = 7;       // L
  int hash_layers = 3;  // L_h: layers [0, L_h) route by hash table
  int heads = 4;
  int kv_heads = 1;
  int head_dim = 32;
  int experts = 8;         // E
  int top_k = 3;           // K
  int shared_experts = 1;  // each of width F; fused into one SwiGLU of width shared_experts·F
  int ffn_dim = 128;       // F
  int seq_len = 256;       // S
  int batch_per_rank = 1;  // B
  ScoreFunc score_func = ScoreFunc::kSqrtSoftplus;
  float route_scale = 1.5f;
  float swiglu_limit = 10.0f;  // <= 0: no clamp
  float rope_theta = 10000.0f;
  int sliding_window = 128;  // 0: full causal attention
  float norm_eps = 1e-6f;
};

// Throws ConfigError naming the first option that makes the model impossible
// (non-positive widths, K > E, L_h > L, kv_heads not dividing heads, ...).
void model_config_validate(const ModelConfig& cfg);

// Throws ConfigError when the expert-parallel layout cannot hold: P must divide W and be at most E.
void parallel_config_validate(const ModelConfig& cfg, int world_size, int ep_size);

// The default of --ep: the largest divisor of W that is at most E.
int default_ep_size(int world_size, int num_experts);

}  // namespace moe
