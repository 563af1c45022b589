// The token capacity (model/capacity.hpp) against a direct reading of its definition: per
// (sequence, expert), the assignments kept are the `capacity` largest combine weights (ties: the
// lower assignment index) or the first `capacity` in token order; the others are dropped and
// counted per expert.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <utility>
#include <vector>

#include "model/capacity.hpp"
#include "model/rng.hpp"

namespace moe {
namespace {

TEST(Capacity, PerSequenceAndExpertIsTheCeilingOfCSKOverE) {
  EXPECT_EQ(expert_capacity(0.0, 256, 3, 8), 0);  // dropless
  EXPECT_EQ(expert_capacity(1.0, 256, 3, 8), 96);
  EXPECT_EQ(expert_capacity(1.25, 256, 3, 8), 120);
  EXPECT_EQ(expert_capacity(2.0, 256, 3, 8), 192);
  EXPECT_EQ(expert_capacity(1.1, 10, 1, 3), 4);   // 3.67 -> 4
  EXPECT_EQ(expert_capacity(0.01, 16, 2, 4), 1);  // at least one
}

// The definition, written out: every (sequence, expert) group sorted by its own key.
std::vector<int32_t> by_definition(const std::vector<int32_t>& idx, const std::vector<float>& w,
                                   int N, int S, int K, int E, int64_t cap, DropPolicy policy) {
  std::vector<int32_t> kept = idx;
  for (int seq = 0; seq < N / S; ++seq) {
    for (int e = 0; e < E; ++e) {
      std::vector<std::pair<float, int>> group;  // (weight, assignment)
      for (int a = seq * S * K; a < (seq + 1) * S * K; ++a) {
        if (idx[a] == e) group.emplace_back(w[a], a);
      }
      if (policy == DropPolicy::kByProbability) {
        std::sort(group.begin(), group.end(), [](const auto& x, const auto& y) {
          return x.first != y.first ? x.first > y.first : x.second < y.second;
        });
      }
      for (size_t i = static_cast<size_t>(cap); i < group.size(); ++i) kept[group[i].second] = -1;
    }
  }
  return kept;
}

TEST(Capacity, DropsWhatTheDefinitionDropsAndCountsThem) {
  const int S = 12, K = 2, E = 5, N = 4 * S;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    uint64_t draw = 0;
    auto uniform = [&] { return rng_uniform(seed, draw++); };
    std::vector<int32_t> idx(N * K);
    std::vector<float> w(N * K);
    for (int t = 0; t < N; ++t) {
      // K distinct experts, skewed towards expert 0; weights on a coarse grid, so ties happen.
      const int first = uniform() < 0.5 ? 0 : static_cast<int>(uniform() * E);
      idx[t * K] = first;
      idx[t * K + 1] = (first + 1 + static_cast<int>(uniform() * (E - 1))) % E;
      for (int j = 0; j < K; ++j)
        w[t * K + j] = static_cast<float>(static_cast<int>(uniform() * 4)) / 4;
    }
    for (const DropPolicy policy : {DropPolicy::kByProbability, DropPolicy::kByPosition}) {
      for (const int64_t cap : {int64_t{1}, int64_t{3}, int64_t{5}, int64_t{24}}) {
        std::vector<int32_t> kept(N * K);
        std::vector<int64_t> dropped(E, 7);  // added to
        std::vector<int> scratch;
        const int64_t total =
            capacity_drop<float>(kept, dropped, idx, w, N, S, K, E, cap, policy, scratch);
        const std::vector<int32_t> want = by_definition(idx, w, N, S, K, E, cap, policy);
        ASSERT_EQ(kept, want) << "seed " << seed << ", capacity " << cap;
        int64_t count = 0;
        for (int e = 0; e < E; ++e) {
          int64_t lost = 0;
          for (int a = 0; a < N * K; ++a) lost += idx[a] == e && kept[a] == -1;
          EXPECT_EQ(dropped[e], 7 + lost) << "expert " << e;
          count += lost;
        }
        EXPECT_EQ(total, count);
        if (cap == 1) {
          EXPECT_GT(total, 0);
        }
        if (cap == 24) {
          EXPECT_EQ(total, 0);  // S·K: nothing can be over it
        }
      }
    }
  }
}

// The unit is the sequence: the drops of a sequence do not depend on the sequences beside it
// (what makes them the same on any rank count).
TEST(Capacity, ASequencesDropsDoNotDependOnItsNeighbours) {
  const int S = 8, K = 2, E = 4;
  std::vector<int32_t> idx;
  std::vector<float> w;
  for (int t = 0; t < 3 * S; ++t) {
    idx.insert(idx.end(), {t % 3 == 0 ? 1 : 0, 2 + t % 2});
    w.insert(w.end(), {0.1f * static_cast<float>(t % 5), 0.5f});
  }
  std::vector<int32_t> all(idx.size()), one(S * K);
  std::vector<int64_t> d_all(E), d_one(E);
  std::vector<int> scratch;
  capacity_drop<float>(all, d_all, idx, w, 3 * S, S, K, E, 2, DropPolicy::kByProbability, scratch);
  for (int seq = 0; seq < 3; ++seq) {
    const auto first = static_cast<std::ptrdiff_t>(seq) * S * K;
    capacity_drop<float>(one, d_one, std::span<const int32_t>(idx).subspan(first, S * K),
                         std::span<const float>(w).subspan(first, S * K), S, S, K, E, 2,
                         DropPolicy::kByProbability, scratch);
    EXPECT_TRUE(std::equal(one.begin(), one.end(), all.begin() + first)) << "sequence " << seq;
  }
  EXPECT_EQ(d_one, d_all);
}

TEST(Capacity, ZeroCapacityKeepsEverythingAndBadSizesAreRefused) {
  const std::vector<int32_t> idx = {0, 1, 0, 1};
  const std::vector<float> w = {1, 1, 1, 1};
  std::vector<int32_t> kept(4);
  std::vector<int64_t> dropped(2);
  std::vector<int> scratch;
  EXPECT_EQ(
      capacity_drop<float>(kept, dropped, idx, w, 2, 2, 2, 2, 0, DropPolicy::kByPosition, scratch),
      0);
  EXPECT_EQ(kept, idx);
  EXPECT_THROW(
      capacity_drop<float>(kept, dropped, idx, w, 2, 3, 2, 2, 1, DropPolicy::kByPosition, scratch),
      std::invalid_argument);  // 2 tokens are no whole sequences of 3
}

}  // namespace
}  // namespace moe
