// Routing math of the MoE layer (docs/load-balancing.md): router logits, the score function and its
// gradient, every expert selection (top-k with bias, group-limited top-k, hash table, forced
// round-robin and random; --force-balance and the other settings are routing_config.hpp), the
// hash tables themselves, and the combine weights with their gradient. Selection is not
// differentiated; gradients reach the router through the weights (and, elsewhere, through the
// balance loss). Legend: N rows/tokens, D model width, E experts, K top-k, V vocab (F expert width
// unused here).
#pragma once

#include <cstdint>

#include "model/config.hpp"
#include "model/routing_config.hpp"

namespace moe {

// logits = in·w_gate with a fixed-order loop, not BLAS (see router.cpp for why). Overwrites.
template <class T>
void router_logits_forward(T* logits,        // [N,E]
                           const T* in,      // [N,D]
                           const T* w_gate,  // [D,E]
                           int N, int D, int E);

// scores = f(logits), row by row (softmax normalises over the E experts of a row). Overwrites.
template <class T>
void score_forward(T* scores,        // [N,E]
                   const T* logits,  // [N,E]
                   int N, int E, ScoreFunc f);

// d_logits += ∂L/∂logits given d_scores, the forward's logits and scores.
template <class T>
void score_backward(T* d_logits,        // [N,E] +=
                    const T* d_scores,  // [N,E]
                    const T* logits,    // [N,E]
                    const T* scores,    // [N,E]
                    int N, int E, ScoreFunc f);

// The K largest of scores + bias per row, in descending order of that value; on ties the lower
// expert index wins and comes first. bias may be nullptr (no bias). The biased value is computed
// in T as scores[e] + T(bias[e]). A NaN value ranks after every number (a NaN score means training
// has diverged: the run's non-finite check stops it after the step).
template <class T>
void route_topk(int32_t* expert_idx,  // [N,K]
                const T* scores,      // [N,E]
                const float* bias,    // [E] or nullptr
                int N, int E, int K);

// expert_idx[t] = table[token_ids[t]]. Throws std::out_of_range naming the token id and V when
// a token id is outside [0, V).
void route_hash(int32_t* expert_idx,       // [N,K]
                const int32_t* token_ids,  // [N]
                const int32_t* table,      // [V,K]
                int N, int K, int V);

// Forced balanced routing: expert_idx[t][j] = ((first_global_token + t)·K + j) mod E, in int64,
// where first_global_token is the global index (within the step) of this rank's row 0. Over any
// whole step the counts per expert are equal whenever T·K mod E == 0. Throws
// std::invalid_argument when E <= 0 or first_global_token < 0.
void route_round_robin(int32_t* expert_idx,  // [N,K]
                       int64_t first_global_token, int N, int E, int K);

// Default hash-routing table of one layer: K distinct experts per row, pseudo-random, each row a
// pure function of (seed, layer, row) via the counter RNG stream "layers.<layer>.moe.tid2eid".
// Throws std::invalid_argument unless 0 < K <= E and V >= 0.
void hash_table_init(int32_t* table,  // [V,K]
                     int V, int E, int K, uint64_t seed, int layer);

// Throws std::invalid_argument naming the row on an entry outside [0, E) or an expert repeated
// within a row (e.g. for a table loaded from a file).
void hash_table_validate(const int32_t* table,  // [V,K]
                         int V, int E, int K);

// Group-limited top-k (DeepSeek-V3 node-limited routing): the E experts form G equal groups; a
// group's score is the sum of its top K/M biased scores; the M best groups are kept and the K
// largest biased scores among their experts are selected (ties: lower index). G <= 1 is plain
// top-k: route_topk itself, M unused (so every top-k selection can go through here).
template <class T>
void route_topk_grouped(int32_t* expert_idx,  // [N, K]
                        const T* scores,      // [N, E]
                        const float* bias,    // [E] or nullptr
                        int N, int E, int K, int groups, int group_topk);

// Forced random routing for throughput runs: K distinct experts per token, a pure function of
// (stream, global token index), so any rank count draws the same experts for the same token.
// Expert e is drawn with weight (e + 1)^-zipf_alpha among those not yet taken (alpha 0: uniform);
// with probability h = hot_fraction a token's first slot is expert 0 (a "hot" expert), and
// otherwise its slots are drawn as without skew, expert 0 included: expert 0 holds h + (1 − h)/E
// of the first slots and serves h + (1 − h)·K/E of the tokens. Skew makes imbalance a controlled
// variable: plot step time against it.
void route_random(int32_t* expert_idx,  // [N, K]
                  uint64_t stream, int64_t first_global_token, int N, int E, int K,
                  const RandomRouting& skew);

// w_j = s[sel_j] / (Σ_j' s[sel_j'] + 1e-20) · route_scale, from the unbiased scores. Overwrites.
template <class T>
void route_weights_forward(T* weights,                 // [N,K]
                           const T* scores,            // [N,E]
                           const int32_t* expert_idx,  // [N,K]
                           int N, int E, int K, float route_scale);

// d_scores += ∂L/∂scores through the weights (only the selected experts' entries change).
template <class T>
void route_weights_backward(T* d_scores,                // [N,E] +=
                            const T* d_weights,         // [N,K]
                            const T* scores,            // [N,E]
                            const int32_t* expert_idx,  // [N,K]
                            int N, int E, int K, float route_scale);

}  // namespace moe
