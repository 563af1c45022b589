// Test fixtures shared by the comm tests: deterministic routings that any rank can recompute for
// any other rank, and identity-coded rows that say where they came from.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace moe::testing_fixtures {

// [T, K] distinct expert ids for source `rank`, a pure function of (seed, rank, T, K, E).
// Skewed on purpose (expert e drawn with weight ~ 1/(e+1)) so some experts get far more rows.
inline std::vector<int32_t> make_routing(uint32_t seed, int rank, int T, int K, int E) {
  std::mt19937 gen(seed * 7919u + static_cast<uint32_t>(rank));
  std::vector<int32_t> idx(static_cast<size_t>(T) * K);
  for (int t = 0; t < T; ++t) {
    std::vector<bool> used(E, false);
    for (int j = 0; j < K; ++j) {
      int e;
      do {
        // Zipf-ish: square a uniform draw so low ids are favoured.
        const double u = static_cast<double>(gen()) / 4294967296.0;
        e = static_cast<int>(u * u * E);
      } while (used[e]);
      used[e] = true;
      idx[static_cast<size_t>(t) * K + j] = e;
    }
  }
  return idx;
}

// Token count of source `rank`: varies with the rank so the exchange is uneven.
inline int tokens_of_rank(int rank) {
  return 5 + 3 * (rank % 4);
}

// An identity-coded row of width D >= 4: [source, token, slot, expert, token+0.5 ...].
constexpr int kCodeWidth = 6;
inline void encode_row(float* row, int source, int t, int j, int e) {
  row[0] = static_cast<float>(source);
  row[1] = static_cast<float>(t);
  row[2] = static_cast<float>(j);
  row[3] = static_cast<float>(e);
  row[4] = static_cast<float>(t) + 0.5f;
  row[5] = -static_cast<float>(source);
}

}  // namespace moe::testing_fixtures
