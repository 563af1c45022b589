// The per-sequence weight gradients (model/per_sequence.hpp) against the plain backward functions
// over all N rows, and their split invariance: B sequences in one call give the bits of two calls
// of B/2 sequences whose results are added, when B is a power of two, which is how one rank's
// gradient becomes two ranks' gradients summed by Comm::allreduce_sum_tree.
// Legend: B sequences of S rows (N = B·S), I input and O output widths, D model width, V vocab.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "model/embedding.hpp"
#include "model/linear.hpp"
#include "model/per_sequence.hpp"
#include "model/rmsnorm.hpp"
#include "model/rng.hpp"
#include "model/tree_sum.hpp"

namespace moe {
namespace {

constexpr int kS = 5, kI = 12, kO = 7, kD = 12, kV = 11;

template <class T> std::vector<T> normal(size_t n, const char* name) {
  const uint64_t stream = rng_stream(23, name);
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<T>(rng_normal(stream, i));
  return v;
}

// Token ids with repeats inside and across sequences, so that embedding rows sum many tokens.
std::vector<int32_t> token_ids(size_t n) {
  const uint64_t stream = rng_stream(23, "per_sequence.ids");
  std::vector<int32_t> ids(n);
  for (size_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>(rng_below(stream, i, kV));
  return ids;
}

template <class T> bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  using U = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::bit_cast<U>(a[i]) != std::bit_cast<U>(b[i])) return false;
  }
  return true;
}

// Two summation orders of n terms differ by at most about 2·n·ε·Σ|terms|; allowed: twice that.
template <class T>
void expect_sums_close(const std::vector<T>& actual, const std::vector<T>& expected,
                       const std::vector<double>& abs_sum, int n_terms) {
  ASSERT_EQ(actual.size(), expected.size());
  const double eps = std::numeric_limits<T>::epsilon();
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_NEAR(actual[i], expected[i], 4.0 * n_terms * eps * abs_sum[i] + 1e-30) << "i = " << i;
  }
}

// d_weight[I,O] of in[N,I], d_out[N,O], and Σ_n |in[n,i]·d_out[n,o]| for the tolerance.
template <class T> struct LinearCase {
  int B;
  std::vector<T> in, d_out, weight;
  explicit LinearCase(int b)
      : B(b),
        in(normal<T>(size_t(b) * kS * kI, "per_sequence.in")),
        d_out(normal<T>(size_t(b) * kS * kO, "per_sequence.d_out")),
        weight(normal<T>(size_t(kI) * kO, "per_sequence.weight")) {}

  // seq_linear_weight_backward over sequences [b0, b0 + nb), added into zeros.
  std::vector<T> seq(int b0, int nb) const {
    TreeSum<T> tree;
    tree.reserve(size_t(kI) * kO, nb);
    std::vector<T> d_weight(size_t(kI) * kO, T(0));
    const size_t row0 = size_t(b0) * kS;
    seq_linear_weight_backward(d_weight.data(), tree, d_out.data() + row0 * kO,
                               in.data() + row0 * kI, nb, kS, kI, kO);
    return d_weight;
  }
};

template <class T> void expect_linear_weight_matches_plain() {
  for (int B : {1, 3, 4, 8}) {
    const LinearCase<T> c(B);
    const int N = B * kS;
    std::vector<T> plain(size_t(kI) * kO, T(0));
    linear_backward<T>(nullptr, plain.data(), c.d_out.data(), c.in.data(), c.weight.data(), N, kI,
                       kO);
    std::vector<double> abs_sum(plain.size(), 0.0);
    for (int n = 0; n < N; ++n) {
      for (int i = 0; i < kI; ++i) {
        for (int o = 0; o < kO; ++o) {
          abs_sum[size_t(i) * kO + o] +=
              std::abs(double(c.in[size_t(n) * kI + i]) * c.d_out[size_t(n) * kO + o]);
        }
      }
    }
    SCOPED_TRACE("B = " + std::to_string(B));
    expect_sums_close(c.seq(0, B), plain, abs_sum, N);
  }
}

TEST(PerSequence, LinearWeightBackwardMatchesPlainFloat) {
  expect_linear_weight_matches_plain<float>();
}
TEST(PerSequence, LinearWeightBackwardMatchesPlainDouble) {
  expect_linear_weight_matches_plain<double>();
}

// Adds b into a elementwise: the second rank's gradient added to the first's.
template <class T> std::vector<T> added(std::vector<T> a, const std::vector<T>& b) {
  for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
  return a;
}

TEST(PerSequence, LinearWeightBackwardSplitsIntoHalvesBitForBit) {
  for (int B : {2, 4, 8}) {
    const LinearCase<float> c(B);
    EXPECT_TRUE(same_bits(c.seq(0, B), added(c.seq(0, B / 2), c.seq(B / 2, B / 2)))) << "B " << B;
  }
}

// in[N,D], d_out[N,D], weight[D] and the forward's rstd[N].
template <class T> struct RmsCase {
  int B;
  std::vector<T> in, d_out, weight, rstd;
  explicit RmsCase(int b)
      : B(b),
        in(normal<T>(size_t(b) * kS * kD, "per_sequence.rms_in")),
        d_out(normal<T>(size_t(b) * kS * kD, "per_sequence.rms_d_out")),
        weight(normal<T>(kD, "per_sequence.rms_weight")),
        rstd(size_t(b) * kS) {
    std::vector<T> out(in.size());
    rmsnorm_forward(out.data(), rstd.data(), in.data(), weight.data(), B * kS, kD, 1e-6f);
  }

  // seq_rmsnorm_backward over sequences [b0, b0 + nb) into zeros: d_in rows of those sequences
  // (the rest stay zero) and d_weight.
  std::pair<std::vector<T>, std::vector<T>> seq(int b0, int nb) const {
    std::vector<T> leaves;
    std::vector<T> d_in(in.size(), T(0)), d_weight(kD, T(0));
    const size_t row0 = size_t(b0) * kS;
    seq_rmsnorm_backward(d_in.data() + row0 * kD, d_weight.data(), leaves, d_out.data() + row0 * kD,
                         in.data() + row0 * kD, weight.data(), rstd.data() + row0, nb, kS, kD);
    return {d_in, d_weight};
  }
};

template <class T> void expect_rmsnorm_matches_plain() {
  for (int B : {1, 3, 4, 8}) {
    const RmsCase<T> c(B);
    const int N = B * kS;
    std::vector<T> d_in(c.in.size(), T(0)), d_weight(kD, T(0));
    rmsnorm_backward(d_in.data(), d_weight.data(), c.d_out.data(), c.in.data(), c.weight.data(),
                     c.rstd.data(), N, kD);
    std::vector<double> abs_sum(kD, 0.0);
    for (int n = 0; n < N; ++n) {
      for (int d = 0; d < kD; ++d) {
        abs_sum[d] +=
            std::abs(double(c.d_out[size_t(n) * kD + d]) * c.in[size_t(n) * kD + d] * c.rstd[n]);
      }
    }
    SCOPED_TRACE("B = " + std::to_string(B));
    const auto [seq_d_in, seq_d_weight] = c.seq(0, B);
    // d_in is row by row: the same computation whatever rows are around it.
    EXPECT_TRUE(same_bits(seq_d_in, d_in));
    expect_sums_close(seq_d_weight, d_weight, abs_sum, N);
  }
}

TEST(PerSequence, RmsnormBackwardMatchesPlainFloat) {
  expect_rmsnorm_matches_plain<float>();
}
TEST(PerSequence, RmsnormBackwardMatchesPlainDouble) {
  expect_rmsnorm_matches_plain<double>();
}

TEST(PerSequence, RmsnormBackwardSplitsIntoHalvesBitForBit) {
  for (int B : {2, 4, 8}) {
    const RmsCase<float> c(B);
    const auto [whole_d_in, whole_d_weight] = c.seq(0, B);
    const auto [first_d_in, first_d_weight] = c.seq(0, B / 2);
    const auto [second_d_in, second_d_weight] = c.seq(B / 2, B / 2);
    EXPECT_TRUE(same_bits(whole_d_weight, added(first_d_weight, second_d_weight))) << "B " << B;
    // Each half wrote only its own rows, so their sum is the two halves side by side.
    EXPECT_TRUE(same_bits(whole_d_in, added(first_d_in, second_d_in))) << "B " << B;
  }
}

// d_out[N,D] into the table rows of ids[N].
template <class T> struct EmbeddingCase {
  int B;
  std::vector<T> d_out;
  std::vector<int32_t> ids;
  explicit EmbeddingCase(int b)
      : B(b),
        d_out(normal<T>(size_t(b) * kS * kD, "per_sequence.emb_d_out")),
        ids(token_ids(size_t(b) * kS)) {}

  std::vector<T> seq(int b0, int nb) const {
    TreeSum<T> tree;
    tree.reserve(size_t(kV) * kD, nb);
    std::vector<T> d_table(size_t(kV) * kD, T(0));
    const size_t row0 = size_t(b0) * kS;
    seq_embedding_backward(d_table.data(), tree, d_out.data() + row0 * kD, ids.data() + row0, nb,
                           kS, kD, kV);
    return d_table;
  }
};

template <class T> void expect_embedding_matches_plain() {
  for (int B : {1, 3, 4, 8}) {
    const EmbeddingCase<T> c(B);
    const int N = B * kS;
    std::vector<T> plain(size_t(kV) * kD, T(0));
    embedding_backward(plain.data(), c.d_out.data(), c.ids.data(), N, kD);
    std::vector<double> abs_sum(plain.size(), 0.0);
    for (int n = 0; n < N; ++n) {
      for (int d = 0; d < kD; ++d) {
        abs_sum[size_t(c.ids[n]) * kD + d] += std::abs(double(c.d_out[size_t(n) * kD + d]));
      }
    }
    SCOPED_TRACE("B = " + std::to_string(B));
    expect_sums_close(c.seq(0, B), plain, abs_sum, N);
  }
}

TEST(PerSequence, EmbeddingBackwardMatchesPlainFloat) {
  expect_embedding_matches_plain<float>();
}
TEST(PerSequence, EmbeddingBackwardMatchesPlainDouble) {
  expect_embedding_matches_plain<double>();
}

TEST(PerSequence, EmbeddingBackwardSplitsIntoHalvesBitForBit) {
  for (int B : {2, 4, 8}) {
    const EmbeddingCase<float> c(B);
    EXPECT_TRUE(same_bits(c.seq(0, B), added(c.seq(0, B / 2), c.seq(B / 2, B / 2)))) << "B " << B;
  }
}

// Each adds into its gradient, as the plain backward functions do.
TEST(PerSequence, WeightGradientsAddIntoTheirOutput) {
  const LinearCase<double> c(4);
  TreeSum<double> tree;
  tree.reserve(size_t(kI) * kO, 4);
  std::vector<double> d_weight(size_t(kI) * kO, 1.0);
  seq_linear_weight_backward(d_weight.data(), tree, c.d_out.data(), c.in.data(), 4, kS, kI, kO);
  const std::vector<double> sum = c.seq(0, 4);
  for (size_t i = 0; i < sum.size(); ++i) EXPECT_EQ(d_weight[i], 1.0 + sum[i]);
}

}  // namespace
}  // namespace moe
