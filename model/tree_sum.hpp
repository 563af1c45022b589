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

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

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
  }

  // The next leaf's buffer, to be overwritten by the caller before push().
  T* leaf() {
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
    if (sizes_.size() >= buffers_.size()) {
      throw std::logic_error("TreeSum: more leaves than reserved");
    }
    sizes_.push_back(1);
    while (sizes_.size() >= 2 && sizes_[sizes_.size() - 1] == sizes_[sizes_.size() - 2]) merge();
  }

  // out[i] += the tree sum of the leaves pushed since begin(); nothing when none were.
  void finish(T* out) {
    while (sizes_.size() >= 2) merge();
    if (sizes_.empty()) return;
    const T* sum = buffers_[0].data();
    for (size_t i = 0; i < count_; ++i) out[i] += sum[i];
    sizes_.clear();
  }

 private:
  // The top two partial sums (adjacent subtrees) become one.
  void merge() {
    const size_t top = sizes_.size() - 1;
    T* left = buffers_[top - 1].data();
    const T* right = buffers_[top].data();
    for (size_t i = 0; i < count_; ++i) left[i] += right[i];
    sizes_[top - 1] += sizes_[top];
    sizes_.pop_back();
  }

  std::vector<std::vector<T>> buffers_;  // [depth][max_count]; buffer i holds stack entry i
  std::vector<int64_t> sizes_;           // leaves under each stack entry, bottom first
  size_t count_ = 0;
};

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
