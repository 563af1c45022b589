// Token capacity (--capacity-factor, --drop-policy; docs/load-balancing.md "Token capacity and
// drops"): an expert takes at most `capacity` of a sequence's assignments; those over it are
// dropped before the dispatch (they never travel; their combine weight is in effect zero, the
// token keeps its residual and the shared expert).
//
// The unit is the sequence: capacity = ceil(C·S·K/E) assignments per (sequence, expert). A
// sequence is never split between ranks, so each rank decides the drops of its own tokens alone,
// before the exchange, and a step's drops are the same on any rank count and EP layout. With one
// sequence per rank (the 8-rank default run) that is Megatron-Core's per-rank capacity; with more
// sequences per rank Megatron-Core pools them, which moe_rt does not (it would tie the drops to
// the rank count).
//
// Legend: N tokens in sequences of S, K experts per token, E experts; an assignment a = t·K + j.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/routing_config.hpp"

namespace moe {

// ceil(C·S·K/E), at least 1: the assignments one expert takes from one sequence of S tokens;
// 0 for C = 0 (dropless).
int64_t expert_capacity(double capacity_factor, int S, int K, int E);

// Writes `kept` = `expert_idx` with −1 for each dropped assignment, and adds each expert's
// dropped assignments to `dropped` [E]. Per (sequence, expert), the assignments kept are, with
// kByProbability, those of the largest combine weights (ties: lower token, then lower slot),
// with kByPosition the first in token order. Returns the assignments dropped. `capacity` 0:
// nothing is dropped. `scratch` grows to 3·E + 1 + S·K ints (reserved, it never allocates).
template <class T>
int64_t capacity_drop(std::span<int32_t> kept,              // [N, K] out
                      std::span<int64_t> dropped,           // [E] +=
                      std::span<const int32_t> expert_idx,  // [N, K]
                      std::span<const T> weights,           // [N, K]
                      int N, int S, int K, int E, int64_t capacity, DropPolicy policy,
                      std::vector<int>& scratch);

}  // namespace moe
