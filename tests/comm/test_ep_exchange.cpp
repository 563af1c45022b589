// Token exchange over real MPI ranks with identity-coded rows: each receiver checks provenance and
// order exactly, and dispatch followed by combine gives back exactly the weighted sum.
// Runs every EP group size P that divides the world, so 3 ranks cover E=8 split 3/3/2 and 4 ranks
// cover P=2 (two EP groups, each a full copy of the experts).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "comm/ep_exchange.hpp"
#include "mpi_test_ranks.hpp"
#include "routing_fixtures.hpp"

namespace moe {
namespace {

using testing_fixtures::kCodeWidth;

constexpr int kExperts = 8;
// The exchange's forms: counts before the rows or with them; pairs as one message (the default,
// for rows this small), every block a message of its own (0), and a mix (pairs of up to 9 rows
// whole, larger ones block by block).
struct Form {
  EpExchange::Counts counts;
  size_t whole_bytes;
};
constexpr size_t kMixBytes = 10 * kCodeWidth * sizeof(float);
constexpr Form kForms[] = {
    {EpExchange::Counts::kBeforeRows, EpExchange::kWholeMessageBytes},
    {EpExchange::Counts::kWithRows, EpExchange::kWholeMessageBytes},
    {EpExchange::Counts::kBeforeRows, 0},
    {EpExchange::Counts::kWithRows, 0},
    {EpExchange::Counts::kBeforeRows, kMixBytes},
    {EpExchange::Counts::kWithRows, kMixBytes},
};
std::string name(const Form& f) {
  return std::string(f.counts == EpExchange::Counts::kWithRows ? "counts with rows"
                                                               : "counts before rows") +
         ", whole-message bytes " + std::to_string(f.whole_bytes);
}

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
// pause (other ranks run ahead into the next exchange), then dispatch_end. With `alone` (EP
// groups of one rank), the first dispatch is dispatch_counted_alone, which moves no row: the
// rows where they lie, in send order, must then be the expert-major rows its plan describes.
template <class Route>
void check_exchange(int P, int K, Route route, const Form& form, EpExchange* reuse = nullptr,
                    bool begin_end = false, bool alone = false) {
  SCOPED_TRACE(name(form));
  const Comm world = Comm::world();
  // A reused exchange brings its EP communicator: no collective here to line the ranks up.
  std::optional<ParallelGroups> groups;
  if (reuse == nullptr) groups = parallel_groups_make(world, P);
  const Comm& ep = reuse != nullptr ? reuse->comm() : groups->ep;
  const ExpertPlacement placement{kExperts, P};
  const int me = world.rank(), group_base = (me / P) * P, ep_rank = ep.rank();
  // Routing of every member of my EP group, recomputable anywhere (keyed on the world rank).
  std::vector<std::vector<int32_t>> routing(P);
  for (int s = 0; s < P; ++s) routing[s] = route(group_base + s);
  const int T = testing_fixtures::tokens_of_rank(me);
  DispatchPlan plan;
  dispatch_plan_build(plan, routing[ep_rank], T, K, placement, ep_rank);
  std::optional<EpExchange> own;
  if (reuse == nullptr) own.emplace(ep, form.counts, form.whole_bytes);
  EpExchange& ex = reuse != nullptr ? *reuse : *own;
  std::vector<float> send(static_cast<size_t>(plan.num_send()) * kCodeWidth);
  for (int p = 0; p < plan.num_send(); ++p) {
    const int a = plan.send_assignment[p];
    testing_fixtures::encode_row(&send[p * kCodeWidth], me, a / K, a % K, routing[ep_rank][a]);
  }
  // The plan's first dispatch carries its counts (alone: sets its receive side).
  std::vector<float> rows;
  if (alone) {
    ex.dispatch_counted_alone(plan, kCodeWidth);
    rows = send;
  } else if (begin_end) {
    ex.dispatch_counted_begin(rows, std::span<const float>(send), plan, kCodeWidth);
    std::this_thread::sleep_for(std::chrono::milliseconds(3 * (me % 3)));
    ex.dispatch_end();
  } else {
    ex.dispatch_counted(rows, std::span<const float>(send), plan, kCodeWidth);
  }
  ASSERT_EQ(rows.size(), static_cast<size_t>(plan.num_recv) * kCodeWidth);

  // Expected rows for each local expert: (source, token, slot) in exactly this order.
  for (int i = 0; i < plan.num_local_experts(); ++i) {
    const int e = placement.expert(ep_rank, i);
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

  // A later dispatch of the same plan (the backward pass's) moves the same rows again.
  std::vector<float> again(rows.size(), -9.0f);
  ex.dispatch(std::span<float>(again), std::span<const float>(send), plan, kCodeWidth);
  EXPECT_EQ(again, rows);

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
    if (plan.send_position[a] < 0) continue;  // dropped (routed to −1): no row
    const float w = 1.0f / static_cast<float>(1 << (a % K));
    const float* y = &back[plan.send_position[a] * kCodeWidth];
    for (int c = 0; c < kCodeWidth; ++c) out[(a / K) * kCodeWidth + c] += w * y[c];
  }
  for (int t = 0; t < T; ++t) {
    float expect[kCodeWidth] = {0, 0, 0, 0, 0, 0};
    for (int j = 0; j < K; ++j) {
      const int e = routing[ep_rank][t * K + j];
      if (e < 0) continue;
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
    for (const Form& form : kForms) {
      for (int K : {3, 1}) {
        check_exchange(
            P, K, [K](int r) { return skewed_routing(r, K, 5); }, form);
      }
    }
  }
}

// An EP group of one rank moves no rows (the MoE layer's experts read them in place): the plan's
// receive side must make the send order the expert-major order, on skewed and concentrated
// routing and with dropped assignments (−1, as a token capacity leaves them). A larger group
// refuses: its rows must travel.
TEST(EpExchange, AloneTheSendOrderIsTheExpertOrder) {
  auto with_drops = [](int r, int K) {
    std::vector<int32_t> idx = skewed_routing(r, K, 9);
    for (size_t a = 0; a < idx.size(); a += 3) idx[a] = -1;
    return idx;
  };
  for (int K : {3, 1}) {
    check_exchange(
        1, K, [K](int r) { return skewed_routing(r, K, 7); }, kForms[0], nullptr, false, true);
    check_exchange(
        1, K, [K](int r) { return concentrated_routing(r, K, 2); }, kForms[0], nullptr, false,
        true);
    check_exchange(
        1, K, [&](int r) { return with_drops(r, K); }, kForms[0], nullptr, false, true);
  }
  const Comm world = Comm::world();
  if (world.size() < 2) return;
  const ParallelGroups groups = parallel_groups_make(world, world.size());
  EpExchange ex(groups.ep);
  DispatchPlan plan;
  const std::vector<int32_t> routing = skewed_routing(world.rank(), 2, 7);
  dispatch_plan_build(plan, routing, testing_fixtures::tokens_of_rank(world.rank()), 2,
                      ExpertPlacement{kExperts, world.size()}, groups.ep.rank());
  EXPECT_THROW(ex.dispatch_counted_alone(plan, kCodeWidth), std::logic_error);
}

TEST(EpExchange, EmptyBlocksAndRanksThatReceiveNothing) {
  const int W = Comm::world().size();
  for (int P = 1; P <= std::min(W, kExperts); ++P) {
    if (W % P != 0) continue;
    SCOPED_TRACE("P=" + std::to_string(P));
    for (int K : {1, 2}) {
      for (int first : {0, kExperts - 1}) {
        for (const Form& form : kForms) {
          check_exchange(
              P, K, [=](int r) { return concentrated_routing(r, K, first); }, form);
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
  for (const Form& form : kForms) {
    EpExchange ex(groups.ep, form.counts, form.whole_bytes);
    for (int layer = 0; layer < 8; ++layer) {
      SCOPED_TRACE(name(form) + ", layer " + std::to_string(layer));
      const int K = 1 + layer % 3;
      if (layer % 2 == 0) {
        check_exchange(
            P, K, [=](int r) { return skewed_routing(r, K, 11 + layer); }, form, &ex, true);
      } else {
        check_exchange(
            P, K, [=](int r) { return concentrated_routing(r, K, layer); }, form, &ex, true);
      }
    }
  }
}

TEST(EpExchange, CountsTravelWithTheRowsOnlyAcrossHosts) {
  using C = EpExchange::Counts;
  EXPECT_EQ(EpExchange::counts_for_hosts(std::vector<int>{}), C::kBeforeRows);
  EXPECT_EQ(EpExchange::counts_for_hosts(std::vector<int>{3, 3, 3}), C::kBeforeRows);
  EXPECT_EQ(EpExchange::counts_for_hosts(std::vector<int>{0, 0, 1, 1}), C::kWithRows);
  EXPECT_EQ(EpExchange::counts_for_hosts(std::vector<int>{1, 0}), C::kWithRows);
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
  // Before its first (counted) dispatch the plan has no receive side.
  EXPECT_THROW(ex.dispatch(std::span<float>(rows), std::span<const float>(send), plan, kCodeWidth),
               std::logic_error);
  EXPECT_THROW(ex.dispatch_end(), std::logic_error);
  ex.dispatch_counted(rows, std::span<const float>(send), plan, kCodeWidth);
  EXPECT_EQ(rows, send);
  std::fill(rows.begin(), rows.end(), 0.0f);
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

MOE_TEST_RANKS(EpExchange, RejectsPlanOfAnotherGroup, [](int w) { return w >= 2; });
TEST(EpExchange, RejectsPlanOfAnotherGroup) {
  const Comm world = Comm::world();
  ASSERT_GE(world.size(), 2) << "needs two ranks";
  const ParallelGroups groups = parallel_groups_make(world, world.size());
  DispatchPlan plan;
  const std::vector<int32_t> idx = {0};
  dispatch_plan_build(plan, idx, 1, 1, ExpertPlacement{kExperts, 1}, 0);
  EpExchange ex(groups.ep);
  std::vector<float> rows;
  const std::vector<float> send(kCodeWidth);
  EXPECT_THROW(ex.dispatch_counted(rows, std::span<const float>(send), plan, kCodeWidth),
               std::invalid_argument);
}

}  // namespace
}  // namespace moe
