// Validation of ModelConfig and of the expert-parallel layout; every message names its option.
#include "model/config.hpp"

#include <algorithm>
#include <string>

namespace moe {
namespace {

void require_positive(int value, const char* option) {
  if (value <= 0) {
    throw ConfigError(std::string(option) + " must be positive, got " + std::to_string(value));
  }
}

}  // namespace

const char* score_func_name(ScoreFunc f) {
  switch (f) {
    case ScoreFunc::kSqrtSoftplus:
      return "sqrtsoftplus";
    case ScoreFunc::kSigmoid:
      return "sigmoid";
    case ScoreFunc::kSoftmax:
      return "softmax";
  }
  return "?";
}

ScoreFunc score_func_from_name(std::string_view name) {
  for (ScoreFunc f : {ScoreFunc::kSqrtSoftplus, ScoreFunc::kSigmoid, ScoreFunc::kSoftmax}) {
    if (name == score_func_name(f)) return f;
  }
  throw ConfigError("--score-func: unknown score function '" + std::string(name) +
                    "' (valid: sqrtsoftplus, sigmoid, softmax)");
}

const char* routing_mode_name(RoutingMode m) {
  switch (m) {
    case RoutingMode::kHash:
      return "hash";
    case RoutingMode::kTopK:
      return "topk";
    case RoutingMode::kRoundRobin:
    case RoutingMode::kRandom:
      return "forced";
  }
  return "?";
}

void model_config_validate(const ModelConfig& c) {
  require_positive(c.vocab, "--vocab");
  require_positive(c.d_model, "--d-model");
  require_positive(c.layers, "--layers");
  require_positive(c.heads, "--heads");
  require_positive(c.kv_heads, "--kv-heads");
  require_positive(c.head_dim, "--head-dim");
  require_positive(c.experts, "--experts");
  require_positive(c.top_k, "--top-k");
  require_positive(c.ffn_dim, "--ffn-dim");
  require_positive(c.seq_len, "--seq-len");
  require_positive(c.batch_per_rank, "--batch-per-rank");
  if (c.hash_layers < 0 || c.hash_layers > c.layers) {
    throw ConfigError("--hash-layers must be in [0, --layers=" + std::to_string(c.layers) +
                      "], got " + std::to_string(c.hash_layers));
  }
  if (c.shared_experts < 0) {
    throw ConfigError("--shared-experts must be >= 0, got " + std::to_string(c.shared_experts));
  }
  if (c.top_k > c.experts) {
    throw ConfigError("--top-k=" + std::to_string(c.top_k) + " exceeds --experts=" +
                      std::to_string(c.experts) + ": a token needs K distinct experts");
  }
  if (c.heads % c.kv_heads != 0) {
    throw ConfigError("--kv-heads=" + std::to_string(c.kv_heads) +
                      " must divide --heads=" + std::to_string(c.heads));
  }
  if (c.head_dim % 2 != 0) {
    throw ConfigError("--head-dim must be even for RoPE, got " + std::to_string(c.head_dim));
  }
  if (c.sliding_window < 0) {
    throw ConfigError("--sliding-window must be >= 0 (0 = full), got " +
                      std::to_string(c.sliding_window));
  }
  if (!(c.route_scale > 0.0f)) {
    throw ConfigError("--route-scale must be positive, got " + std::to_string(c.route_scale));
  }
  if (!(c.rope_theta > 0.0f)) {
    throw ConfigError("--rope-theta must be positive, got " + std::to_string(c.rope_theta));
  }
  if (!(c.norm_eps > 0.0f)) {
    throw ConfigError("--norm-eps must be positive, got " + std::to_string(c.norm_eps));
  }
}

void parallel_config_validate(const ModelConfig& c, int world_size, int ep_size) {
  require_positive(ep_size, "--ep");
  if (world_size % ep_size != 0) {
    throw ConfigError("--ep=" + std::to_string(ep_size) + " must divide the number of ranks (" +
                      std::to_string(world_size) + ")");
  }
  if (ep_size > c.experts) {
    throw ConfigError("--ep=" + std::to_string(ep_size) + " exceeds --experts=" +
                      std::to_string(c.experts) + ": every rank of an EP group must own an expert");
  }
}

int default_ep_size(int world_size, int num_experts) {
  for (int p = std::min(world_size, num_experts); p > 1; --p) {
    if (world_size % p == 0) return p;
  }
  return 1;
}

}  // namespace moe
