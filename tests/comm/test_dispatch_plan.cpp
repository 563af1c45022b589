// The dispatch plan as a pure function, with P simulated ranks in one process: counts, send order,
// receive layout, and a simulated all-to-all that moves identity-coded rows there and back.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "comm/dispatch_plan.hpp"
#include "routing_fixtures.hpp"

namespace moe {
namespace {

using testing_fixtures::kCodeWidth;

TEST(ExpertPlacement, ContiguousBlocksAsEqualAsPossible) {
  const ExpertPlacement p{8, 3};  // 3, 3, 2
  EXPECT_EQ(p.num_local(0), 3);
  EXPECT_EQ(p.num_local(1), 3);
  EXPECT_EQ(p.num_local(2), 2);
  EXPECT_EQ(p.expert(0, 0), 0);
  EXPECT_EQ(p.expert(1, 0), 3);
  EXPECT_EQ(p.expert(2, 1), 7);
  EXPECT_TRUE(p.is_contiguous());
  EXPECT_EQ(p.max_local(), 3);
  const int owners[8] = {0, 0, 0, 1, 1, 1, 2, 2};
  for (int e = 0; e < 8; ++e) EXPECT_EQ(p.owner(e), owners[e]) << "expert " << e;

  for (int E = 1; E <= 17; ++E) {
    for (int P = 1; P <= E; ++P) {
      const ExpertPlacement pl{E, P};
      int total = 0;
      for (int r = 0; r < P; ++r) {
        EXPECT_EQ(pl.expert(r, 0), total);
        EXPECT_GE(pl.num_local(r), E / P);
        EXPECT_LE(pl.num_local(r), E / P + 1);
        for (int i = 0; i < pl.num_local(r); ++i) {
          EXPECT_EQ(pl.owner(total + i), r);
          EXPECT_EQ(pl.local_index(total + i), i);
          EXPECT_EQ(pl.replica_slot(total + i, 0), total + i);
          EXPECT_EQ(pl.num_replicas(total + i), 1);
        }
        total += pl.num_local(r);
      }
      EXPECT_EQ(total, E);
    }
  }
}

// Any assignment: each rank's experts in ascending id whatever order the lists give, slots
// rank-major, uneven counts.
TEST(ExpertPlacement, AnyAssignment) {
  const ExpertPlacement p(6, {{5, 0}, {3}, {4, 1, 2}});
  EXPECT_EQ(p.ep_size, 3);
  EXPECT_EQ(p.num_local(0), 2);
  EXPECT_EQ(p.num_local(1), 1);
  EXPECT_EQ(p.num_local(2), 3);
  EXPECT_EQ(p.max_local(), 3);
  EXPECT_FALSE(p.is_contiguous());
  const int owners[6] = {0, 2, 2, 1, 2, 0}, slots[6] = {0, 3, 4, 2, 5, 1};
  for (int e = 0; e < 6; ++e) {
    EXPECT_EQ(p.owner(e), owners[e]) << "expert " << e;
    EXPECT_EQ(p.replica_slot(e, 0), slots[e]) << "expert " << e;
    EXPECT_EQ(p.expert_at_slot(slots[e]), e);
    EXPECT_EQ(p.expert(p.owner(e), p.local_index(e)), e);
  }
  EXPECT_EQ(p.expert(0, 0), 0);
  EXPECT_EQ(p.expert(0, 1), 5);
  // The contiguous layout written as lists is the contiguous layout.
  EXPECT_EQ(ExpertPlacement(5, {{0, 1}, {2, 3}, {4}}), ExpertPlacement(5, 3));
  EXPECT_TRUE(ExpertPlacement(5, {{1, 0}, {3, 2}, {4}}).is_contiguous());
}

// Replicas: an expert on several ranks, its instances numbered in rank order, each taking a
// contiguous chunk of the EP group's sequences.
TEST(ExpertPlacement, Replicas) {
  const ExpertPlacement p(4, {{0, 1, 3}, {1, 2}, {3, 1}});
  EXPECT_TRUE(p.has_replicas());
  EXPECT_EQ(p.num_instances(), 7);
  EXPECT_EQ(p.max_local(), 3);
  EXPECT_EQ(p.num_replicas(0), 1);
  EXPECT_EQ(p.num_replicas(1), 3);
  EXPECT_EQ(p.num_replicas(3), 2);
  // Slots: rank 0 {0, 1, 3} = 0..2, rank 1 {1, 2} = 3..4, rank 2 {1, 3} = 5..6.
  EXPECT_EQ(p.replica_slot(1, 0), 1);
  EXPECT_EQ(p.replica_slot(1, 1), 3);
  EXPECT_EQ(p.replica_slot(1, 2), 5);
  EXPECT_EQ(p.replica_slot(3, 1), 6);
  for (int slot = 0; slot < p.num_instances(); ++slot) {
    const int e = p.expert_at_slot(slot);
    EXPECT_EQ(p.replica_slot(e, p.replica_of_slot(slot)), slot);
    EXPECT_EQ(p.expert(p.rank_of_slot(slot), p.local_of_slot(slot)), e);
  }
  EXPECT_EQ(p.owner(3), 0);  // the first holder
  EXPECT_EQ(p.local_index(3), 2);
  // The chunks tile the sequences in order, and replica_for agrees with them.
  for (int k = 1; k <= 9; ++k) {
    for (int n = 1; n <= 12; ++n) {
      int next = 0;
      for (int j = 0; j < k; ++j) {
        const auto [lo, hi] = ExpertPlacement::replica_chunk(j, k, n);
        EXPECT_EQ(lo, next) << j << " of " << k << " over " << n;
        for (int seq = lo; seq < hi; ++seq) {
          EXPECT_EQ(static_cast<int>(static_cast<int64_t>(seq) * k / n), j);
        }
        next = hi;
      }
      EXPECT_EQ(next, n);
    }
  }
  // 3 replicas over 8 sequences: [0, 3), [3, 6), [6, 8).
  EXPECT_EQ(p.replica_for(1, 2, 8), 0);
  EXPECT_EQ(p.replica_for(1, 3, 8), 1);
  EXPECT_EQ(p.replica_for(1, 7, 8), 2);
}

TEST(ExpertPlacement, RefusesBadAssignments) {
  const auto refused = [](int E, const std::vector<std::vector<int>>& ranks, const char* what) {
    try {
      const ExpertPlacement p(E, ranks);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  refused(4, {{0, 1}, {}, {2, 3}}, "rank 1 holds no expert");
  refused(4, {{0, 1}, {2, 4}}, "expert 4 outside [0, 4)");
  refused(4, {{0, 1}, {2, -1}}, "expert -1 outside [0, 4)");
  refused(4, {{0, 1, 1}, {2, 3}}, "rank 0 lists expert 1 twice");
  refused(4, {{0, 1}, {2}}, "expert 3 is on no rank");
  EXPECT_THROW(ExpertPlacement(3, 4), std::invalid_argument);
  EXPECT_THROW(ExpertPlacement(3, 0), std::invalid_argument);
}

TEST(DispatchPlan, SendSideOnHandExample) {
  // T=3, K=2, E=4 on P=2: rank 0 owns {0,1}, rank 1 owns {2,3}.
  const std::vector<int32_t> idx = {3, 0,   // token 0
                                    1, 3,   // token 1
                                    0, 2};  // token 2
  DispatchPlan plan;
  dispatch_plan_build(plan, idx, 3, 2, ExpertPlacement{4, 2}, 0);
  // Sorted by expert, then assignment: e0: a1, a4; e1: a2; e2: a5; e3: a0, a3.
  EXPECT_EQ(plan.send_assignment, (std::vector<int32_t>{1, 4, 2, 5, 0, 3}));
  for (int p = 0; p < 6; ++p) EXPECT_EQ(plan.send_position[plan.send_assignment[p]], p);
  EXPECT_EQ(plan.send_counts, (std::vector<int>{3, 3}));
  EXPECT_EQ(plan.send_offsets, (std::vector<int>{0, 3}));
  EXPECT_EQ(plan.expert_counts, (std::vector<int64_t>{2, 1, 1, 2}));
  EXPECT_EQ(plan.count_message, (std::vector<int>{2, 1, 1, 2}));
}

// The same routing under a permuted, uneven placement: rank 0 holds {3}, rank 1 holds {0, 1, 2}.
// The send order follows the slots: destination rank, then its local experts by id.
TEST(DispatchPlan, SendSideFollowsThePlacement) {
  const std::vector<int32_t> idx = {3, 0, 1, 3, 0, 2};
  DispatchPlan plan;
  const ExpertPlacement placement(4, {{3}, {2, 1, 0}});
  dispatch_plan_build(plan, idx, 3, 2, placement, 0);
  // e3: a0, a3 (to rank 0); then rank 1's e0: a1, a4; e1: a2; e2: a5.
  EXPECT_EQ(plan.send_assignment, (std::vector<int32_t>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(plan.send_counts, (std::vector<int>{2, 4}));
  EXPECT_EQ(plan.send_offsets, (std::vector<int>{0, 2}));
  EXPECT_EQ(plan.expert_counts, (std::vector<int64_t>{2, 1, 1, 2}));  // by global id
  // [P, max_local = 3]: rank 0's one expert, then rank 1's three.
  EXPECT_EQ(plan.count_message, (std::vector<int>{2, 0, 0, 2, 1, 1}));
  EXPECT_EQ(plan.send_block_offsets, (std::vector<int>{0, 0, 0, 2, 4, 5}));
}

// Replicas by sequence: T = 4 tokens in 2 sequences of 2 on EP rank 1 of 3 (the group's
// sequences 2 and 3 of 6). Expert 0 on ranks 0 and 1: replica 1 takes sequences [3, 6), so
// sequence 2 goes to rank 0 and sequence 3 to rank 1. Expert 1 on all three ranks: [0, 2),
// [2, 4), [4, 6), both sequences to rank 1. Expert 2 only on rank 1.
TEST(DispatchPlan, ReplicasTakeTheRowsOfTheirSequences) {
  const ExpertPlacement placement(3, {{0, 1}, {0, 1, 2}, {1}});
  const std::vector<int32_t> idx = {0, 1,   // token 0 (sequence 2)
                                    1, 2,   // token 1 (sequence 2)
                                    1, 0,   // token 2 (sequence 3)
                                    2, 1};  // token 3 (sequence 3)
  DispatchPlan plan;
  dispatch_plan_build(plan, idx, 4, 2, placement, /*ep_rank=*/1, /*seq_len=*/2);
  // Slots: rank 0 {0, 1} = 0, 1; rank 1 {0, 1, 2} = 2, 3, 4; rank 2 {1} = 5.
  EXPECT_EQ(plan.send_slot, (std::vector<int32_t>{0, 3, 3, 4, 3, 2, 4, 3}));
  // Rank 0: e0 a0; rank 1: e0 a5; e1 a1, a2, a4, a7; e2 a3, a6.
  EXPECT_EQ(plan.send_assignment, (std::vector<int32_t>{0, 5, 1, 2, 4, 7, 3, 6}));
  EXPECT_EQ(plan.send_counts, (std::vector<int>{1, 7, 0}));
  EXPECT_EQ(plan.expert_counts, (std::vector<int64_t>{2, 4, 2}));  // the loads, by expert
  EXPECT_EQ(plan.count_message, (std::vector<int>{1, 0, 0, 1, 4, 2, 0, 0, 0}));
  // Host traffic counts each assignment at the replica it goes to: rank 0 on another host
  // receives token 0 only.
  EXPECT_EQ(dispatch_plan_cross_host_tokens(plan, std::vector<int>{1, 0, 0}), 1);
  EXPECT_THROW(dispatch_plan_build(plan, idx, 4, 2, placement, 1, /*seq_len=*/3),
               std::invalid_argument);
}

// A token capacity's drops (−1) are not sent: no send position, not counted, the rest in order.
TEST(DispatchPlan, DroppedAssignmentsAreNotSent) {
  const std::vector<int32_t> idx = {3,  -1,  // token 0: its second slot dropped
                                    1,  3,   // token 1
                                    -1, 2};  // token 2: its first slot dropped
  DispatchPlan plan;
  dispatch_plan_build(plan, idx, 3, 2, ExpertPlacement{4, 2}, 0);
  EXPECT_EQ(plan.num_send(), 4);
  EXPECT_EQ(plan.send_assignment, (std::vector<int32_t>{2, 5, 0, 3}));
  EXPECT_EQ(plan.send_position, (std::vector<int32_t>{2, -1, 0, 3, -1, 1}));
  EXPECT_EQ(plan.expert_counts, (std::vector<int64_t>{0, 1, 1, 2}));
  EXPECT_EQ(plan.send_counts, (std::vector<int>{1, 3}));
  // Only the sent copies cross hosts: with rank 1 on another host, tokens 0, 1, 2 send one each.
  EXPECT_EQ(dispatch_cross_host_tokens(idx, 2, ExpertPlacement{4, 2}, 0, std::vector<int>{0, 1}),
            3);
  const std::vector<int32_t> bad = {3, -2};
  EXPECT_THROW(dispatch_plan_build(plan, bad, 1, 2, ExpertPlacement{4, 2}, 0),
               std::invalid_argument);
}

TEST(DispatchPlan, RejectsBadRouting) {
  DispatchPlan plan;
  const std::vector<int32_t> bad = {0, 4};
  EXPECT_THROW(dispatch_plan_build(plan, bad, 1, 2, ExpertPlacement{4, 2}, 0),
               std::invalid_argument);
  const std::vector<int32_t> ok = {0, 1};
  EXPECT_THROW(dispatch_plan_build(plan, ok, 1, 2, ExpertPlacement{2, 3}, 0),
               std::invalid_argument);
  EXPECT_THROW(dispatch_plan_build(plan, ok, 2, 2, ExpertPlacement{4, 2}, 0),
               std::invalid_argument);
}

// Simulates the whole exchange over P ranks in one process and checks provenance and order.
void check_simulated_exchange(const ExpertPlacement& pl, int K) {
  const int E = pl.num_experts, P = pl.ep_size;
  std::vector<std::vector<int32_t>> routing(P);
  std::vector<DispatchPlan> plans(P);
  for (int s = 0; s < P; ++s) {
    const int T = testing_fixtures::tokens_of_rank(s);
    routing[s] = testing_fixtures::make_routing(11, s, T, K, E);
    dispatch_plan_build(plans[s], routing[s], T, K, pl, s);
  }
  // Count all-to-all.
  const int ml = pl.max_local();
  for (int d = 0; d < P; ++d) {
    std::vector<int> inbox(static_cast<size_t>(P) * ml);
    for (int s = 0; s < P; ++s) {
      for (int i = 0; i < ml; ++i) inbox[s * ml + i] = plans[s].count_message[d * ml + i];
    }
    dispatch_plan_set_recv(plans[d], inbox);
  }
  // Identity-coded send rows.
  std::vector<std::vector<float>> send(P);
  for (int s = 0; s < P; ++s) {
    const DispatchPlan& pl_s = plans[s];
    send[s].resize(static_cast<size_t>(pl_s.num_send()) * kCodeWidth);
    for (int p = 0; p < pl_s.num_send(); ++p) {
      const int a = pl_s.send_assignment[p];
      testing_fixtures::encode_row(&send[s][p * kCodeWidth], s, a / K, a % K, routing[s][a]);
    }
  }
  // Each block (source s's rows for expert i of owner d) from its send position to its
  // expert-major position, as the exchange moves it.
  std::vector<std::vector<float>> expert_rows(P);
  for (int d = 0; d < P; ++d) {
    const DispatchPlan& pd = plans[d];
    expert_rows[d].assign(static_cast<size_t>(pd.num_recv) * kCodeWidth, -1.0f);
    for (int s = 0; s < P; ++s) {
      EXPECT_EQ(pd.recv_counts[s], plans[s].send_counts[d]);
      for (int i = 0; i < pd.num_local_experts(); ++i) {
        const int b_send = d * ml + i, b_recv = s * ml + i;
        const int rows = plans[s].count_message[b_send];
        ASSERT_EQ(pd.recv_counts_by_source[b_recv], rows);
        ASSERT_LE(pd.recv_block_offsets[b_recv] + rows, pd.num_recv);
        if (rows == 0) continue;  // its offset may be one past the end
        std::copy_n(&send[s][plans[s].send_block_offsets[b_send] * kCodeWidth], rows * kCodeWidth,
                    &expert_rows[d][pd.recv_block_offsets[b_recv] * kCodeWidth]);
      }
    }
    // Every row is for this rank's expert of its range, ordered by (expert, source, token, slot).
    for (int i = 0; i < pd.num_local_experts(); ++i) {
      const int e = pl.expert(d, i);
      std::tuple<int, int, int> prev{-1, -1, -1};
      for (int r = pd.expert_offsets[i]; r < pd.expert_offsets[i + 1]; ++r) {
        const float* row = &expert_rows[d][r * kCodeWidth];
        EXPECT_EQ(static_cast<int>(row[3]), e);
        const std::tuple<int, int, int> key{static_cast<int>(row[0]), static_cast<int>(row[1]),
                                            static_cast<int>(row[2])};
        EXPECT_LT(prev, key) << "expert " << e << " row " << r;
        prev = key;
        const int s = std::get<0>(key), t = std::get<1>(key), j = std::get<2>(key);
        EXPECT_EQ(routing[s][t * K + j], e);
      }
      // Exactly the rows of expert e for this replica arrived: all of them without replicas, and
      // with replicas those of the sources whose sequence (one a rank) is in its chunk.
      const int slot = pl.slot_of(d, i);
      int64_t expected = 0;
      for (int s = 0; s < P; ++s) {
        if (pl.replica_for(e, s, P) == pl.replica_of_slot(slot)) {
          expected += plans[s].expert_counts[e];
        }
      }
      EXPECT_EQ(pd.expert_offsets[i + 1] - pd.expert_offsets[i], expected);
    }
  }
  // Combine: the inverse path returns each row to its source's send position.
  for (int s = 0; s < P; ++s) {
    std::vector<float> back(send[s].size(), -1.0f);
    for (int d = 0; d < P; ++d) {
      const DispatchPlan& pd = plans[d];
      for (int i = 0; i < pd.num_local_experts(); ++i) {
        const int b_send = d * ml + i, b_recv = s * ml + i;
        if (pd.recv_counts_by_source[b_recv] == 0) continue;
        std::copy_n(&expert_rows[d][pd.recv_block_offsets[b_recv] * kCodeWidth],
                    pd.recv_counts_by_source[b_recv] * kCodeWidth,
                    &back[plans[s].send_block_offsets[b_send] * kCodeWidth]);
      }
    }
    EXPECT_EQ(back, send[s]) << "source " << s;
  }
}

TEST(DispatchPlan, SimulatedExchangeEvenSplit) {
  check_simulated_exchange(ExpertPlacement(8, 4), 3);
}
TEST(DispatchPlan, SimulatedExchangeUnevenSplit) {
  check_simulated_exchange(ExpertPlacement(8, 3), 3);
}
TEST(DispatchPlan, SimulatedExchangeOneRank) {
  check_simulated_exchange(ExpertPlacement(8, 1), 3);
}
TEST(DispatchPlan, SimulatedExchangeOneExpertPerRank) {
  check_simulated_exchange(ExpertPlacement(8, 8), 2);
}
TEST(DispatchPlan, SimulatedExchangeManyExperts) {
  check_simulated_exchange(ExpertPlacement(13, 5), 4);
}
TEST(DispatchPlan, SimulatedExchangePermutedPlacement) {
  check_simulated_exchange(ExpertPlacement(8, {{6, 1}, {0, 7}, {3, 5}, {2, 4}}), 3);
}
TEST(DispatchPlan, SimulatedExchangeReplicatedPlacement) {
  check_simulated_exchange(ExpertPlacement(6, {{0, 5, 1}, {1, 2}, {3, 1, 0}, {4, 1}}), 3);
}
TEST(DispatchPlan, SimulatedExchangeUnevenPlacement) {
  check_simulated_exchange(ExpertPlacement(13, {{12}, {0, 5, 9, 3, 11, 1}, {2, 4}, {6, 7, 8, 10}}),
                           4);
}

}  // namespace
}  // namespace moe
