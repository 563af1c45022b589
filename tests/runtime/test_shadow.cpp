// Shadow balancers (--shadow): nothing they do reaches training, a shadow with the run's own rule
// and rate is the run's routing, and their loads and biases are the same bits on any rank count.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "comm/communicator.hpp"
#include "micro_run.hpp"
#include "model/routing_config.hpp"
#include "mpi_test_ranks.hpp"
#include "runtime/run/train.hpp"

namespace moe {
namespace {

constexpr int kGlobalBatch = 8;

RunConfig micro_run(int steps, int world_size) {
  return testing_train::micro_run(steps, kGlobalBatch, world_size);
}

// The values of shadow `r`, layer `l` in a step's [R, L, E] vector.
template <class T>
std::vector<T> shadow_part(const std::vector<T>& all, int r, int l, int L, int E) {
  const auto first = all.begin() + (static_cast<size_t>(r) * L + l) * E;
  return std::vector<T>(first, first + E);
}
template <class T> std::vector<T> layer_part(const std::vector<T>& all, int l, int E) {
  const auto first = all.begin() + static_cast<size_t>(l) * E;
  return std::vector<T>(first, first + E);
}

// A run with shadows against the same run without: every step's loss, gradient norm, loads and
// bias, and the parameters at the end, bit for bit. Shadow 0 must be the run's own rule and rate:
// in every top-k layer its loads and bias are the run's at every step.
void expect_shadows_change_nothing(RunConfig cfg) {
  const Comm world = Comm::world();
  const TrainSummary with = train_run(cfg, world, /*quiet=*/true);
  const std::vector<ShadowRule> shadows = cfg.routing.shadows;
  cfg.routing.shadows.clear();
  const TrainSummary without = train_run(cfg, world, /*quiet=*/true);
  ASSERT_EQ(with.steps.size(), without.steps.size());
  EXPECT_EQ(with.param_digest, without.param_digest) << "parameters after the last step";
  const int L = cfg.model.layers, E = cfg.model.experts, R = static_cast<int>(shadows.size());
  bool others_differ = false;
  for (size_t s = 0; s < with.steps.size(); ++s) {
    const StepRecord& a = with.steps[s];
    const StepRecord& b = without.steps[s];
    EXPECT_EQ(a.loss, b.loss) << "step " << s;
    EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << s;
    EXPECT_EQ(a.expert_load, b.expert_load) << "step " << s;
    EXPECT_EQ(a.bias, b.bias) << "step " << s;
    EXPECT_EQ(a.max_violation, b.max_violation) << "step " << s;
    EXPECT_TRUE(b.shadow_load.empty() && b.shadow_bias.empty());
    ASSERT_EQ(a.shadow_load.size(), static_cast<size_t>(R) * L * E);
    ASSERT_EQ(a.shadow_bias.size(), static_cast<size_t>(R) * L * E);
    ASSERT_EQ(a.shadow_max_violation.size(), static_cast<size_t>(R) * L);
    for (int l = cfg.model.hash_layers; l < L; ++l) {
      EXPECT_EQ(shadow_part(a.shadow_load, 0, l, L, E), layer_part(a.expert_load, l, E))
          << "step " << s << ", layer " << l << ": the run's own rule as a shadow";
      EXPECT_EQ(shadow_part(a.shadow_bias, 0, l, L, E), layer_part(a.bias, l, E))
          << "step " << s << ", layer " << l;
      EXPECT_EQ(a.shadow_max_violation[l], a.max_violation[l]) << "step " << s;
      for (int r = 1; r < R; ++r) {
        others_differ =
            others_differ || shadow_part(a.shadow_bias, r, l, L, E) != layer_part(a.bias, l, E);
        if (shadows[r].kind == ShadowKind::kNone) {
          EXPECT_EQ(shadow_part(a.shadow_bias, r, l, L, E), std::vector<float>(E, 0.0f));
        }
      }
    }
    for (int l = 0; l < cfg.model.hash_layers; ++l) {  // hash layers: no shadow routes there
      for (int r = 0; r < R; ++r) {
        EXPECT_EQ(shadow_part(a.shadow_load, r, l, L, E), std::vector<int64_t>(E, 0));
        EXPECT_EQ(a.shadow_max_violation[static_cast<size_t>(r) * L + l], 0.0);
      }
    }
  }
  // The other rules did something else: the test would notice shadows that copy the run.
  EXPECT_TRUE(others_differ);
}

MOE_TEST_RANKS(ShadowBalancers, ChangeNothingAndTheRunsOwnRuleIsTheRun,
               [](int w) { return kGlobalBatch % w == 0; });
TEST(ShadowBalancers, ChangeNothingAndTheRunsOwnRuleIsTheRun) {
  RunConfig cfg = micro_run(6, Comm::world().size());
  cfg.routing.shadows =
      shadow_rules_from_text("sign:0.01,proportional:0.05,sign-centered:0.1,none");
  ASSERT_EQ(cfg.routing.bias_update_rate, 0.01);
  expect_shadows_change_nothing(cfg);
}

// A centred update, and group-limited routing (G = 2, M = 1): the shadow's centred rule is the
// run's, and it routes with the same group limit. (Not both in one run: with E = 4 in two groups
// of two, a token takes both experts of its group, the signs cancel and centring changes nothing.)
MOE_TEST_RANKS(ShadowBalancers, CentredAndGroupLimitedRunsOwnRuleIsTheRun,
               [](int w) { return kGlobalBatch % w == 0; });
TEST(ShadowBalancers, CentredAndGroupLimitedRunsOwnRuleIsTheRun) {
  RunConfig cfg = micro_run(5, Comm::world().size());
  cfg.routing.bias_update_rate = 0.05;
  cfg.routing.bias_update_center = true;
  cfg.routing.shadows = shadow_rules_from_text("sign-centered:0.05,sign:0.05,none");
  expect_shadows_change_nothing(cfg);
  if (HasFailure()) return;
  cfg.routing.routing_groups = 2;
  cfg.routing.group_topk = 1;
  cfg.routing.bias_update_center = false;
  cfg.routing.shadows = shadow_rules_from_text("sign:0.05,proportional:0.5,none");
  expect_shadows_change_nothing(cfg);
  if (HasFailure()) return;
  // With a token capacity: the shadows count the selection's loads, as the bias does.
  cfg.routing.routing_groups = 1;
  cfg.routing.capacity_factor = 1.0;
  expect_shadows_change_nothing(cfg);
}

// The shadows' loads, violations and biases at every step against one rank holding the whole
// global batch: bitwise, on 1, 2, 4 and 8 ranks (8 ranks: two EP groups of 4).
MOE_TEST_RANKS(ShadowBalancers, SameOnAnyRankCount, [](int w) { return kGlobalBatch % w == 0; });
TEST(ShadowBalancers, SameOnAnyRankCount) {
  const Comm world = Comm::world();
  RunConfig cfg = micro_run(5, 1);
  cfg.routing.shadows = shadow_rules_from_text("proportional:0.05,none,sign:0.3");
  const int L = cfg.model.layers, E = cfg.model.experts, R = 3, steps = cfg.steps;
  const size_t per_step = static_cast<size_t>(R) * L * E;
  std::vector<int64_t> ref_load(steps * per_step);
  std::vector<float> ref_bias(steps * per_step);
  std::vector<double> ref_violation(static_cast<size_t>(steps) * R * L);
  if (world.rank() == 0) {
    const TrainSummary one = train_run(cfg, Comm::self(), /*quiet=*/true);
    for (int s = 0; s < steps; ++s) {
      const StepRecord& rec = one.steps[s];
      std::copy(rec.shadow_load.begin(), rec.shadow_load.end(), ref_load.begin() + s * per_step);
      std::copy(rec.shadow_bias.begin(), rec.shadow_bias.end(), ref_bias.begin() + s * per_step);
      std::copy(rec.shadow_max_violation.begin(), rec.shadow_max_violation.end(),
                ref_violation.begin() + static_cast<size_t>(s) * R * L);
    }
  }
  world.broadcast(std::span<int64_t>(ref_load), 0);
  world.broadcast(std::span<float>(ref_bias), 0);
  world.broadcast(std::span<double>(ref_violation), 0);
  cfg.model.batch_per_rank = kGlobalBatch / world.size();
  const TrainSummary got = train_run(cfg, world, /*quiet=*/true);
  ASSERT_EQ(got.steps.size(), static_cast<size_t>(steps));
  for (int s = 0; s < steps; ++s) {
    const StepRecord& rec = got.steps[s];
    ASSERT_EQ(rec.shadow_load.size(), per_step);
    ASSERT_EQ(rec.shadow_bias.size(), per_step);
    ASSERT_EQ(rec.shadow_max_violation.size(), static_cast<size_t>(R) * L);
    EXPECT_TRUE(
        std::equal(rec.shadow_load.begin(), rec.shadow_load.end(), ref_load.begin() + s * per_step))
        << "step " << s;
    EXPECT_TRUE(
        std::equal(rec.shadow_bias.begin(), rec.shadow_bias.end(), ref_bias.begin() + s * per_step))
        << "step " << s;
    EXPECT_TRUE(std::equal(rec.shadow_max_violation.begin(), rec.shadow_max_violation.end(),
                           ref_violation.begin() + static_cast<size_t>(s) * R * L))
        << "step " << s;
  }
  // The proportional shadow moved its bias by the end.
  const std::vector<float>& last = got.steps.back().shadow_bias;
  EXPECT_TRUE(std::any_of(last.begin(), last.begin() + static_cast<size_t>(L) * E,
                          [](float b) { return b != 0.0f; }));
}

}  // namespace
}  // namespace moe
