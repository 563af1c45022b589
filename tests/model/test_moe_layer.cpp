// The MoE layer end to end: finite-difference gradients of every parameter group and the input
// (one rank, double precision), and expert-parallel invariance (the same global tokens on W ranks
// with every EP size P dividing W give the same routing and loads exactly, and the same outputs
// and gradients within a stated float tolerance as one rank holding all experts).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.hpp"
#include "model/linear.hpp"
#include "model/optimizer.hpp"
#include "moe_harness.hpp"

namespace moe {
namespace {

using testing_moe::MoeHarness;

// ---------------------------------------------------------------------------------------------
// Gradient check. Loss L = Σ out ⊙ R for a fixed random R, so ∂L/∂out = R. Central differences
// with h = 1e-6 in double: truncation error O(h²) ~ 1e-12 and rounding ~ 1e-16/h ~ 1e-10 on
// values of order 1, so we require |analytic − numeric| <= 1e-6 · max(1, |analytic|).
// Selection (top-k, clamps) is piecewise constant: random data keeps every margin far above h.
// The cases with a router z-loss add it to L (MoeSaved::z_loss), so its gradient is checked
// through the layer, into the router and the input. The cases with a token capacity drop some
// assignments (model/capacity.hpp): their outputs, and so their gradients, are absent.

struct GradCase {
  RoutingMode mode;
  ScoreFunc score;
  float swiglu_limit;
  double z_loss_weight = 0.0;  // the router z-loss, added to the loss when > 0
  int64_t capacity = 0;        // per (sequence, expert); 0: dropless
  DropPolicy drop_policy = DropPolicy::kByProbability;
};

class MoeGradient : public ::testing::TestWithParam<GradCase> {};

double moe_loss(MoeHarness<double>& h, EpExchange& ex, const std::vector<double>& in,
                const std::vector<double>& R, const MoeRouting& routing, int N) {
  std::vector<double> out(R.size());
  moe_forward(out.data(), h.saved, in.data(), h.weights(), routing, h.dims, h.placement, ex, N);
  double loss = 0;
  for (size_t i = 0; i < out.size(); ++i) loss += out[i] * R[i];
  return loss + h.saved.z_loss;
}

TEST_P(MoeGradient, MatchesFiniteDifferences) {
  const GradCase c = GetParam();
  const Comm self = Comm::self();
  EpExchange ex(self);
  const int N = 7, V = 16;
  const MoeDims dims{
      /*D=*/6,       /*F=*/5, /*Fs=*/4, /*E=*/5, /*K=*/2, c.score, /*route_scale=*/1.5f,
      c.swiglu_limit};
  MoeHarness<double> h(dims, 1, 0, /*seed=*/7, V, N);
  // Larger weights than the 0.02 init so every term (router included) matters at 1e-6.
  for (auto& x : h.dense_params) x *= 25.0;
  for (auto& x : h.expert_params) x *= 25.0;
  std::vector<double> in = testing_moe::global_normal<double>("in", N * dims.D, 1.0);
  const std::vector<double> R = testing_moe::global_normal<double>("R", N * dims.D, 1.0);
  const std::vector<int32_t> ids = testing_moe::global_token_ids(N, V);
  MoeRouting routing = h.routing(c.mode, ids.data(), 3);
  routing.z_loss_weight = c.z_loss_weight;
  routing.capacity = c.capacity;
  routing.drop_policy = c.drop_policy;

  moe_loss(h, ex, in, R, routing, N);
  const std::vector<int32_t> selection = h.saved.expert_idx;
  const std::vector<int32_t> dispatched = h.saved.dispatched_idx;
  if (c.capacity > 0) {  // the case drops something, or it checks nothing new
    EXPECT_GT(std::count(dispatched.begin(), dispatched.end(), -1), 0);
  }
  std::vector<double> d_in(in.size(), 0.0);
  // What the buffers hold from an earlier step must not matter: every combine weight's gradient,
  // a dropped assignment's (0) included, is written anew.
  h.saved.scratch.d_weights.assign(static_cast<size_t>(N) * dims.K, std::nan(""));
  moe_backward(d_in.data(), h.grads(), R.data(), h.saved, in.data(), h.weights(), dims, ex);

  const double eps = 1e-6;
  int checked = 0;
  auto check = [&](std::vector<double>& x, const std::vector<double>& analytic,
                   const std::string& what) {
    for (size_t i = 0; i < x.size(); ++i) {
      const double keep = x[i];
      x[i] = keep + eps;
      const double lp = moe_loss(h, ex, in, R, routing, N);
      x[i] = keep - eps;
      const double lm = moe_loss(h, ex, in, R, routing, N);
      x[i] = keep;
      ASSERT_EQ(h.saved.expert_idx, selection) << what << "[" << i << "] flipped a selection";
      ASSERT_EQ(h.saved.dispatched_idx, dispatched) << what << "[" << i << "] flipped a drop";
      const double numeric = (lp - lm) / (2 * eps);
      EXPECT_NEAR(analytic[i], numeric, 1e-6 * std::max(1.0, std::abs(analytic[i])))
          << what << "[" << i << "]";
      ++checked;
    }
  };
  check(in, d_in, "d_in");
  check(h.dense_params, h.dense_grads, "dense (router, shared)");
  check(h.expert_params, h.expert_grads, "experts");
  EXPECT_EQ(checked, static_cast<int>(in.size() + h.dense_params.size() + h.expert_params.size()));
  // The router must receive gradient (through the weights), or the check proves little.
  double router_norm = 0;
  for (int i = 0; i < dims.D * dims.E; ++i)
    router_norm += std::abs(h.dense_grads[h.off.router + i]);
  EXPECT_GT(router_norm, 1e-3);
}

INSTANTIATE_TEST_SUITE_P(
    AllRoutings, MoeGradient,
    ::testing::Values(GradCase{RoutingMode::kTopK, ScoreFunc::kSqrtSoftplus, 0.4f},
                      GradCase{RoutingMode::kTopK, ScoreFunc::kSigmoid, 0.0f},
                      GradCase{RoutingMode::kTopK, ScoreFunc::kSoftmax, 0.4f},
                      GradCase{RoutingMode::kHash, ScoreFunc::kSqrtSoftplus, 0.4f},
                      GradCase{RoutingMode::kRoundRobin, ScoreFunc::kSqrtSoftplus, 0.4f},
                      GradCase{RoutingMode::kTopK, ScoreFunc::kSqrtSoftplus, 0.4f, 0.05},
                      GradCase{RoutingMode::kHash, ScoreFunc::kSoftmax, 0.0f, 0.05},
                      GradCase{RoutingMode::kTopK, ScoreFunc::kSqrtSoftplus, 0.4f, 0.0, 2},
                      GradCase{RoutingMode::kTopK, ScoreFunc::kSoftmax, 0.4f, 0.05, 2,
                               DropPolicy::kByPosition},
                      GradCase{RoutingMode::kHash, ScoreFunc::kSigmoid, 0.4f, 0.0, 1}));

// ---------------------------------------------------------------------------------------------
// Expert-parallel invariance.

// Against the one-rank reference, bit for bit where the layout allows it: each rank holds a
// power-of-two number of whole sequences (of 3 tokens here), dense gradients are added along the
// sequence tree (allreduce_sum_tree), and the experts' by sequence along the same tree, their EP
// groups' sums over the replicas by allreduce_sum_tree too (model/expert_grads.hpp). At 3 ranks
// 16 tokens are no whole sequences of 3: one sequence a rank, and then the rounding differs,
// within 1e-6·max(1, |ref|) (the differences measured there are below 1e-8 in float).
constexpr double kInvarianceTol = 1e-6;
constexpr int kSeqLen = 3;

enum class Expect { kBitwise, kTolerance };

template <class T>
void expect_same(const T* got, const T* ref, size_t n, const std::string& what, Expect expect) {
  for (size_t i = 0; i < n; ++i) {
    if (expect == Expect::kBitwise) {
      ASSERT_EQ(std::memcmp(&got[i], &ref[i], sizeof(T)), 0)
          << what << "[" << i << "]: " << got[i] << " against " << ref[i];
    } else {
      ASSERT_NEAR(got[i], ref[i], kInvarianceTol * std::max(1.0, std::abs(double(ref[i]))))
          << what << "[" << i << "]";
    }
  }
}

template <class T> void check_invariance(RoutingMode mode, int P) {
  const Comm world = Comm::world();
  const int W = world.size(), rank = world.rank();
  const int G = 48, N = G / W, V = 64;  // 48 tokens split evenly over 1, 2, 3, 4 and 8 ranks
  // Whole sequences of kSeqLen, a power of two of them a rank: bitwise (every W but 3).
  const bool whole = N % kSeqLen == 0 && std::has_single_bit(static_cast<unsigned>(N / kSeqLen));
  const Expect expect = W == 3 ? Expect::kTolerance : Expect::kBitwise;
  ASSERT_EQ(whole, expect == Expect::kBitwise) << W << " ranks are not in the expected case";
  const int S = whole ? kSeqLen : 0, Bs = whole ? N / S : 1;
  const MoeDims dims{
      /*D=*/16, /*F=*/12, /*Fs=*/12, /*E=*/8, /*K=*/3, ScoreFunc::kSqrtSoftplus, 1.5f, 10.0f};
  const uint64_t seed = 1234;
  const std::vector<T> in = testing_moe::global_normal<T>("in", G * dims.D, 1.0);
  const std::vector<T> d_out = testing_moe::global_normal<T>("d_out", G * dims.D, 1.0);
  const std::vector<int32_t> ids = testing_moe::global_token_ids(G, V);

  // Reference: one rank with all experts, all G tokens (every rank computes it).
  const Comm self = Comm::self();
  EpExchange ex_ref(self);
  MoeHarness<T> ref(dims, 1, 0, seed, V, G, whole ? G / S : 1);
  std::vector<T> out_ref(G * dims.D), d_in_ref(G * dims.D, T(0));
  MoeRouting r_ref = ref.routing(mode, ids.data(), 0);
  r_ref.seq_len = S > 0 ? S : G;
  moe_forward(out_ref.data(), ref.saved, in.data(), ref.weights(), r_ref, dims, ref.placement,
              ex_ref, G);
  moe_backward(d_in_ref.data(), ref.grads(), d_out.data(), ref.saved, in.data(), ref.weights(),
               dims, ex_ref);

  // Distributed: rank r holds global tokens [r·N, r·N + N), sequences [r·Bs, r·Bs + Bs); its EP
  // group's sequences start at g·P·Bs of the W·Bs in the tree.
  const ParallelGroups groups = parallel_groups_make(world, P);
  EpExchange ex(groups.ep);
  MoeHarness<T> h(dims, P, groups.ep.rank(), seed, V, N, Bs);
  h.saved.expert_layout = {groups.ep_group * P * Bs, W * Bs, 0};
  ASSERT_EQ(expert_grad_nodes(h.saved.expert_layout, P, Bs).size(), 1u)
      << "an EP group's sequences are one subtree in every layout tested";
  const size_t first = static_cast<size_t>(rank) * N;
  std::vector<T> out(N * dims.D), d_in(N * dims.D, T(0));
  MoeRouting r = h.routing(mode, &ids[first], static_cast<int64_t>(first));
  r.seq_len = S > 0 ? S : N;
  moe_forward(out.data(), h.saved, &in[first * dims.D], h.weights(), r, dims, h.placement, ex, N);
  moe_backward(d_in.data(), h.grads(), &d_out[first * dims.D], h.saved, &in[first * dims.D],
               h.weights(), dims, ex);

  // Routing and global loads: exact.
  for (int i = 0; i < N * dims.K; ++i) {
    ASSERT_EQ(h.saved.expert_idx[i], ref.saved.expert_idx[first * dims.K + i])
        << "assignment " << i;
  }
  std::vector<int64_t> load = h.saved.plan.expert_counts;
  world.allreduce_sum(std::span<int64_t>(load));
  EXPECT_EQ(load, ref.saved.plan.expert_counts);

  // Outputs and input gradients of my tokens.
  expect_same(out.data(), &out_ref[first * dims.D], N * dims.D, "out", expect);
  expect_same(d_in.data(), &d_in_ref[first * dims.D], N * dims.D, "d_in", expect);
  // Replicated gradients: along the tree over all ranks. Expert gradients: over the replicas.
  std::vector<T> scratch(std::max(h.dense_grads.size(), h.expert_grads.size()));
  world.allreduce_sum_tree(std::span<T>(h.dense_grads), std::span<T>(scratch));
  groups.replica.allreduce_sum_tree(std::span<T>(h.expert_grads), std::span<T>(scratch));
  expect_same(h.dense_grads.data(), ref.dense_grads.data(), h.dense_grads.size(), "dense grads",
              expect);
  for (const ParamEntry& e : h.experts.entries) {
    const ParamEntry& re = ref.experts.find(e.name);
    ASSERT_EQ(e.count, re.count);
    expect_same(&h.expert_params[e.offset], &ref.expert_params[re.offset], e.count, e.name,
                Expect::kBitwise);
    expect_same(&h.expert_grads[e.offset], &ref.expert_grads[re.offset], e.count, "d " + e.name,
                expect);
  }
}

class MoeInvariance : public ::testing::TestWithParam<RoutingMode> {};

TEST_P(MoeInvariance, SameAsOneRankForEveryEpSizeInFloatAndDouble) {
  const int W = Comm::world().size();
  for (int P = 1; P <= std::min(W, 8); ++P) {
    if (W % P != 0) continue;
    SCOPED_TRACE("W=" + std::to_string(W) + " P=" + std::to_string(P));
    check_invariance<float>(GetParam(), P);
    if (::testing::Test::HasFatalFailure()) return;
    check_invariance<double>(GetParam(), P);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(AllRoutings, MoeInvariance,
                         ::testing::Values(RoutingMode::kTopK, RoutingMode::kHash,
                                           RoutingMode::kRoundRobin),
                         [](const auto& info) {
                           return std::string(routing_mode_name(info.param));
                         });

// Overlapping the shared expert with the dispatch all-to-all changes the order of work, not one
// bit of the results (forward output, input gradient and every parameter gradient).
TEST(MoeOverlap, SharedExpertOverlapIsBitwiseNeutral) {
  const Comm world = Comm::world();
  const int N = 12, V = 64;
  MoeDims dims{16, 12, 12, 8, 3, ScoreFunc::kSqrtSoftplus, 1.5f, 10.0f};
  const ParallelGroups groups = parallel_groups_make(world, default_ep_size(world.size(), 8));
  EpExchange ex(groups.ep);
  const size_t first = static_cast<size_t>(world.rank()) * N;
  const std::vector<float> in = testing_moe::global_normal<float>("in", (first + N) * 16, 1.0);
  const std::vector<float> d_out =
      testing_moe::global_normal<float>("d_out", (first + N) * 16, 1.0);
  std::vector<std::vector<float>> results;
  for (bool overlap : {true, false}) {
    dims.overlap_shared = overlap;
    MoeHarness<float> h(dims, groups.ep_size, groups.ep.rank(), 9, V, N);
    std::vector<float> out(N * 16), d_in(N * 16, 0.0f);
    moe_forward(out.data(), h.saved, &in[first * 16], h.weights(),
                h.routing(RoutingMode::kTopK, nullptr, 0), dims, h.placement, ex, N);
    moe_backward(d_in.data(), h.grads(), &d_out[first * 16], h.saved, &in[first * 16], h.weights(),
                 dims, ex);
    std::vector<float> all = out;
    all.insert(all.end(), d_in.begin(), d_in.end());
    all.insert(all.end(), h.dense_grads.begin(), h.dense_grads.end());
    all.insert(all.end(), h.expert_grads.begin(), h.expert_grads.end());
    results.push_back(std::move(all));
  }
  EXPECT_EQ(results[0], results[1]);
}

// What an earlier step left in the layer's buffers changes nothing: a step after another whose
// routing kept a different number of rows (a token capacity drops some), with every buffer of
// rows and all of the scratch then filled with NaN, gives the bits of the same step on fresh
// buffers, in an EP group of one rank (whose experts read their rows in place) and in the world's;
// so does a layer reserved without scratch once that NaN scratch is lent to it (as a model's
// layers borrow one set), which refuses the step before.
TEST(MoeBuffers, WhatAnEarlierStepLeftChangesNothing) {
  const Comm world = Comm::world();
  const int N = 12, V = 64;
  const MoeDims dims{16, 12, 12, 8, 3, ScoreFunc::kSqrtSoftplus, 1.5f, 10.0f};
  const size_t first = static_cast<size_t>(world.rank()) * N, ND = static_cast<size_t>(N) * 16;
  std::vector<int> ep_sizes = {1};
  if (default_ep_size(world.size(), 8) > 1) ep_sizes.push_back(default_ep_size(world.size(), 8));
  for (int P : ep_sizes) {
    SCOPED_TRACE("P=" + std::to_string(P));
    const ParallelGroups groups = parallel_groups_make(world, P);
    EpExchange ex(groups.ep);
    // One step on `h`'s buffers: its output, input gradient and parameter gradients.
    auto step = [&](MoeHarness<float>& h, const char* in_name, const char* d_out_name) {
      const std::vector<float> in =
          testing_moe::global_normal<float>(in_name, first * 16 + ND, 1.0);
      const std::vector<float> d_out =
          testing_moe::global_normal<float>(d_out_name, first * 16 + ND, 1.0);
      MoeRouting routing = h.routing(RoutingMode::kTopK, nullptr, 0);
      routing.capacity = 3;  // an expert's rows of a sequence (6 tokens: 18 assignments over 8)
      routing.seq_len = 6;   // two sequences: the router's and the shared expert's leaves
      std::fill(h.dense_grads.begin(), h.dense_grads.end(), 0.0f);
      std::fill(h.expert_grads.begin(), h.expert_grads.end(), 0.0f);
      std::vector<float> out(ND), d_in(ND, 0.0f);
      moe_forward(out.data(), h.saved, &in[first * 16], h.weights(), routing, dims, h.placement, ex,
                  N);
      moe_backward(d_in.data(), h.grads(), &d_out[first * 16], h.saved, &in[first * 16],
                   h.weights(), dims, ex);
      std::vector<float> all = out;
      all.insert(all.end(), d_in.begin(), d_in.end());
      all.insert(all.end(), h.dense_grads.begin(), h.dense_grads.end());
      all.insert(all.end(), h.expert_grads.begin(), h.expert_grads.end());
      return all;
    };
    MoeHarness<float> used(dims, groups.ep_size, groups.ep.rank(), 9, V, N, 2);
    step(used, "in_earlier", "d_out_earlier");
    std::vector<int64_t> rows = {used.saved.plan.num_recv, 0};
    MoeSaved<float>& b = used.saved;
    MoeScratch<float>& t = b.scratch;
    auto poison_scratch = [&] {
      for (std::vector<float>* v :
           {&t.send_rows, &t.d_rows, &t.d_y, &t.d_x, &t.d_g, &t.d_v, &t.h, &t.sd_g, &t.sd_v, &t.sh,
            &t.d_weights, &t.d_scores, &t.d_logits, &t.router_leaves}) {
        std::fill(v->begin(), v->end(), std::nanf(""));
      }
      for (std::vector<float>& leaf : t.leaf_scratch)
        std::fill(leaf.begin(), leaf.end(), std::nanf(""));
    };
    for (std::vector<float>* v : {&b.x, &b.g, &b.v, &b.y, &b.y_rows}) {
      std::fill(v->begin(), v->end(), std::nanf(""));
    }
    poison_scratch();
    const std::vector<float> after = step(used, "in", "d_out");
    rows[1] = used.saved.plan.num_recv;
    MoeHarness<float> fresh(dims, groups.ep_size, groups.ep.rank(), 9, V, N, 2);
    const std::vector<float> alone = step(fresh, "in", "d_out");
    ASSERT_EQ(after.size(), alone.size());
    EXPECT_EQ(std::memcmp(after.data(), alone.data(), after.size() * sizeof(float)), 0);
    MoeHarness<float> lent(dims, groups.ep_size, groups.ep.rank(), 9, V, N, 2);
    moe_saved_reserve(lent.saved, N, dims, groups.ep_size, lent.placement.max_local(), 2,
                      /*own_scratch=*/false);
    EXPECT_THROW(step(lent, "in", "d_out"), std::invalid_argument);
    poison_scratch();
    std::swap(lent.saved.scratch, t);
    const std::vector<float> borrowed = step(lent, "in", "d_out");
    ASSERT_EQ(borrowed.size(), alone.size());
    EXPECT_EQ(std::memcmp(borrowed.data(), alone.data(), borrowed.size() * sizeof(float)), 0);
    // The case is exercised: some rank kept a different number of rows in the two steps.
    std::vector<int64_t> changed = {rows[0] != rows[1] ? 1 : 0};
    world.allreduce_sum(std::span<int64_t>(changed));
    EXPECT_GT(changed[0], 0) << "the two steps' routings kept the same rows everywhere";
  }
}

// Asked for them, the backward leaves each routed expert's sums of squares of its W2, W1 and W3
// gradients: sum_squares of exactly those matrices, bit for bit (0 for an expert without rows;
// the trainer adds them into the gradient norm in place of its own pass over the arena).
TEST(MoeGradSq, BackwardSumsOfSquaresAreThoseOfEachMatrix) {
  const Comm world = Comm::world();
  const int N = 12, V = 64;
  const MoeDims dims{16, 12, 12, 8, 3, ScoreFunc::kSqrtSoftplus, 1.5f, 10.0f};
  const ParallelGroups groups = parallel_groups_make(world, default_ep_size(world.size(), 8));
  EpExchange ex(groups.ep);
  const size_t first = static_cast<size_t>(world.rank()) * N, ND = static_cast<size_t>(N) * 16;
  const std::vector<float> in = testing_moe::global_normal<float>("in", first * 16 + ND, 1.0);
  const std::vector<float> d_out = testing_moe::global_normal<float>("d_out", first * 16 + ND, 1.0);
  MoeHarness<float> h(dims, groups.ep_size, groups.ep.rank(), 9, V, N);
  h.saved.weight_grads_final = true;
  std::vector<float> out(ND), d_in(ND, 0.0f);
  moe_forward(out.data(), h.saved, &in[first * 16], h.weights(),
              h.routing(RoutingMode::kTopK, nullptr, 0), dims, h.placement, ex, N);
  moe_backward(d_in.data(), h.grads(), &d_out[first * 16], h.saved, &in[first * 16], h.weights(),
               dims, ex);
  const int local = h.placement.num_local(groups.ep.rank());
  ASSERT_EQ(h.saved.weight_grad_sq.size(), 3 * static_cast<size_t>(local));
  const size_t DF = static_cast<size_t>(dims.D) * dims.F;
  int64_t with_rows = 0;
  for (int i = 0; i < local; ++i) {
    const std::span<const float> grads(h.expert_grads);
    const size_t at[3] = {h.off.w2, h.off.w1, h.off.w3};
    const bool rows = h.saved.plan.expert_offsets[i + 1] > h.saved.plan.expert_offsets[i];
    with_rows += rows;
    for (int m = 0; m < 3; ++m) {
      const double expect = sum_squares(grads.subspan(at[m] + i * DF, DF));
      EXPECT_EQ(h.saved.weight_grad_sq[3 * i + m], expect) << "expert " << i << " matrix " << m;
      if (rows) {
        EXPECT_GT(expect, 0.0);
      }
    }
  }
  std::vector<int64_t> any = {with_rows};  // some rank's experts got rows
  world.allreduce_sum(std::span<int64_t>(any));
  EXPECT_GT(any[0], 0);
}

// Promised final (weight_grads_final), the backward writes every routed expert's gradients over
// whatever the arena held: NaN-filled, the arena ends bit for bit as a zeroed one does without the
// promise, an expert without rows at +0. Alone with 2 tokens (6 assignments over 8 experts: some
// get none), in float and double, and in the world's EP group.
template <class T> void expect_final_grads_written(bool alone) {
  const Comm world = Comm::world();
  const Comm self = Comm::self();
  const MoeDims dims{16, 12, 12, 8, 3, ScoreFunc::kSqrtSoftplus, 1.5f, 10.0f};
  const ParallelGroups groups = parallel_groups_make(world, default_ep_size(world.size(), 8));
  EpExchange ex(alone ? self : groups.ep);
  const int N = alone ? 2 : 12, V = 64, ep_size = alone ? 1 : groups.ep_size;
  const int ep_rank = alone ? 0 : groups.ep.rank();
  const size_t first = alone ? 0 : static_cast<size_t>(world.rank()) * N;
  const size_t ND = static_cast<size_t>(N) * 16;
  const std::vector<T> in = testing_moe::global_normal<T>("in", first * 16 + ND, 1.0);
  const std::vector<T> d_out = testing_moe::global_normal<T>("d_out", first * 16 + ND, 1.0);
  auto run = [&](bool final_grads) {
    MoeHarness<T> h(dims, ep_size, ep_rank, 9, V, N);
    h.saved.weight_grads_final = final_grads;
    std::fill(h.expert_grads.begin(), h.expert_grads.end(),
              final_grads ? std::numeric_limits<T>::quiet_NaN() : T(0));
    std::vector<T> out(ND), d_in(ND, T(0));
    moe_forward(out.data(), h.saved, &in[first * 16], h.weights(),
                h.routing(RoutingMode::kTopK, nullptr, 0), dims, h.placement, ex, N);
    moe_backward(d_in.data(), h.grads(), &d_out[first * 16], h.saved, &in[first * 16], h.weights(),
                 dims, ex);
    int empty = 0;
    for (size_t i = 0; i + 1 < h.saved.plan.expert_offsets.size(); ++i) {
      empty += h.saved.plan.expert_offsets[i + 1] == h.saved.plan.expert_offsets[i];
    }
    std::vector<T> all = d_in;
    all.insert(all.end(), h.expert_grads.begin(), h.expert_grads.end());
    return std::pair{all, empty};
  };
  const auto [added, empty] = run(false);
  const auto [written, empty_too] = run(true);
  ASSERT_EQ(added.size(), written.size());
  EXPECT_EQ(std::memcmp(added.data(), written.data(), added.size() * sizeof(T)), 0)
      << (alone ? "alone" : "in the world's EP group");
  EXPECT_EQ(empty, empty_too);
  if (alone) {
    EXPECT_GT(empty, 0) << "every expert got rows: the case of none is not exercised";
  }
}

TEST(MoeGradsFinal, WrittenOverWhateverTheArenaHeld) {
  expect_final_grads_written<float>(true);
  expect_final_grads_written<double>(true);
  expect_final_grads_written<float>(false);
}

// Output gradients so small that the experts' backward GEMMs underflow to zeros of either sign:
// every output of the backward, signs of zeros included, keeps the bits it had when each GEMM
// added into buffers of +0 (pinned: computed with that code). The layer now writes the first
// GEMM of d_h and of d_x without zeroing and reads them as x + 0, which is that sum.
TEST(MoeUnderflow, ZeroSignsOfUnderflowingGradientsKeepTheirBits) {
  const Comm self = Comm::self();
  EpExchange ex(self);
  const int N = 32, V = 16;
  const MoeDims dims{16, 8, 8, 4, 2, ScoreFunc::kSqrtSoftplus, 1.5f, 10.0f};
  MoeHarness<float> h(dims, 1, 0, /*seed=*/11, V, N);
  const std::vector<float> in = testing_moe::global_normal<float>("in", N * dims.D, 1.0);
  std::vector<float> d_out = testing_moe::global_normal<float>("d_out", N * dims.D, 1.0);
  // Every other token's gradient about 1e-44 to 1e-37: products with weights of 0.02 round to
  // ±0 in d_h (the smaller), or later in d_x (the larger, whose d_h is a tiny subnormal).
  const float scales[] = {1e-44f, 1e-43f, 1e-42f, 1e-41f, 1e-40f, 1e-39f, 1e-38f, 1e-37f};
  for (int t = 0; t < N; t += 2) {
    for (int c = 0; c < dims.D; ++c) d_out[t * dims.D + c] *= scales[(t / 2) % 8];
  }
  std::vector<float> out(N * dims.D), d_in(N * dims.D, 0.0f);
  // FNV-1a over the bits of d_in and the gradients; and how many of them are zeros.
  auto hash_of = [&](const MoeHarness<float>& of) {
    uint64_t hash = 1469598103934665603ull;
    size_t zeros = 0;
    for (const std::vector<float>* v : {&std::as_const(d_in), &of.dense_grads, &of.expert_grads}) {
      for (float x : *v) {
        const uint32_t b = std::bit_cast<uint32_t>(x);
        for (int i = 0; i < 4; ++i) hash = (hash ^ ((b >> (8 * i)) & 0xffu)) * 1099511628211ull;
        zeros += x == 0.0f;
      }
    }
    return std::pair{hash, zeros};
  };
  moe_forward(out.data(), h.saved, in.data(), h.weights(),
              h.routing(RoutingMode::kTopK, nullptr, 0), dims, h.placement, ex, N);
  moe_backward(d_in.data(), h.grads(), d_out.data(), h.saved, in.data(), h.weights(), dims, ex);
  const auto [hash, zeros] = hash_of(h);
  EXPECT_EQ(hash, 0x8b3e795a3aad22aeull);
  EXPECT_GT(zeros, 0u);  // the outputs hold zeros whose signs the hash pins
  {
    // The same bits when the expert gradients are written over a NaN arena (weight_grads_final)
    // instead of added to zeros: a leaf tree's −0 sum lands as +0 either way.
    MoeHarness<float> written(dims, 1, 0, /*seed=*/11, V, N);
    written.saved.weight_grads_final = true;
    std::fill(written.expert_grads.begin(), written.expert_grads.end(), std::nanf(""));
    std::fill(d_in.begin(), d_in.end(), 0.0f);
    moe_forward(out.data(), written.saved, in.data(), written.weights(),
                written.routing(RoutingMode::kTopK, nullptr, 0), dims, written.placement, ex, N);
    moe_backward(d_in.data(), written.grads(), d_out.data(), written.saved, in.data(),
                 written.weights(), dims, ex);
    EXPECT_EQ(hash_of(written).first, 0x8b3e795a3aad22aeull);
  }
  // The case is exercised: the experts' raw d_h (which swiglu_backward overwrote with h: made
  // again here, expert by expert, as the backward's first GEMM makes it) and d_x (which an EP group
  // of one rank scatters into d_in where it lies) hold zeros of both signs.
  const MoeScratch<float>& t = h.saved.scratch;
  std::vector<float> d_h(t.h.size());
  const std::vector<int>& offsets = h.saved.plan.expert_offsets;
  const MoeWeights<float> w = h.weights();
  for (size_t i = 0; i + 1 < offsets.size(); ++i) {
    const size_t row = offsets[i], DF = size_t(dims.D) * dims.F;
    linear_backward_input_overwrite(&d_h[row * dims.F], &t.d_y[row * dims.D], w.w2 + i * DF,
                                    offsets[i + 1] - offsets[i], dims.F, dims.D);
  }
  for (const std::vector<float>* v : {&std::as_const(d_h), &t.d_x}) {
    const auto negative = std::count_if(
        v->begin(), v->end(), [](float x) { return std::bit_cast<uint32_t>(x) == 0x80000000u; });
    EXPECT_GT(negative, 0) << "no −0 to read as +0";
  }
}

// Round-robin over all ranks: T·K mod E = 0 gives exactly equal global loads.
TEST(MoeRouting, RoundRobinLoadsExactlyEqual) {
  const Comm world = Comm::world();
  const int W = world.size(), N = 16;
  const MoeDims dims{8, 4, 0, 8, 3, ScoreFunc::kSqrtSoftplus, 1.0f, 0.0f};
  const ParallelGroups groups = parallel_groups_make(world, default_ep_size(W, 8));
  EpExchange ex(groups.ep);
  MoeHarness<float> h(dims, groups.ep_size, groups.ep.rank(), 5, 16, N);
  const std::vector<float> in = testing_moe::global_normal<float>("in", N * dims.D, 1.0);
  std::vector<float> out(N * dims.D);
  moe_forward(out.data(), h.saved, in.data(), h.weights(),
              h.routing(RoutingMode::kRoundRobin, nullptr, int64_t{world.rank()} * N), dims,
              h.placement, ex, N);
  std::vector<int64_t> load = h.saved.plan.expert_counts;
  world.allreduce_sum(std::span<int64_t>(load));
  ASSERT_EQ((W * N * dims.K) % dims.E, 0);
  for (int e = 0; e < dims.E; ++e) EXPECT_EQ(load[e], W * N * dims.K / dims.E) << "expert " << e;
}

// The shared expert and the weight gradients go sequence by sequence: tokens that are not whole
// sequences, or more sequences than reserved, are refused before any work (no rank waits: all see
// the same sizes), rather than leaving the tail rows of the output uncomputed.
TEST(MoeSequences, PartialSequencesAndUnreservedSequencesAreRefused) {
  const Comm self = Comm::self();
  EpExchange ex(self);
  const int N = 12, V = 16;
  const MoeDims dims{8, 4, 4, 4, 2, ScoreFunc::kSqrtSoftplus, 1.0f, 0.0f};
  MoeHarness<float> h(dims, 1, 0, 3, V, N);  // reserved for one sequence
  const std::vector<float> in = testing_moe::global_normal<float>("in", N * dims.D, 1.0);
  std::vector<float> out(N * dims.D);
  MoeRouting routing = h.routing(RoutingMode::kRoundRobin, nullptr, 0);
  for (int seq_len : {-1, 5, 8, 24}) {
    routing.seq_len = seq_len;
    EXPECT_THROW(
        moe_forward(out.data(), h.saved, in.data(), h.weights(), routing, dims, h.placement, ex, N),
        std::invalid_argument)
        << "seq_len " << seq_len;
  }
  routing.seq_len = 4;  // three sequences, one reserved
  EXPECT_THROW(
      moe_forward(out.data(), h.saved, in.data(), h.weights(), routing, dims, h.placement, ex, N),
      std::invalid_argument);
  moe_saved_reserve(h.saved, N, dims, 1, h.placement.max_local(), 3);
  for (int seq_len : {0, 4, 12}) {
    routing.seq_len = seq_len;
    std::vector<float> d_in(N * dims.D, 0.0f);
    EXPECT_NO_THROW(moe_forward(out.data(), h.saved, in.data(), h.weights(), routing, dims,
                                h.placement, ex, N));
    EXPECT_NO_THROW(
        moe_backward(d_in.data(), h.grads(), in.data(), h.saved, in.data(), h.weights(), dims, ex));
  }
}

}  // namespace
}  // namespace moe
