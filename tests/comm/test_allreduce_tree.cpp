// Comm::allreduce_sum_tree at whatever rank count CTest uses: every rank ends with the same bits,
// and they are the documented tree over the ranks' values (a range of n ranks splits after the
// largest power of two below n), computed here on each rank from the formula that gives every
// rank's values. The values span dozens of binades, so that another order of addition rounds
// differently; from 4 ranks on, the test checks that a sequential sum does.
// Legend: W ranks, n elements per rank.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "comm/communicator.hpp"

namespace moe {
namespace {

// SplitMix64: a pure function of (rank, element), so any rank can compute any rank's values.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// ±(1 + u)·2^e with e in [−30, 30] and u of 52 random bits.
template <class T> T rank_value(int rank, size_t i) {
  const uint64_t h = mix(mix(static_cast<uint64_t>(rank) + 0x5eed) ^ i);
  const int exponent = static_cast<int>(h % 61) - 30;
  const double sign = (h >> 8) & 1 ? -1.0 : 1.0;
  const double mantissa = 1.0 + static_cast<double>(h >> 12) * 0x1.0p-52;
  return static_cast<T>(sign * std::ldexp(mantissa, exponent));
}

template <class T> std::vector<T> rank_values(int rank, size_t n) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = rank_value<T>(rank, i);
  return v;
}

// The tree over ranks [lo, lo + W), by its definition.
template <class T> std::vector<T> tree_reference(int lo, int W, size_t n) {
  if (W == 1) return rank_values<T>(lo, n);
  int half = 1;
  while (half * 2 < W) half *= 2;
  std::vector<T> sum = tree_reference<T>(lo, half, n);
  const std::vector<T> right = tree_reference<T>(lo + half, W - half, n);
  for (size_t i = 0; i < n; ++i) sum[i] += right[i];
  return sum;
}

template <class T> auto bits(T value) {
  using U = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  return std::bit_cast<U>(value);
}

template <class T> void expect_tree_allreduce(const Comm& comm, size_t n) {
  const int W = comm.size(), r = comm.rank();
  std::vector<T> data = rank_values<T>(r, n), scratch(n + 3);
  comm.allreduce_sum_tree(std::span<T>(data), std::span<T>(scratch));

  const std::vector<T> expected = tree_reference<T>(0, W, n);
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) wrong += bits(data[i]) != bits(expected[i]);
  EXPECT_EQ(wrong, 0u) << "of " << n << " elements at " << W << " ranks";

  // Every rank holds the same bits: each compares its result with every other rank's.
  std::vector<T> all(n * W);
  comm.allgather(std::span<const T>(data), std::span<T>(all));
  for (int q = 0; q < W; ++q) {
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(bits(all[q * n + i]), bits(data[i])) << "rank " << q << " element " << i;
    }
  }

  // With 3 ranks the tree, (0 + 1) + 2, is the sequential order; from 4 on it is not, and the
  // values must show it, or this test could not tell the orders apart.
  if (W >= 4 && n >= 1000) {
    std::vector<T> sequential = rank_values<T>(0, n);
    for (int q = 1; q < W; ++q) {
      const std::vector<T> v = rank_values<T>(q, n);
      for (size_t i = 0; i < n; ++i) sequential[i] += v[i];
    }
    size_t differ = 0;
    for (size_t i = 0; i < n; ++i) differ += bits(sequential[i]) != bits(expected[i]);
    EXPECT_GT(differ, 0u);
  }
}

TEST(AllreduceSumTree, FloatIsTheTreeSumOnEveryRank) {
  const Comm world = Comm::world();
  for (size_t n : {size_t{0}, size_t{1}, size_t{1000}}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    expect_tree_allreduce<float>(world, n);
  }
}

TEST(AllreduceSumTree, DoubleIsTheTreeSumOnEveryRank) {
  const Comm world = Comm::world();
  for (size_t n : {size_t{0}, size_t{1}, size_t{1000}}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    expect_tree_allreduce<double>(world, n);
  }
}

// The tree is over the communicator's own ranks: on halves of the world, rank 0 of each half is
// the root and the split rule applies to the half's size.
TEST(AllreduceSumTree, SubCommunicatorsUseTheirOwnRanks) {
  const Comm world = Comm::world();
  const Comm half = world.split(world.rank() % 2, world.rank());
  expect_tree_allreduce<double>(half, 1000);
  expect_tree_allreduce<float>(half, 1);
}

// Every rank refuses before sending anything, so no rank is left waiting.
TEST(AllreduceSumTree, ScratchSmallerThanDataThrows) {
  const Comm world = Comm::world();
  std::vector<float> data(4, 1.0f), scratch(3);
  EXPECT_THROW(world.allreduce_sum_tree(std::span<float>(data), std::span<float>(scratch)),
               std::invalid_argument);
  std::vector<double> empty_scratch;
  std::vector<double> one = {1.0};
  EXPECT_THROW(world.allreduce_sum_tree(std::span<double>(one), std::span<double>(empty_scratch)),
               std::invalid_argument);
  // The communicator is still usable afterwards.
  std::vector<float> s(4);
  world.allreduce_sum_tree(std::span<float>(data), std::span<float>(s));
  for (float v : data) EXPECT_EQ(v, static_cast<float>(world.size()));
}

// Comm::reduce_scatter_tree: each rank's block holds the bits allreduce_sum_tree gives there
// (blocks of unequal sizes, an empty one among them), the rest of its data is untouched; then
// allgatherv_blocks puts the whole sum on every rank.
template <class T> void expect_reduce_scatter_tree(const Comm& comm, size_t n) {
  const int W = comm.size(), r = comm.rank();
  std::vector<int> counts(W), displs(W);
  size_t at = 0;
  for (int q = 0; q < W; ++q) {
    // Rank 1 (when there is one) gets nothing; the others share n unevenly.
    const size_t left = n - at;
    counts[q] = q == W - 1 ? static_cast<int>(left) : q == 1 ? 0 : static_cast<int>(left / 2);
    displs[q] = static_cast<int>(at);
    at += static_cast<size_t>(counts[q]);
  }
  const std::vector<T> mine = rank_values<T>(r, n);
  std::vector<T> data = mine, scratch(static_cast<size_t>(W) * counts[r] + 1);
  comm.reduce_scatter_tree(std::span<T>(data), std::span<const int>(counts),
                           std::span<const int>(displs), std::span<T>(scratch));
  const std::vector<T> expected = tree_reference<T>(0, W, n);
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) {
    const bool own = i >= static_cast<size_t>(displs[r]) &&
                     i < static_cast<size_t>(displs[r]) + static_cast<size_t>(counts[r]);
    wrong += bits(data[i]) != bits(own ? expected[i] : mine[i]);
  }
  EXPECT_EQ(wrong, 0u) << "rank " << r << " of " << W;
  comm.allgatherv_blocks(std::span<T>(data), std::span<const int>(counts),
                         std::span<const int>(displs));
  wrong = 0;
  for (size_t i = 0; i < n; ++i) wrong += bits(data[i]) != bits(expected[i]);
  EXPECT_EQ(wrong, 0u) << "after the gather, rank " << r << " of " << W;
}

TEST(ReduceScatterTree, EachBlockIsTheTreeSumAndTheGatherCompletesIt) {
  const Comm world = Comm::world();
  for (size_t n : {size_t{0}, size_t{7}, size_t{1000}}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    expect_reduce_scatter_tree<float>(world, n);
    expect_reduce_scatter_tree<double>(world, n);
  }
  const Comm half = world.split(world.rank() % 2, world.rank());
  expect_reduce_scatter_tree<float>(half, 1000);
  // A communicator moved into another (constructed, then assigned) keeps the scratch its
  // reduce-scatter writes its receive counts into.
  Comm moved(world.split(0, world.rank()));
  Comm target = std::move(moved);
  expect_reduce_scatter_tree<float>(target, 1000);
  Comm assigned = world.split(1, world.rank());
  const Comm spare(std::move(assigned));  // leaves `assigned` with no scratch of its own
  assigned = std::move(target);
  expect_reduce_scatter_tree<double>(assigned, 1000);
}

// Every rank refuses before sending anything: blocks outside the data, or too little scratch.
TEST(ReduceScatterTree, BadBlocksOrScratchThrow) {
  const Comm world = Comm::world();
  const int W = world.size();
  std::vector<float> data(4, 1.0f), scratch(4 * W);
  std::vector<int> counts(W, 0), displs(W, 0);
  counts[0] = 5;
  EXPECT_THROW(world.reduce_scatter_tree(std::span<float>(data), std::span<const int>(counts),
                                         std::span<const int>(displs), std::span<float>(scratch)),
               std::invalid_argument);
  counts[0] = 0;
  counts[world.rank()] = 4;
  std::vector<float> small(3);
  EXPECT_THROW(world.reduce_scatter_tree(std::span<float>(data), std::span<const int>(counts),
                                         std::span<const int>(displs), std::span<float>(small)),
               std::invalid_argument);
}

}  // namespace
}  // namespace moe
