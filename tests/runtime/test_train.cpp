// The training loop over MPI ranks: rank-count invariance against a one-rank run of the same
// global batch, bitwise determinism, and learning toward the synthetic data's entropy floor.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.hpp"
#include "micro_run.hpp"
#include "model/routing_config.hpp"
#include "mpi_test_ranks.hpp"
#include "runtime/options/options.hpp"
#include "runtime/options/presets.hpp"
#include "runtime/run/placement_file.hpp"
#include "runtime/run/train.hpp"

namespace moe {
namespace {

using testing_train::micro_run;

// Between rank counts whose ranks hold a power-of-two number of sequences, a run is bitwise the
// same, with one EP group or several (replicas): every token-summed gradient and loss, the
// experts' included, is added along one tree over the global sequences (model/tree_sum.hpp,
// model/expert_grads.hpp), and the GEMM's bits do not depend on the call's shape
// (model/gemm/gemm.hpp). Otherwise the dense gradients' tree is cut differently: the same math
// in another rounding, within kLossRelTol.
constexpr double kLossRelTol = 1e-6;

// Which of the two a test expects: it says so, and fails if its layout is in the other case.
enum class Expect { kBitwise, kTolerance };

struct Reference {
  std::vector<double> losses, grad_norms, z_losses;
  std::vector<int64_t> loads;    // [steps, L, E]
  std::vector<int64_t> dropped;  // [steps, L, E] by the token capacity
  std::vector<float> bias;       // [steps, L, E] the bias each step routed with
  uint64_t param_digest = 0;     // the parameters after the last step's AdamW
};

// Runs `cfg` on one rank with the whole global batch (on world rank 0 only, to spare the other
// oversubscribed ranks) and shares its per-step values with every rank.
Reference reference_run(const RunConfig& cfg, const Comm& world) {
  Reference r;
  const size_t LE = static_cast<size_t>(cfg.model.layers) * cfg.model.experts;
  r.losses.assign(cfg.steps, 0.0);
  r.grad_norms.assign(cfg.steps, 0.0);
  r.z_losses.assign(cfg.steps, 0.0);
  r.loads.assign(cfg.steps * LE, 0);
  r.dropped.assign(cfg.steps * LE, 0);
  r.bias.assign(cfg.steps * LE, 0.0f);
  if (world.rank() == 0) {
    const TrainSummary ref = train_run(cfg, Comm::self(), /*quiet=*/true);
    r.param_digest = ref.param_digest;
    for (int s = 0; s < cfg.steps; ++s) {
      r.losses[s] = ref.steps[s].loss;
      r.grad_norms[s] = ref.steps[s].grad_norm;
      r.z_losses[s] = ref.steps[s].z_loss;
      std::copy(ref.steps[s].expert_load.begin(), ref.steps[s].expert_load.end(),
                r.loads.begin() + s * LE);
      std::copy(ref.steps[s].dropped.begin(), ref.steps[s].dropped.end(),
                r.dropped.begin() + s * LE);
      std::copy(ref.steps[s].bias.begin(), ref.steps[s].bias.end(), r.bias.begin() + s * LE);
    }
  }
  world.broadcast(std::span<double>(r.losses), 0);
  world.broadcast(std::span<double>(r.grad_norms), 0);
  world.broadcast(std::span<double>(r.z_losses), 0);
  world.broadcast(std::span<int64_t>(r.loads), 0);
  world.broadcast(std::span<int64_t>(r.dropped), 0);
  world.broadcast(std::span<float>(r.bias), 0);
  world.broadcast(std::span<uint64_t>(&r.param_digest, 1), 0);
  return r;
}

// Returns the reference run's dropped assignments over all steps (0 without a token capacity).
int64_t check_rank_invariance(RunConfig cfg, int global_batch, Expect expect) {
  const Comm world = Comm::world();
  const int W = world.size();
  EXPECT_EQ(global_batch % W, 0) << "global batch does not split over " << W
                                 << " ranks: register the test's rank counts (MOE_TEST_RANKS)";
  if (global_batch % W != 0) return 0;
  cfg.model.batch_per_rank = global_batch;
  RunConfig one_rank = cfg;
  one_rank.ep = 0;  // one rank is one EP group, holding every expert
  one_rank.expert_placement.clear();
  const Reference ref = reference_run(one_rank, world);
  const int B = global_batch / W;
  cfg.model.batch_per_rank = B;
  const TrainSummary got = train_run(cfg, world, /*quiet=*/true);
  EXPECT_EQ(got.steps.size(), ref.losses.size());
  if (got.steps.size() != ref.losses.size()) return 0;
  const size_t LE = static_cast<size_t>(cfg.model.layers) * cfg.model.experts;
  // Step 0: the same tokens and the same weights route identically, bit for bit.
  EXPECT_TRUE(std::equal(got.steps[0].expert_load.begin(), got.steps[0].expert_load.end(),
                         ref.loads.begin()));
  const bool bitwise = W == 1 || (B & (B - 1)) == 0;
  EXPECT_EQ(bitwise, expect == Expect::kBitwise)
      << W << " ranks of " << B << " sequences (EP size " << default_ep_size(W, cfg.model.experts)
      << ") are not in the case this test expects";
  if (bitwise != (expect == Expect::kBitwise)) return 0;
  if (bitwise) {
    // The parameters after the last step's AdamW, every bit of them.
    EXPECT_EQ(got.param_digest, ref.param_digest) << "parameters after the last step";
  }
  double worst = 0;
  for (size_t s = 0; s < ref.losses.size(); ++s) {
    if (bitwise) {
      EXPECT_EQ(got.steps[s].loss, ref.losses[s]) << "step " << s;
      EXPECT_EQ(got.steps[s].grad_norm, ref.grad_norms[s]) << "step " << s;
      EXPECT_EQ(got.steps[s].z_loss, ref.z_losses[s]) << "step " << s;
      EXPECT_TRUE(std::equal(got.steps[s].expert_load.begin(), got.steps[s].expert_load.end(),
                             ref.loads.begin() + s * LE))
          << "step " << s;
      EXPECT_EQ(got.steps[s].dropped.size(), LE) << "step " << s;
      EXPECT_TRUE(std::equal(got.steps[s].dropped.begin(), got.steps[s].dropped.end(),
                             ref.dropped.begin() + s * LE))
          << "step " << s;
      EXPECT_TRUE(
          std::equal(got.steps[s].bias.begin(), got.steps[s].bias.end(), ref.bias.begin() + s * LE))
          << "step " << s;
    } else {
      EXPECT_NEAR(got.steps[s].loss, ref.losses[s], kLossRelTol * ref.losses[s]) << "step " << s;
    }
    worst = std::max(worst, std::abs(got.steps[s].loss / ref.losses[s] - 1.0));
  }
  if (world.rank() == 0) {
    std::printf("  %s; worst relative loss difference: %.2e\n",
                bitwise ? "bitwise expected" : "tolerance", worst);
  }
  int64_t dropped = 0;
  for (int64_t d : ref.dropped) dropped += d;
  return dropped;
}

MOE_TEST_RANKS(TrainInvariance, MicroSameRoutingAndLossOnAnyRankCount,
               [](int w) { return 8 % w == 0; });
TEST(TrainInvariance, MicroSameRoutingAndLossOnAnyRankCount) {
  // E = 4: 8 ranks form two EP groups of 4 (replicas), bitwise too.
  EXPECT_EQ(check_rank_invariance(micro_run(5, 8, 1), 8, Expect::kBitwise), 0)
      << "dropless by default";
}

// The real preset, 2 steps, E = 8: bitwise the same on 1, 2, 4 and 8 ranks.
MOE_TEST_RANKS(TrainInvariance, DeepseekTinySameRoutingAndLossOnAnyRankCount,
               [](int w) { return 8 % w == 0; });
TEST(TrainInvariance, DeepseekTinySameRoutingAndLossOnAnyRankCount) {
  RunConfig cfg = micro_run(2, 8, 1);
  cfg.model_name = "deepseek4-tiny";
  cfg.model = preset_model("deepseek4-tiny");
  check_rank_invariance(cfg, 8, Expect::kBitwise);
}

// The fine-grained preset, 2 steps: E = 64 in 8 groups, K = 8, the groups chosen per token; 8,
// 16, 32 or 64 experts per rank, bitwise the same on 1, 2, 4 and 8 ranks.
MOE_TEST_RANKS(TrainInvariance, DeepseekFineSameRoutingAndLossOnAnyRankCount,
               [](int w) { return 8 % w == 0; });
TEST(TrainInvariance, DeepseekFineSameRoutingAndLossOnAnyRankCount) {
  RunConfig cfg = micro_run(2, 8, 1);
  cfg.model_name = "deepseek4-fine";
  preset_apply(cfg.model_name, cfg.model, cfg.routing);
  ASSERT_EQ(cfg.routing.routing_groups, 8);
  check_rank_invariance(cfg, 8, Expect::kBitwise);
}

// --threads changes no bit either: the experts' gradient-norm sums, attention's sequences as
// tasks, the group-limited top-k over the rows and the own blocks' copies on 1 and on 2 threads.
MOE_TEST_RANKS(TrainThreads, DeepseekFineSameOnOneAndTwoThreads,
               [](int w) { return w == 1 || w == 2; });
TEST(TrainThreads, DeepseekFineSameOnOneAndTwoThreads) {
  const Comm world = Comm::world();
  RunConfig cfg = micro_run(2, 4, world.size());
  cfg.model_name = "deepseek4-fine";
  preset_apply(cfg.model_name, cfg.model, cfg.routing);
  cfg.model.batch_per_rank = 4 / world.size();
  cfg.threads = 1;
  const TrainSummary one = train_run(cfg, world, /*quiet=*/true);
  cfg.threads = 2;
  const TrainSummary two = train_run(cfg, world, /*quiet=*/true);
  ASSERT_EQ(one.steps.size(), 2u);
  ASSERT_EQ(two.steps.size(), 2u);
  for (size_t s = 0; s < one.steps.size(); ++s) {
    EXPECT_EQ(one.steps[s].loss, two.steps[s].loss) << "step " << s;
    EXPECT_EQ(one.steps[s].grad_norm, two.steps[s].grad_norm) << "step " << s;
    EXPECT_EQ(one.steps[s].expert_load, two.steps[s].expert_load) << "step " << s;
  }
  EXPECT_EQ(one.param_digest, two.param_digest);
}

// With the router z-loss: its per-sequence sums go along the same tree, so the run stays bitwise
// the same on 1, 2, 4 and 8 ranks (losses, z-losses, gradient norms, loads, parameters).
MOE_TEST_RANKS(TrainInvariance, MicroWithZLossSameOnAnyRankCount, [](int w) { return 8 % w == 0; });
TEST(TrainInvariance, MicroWithZLossSameOnAnyRankCount) {
  RunConfig cfg = micro_run(4, 8, 1);
  cfg.routing.z_loss_weight = 0.01;
  check_rank_invariance(cfg, 8, Expect::kBitwise);
  // It is on, and it changes the run: the same run without it ends with other parameters.
  const Comm world = Comm::world();
  cfg.model.batch_per_rank = 8 / world.size();
  const TrainSummary with = train_run(cfg, world, /*quiet=*/true);
  cfg.routing.z_loss_weight = 0.0;
  const TrainSummary without = train_run(cfg, world, /*quiet=*/true);
  EXPECT_GT(with.steps[0].z_loss, 0.0);
  EXPECT_EQ(without.steps[0].z_loss, 0.0);
  EXPECT_EQ(with.steps[0].loss, without.steps[0].loss);  // step 0: the same weights
  EXPECT_NE(with.param_digest, without.param_digest);
}

// With a token capacity (per sequence, model/capacity.hpp) at C = 1, 1.25 and 2 and both drop
// policies: the drops are each sequence's own, so the run stays bitwise the same on 1, 2, 4 and
// 8 ranks (8: two EP groups) - losses, gradient norms, loads, the dropped counts, parameters.
MOE_TEST_RANKS(TrainInvariance, MicroWithCapacitySameOnAnyRankCount,
               [](int w) { return 8 % w == 0; });
TEST(TrainInvariance, MicroWithCapacitySameOnAnyRankCount) {
  for (const double c : {1.0, 1.25, 2.0}) {
    for (const DropPolicy policy : {DropPolicy::kByProbability, DropPolicy::kByPosition}) {
      SCOPED_TRACE("C = " + std::to_string(c) + ", " + drop_policy_name(policy));
      RunConfig cfg = micro_run(3, 8, 1);
      cfg.routing.capacity_factor = c;
      cfg.routing.drop_policy = policy;
      const int64_t dropped = check_rank_invariance(cfg, 8, Expect::kBitwise);
      if (c < 2.0) {
        EXPECT_GT(dropped, 0) << "the capacity must bind for the test to mean much";
      }
      if (HasFailure()) return;
    }
  }
}

// Megatron-Core's per-rank capacity (--capacity-unit rank): with one sequence a rank it is the
// per-sequence capacity, bit for bit; with four, the rank pools them (one capacity of 4·S
// tokens per expert) and drops other assignments.
MOE_TEST_RANKS(TrainCapacity, PerRankUnitPoolsTheRanksSequences, [](int w) { return w == 1; });
TEST(TrainCapacity, PerRankUnitPoolsTheRanksSequences) {
  auto total_dropped = [](const TrainSummary& s) {
    int64_t d = 0;
    for (const StepRecord& r : s.steps) {
      for (int64_t x : r.dropped) d += x;
    }
    return d;
  };
  for (const int B : {1, 4}) {
    RunConfig cfg = micro_run(3, B, 1);
    cfg.routing.capacity_factor = 1.0;
    const TrainSummary per_sequence = train_run(cfg, Comm::self(), /*quiet=*/true);
    cfg.routing.capacity_unit = CapacityUnit::kRank;
    const TrainSummary per_rank = train_run(cfg, Comm::self(), /*quiet=*/true);
    EXPECT_GT(total_dropped(per_sequence), 0);
    if (B == 1) {
      EXPECT_EQ(per_rank.param_digest, per_sequence.param_digest);
      EXPECT_EQ(total_dropped(per_rank), total_dropped(per_sequence));
    } else {
      EXPECT_NE(per_rank.param_digest, per_sequence.param_digest);
      EXPECT_LT(total_dropped(per_rank), total_dropped(per_sequence));
    }
  }
}

// EP groups of 3 ranks (--ep 3: a group's 6 sequences are no subtree of the tree over 12, so
// each group sums two nodes and the replicas add them along the rest of the tree), against one
// rank holding all 12 sequences: bitwise. Runs on 6 ranks only.
MOE_TEST_RANKS(TrainInvariance, MicroReplicasOfThreeRankGroupsOnSixRanks,
               [](int w) { return w == 6; });
TEST(TrainInvariance, MicroReplicasOfThreeRankGroupsOnSixRanks) {
  const Comm world = Comm::world();
  ASSERT_EQ(world.size(), 6) << "needs 6 ranks (train_mpi_tests.np6)";
  RunConfig cfg = micro_run(4, 12, 1);
  cfg.ep = 3;
  check_rank_invariance(cfg, 12, Expect::kBitwise);
}

// A placement of `E` experts on `P` ranks in each of `L` layers, drawn from `seed`: experts
// shuffled, then cut at P - 1 distinct points, so counts are uneven (a permutation when P == E);
// then `replicas` more instances, each of a drawn expert on a drawn rank that does not hold it yet.
ModelPlacement drawn_placement(int E, int L, int P, unsigned seed, int replicas = 0) {
  std::mt19937 rng(seed);
  ModelPlacement placement;
  for (int l = 0; l < L; ++l) {
    std::vector<int> experts(E), cuts(E - 1);
    std::iota(experts.begin(), experts.end(), 0);
    std::shuffle(experts.begin(), experts.end(), rng);
    std::iota(cuts.begin(), cuts.end(), 1);
    std::shuffle(cuts.begin(), cuts.end(), rng);
    cuts.resize(P - 1);
    cuts.push_back(0);
    cuts.push_back(E);
    std::sort(cuts.begin(), cuts.end());
    std::vector<std::vector<int>> ranks(P);
    for (int q = 0; q < P; ++q) {
      ranks[q].assign(experts.begin() + cuts[q], experts.begin() + cuts[q + 1]);
    }
    for (int added = 0; added < replicas && P > 1;) {
      const int e = static_cast<int>(rng() % E), q = static_cast<int>(rng() % P);
      if (std::find(ranks[q].begin(), ranks[q].end(), e) != ranks[q].end()) continue;
      ranks[q].push_back(e);
      ++added;
    }
    placement.emplace_back(E, ranks);
  }
  return placement;
}

// Where experts lie changes no bit, only the time: under drawn placements (uneven counts, every
// layer its own, and with replicated experts: 3 more instances a layer, each replica taking a
// chunk of the sequences) a run's losses, gradient norms, loads, bias and parameters equal the
// one-rank run's, with one EP group and with two.
MOE_TEST_RANKS(TrainPlacement, DeepseekTinySameUnderAnyPlacement,
               [](int w) { return w == 2 || w == 4 || w == 8; });
TEST(TrainPlacement, DeepseekTinySameUnderAnyPlacement) {
  const Comm world = Comm::world();
  const int W = world.size();
  RunConfig cfg = micro_run(2, 8, 1);
  cfg.model_name = "deepseek4-tiny";
  cfg.model = preset_model("deepseek4-tiny");
  // Every rank reads the file rank 0 wrote, under rank 0's name for it.
  int root_pid = static_cast<int>(::getpid());
  world.broadcast(std::span<int>(&root_pid, 1), 0);
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("moe_placement_test_" + std::to_string(root_pid) + ".txt"))
                               .string();
  for (const int ep : {0, W / 2}) {
    if (ep == 1) continue;  // one rank of each group holds every expert: nothing to place
    cfg.ep = ep;
    const int P = run_ep_size(cfg, W);
    for (const auto& [seed, replicas] : {std::pair{1u, 0}, std::pair{2u, 3}}) {
      const ModelPlacement drawn =
          drawn_placement(cfg.model.experts, cfg.model.layers, P, seed, replicas);
      if (world.rank() == 0) {
        std::ofstream(path) << "# drawn by the test, seed " << seed << ", " << replicas
                            << " replicas a layer\n"
                            << placement_text_make(drawn);
      }
      world.barrier();
      cfg.expert_placement = path;
      SCOPED_TRACE("EP size " + std::to_string(P) + ", placement seed " + std::to_string(seed) +
                   ", " + std::to_string(replicas) + " replicas a layer");
      check_rank_invariance(cfg, 8, Expect::kBitwise);
      world.barrier();
    }
  }
  if (world.rank() == 0) std::filesystem::remove(path);
}

TEST(TrainDeterminism, SameCommandGivesBitwiseIdenticalRun) {
  const Comm world = Comm::world();
  const RunConfig cfg = micro_run(6, 2 * world.size(), world.size());
  const TrainSummary a = train_run(cfg, world, true);
  const TrainSummary b = train_run(cfg, world, true);
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (size_t s = 0; s < a.steps.size(); ++s) {
    EXPECT_EQ(a.steps[s].loss, b.steps[s].loss) << "step " << s;
    EXPECT_EQ(a.steps[s].grad_norm, b.steps[s].grad_norm) << "step " << s;
    EXPECT_EQ(a.steps[s].expert_load, b.steps[s].expert_load) << "step " << s;
    EXPECT_EQ(a.steps[s].bias, b.steps[s].bias) << "step " << s;
  }
  EXPECT_EQ(a.param_digest, b.param_digest) << "parameters after the last step";
  EXPECT_NE(a.param_digest, 0u);
}

TEST(TrainBias, IdenticalOnEveryRank) {
  const Comm world = Comm::world();
  RunConfig cfg = micro_run(12, 2 * world.size(), world.size());
  cfg.routing.bias_update_rate = 0.01;
  const TrainSummary s = train_run(cfg, world, true);
  std::vector<float> bias = s.steps.back().bias;
  std::vector<float> root = bias;
  world.broadcast(std::span<float>(root), 0);
  EXPECT_EQ(bias, root);
  float total = 0;
  for (float b : bias) total += std::abs(b);
  EXPECT_GT(total, 0.0f) << "the bias never moved";
}

}  // namespace
}  // namespace moe
