// Parameter arenas: layout bookkeeping, and initialisation that depends only on the seed and the
// tensor's name, so every expert has the same values whichever rank owns it.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "model/moe_layer.hpp"
#include "model/params.hpp"

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
