// A test harness around one MoE layer: both arenas (parameters and gradients) laid out for one
// rank's experts, initialised from the seed, and the layer's saved state. Used by the gradient
// check (one rank, double) and the expert-parallel invariance test (many ranks, float and double).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "model/moe_layer.hpp"
#include "model/rng.hpp"
#include "model/router.hpp"

namespace moe::testing_moe {

template <class T> struct MoeHarness {
  MoeDims dims;
  ExpertPlacement placement;
  int ep_rank = 0;
  ParamLayout dense, experts;
  MoeOffsets off;
  std::vector<T> dense_params, expert_params, dense_grads, expert_grads;
  std::vector<float> bias;          // [E]
  std::vector<int32_t> hash_table;  // [V, K]
  int vocab = 0;
  MoeSaved<T> saved;

  MoeHarness(const MoeDims& d, int ep_size, int rank, uint64_t seed, int V, int num_tokens,
             int max_sequences = 1)
      : dims(d), placement{d.E, ep_size}, ep_rank(rank), vocab(V) {
    off = moe_layout(dense, experts, dims, /*layer=*/3, /*num_layers=*/4, placement, ep_rank);
    dense_params.resize(dense.num_elements);
    expert_params.resize(experts.num_elements);
    param_init(std::span<T>(dense_params), dense, seed);
    param_init(std::span<T>(expert_params), experts, seed);
    dense_grads.assign(dense.num_elements, T(0));
    expert_grads.assign(experts.num_elements, T(0));
    // A bias large enough to change some selections, identical on every rank.
    bias.resize(d.E);
    for (int e = 0; e < d.E; ++e) bias[e] = 0.05f * static_cast<float>((e * 7) % 5 - 2);
    hash_table.resize(static_cast<size_t>(V) * d.K);
    hash_table_init(hash_table.data(), V, d.E, d.K, seed, 3);
    moe_saved_reserve(saved, num_tokens, dims, ep_size, placement.max_local(), max_sequences);
  }

  MoeWeights<T> weights() {
    return moe_weights_at(dense_params.data(), expert_params.data(), off, dims);
  }
  MoeWeights<T> grads() {
    return moe_weights_at(dense_grads.data(), expert_grads.data(), off, dims);
  }

  MoeRouting routing(RoutingMode mode, const int32_t* token_ids, int64_t first_token) const {
    MoeRouting r;
    r.mode = mode;
    r.bias = bias.data();
    r.hash_table = hash_table.data();
    r.vocab = vocab;
    r.token_ids = token_ids;
    r.first_global_token = first_token;
    return r;
  }
};

// Deterministic global test data: element i of tensor `name`, a pure function of the index.
template <class T> std::vector<T> global_normal(const char* name, size_t n, double scale) {
  std::vector<T> v(n);
  const uint64_t stream = rng_stream(99, name);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<T>(scale * rng_normal(stream, i));
  return v;
}

// Zipf-like token ids for hash routing: id = floor(V · u^3).
inline std::vector<int32_t> global_token_ids(size_t n, int V) {
  std::vector<int32_t> ids(n);
  const uint64_t stream = rng_stream(99, "token_ids");
  for (size_t i = 0; i < n; ++i) {
    const double u = rng_uniform(stream, i);
    ids[i] = std::min(V - 1, static_cast<int>(V * u * u * u));
  }
  return ids;
}

}  // namespace moe::testing_moe
