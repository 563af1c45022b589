// Sums over sequences in one fixed order, so that no bit of a gradient or a loss depends on how
// the global batch is dealt out to the ranks.
//
// A weight gradient is a sum over tokens. Summed over the tokens a rank holds and then over the
// ranks, its rounding would depend on the rank count. Instead every token-summed quantity is
// first summed within each sequence (a sequence is never split between ranks, and its sum is the
// same wherever it is computed), and the per-sequence sums are added along a binary tree over the
// global sequence index: a range of n sequences splits after the largest power of two below n.
// When each rank holds B sequences and B is a power of two, each rank's range is a subtree: the
// rank adds its own sequences with TreeSum, and the ranks' sums are added along the same tree by
// Comm::allreduce_sum_tree. The result is the one-rank result, bit for bit, on any rank count.
// Float addition is commutative, so only the tree's shape matters, not which operand is left.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "model/parallel.hpp"

namespace moe {

// The partial sums a TreeSum of up to `max_leaves` leaves keeps at once (its buffers): the stack
// holds at most floor(log2(max_leaves)) + 1 entries, the next leaf included; at least 1.
inline int tree_sum_depth(int max_leaves) {
  int depth = 1;
  while (depth < 62 && (int64_t{1} << depth) <= max_leaves) ++depth;
  return depth;
}

// Adds leaves pushed in order along the tree above: a binary counter that merges two partial
// sums of equal size as soon as both exist, and at the end merges what is left from the right,
// which is the same tree. Holds at most log2(leaves) + 1 partial sums of `count` values.
template <class T> class TreeSum {
 public:
  // Room for sums of up to `max_count` values over up to `max_leaves` leaves; allocates here,
  // never later.
  void reserve(size_t max_count, int max_leaves) {
    const size_t depth = tree_sum_depth(max_leaves);
    buffers_.assign(depth, std::vector<T>(max_count));
    sizes_.reserve(depth + 1);
  }

  // Starts a sum of `count` values per leaf (<= the reserved count).
  void begin(size_t count) {
    if (buffers_.empty() || count > buffers_[0].size()) {
      throw std::logic_error("TreeSum::begin: more values than reserved");
    }
    count_ = count;
    sizes_.clear();
    direct_ = nullptr;
    into_ = false;
  }

  // As begin, for a sum of exactly `leaves` leaves that finish(out) adds into `out`, each leaf
  // written by a GEMM with beta = leaf_beta() into leaf(). A GEMM's C = s + 1·C gives the bits of
  // C + s (IEEE addition commutes; only of two NaNs may the payload kept differ, in a step that
  // stops on its non-finite values anyway), so a leaf is added where it lies instead of through a
  // buffer and a pass of its own: with one leaf, leaf() is `out` itself; after an odd number of
  // leaves, leaf() is the top partial sum (one leaf, its left sibling), which push() then counts as
  // two.
  void begin_into(size_t count, int leaves, T* out) {
    begin(count);
    into_ = true;
    if (leaves == 1) direct_ = out;
  }
  T leaf_beta() const { return direct_ != nullptr || pairs() ? T(1) : T(0); }

  // The next leaf's buffer, to be overwritten by the caller before push() (or, after begin_into,
  // the sum to add it into where leaf_beta() is 1).
  T* leaf() {
    if (direct_ != nullptr) {
      if (!sizes_.empty()) throw std::logic_error("TreeSum: more leaves than begin_into said");
      return direct_;
    }
    if (pairs()) return buffers_[sizes_.size() - 1].data();
    if (sizes_.size() >= buffers_.size())
      throw std::logic_error("TreeSum: more leaves than reserved");
    return buffers_[sizes_.size()].data();
  }

  // Values held by the reserved buffers (model_memory_estimate counts them).
  size_t reserved_values() const {
    return buffers_.empty() ? 0 : buffers_.size() * buffers_[0].size();
  }

  // Adds the leaf written through leaf(). Refuses, as leaf() does, a leaf past the reserved
  // buffers, so that a push without leaf() cannot merge outside them.
  void push() {
    if (direct_ != nullptr && !sizes_.empty()) {
      throw std::logic_error("TreeSum: more leaves than begin_into said");
    }
    if (pairs()) {  // the leaf was added into its left sibling: the pair is one sum of two
      sizes_.back() = 2;
      while (sizes_.size() >= 2 && sizes_[sizes_.size() - 1] == sizes_[sizes_.size() - 2]) merge();
      return;
    }
    if (sizes_.size() >= buffers_.size()) {
      throw std::logic_error("TreeSum: more leaves than reserved");
    }
    sizes_.push_back(1);
    while (sizes_.size() >= 2 && sizes_[sizes_.size() - 1] == sizes_[sizes_.size() - 2]) merge();
  }

  // out[i] += the tree sum of the leaves pushed since begin(); nothing when none were.
  void finish(T* out) {
    if (direct_ != nullptr) {
      if (out != direct_) throw std::logic_error("TreeSum::finish: not the output of begin_into");
      direct_ = nullptr;
      sizes_.clear();
      return;
    }
    while (sizes_.size() >= 2) merge();
    if (sizes_.empty()) return;
    const T* sum = buffers_[0].data();
    parallel_add(out, sum, count_);
    sizes_.clear();
  }

 private:
  // After begin_into, the next leaf is the right sibling of the single leaf on top.
  bool pairs() const { return into_ && !sizes_.empty() && sizes_.back() == 1; }

  // The top two partial sums (adjacent subtrees) become one.
  void merge() {
    const size_t top = sizes_.size() - 1;
    T* left = buffers_[top - 1].data();
    const T* right = buffers_[top].data();
    parallel_add(left, right, count_);
    sizes_[top - 1] += sizes_[top];
    sizes_.pop_back();
  }

  std::vector<std::vector<T>> buffers_;  // [depth][max_count]; buffer i holds stack entry i
  std::vector<int64_t> sizes_;           // leaves under each stack entry, bottom first
  size_t count_ = 0;
  T* direct_ = nullptr;  // begin_into of one leaf: its output, written through leaf()
  bool into_ = false;    // begun by begin_into: leaves written with leaf_beta()
};

// A node of the tree over [0, total): the sequences [first, first + count).
struct TreeNode {
  int first = 0, count = 0;
  bool operator==(const TreeNode&) const = default;
};

// Where the tree over [0, n) splits: after the largest power of two below n (n >= 2).
inline int tree_split(int n) {
  int half = 1;
  while (2 * half < n) half *= 2;
  return half;
}

// The largest nodes of the tree over [0, total) that lie inside [lo, hi), left to right: the
// pieces a holder of the sequences [lo, hi) can sum alone (each with a TreeSum over its leaves,
// whose tree is the node's own). One node when [lo, hi) is a subtree, e.g. an aligned
// power-of-two block; [0, 6) of 12 gives [0, 4) and [4, 6).
inline std::vector<TreeNode> tree_nodes_within(int lo, int hi, int total) {
  std::vector<TreeNode> nodes;
  auto visit = [&](auto&& self, int first, int count) -> void {
    const int last = first + count;
    if (last <= lo || first >= hi) return;
    if (lo <= first && last <= hi) {
      nodes.push_back({first, count});
      return;
    }
    const int half = tree_split(count);
    self(self, first, half);
    self(self, first + half, count - half);
  };
  if (lo < hi && total > 0) visit(visit, 0, total);
  return nodes;
}

// out[0, count) = the sum of the tree over [0, total) from nodes whose sums are known: known(node)
// gives a node's sum or nullptr; the nodes known must cover [0, total) (tree_nodes_within of a
// partition of it). Unknown nodes are the sum of their two halves, as TreeSum adds them;
// `scratch` holds one buffer of `count` per level of the tree (tree_sum_depth(total)).
template <class T, class Known>
void tree_sum_from_nodes(T* out, size_t count, int total, Known&& known,
                         std::vector<std::vector<T>>& scratch) {
  auto sum = [&](auto&& self, T* dst, TreeNode node, size_t level) -> void {
    if (const T* value = known(node)) {
      std::copy(value, value + count, dst);
      return;
    }
    if (node.count < 2 || level >= scratch.size()) {
      throw std::logic_error("tree_sum_from_nodes: the known nodes do not cover the tree");
    }
    const int half = tree_split(node.count);
    self(self, dst, TreeNode{node.first, half}, level + 1);
    T* right = scratch[level].data();
    self(self, right, TreeNode{node.first + half, node.count - half}, level + 1);
    for (size_t i = 0; i < count; ++i) dst[i] += right[i];
  };
  sum(sum, out, TreeNode{0, total}, 0);
}

// out[0, count) += the tree sum of n leaves held at once, leaf i at leaves + i·stride: the tree
// and the bits of a TreeSum pushed the same leaves in order, for leaves computed out of order (on
// the threads). The leaves are overwritten by partial sums.
template <class T> void tree_sum_leaves(T* out, T* leaves, int n, size_t stride, size_t count) {
  auto node = [&](auto&& self, int first, int size) -> void {
    if (size < 2) return;
    const int half = tree_split(size);
    self(self, first, half);
    self(self, first + half, size - half);
    T* left = leaves + static_cast<size_t>(first) * stride;
    const T* right = leaves + static_cast<size_t>(first + half) * stride;
    parallel_add(left, right, count);
  };
  if (n < 1) return;
  node(node, 0, n);
  parallel_add(out, static_cast<const T*>(leaves), count);
}

// The same tree over scalars pushed one by one (per-sequence losses), without allocation.
class TreeSumScalar {
 public:
  void push(double value) {
    if (top_ == kMaxDepth) throw std::logic_error("TreeSumScalar: too many leaves");
    values_[top_] = value;
    sizes_[top_++] = 1;
    while (top_ >= 2 && sizes_[top_ - 1] == sizes_[top_ - 2]) merge();
  }
  double finish() {
    while (top_ >= 2) merge();
    const double sum = top_ == 0 ? 0.0 : values_[0];
    top_ = 0;
    return sum;
  }

 private:
  static constexpr int kMaxDepth = 64;
  void merge() {
    values_[top_ - 2] += values_[top_ - 1];
    sizes_[top_ - 2] += sizes_[top_ - 1];
    --top_;
  }
  double values_[kMaxDepth] = {};
  int64_t sizes_[kMaxDepth] = {};
  int top_ = 0;
};

}  // namespace moe
