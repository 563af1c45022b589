// TreeSum and TreeSumScalar (model/tree_sum.hpp) against the tree they document: a range of n
// leaves splits after the largest power of two below n. Sums are compared bit for bit, on values
// of mixed magnitudes, where any other order rounds differently (checked: a sequential sum does
// differ, so these tests can fail). Then the property the runtime builds on: W groups of B leaves,
// each group added by the tree and the group sums by the same tree, give the tree over all W·B
// leaves when B is a power of two, and not in general otherwise.
// Legend: n leaves of `count` values each; W groups (ranks) of B leaves (sequences).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "model/blas.hpp"
#include "model/rng.hpp"
#include "model/tree_sum.hpp"

namespace moe {
namespace {

template <class T> using Leaves = std::vector<std::vector<T>>;  // [n][count]

// Values a few dozen binades apart, of either sign and with full mantissas, so that absorption
// and cancellation make every order of addition round its own way.
template <class T> Leaves<T> adversarial_leaves(int n, size_t count, const char* name) {
  const uint64_t stream = rng_stream(17, name);
  Leaves<T> leaves(n, std::vector<T>(count));
  for (int l = 0; l < n; ++l) {
    for (size_t i = 0; i < count; ++i) {
      const uint64_t index = 3 * (static_cast<uint64_t>(l) * count + i);
      const int exponent = static_cast<int>(rng_below(stream, index, 61)) - 30;
      const double sign = rng_below(stream, index + 1, 2) == 0 ? 1.0 : -1.0;
      const double mantissa = 1.0 + rng_uniform(stream, index + 2);
      leaves[l][i] = static_cast<T>(sign * std::ldexp(mantissa, exponent));
    }
  }
  return leaves;
}

// The documented tree, written as its definition: leaves [lo, lo + n), split after the largest
// power of two below n, the two halves summed the same way and then added.
template <class T> std::vector<T> tree_reference(const Leaves<T>& leaves, size_t lo, size_t n) {
  if (n == 1) return leaves[lo];
  size_t half = 1;
  while (half * 2 < n) half *= 2;
  std::vector<T> sum = tree_reference(leaves, lo, half);
  const std::vector<T> right = tree_reference(leaves, lo + half, n - half);
  for (size_t i = 0; i < sum.size(); ++i) sum[i] += right[i];
  return sum;
}

template <class T> std::vector<T> sequential_sum(const Leaves<T>& leaves, size_t lo, size_t n) {
  std::vector<T> sum = leaves[lo];
  for (size_t l = lo + 1; l < lo + n; ++l) {
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += leaves[l][i];
  }
  return sum;
}

// Leaves [lo, lo + n) through a TreeSum reserved for exactly n leaves, added into zeros.
template <class T> std::vector<T> tree_sum(const Leaves<T>& leaves, size_t lo, size_t n) {
  const size_t count = leaves[lo].size();
  TreeSum<T> tree;
  tree.reserve(count, static_cast<int>(n));
  tree.begin(count);
  for (size_t l = lo; l < lo + n; ++l) {
    T* leaf = tree.leaf();
    for (size_t i = 0; i < count; ++i) leaf[i] = leaves[l][i];
    tree.push();
  }
  std::vector<T> out(count, T(0));
  tree.finish(out.data());
  return out;
}

template <class T> auto bits(T value) {
  using U = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  return std::bit_cast<U>(value);
}

// Bit for bit; a float +0 and −0 count as different.
template <class T> bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (bits(a[i]) != bits(b[i])) return false;
  }
  return true;
}

constexpr int kMaxLeaves = 40;
constexpr size_t kCount = 16;

template <class T> void expect_tree_sum_matches_definition() {
  int differs_from_sequential = 0;
  for (int n = 1; n <= kMaxLeaves; ++n) {
    const Leaves<T> leaves = adversarial_leaves<T>(n, kCount, "tree_sum.leaves");
    const std::vector<T> expected = tree_reference(leaves, 0, n);
    EXPECT_TRUE(same_bits(tree_sum(leaves, 0, n), expected)) << "n = " << n;
    if (!same_bits(sequential_sum(leaves, 0, n), expected)) ++differs_from_sequential;
  }
  // Sequential and tree orders agree for n <= 3; the data must tell them apart for most n above.
  EXPECT_GT(differs_from_sequential, kMaxLeaves / 2);
}

TEST(TreeSum, FloatEqualsTheSplitRuleTreeBitForBit) {
  expect_tree_sum_matches_definition<float>();
}

TEST(TreeSum, DoubleEqualsTheSplitRuleTreeBitForBit) {
  expect_tree_sum_matches_definition<double>();
}

// tree_sum_leaves, for leaves computed out of order and held at once: the bits of a TreeSum pushed
// the same leaves in order, added into the same output; small leaves, and leaves long enough to be
// added on the threads. Its leaves are strided (one set per sequence in the callers).
template <class T> void expect_held_leaves_match_tree_sum(int max_leaves, size_t count) {
  for (int n = 1; n <= max_leaves; ++n) {
    const Leaves<T> leaves = adversarial_leaves<T>(n, count, "tree_sum.held");
    const size_t stride = count + 3;
    std::vector<T> held(stride * n, T(0));
    for (int l = 0; l < n; ++l) std::copy(leaves[l].begin(), leaves[l].end(), &held[stride * l]);
    const Leaves<T> start = adversarial_leaves<T>(1, count, "tree_sum.held_out");
    std::vector<T> out = start[0];
    tree_sum_leaves(out.data(), held.data(), n, stride, count);
    TreeSum<T> tree;
    tree.reserve(count, n);
    tree.begin(count);
    for (int l = 0; l < n; ++l) {
      std::copy(leaves[l].begin(), leaves[l].end(), tree.leaf());
      tree.push();
    }
    std::vector<T> pushed = start[0];
    tree.finish(pushed.data());
    EXPECT_TRUE(same_bits(out, pushed)) << "n = " << n << ", count = " << count;
  }
}

TEST(TreeSum, HeldLeavesGiveTheBitsOfTheSamePushedInOrder) {
  expect_held_leaves_match_tree_sum<float>(kMaxLeaves, kCount);
  expect_held_leaves_match_tree_sum<double>(kMaxLeaves, kCount);
  expect_held_leaves_match_tree_sum<float>(9, static_cast<size_t>(kParallelValues) + 5);
}

TEST(TreeSumScalar, EqualsTheSplitRuleTreeBitForBit) {
  int differs_from_sequential = 0;
  for (int n = 1; n <= kMaxLeaves; ++n) {
    const Leaves<double> leaves = adversarial_leaves<double>(n, 1, "tree_sum.scalars");
    TreeSumScalar tree;
    for (int l = 0; l < n; ++l) tree.push(leaves[l][0]);
    const double expected = tree_reference(leaves, 0, n)[0];
    EXPECT_EQ(bits(tree.finish()), bits(expected)) << "n = " << n;
    if (bits(sequential_sum(leaves, 0, n)[0]) != bits(expected)) ++differs_from_sequential;
  }
  EXPECT_GT(differs_from_sequential, kMaxLeaves / 4);
}

TEST(TreeSumScalar, EmptyIsZeroAndFinishStartsAgain) {
  TreeSumScalar tree;
  EXPECT_EQ(tree.finish(), 0.0);
  const Leaves<double> a = adversarial_leaves<double>(13, 1, "tree_sum.reuse_a");
  const Leaves<double> b = adversarial_leaves<double>(6, 1, "tree_sum.reuse_b");
  for (const auto& leaf : a) tree.push(leaf[0]);
  EXPECT_EQ(bits(tree.finish()), bits(tree_reference(a, 0, a.size())[0]));
  for (const auto& leaf : b) tree.push(leaf[0]);
  EXPECT_EQ(bits(tree.finish()), bits(tree_reference(b, 0, b.size())[0]));
}

// Pushes zero leaves until leaf() refuses; returns how many were pushed.
int leaves_until_refused(TreeSum<float>& tree, int limit) {
  tree.begin(1);
  for (int pushed = 0; pushed < limit; ++pushed) {
    try {
      tree.leaf()[0] = 0.0f;
    } catch (const std::logic_error&) {
      return pushed;
    }
    tree.push();
  }
  return limit;
}

// reserve(·, m) keeps bit_width(m) buffers, the fewest that hold m leaves: the binary counter then
// holds every leaf count up to 2^bit_width(m) − 1, and the next leaf is refused. One buffer fewer
// would refuse m itself when m is a power of two.
TEST(TreeSum, ReserveHoldsMaxLeavesAndRefusesOneMoreThanItsCapacity) {
  for (int max_leaves = 1; max_leaves <= kMaxLeaves; ++max_leaves) {
    const int capacity = (1 << std::bit_width(static_cast<unsigned>(max_leaves))) - 1;
    ASSERT_GE(capacity, max_leaves);
    TreeSum<float> tree;
    tree.reserve(1, max_leaves);
    EXPECT_EQ(leaves_until_refused(tree, 4 * kMaxLeaves), capacity) << "max_leaves " << max_leaves;
  }
  // 2^k needs one buffer more than 2^k − 1.
  for (int k = 1; k <= 5; ++k) {
    TreeSum<float> fewer, enough;
    fewer.reserve(1, (1 << k) - 1);
    enough.reserve(1, 1 << k);
    EXPECT_LT(leaves_until_refused(fewer, 1 << k), 1 << k);
    EXPECT_EQ(leaves_until_refused(enough, 1 << k), 1 << k);
  }
}

// push() refuses the leaf past the capacity too, without a leaf() call before it.
TEST(TreeSum, PushRefusesALeafPastTheCapacity) {
  TreeSum<float> tree;
  tree.reserve(1, 2);  // two buffers: three leaves
  tree.begin(1);
  for (int l = 0; l < 3; ++l) EXPECT_NO_THROW(tree.push());
  EXPECT_THROW(tree.push(), std::logic_error);
  TreeSum<float> unreserved;
  EXPECT_THROW(unreserved.push(), std::logic_error);
}

TEST(TreeSum, BeginRefusesMoreValuesThanReserved) {
  TreeSum<double> unreserved;
  EXPECT_THROW(unreserved.begin(1), std::logic_error);
  TreeSum<double> tree;
  tree.reserve(8, 4);
  EXPECT_NO_THROW(tree.begin(8));
  EXPECT_NO_THROW(tree.begin(0));
  EXPECT_THROW(tree.begin(9), std::logic_error);
}

// finish() adds into its output, leaves it alone when nothing was pushed, and the object sums
// again from scratch after it, with a smaller count as well.
TEST(TreeSum, FinishAddsIntoTheOutputAndTheTreeIsReusable) {
  const Leaves<float> a = adversarial_leaves<float>(7, kCount, "tree_sum.finish_a");
  const Leaves<float> b = adversarial_leaves<float>(5, kCount / 2, "tree_sum.finish_b");
  const std::vector<float> start = adversarial_leaves<float>(1, kCount, "tree_sum.start")[0];
  TreeSum<float> tree;
  tree.reserve(kCount, 8);

  std::vector<float> out = start;
  tree.begin(kCount);
  tree.finish(out.data());
  EXPECT_TRUE(same_bits(out, start)) << "finish with no leaves changed the output";

  tree.begin(kCount);
  for (const auto& leaf : a) {
    std::copy(leaf.begin(), leaf.end(), tree.leaf());
    tree.push();
  }
  tree.finish(out.data());
  std::vector<float> expected = tree_reference(a, 0, a.size());
  for (size_t i = 0; i < kCount; ++i) expected[i] += start[i];
  EXPECT_TRUE(same_bits(out, expected));

  std::vector<float> second(kCount / 2, 0.0f);
  tree.begin(kCount / 2);
  for (const auto& leaf : b) {
    std::copy(leaf.begin(), leaf.end(), tree.leaf());
    tree.push();
  }
  tree.finish(second.data());
  EXPECT_TRUE(same_bits(second, tree_reference(b, 0, b.size())));
}

// W groups of B leaves: each group's tree sum added into zeros (a rank's gradient), then the
// group sums by the same tree (Comm::allreduce_sum_tree over the ranks).
template <class T> std::vector<T> grouped_tree_sum(const Leaves<T>& leaves, int W, int B) {
  Leaves<T> groups;
  for (int w = 0; w < W; ++w) groups.push_back(tree_sum(leaves, static_cast<size_t>(w) * B, B));
  return tree_sum(groups, 0, W);
}

// The runtime's 8 sequences on 1, 2, 4 or 8 ranks: every split gives the one-group bits.
TEST(TreeSum, PowerOfTwoGroupsGiveTheUngroupedSum) {
  const Leaves<float> leaves = adversarial_leaves<float>(8, kCount, "tree_sum.split8");
  const std::vector<float> whole = tree_sum(leaves, 0, 8);
  for (int B : {1, 2, 4, 8}) {
    EXPECT_TRUE(same_bits(grouped_tree_sum(leaves, 8 / B, B), whole)) << "B = " << B;
  }
}

// Any group count works as long as B is a power of two (3, 5, 6 ranks of 2 or 4 sequences).
TEST(TreeSum, PowerOfTwoGroupsOnAnyGroupCount) {
  for (int B : {1, 2, 4}) {
    for (int W = 1; W <= 7; ++W) {
      const Leaves<double> leaves = adversarial_leaves<double>(W * B, kCount, "tree_sum.any_w");
      EXPECT_TRUE(same_bits(grouped_tree_sum(leaves, W, B), tree_sum(leaves, 0, W * B)))
          << "W = " << W << ", B = " << B;
    }
  }
}

// The documented limit: 6 leaves as 2 groups of 3 give ((0+1)+2) + ((3+4)+5), not the tree's
// ((0+1)+(2+3)) + (4+5).
TEST(TreeSum, GroupsOfThreeDoNotGiveTheUngroupedSum) {
  const Leaves<float> leaves = adversarial_leaves<float>(6, kCount, "tree_sum.split6");
  EXPECT_FALSE(same_bits(grouped_tree_sum(leaves, 2, 3), tree_sum(leaves, 0, 6)));
}

// Groups of any size (an EP group of P ranks holding B sequences each is a range of P·B leaves,
// P not a power of two included): each group sums the largest nodes of the global tree inside
// its range (tree_nodes_within, each node by a TreeSum of its own), and tree_sum_from_nodes adds
// every group's nodes along the rest of the tree. The result is the tree over all leaves, bit for
// bit, whatever the groups: how Trainer reduces the experts' gradients over their replicas.
TEST(TreeNodes, GroupsOfAnySizeGiveTheWholeTreeBitForBit) {
  for (int total = 1; total <= 24; ++total) {
    const Leaves<float> leaves = adversarial_leaves<float>(total, kCount, "tree_sum.nodes");
    const std::vector<float> expected = tree_reference(leaves, 0, total);
    for (int group = 1; group <= total; ++group) {
      if (total % group != 0) continue;
      // Every group's nodes, summed by TreeSum over the node's own leaves.
      std::vector<TreeNode> nodes;
      std::vector<std::vector<float>> sums;
      for (int lo = 0; lo < total; lo += group) {
        int covered = lo;
        for (const TreeNode& node : tree_nodes_within(lo, lo + group, total)) {
          ASSERT_EQ(node.first, covered) << "nodes are in order and leave no gap";
          covered += node.count;
          nodes.push_back(node);
          sums.push_back(tree_sum(leaves, node.first, node.count));
        }
        ASSERT_EQ(covered, lo + group);
      }
      auto known = [&](TreeNode node) -> const float* {
        for (size_t n = 0; n < nodes.size(); ++n) {
          if (nodes[n] == node) return sums[n].data();
        }
        return nullptr;
      };
      std::vector<std::vector<float>> scratch(tree_sum_depth(total), std::vector<float>(kCount));
      std::vector<float> got(kCount);
      tree_sum_from_nodes(got.data(), kCount, total, known, scratch);
      EXPECT_TRUE(same_bits(got, expected)) << total << " leaves in groups of " << group;
    }
  }
}

TEST(TreeNodes, ASubtreeIsOneNodeAndAnUnalignedRangeSeveral) {
  EXPECT_EQ(tree_nodes_within(4, 8, 16), (std::vector<TreeNode>{{4, 4}}));
  EXPECT_EQ(tree_nodes_within(0, 6, 12), (std::vector<TreeNode>{{0, 4}, {4, 2}}));
  EXPECT_EQ(tree_nodes_within(6, 12, 12), (std::vector<TreeNode>{{6, 2}, {8, 4}}));
  EXPECT_EQ(tree_nodes_within(0, 12, 12), (std::vector<TreeNode>{{0, 12}}));
  EXPECT_TRUE(tree_nodes_within(3, 3, 12).empty());
  // Nodes that do not cover the tree are refused, not summed short.
  std::vector<std::vector<float>> scratch(4, std::vector<float>(1));
  float out = 0;
  EXPECT_THROW(tree_sum_from_nodes(
                   &out, 1, 8, [](TreeNode) -> const float* { return nullptr; }, scratch),
               std::logic_error);
}

// begin_into: leaves written by GEMMs with beta = leaf_beta() into leaf(), which for one leaf is
// the output itself and otherwise, after an odd number of leaves, the left sibling's sum (C =
// s + 1·C), have the bits of every leaf in a buffer of its own added by push and finish; leaf
// counts that are not powers of two, and leaves of no rows (K = 0: the contract's +0), included.
TEST(TreeSum, BeginIntoHasTheBitsOfTheBufferedSum) {
  const int M = 7, N = 9, K = 13;
  for (int leaves : {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16, 17}) {
    const Leaves<float> a = adversarial_leaves<float>(leaves, size_t(M) * K, "tree_sum.into.a");
    const Leaves<float> b = adversarial_leaves<float>(leaves, size_t(K) * N, "tree_sum.into.b");
    const Leaves<float> start = adversarial_leaves<float>(1, size_t(M) * N, "tree_sum.into.c");
    std::vector<float> buffered = start[0], direct = start[0];
    TreeSum<float> t1, t2;
    t1.reserve(size_t(M) * N, leaves);
    t2.reserve(size_t(M) * N, leaves);
    t1.begin(size_t(M) * N);
    t2.begin_into(size_t(M) * N, leaves, direct.data());
    for (int l = 0; l < leaves; ++l) {
      const int rows = l % 5 == 3 ? 0 : K;
      EXPECT_EQ(t2.leaf_beta(), leaves == 1 || l % 2 == 1 ? 1.0f : 0.0f) << "leaf " << l;
      gemm<float>(false, false, M, N, rows, 1.0f, a[l].data(), b[l].data(), 0.0f, t1.leaf());
      t1.push();
      gemm<float>(false, false, M, N, rows, 1.0f, a[l].data(), b[l].data(), t2.leaf_beta(),
                  t2.leaf());
      t2.push();
    }
    t1.finish(buffered.data());
    t2.finish(direct.data());
    EXPECT_TRUE(same_bits(buffered, direct)) << leaves << " leaves";
  }
}

// begin_into of one leaf writes it into the output: a second leaf is refused, not added.
TEST(TreeSum, BeginIntoOneLeafRefusesASecond) {
  TreeSum<float> tree;
  tree.reserve(4, 4);
  std::vector<float> out(4, 0.0f);
  tree.begin_into(4, 1, out.data());
  std::fill_n(tree.leaf(), 4, 1.0f);
  tree.push();
  EXPECT_THROW(tree.leaf(), std::logic_error);
  EXPECT_THROW(tree.push(), std::logic_error);
}

// After begin_into, begin goes back to leaves that each overwrite a buffer of their own.
TEST(TreeSum, BeginAfterBeginIntoWritesEveryLeafAfresh) {
  TreeSum<float> tree;
  tree.reserve(4, 4);
  std::vector<float> out(4, 0.0f);
  tree.begin_into(4, 2, out.data());
  std::fill_n(tree.leaf(), 4, 1.0f);
  tree.push();
  tree.begin(4);
  std::fill_n(tree.leaf(), 4, 1.0f);
  tree.push();
  EXPECT_EQ(tree.leaf_beta(), 0.0f);
  std::fill_n(tree.leaf(), 4, 2.0f);  // its own buffer: the first leaf's 1s stay
  tree.push();
  tree.finish(out.data());
  EXPECT_EQ(out, std::vector<float>(4, 3.0f));
}

}  // namespace
}  // namespace moe
