// Token exchange over real MPI ranks with identity-coded rows: each receiver checks provenance and
// order exactly, and dispatch followed by combine gives back exactly the weighted sum.
// Runs every EP group size P that divides the world, so 3 ranks cover E=8 split 3/3/2 and 4 ranks
// cover P=2 (two EP groups, each a full copy of the experts).
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <tuple>
#include <vector>

#include "comm/ep_exchange.hpp"
#include "routing_fixtures.hpp"

namespace moe {
namespace {

using testing_fixtures::kCodeWidth;

constexpr int kExperts = 8;
// The exchange's forms: pairs as one message (the default, for rows this small), every block a
// message of its own (0), and a mix: pairs of up to 9 rows whole, larger ones block by block.
constexpr size_t kWholeBytes[] = {EpExchange::kWholeMessageBytes, 0,
                                  10 * kCodeWidth * sizeof(float)};

// The skewed routing of world rank `rank`, recomputable on any rank.
std::vector<int32_t> skewed_routing(int rank, int K, uint32_t seed) {
  return testing_fixtures::make_routing(seed, rank, testing_fixtures::tokens_of_rank(rank), K,
                                        kExperts);
}

// Every token of every rank on experts first, first + 1, ... (mod E): one or a few owners receive
// everything, the other ranks nothing, and most blocks are empty.
std::vector<int32_t> concentrated_routing(int rank, int K, int first) {
  std::vector<int32_t> idx(static_cast<size_t>(testing_fixtures::tokens_of_rank(rank)) * K);
  for (size_t a = 0; a < idx.size(); ++a) idx[a] = static_cast<int32_t>((first + a % K) % kExperts);
  return idx;
}

// One dispatch and combine on EP groups of size P, checked exactly. `route(world_rank)` gives a
// rank's routing [T, K]. With `begin_end`, dispatch goes through dispatch_begin, a rank-dependent
// pause (other ranks run ahead into the next exchange), then dispatch_end.
template <class Route>
void check_exchange(int P, int K, Route route, size_t whole_bytes, EpExchange* reuse = nullptr,
                    bool begin_end = false) {
  const Comm world = Comm::world();
  const ParallelGroups groups = parallel_groups_make(world, P);
  const ExpertPlacement placement{kExperts, P};
  const int me = world.rank(), group_base = (me / P) * P, ep_rank = groups.ep.rank();
  // Routing of every member of my EP group, recomputable anywhere (keyed on the world rank).
  std::vector<std::vector<int32_t>> routing(P);
  for (int s = 0; s < P; ++s) routing[s] = route(group_base + s);
  const int T = testing_fixtures::tokens_of_rank(me);
  DispatchPlan plan;
  dispatch_plan_build(plan, routing[ep_rank], T, K, placement, ep_rank);
  EpExchange own(groups.ep, whole_bytes);
  EpExchange& ex = reuse != nullptr && reuse->comm().size() == P ? *reuse : own;
  ex.exchange_counts(plan);

  std::vector<float> send(static_cast<size_t>(T) * K * kCodeWidth);
  for (int p = 0; p < plan.num_send(); ++p) {
    const int a = plan.send_assignment[p];
    testing_fixtures::encode_row(&send[p * kCodeWidth], me, a / K, a % K, routing[ep_rank][a]);
  }
  std::vector<float> rows(static_cast<size_t>(plan.num_recv) * kCodeWidth, -9.0f);
  if (begin_end) {
    ex.dispatch_begin(std::span<float>(rows), std::span<const float>(send), plan, kCodeWidth);
    std::this_thread::sleep_for(std::chrono::milliseconds(3 * (me % 3)));
    ex.dispatch_end();
  } else {
    ex.dispatch(std::span<float>(rows), std::span<const float>(send), plan, kCodeWidth);
  }

  // Expected rows for each local expert: (source, token, slot) in exactly this order.
  for (int i = 0; i < plan.num_local_experts(); ++i) {
    const int e = placement.first_expert(ep_rank) + i;
    std::vector<std::tuple<int, int, int>> expected;
    for (int s = 0; s < P; ++s) {
      for (size_t a = 0; a < routing[s].size(); ++a) {
        if (routing[s][a] == e) expected.emplace_back(group_base + s, a / K, a % K);
      }
    }
    ASSERT_EQ(plan.expert_offsets[i + 1] - plan.expert_offsets[i],
              static_cast<int>(expected.size()));
    for (size_t n = 0; n < expected.size(); ++n) {
      const float* row = &rows[(plan.expert_offsets[i] + n) * kCodeWidth];
      const auto [s, t, j] = expected[n];
      EXPECT_EQ(row[0], s);
      EXPECT_EQ(row[1], t);
      EXPECT_EQ(row[2], j);
      EXPECT_EQ(row[3], e);
      EXPECT_EQ(row[4], t + 0.5f);
      EXPECT_EQ(row[5], -s);
    }
  }

  // The "expert" doubles each row and adds its id to column 5; combine must return exactly
  // 2·row + e to each send position, and the weighted sum per token is then exact in float
  // (weights are powers of two and all values small integers or halves).
  for (int r = 0; r < plan.num_recv; ++r) {
    float* row = &rows[r * kCodeWidth];
    for (int c = 0; c < kCodeWidth; ++c) row[c] *= 2.0f;
    row[5] += row[3] / 2.0f;
  }
  std::vector<float> back(send.size(), -7.0f);
  ex.combine(std::span<float>(back), std::span<const float>(rows), plan, kCodeWidth);
  std::vector<float> out(static_cast<size_t>(T) * kCodeWidth, 0.0f);
  for (int a = 0; a < T * K; ++a) {
    const float w = 1.0f / static_cast<float>(1 << (a % K));
    const float* y = &back[plan.send_position[a] * kCodeWidth];
    for (int c = 0; c < kCodeWidth; ++c) out[(a / K) * kCodeWidth + c] += w * y[c];
  }
  for (int t = 0; t < T; ++t) {
    float expect[kCodeWidth] = {0, 0, 0, 0, 0, 0};
    for (int j = 0; j < K; ++j) {
      const int e = routing[ep_rank][t * K + j];
      float code[kCodeWidth];
      testing_fixtures::encode_row(code, me, t, j, e);
      const float w = 1.0f / static_cast<float>(1 << j);
      for (int c = 0; c < kCodeWidth; ++c) expect[c] += w * (2.0f * code[c] + (c == 5 ? e : 0));
    }
    for (int c = 0; c < kCodeWidth; ++c) {
      EXPECT_EQ(out[t * kCodeWidth + c], expect[c]) << "token " << t << " column " << c;
    }
  }
}

TEST(EpExchange, ProvenanceAndWeightedSumForEveryEpSize) {
  const int W = Comm::world().size();
  for (int P = 1; P <= std::min(W, kExperts); ++P) {
    if (W % P != 0) continue;
    SCOPED_TRACE("P=" + std::to_string(P));
    for (size_t whole : kWholeBytes) {
      for (int K : {3, 1}) {
        check_exchange(
            P, K, [K](int r) { return skewed_routing(r, K, 5); }, whole);
      }
    }
  }
}

TEST(EpExchange, EmptyBlocksAndRanksThatReceiveNothing) {
  const int W = Comm::world().size();
  for (int P = 1; P <= std::min(W, kExperts); ++P) {
    if (W % P != 0) continue;
    SCOPED_TRACE("P=" + std::to_string(P));
    for (int K : {1, 2}) {
      for (int first : {0, kExperts - 1}) {
        for (size_t whole : kWholeBytes) {
          check_exchange(
              P, K, [=](int r) { return concentrated_routing(r, K, first); }, whole);
        }
      }
    }
  }
}

// Layer after layer through one EpExchange, as a training step does, with no barrier between and
// ranks pausing at different points: every block message must match the receive of its own
// exchange, never one of the exchange before or after.
TEST(EpExchange, BackToBackExchangesOfDifferentPlans) {
  const Comm world = Comm::world();
  const int P = world.size() <= kExperts ? world.size() : 1;
  const ParallelGroups groups = parallel_groups_make(world, P);
  for (size_t whole : kWholeBytes) {
    EpExchange ex(groups.ep, whole);
    for (int layer = 0; layer < 8; ++layer) {
      SCOPED_TRACE("whole-message bytes " + std::to_string(whole) + ", layer " +
                   std::to_string(layer));
      const int K = 1 + layer % 3;
      if (layer % 2 == 0) {
        check_exchange(
            P, K, [=](int r) { return skewed_routing(r, K, 11 + layer); }, whole, &ex, true);
      } else {
        check_exchange(
            P, K, [=](int r) { return concentrated_routing(r, K, layer); }, whole, &ex, true);
      }
    }
  }
}

TEST(EpExchange, RejectsCallsOutOfOrder) {
  const Comm world = Comm::world();
  const ParallelGroups groups = parallel_groups_make(world, 1);
  EpExchange ex(groups.ep);
  DispatchPlan plan;
  const std::vector<int32_t> idx = {0, 1};
  dispatch_plan_build(plan, idx, 2, 1, ExpertPlacement{kExperts, 1}, 0);
  std::vector<float> send(2 * kCodeWidth), rows(2 * kCodeWidth);
  for (size_t i = 0; i < send.size(); ++i) send[i] = static_cast<float>(i + 1);
  // Before exchange_counts the plan has no receive side.
  EXPECT_THROW(ex.dispatch(std::span<float>(rows), std::span<const float>(send), plan, kCodeWidth),
               std::logic_error);
  EXPECT_THROW(ex.dispatch_end(), std::logic_error);
  ex.exchange_counts(plan);
  ex.dispatch_begin(std::span<float>(rows), std::span<const float>(send), plan, kCodeWidth);
  EXPECT_THROW(
      ex.dispatch_begin(std::span<float>(rows), std::span<const float>(send), plan, kCodeWidth),
      std::logic_error);
  EXPECT_THROW(ex.combine(std::span<float>(send), std::span<const float>(rows), plan, kCodeWidth),
               std::logic_error);
  ex.dispatch_end();
  EXPECT_EQ(rows, send);  // one rank: its own blocks, copied in send order (= expert order)
  std::vector<float> short_rows(kCodeWidth);
  EXPECT_THROW(
      ex.dispatch(std::span<float>(short_rows), std::span<const float>(send), plan, kCodeWidth),
      std::invalid_argument);
}

TEST(EpExchange, RejectsPlanOfAnotherGroup) {
  const Comm world = Comm::world();
  if (world.size() < 2) GTEST_SKIP() << "needs two ranks";
  const ParallelGroups groups = parallel_groups_make(world, world.size());
  DispatchPlan plan;
  const std::vector<int32_t> idx = {0};
  dispatch_plan_build(plan, idx, 1, 1, ExpertPlacement{kExperts, 1}, 0);
  EpExchange ex(groups.ep);
  EXPECT_THROW(ex.exchange_counts(plan), std::invalid_argument);
}

}  // namespace
}  // namespace moe
