// Parameter arenas: layout bookkeeping, and initialisation that depends only on the seed and the
// tensor's name, so every expert has the same values whichever rank owns it.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "model/blas.hpp"
#include "model/moe_layer.hpp"
#include "model/params.hpp"
#include "model/rng.hpp"

namespace moe {
namespace {

TEST(ParamLayout, OffsetsAreContiguousAndNamesUnique) {
  ParamLayout l;
  EXPECT_EQ(l.add("a", 10, ParamInit::kOnes), 0u);
  EXPECT_EQ(l.add("b", 5, ParamInit::kZeros), 10u);
  EXPECT_EQ(l.add("c", 7, ParamInit::kNormal, 0.5f), 15u);
  EXPECT_EQ(l.num_elements, 22u);
  EXPECT_EQ(l.find("b").offset, 10u);
  EXPECT_THROW(l.add("a", 1, ParamInit::kOnes), std::invalid_argument);
  EXPECT_THROW(l.find("zz"), std::out_of_range);
}

TEST(ParamInit, ValuesFollowTheirKindAndStd) {
  ParamLayout l;
  l.add("ones", 3, ParamInit::kOnes);
  l.add("zeros", 3, ParamInit::kZeros);
  l.add("w", 20000, ParamInit::kNormal, 0.02f);
  std::vector<double> v(l.num_elements, -9.0);
  param_init(std::span<double>(v), l, 42);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(v[i], 1.0);
    EXPECT_EQ(v[3 + i], 0.0);
  }
  double sum = 0, sq = 0;
  for (size_t i = 6; i < v.size(); ++i) {
    sum += v[i];
    sq += v[i] * v[i];
  }
  const double mean = sum / 20000, sd = std::sqrt(sq / 20000 - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.02 * 4 / std::sqrt(20000.0));  // 4 standard errors
  EXPECT_NEAR(sd, 0.02, 0.02 * 0.03);
  std::vector<double> other(l.num_elements);
  param_init(std::span<double>(other), l, 43);
  EXPECT_NE(v[6], other[6]);
  std::vector<double> again(l.num_elements);
  param_init(std::span<double>(again), l, 42);
  EXPECT_EQ(v, again);
  std::vector<double> wrong(l.num_elements + 1);
  EXPECT_THROW(param_init(std::span<double>(wrong), l, 42), std::invalid_argument);
}

// The tensors, initialised as tasks on the model's threads, have the same bits on 1, 2 and 3
// threads: each value init_std · N(0,1) at its own counter of its tensor's stream.
TEST(ParamInit, ValuesIndependentOfTheThreads) {
  ParamLayout l;
  const char* names[] = {"w0", "w1", "w2", "w3", "w4", "w5", "w6", "w7", "w8", "w9", "w10", "w11"};
  for (int t = 0; t < 12; ++t) {
    l.add(names[t], 1000 + 7919 * static_cast<size_t>(t), ParamInit::kNormal,
          0.01f * static_cast<float>(t + 1));
    if (t % 4 == 3) l.add(std::string(names[t]) + ".ones", 300, ParamInit::kOnes);
  }
  std::vector<std::vector<float>> by_threads;
  for (int threads : {1, 2, 3}) {
    blas_set_threads(threads);
    by_threads.emplace_back(l.num_elements, -9.0f);
    param_init(std::span<float>(by_threads.back()), l, 7);
  }
  blas_set_threads(1);
  EXPECT_EQ(by_threads[0], by_threads[1]);
  EXPECT_EQ(by_threads[0], by_threads[2]);
  for (const ParamEntry& e : l.entries) {
    const uint64_t stream = rng_stream(7, e.name);
    for (size_t i : {size_t{0}, e.count / 2, e.count - 1}) {
      const float want = e.init == ParamInit::kOnes
                             ? 1.0f
                             : static_cast<float>(e.init_std * rng_normal(stream, i));
      ASSERT_EQ(by_threads[2][e.offset + i], want) << e.name << " value " << i;
    }
  }
}

// rng_normal_lanes, which param_init runs at the CPU's vector width, draws rng_normal's bits: a
// million counters of two streams and two far beyond any tensor; its integer conversion at the
// edges of its 53 bits.
TEST(ParamInit, NormalLanesAreTheScalarDraws) {
  for (const uint64_t v : {uint64_t{0}, uint64_t{1}, (uint64_t{1} << 52) - 1, uint64_t{1} << 52,
                           (uint64_t{1} << 52) + 1, (uint64_t{1} << 53) - 1}) {
    for (const uint64_t low : {uint64_t{0}, uint64_t{0x7ff}}) {  // the 11 bits dropped
      EXPECT_EQ(rng_top53_lanes((v << 11) | low), static_cast<double>(v)) << v;
    }
  }
  size_t wrong = 0;
  for (const uint64_t stream : {rng_stream(1234, "layers.0.attn.wq"), rng_stream(7, "x")}) {
    for (uint64_t i = 0; i < 500000; ++i) {
      wrong += std::bit_cast<uint64_t>(rng_normal_lanes(stream, i)) !=
               std::bit_cast<uint64_t>(rng_normal(stream, i));
    }
    for (const uint64_t i : {uint64_t{1} << 40, (uint64_t{1} << 62) - 1}) {
      EXPECT_EQ(std::bit_cast<uint64_t>(rng_normal_lanes(stream, i)),
                std::bit_cast<uint64_t>(rng_normal(stream, i)));
    }
  }
  EXPECT_EQ(wrong, 0u);
}

// A rank's share of the dense arena: any range, cut inside a tensor or at its edge, holds the bits
// the whole arena's initialisation gives there and leaves the rest as it was, so shares gathered
// from W ranks are the one-rank arena.
TEST(ParamInit, RangesAssembleTheWholeArena) {
  ParamLayout l;
  l.add("norm", 40, ParamInit::kOnes);
  l.add("w", 3001, ParamInit::kNormal, 0.02f);
  l.add("bias", 17, ParamInit::kZeros);
  l.add("v", 999, ParamInit::kNormal, 0.5f);
  std::vector<float> whole(l.num_elements);
  param_init(std::span<float>(whole), l, 9);
  for (const std::vector<size_t>& cuts :
       {std::vector<size_t>{0, l.num_elements}, std::vector<size_t>{0, 40, 3041, 3058, 4057},
        std::vector<size_t>{0, 1, 39, 41, 1500, 3040, 3059, 4056, 4057},
        std::vector<size_t>{0, 1014, 2028, 3042, 4057}}) {
    std::vector<float> pieces(l.num_elements, -9.0f);
    for (size_t k = 0; k + 1 < cuts.size(); ++k) {
      std::vector<float> share(l.num_elements, -9.0f);
      param_init_range(std::span<float>(share), l, 9, cuts[k], cuts[k + 1]);
      for (size_t i = 0; i < share.size(); ++i) {
        const bool inside = i >= cuts[k] && i < cuts[k + 1];
        if (inside) {
          pieces[i] = share[i];
        } else {
          ASSERT_EQ(share[i], -9.0f) << "element " << i << " outside the range";
        }
      }
    }
    EXPECT_EQ(pieces, whole) << cuts.size() - 1 << " ranges";
  }
  std::vector<float> empty(l.num_elements, -9.0f);
  param_init_range(std::span<float>(empty), l, 9, 100, 100);
  EXPECT_EQ(empty, std::vector<float>(l.num_elements, -9.0f));
  EXPECT_THROW(param_init_range(std::span<float>(empty), l, 9, 10, 5), std::invalid_argument);
  EXPECT_THROW(param_init_range(std::span<float>(empty), l, 9, 0, l.num_elements + 1),
               std::invalid_argument);
}

TEST(ParamInit, ExpertValuesIndependentOfOwner) {
  const MoeDims dims{8, 6, 6, 8, 3, ScoreFunc::kSqrtSoftplus, 1.0f, 0.0f};
  ParamLayout dense_all, experts_all;
  moe_layout(dense_all, experts_all, dims, 2, 4, ExpertPlacement{8, 1}, 0);
  std::vector<float> all(experts_all.num_elements), dense_ref(dense_all.num_elements);
  param_init(std::span<float>(all), experts_all, 5);
  param_init(std::span<float>(dense_ref), dense_all, 5);
  for (int P : {2, 3, 8}) {
    for (int r = 0; r < P; ++r) {
      ParamLayout dense, experts;
      const MoeOffsets off = moe_layout(dense, experts, dims, 2, 4, ExpertPlacement{8, P}, r);
      std::vector<float> mine(experts.num_elements), dense_mine(dense.num_elements);
      param_init(std::span<float>(mine), experts, 5);
      param_init(std::span<float>(dense_mine), dense, 5);
      EXPECT_EQ(dense_mine, dense_ref);
      const int n_loc = ExpertPlacement{8, P}.num_local(r);
      EXPECT_EQ(experts.entries.size(), static_cast<size_t>(3 * n_loc));
      EXPECT_EQ(off.w3 - off.w1, static_cast<size_t>(n_loc) * 8 * 6);  // [E_loc, D, F] blocks
      for (const ParamEntry& e : experts.entries) {
        const ParamEntry& ref = experts_all.find(e.name);
        for (size_t i = 0; i < e.count; ++i) {
          ASSERT_EQ(mine[e.offset + i], all[ref.offset + i]) << e.name << " P=" << P;
        }
      }
    }
  }
}

}  // namespace
}  // namespace moe
