// Token capacity and drops, per (sequence, expert) (model/capacity.hpp).
#include "model/capacity.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

namespace moe {

int64_t expert_capacity(double capacity_factor, int S, int K, int E) {
  if (!(capacity_factor > 0)) return 0;
  const double per_expert = static_cast<double>(S) * K / E;
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(capacity_factor * per_expert)));
}

template <class T>
int64_t capacity_drop(std::span<int32_t> kept, std::span<int64_t> dropped,
                      std::span<const int32_t> expert_idx, std::span<const T> weights, int N, int S,
                      int K, int E, int64_t capacity, DropPolicy policy,
                      std::vector<int>& scratch) {
  const size_t NK = static_cast<size_t>(N) * K;
  if (kept.size() != NK || expert_idx.size() != NK || weights.size() != NK ||
      dropped.size() != static_cast<size_t>(E) || S <= 0 || N % S != 0) {
    throw std::invalid_argument("capacity_drop: sizes do not fit N = " + std::to_string(N) +
                                ", S = " + std::to_string(S) + ", K = " + std::to_string(K) +
                                ", E = " + std::to_string(E));
  }
  std::copy(expert_idx.begin(), expert_idx.end(), kept.begin());
  if (capacity <= 0) return 0;
  int64_t total = 0;
  scratch.resize(3 * static_cast<size_t>(E) + 1 + static_cast<size_t>(S) * K);
  const std::span<int> count(scratch.data(), E), first(count.data() + E, E + 1),
      cursor(first.data() + E + 1, E), order(cursor.data() + E, static_cast<size_t>(S) * K);
  for (int seq = 0; seq < N / S; ++seq) {
    const int a0 = seq * S * K, a1 = a0 + S * K;
    // The sequence's assignments grouped by expert, in assignment (token, slot) order.
    std::fill(count.begin(), count.end(), 0);
    for (int a = a0; a < a1; ++a) ++count[expert_idx[a]];
    first[0] = 0;
    for (int e = 0; e < E; ++e) first[e + 1] = first[e] + count[e];
    std::copy(first.begin(), first.end() - 1, cursor.begin());
    for (int a = a0; a < a1; ++a) order[cursor[expert_idx[a]]++] = a;
    for (int e = 0; e < E; ++e) {
      if (count[e] <= capacity) continue;
      const auto begin = order.begin() + first[e], end = order.begin() + first[e + 1];
      if (policy == DropPolicy::kByProbability) {
        // Largest weight first; equal weights in assignment order (a total order: std::sort,
        // which allocates nothing, gives the one result). A NaN weight (a diverged step, stopped
        // after it) ranks last.
        auto key = [&](int a) {
          const T w = weights[a];
          return std::isnan(w) ? -std::numeric_limits<T>::infinity() : w;
        };
        std::sort(begin, end, [&](int x, int y) {
          const T kx = key(x), ky = key(y);
          return kx != ky ? kx > ky : x < y;
        });
      }
      for (auto it = begin + capacity; it != end; ++it) kept[*it] = -1;
      const int64_t over = count[e] - capacity;
      dropped[e] += over;
      total += over;
    }
  }
  return total;
}

template int64_t capacity_drop<float>(std::span<int32_t>, std::span<int64_t>,
                                      std::span<const int32_t>, std::span<const float>, int, int,
                                      int, int, int64_t, DropPolicy, std::vector<int>&);
template int64_t capacity_drop<double>(std::span<int32_t>, std::span<int64_t>,
                                       std::span<const int32_t>, std::span<const double>, int, int,
                                       int, int, int64_t, DropPolicy, std::vector<int>&);

}  // namespace moe
