// Host layouts as pure functions (hosts from keys and from blocks, the layout order, the banner's
// words) and the count of dispatched rows that cross hosts, from hand-made routings and host maps.
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "comm/dispatch_plan.hpp"
#include "comm/host_layout.hpp"

namespace moe {
namespace {

TEST(HostLayout, BlocksOfConsecutiveRanks) {
  const HostLayout h = host_layout_blocks(8, 4);
  EXPECT_EQ(h.host_of_rank, (std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1}));
  EXPECT_EQ(h.ranks_on_host, (std::vector<int>{4, 4}));
  EXPECT_EQ(h.order, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(h.ranks_per_host, 4);
  EXPECT_TRUE(h.uniform());
  EXPECT_EQ(host_layout_blocks(6, 6).num_hosts(), 1);
  EXPECT_EQ(host_layout_blocks(6, 1).num_hosts(), 6);
  for (int bad : {0, -1, 3, 5, 16}) {
    EXPECT_THROW(host_layout_blocks(8, bad), std::invalid_argument) << bad;
  }
}

TEST(HostLayout, InterleavedHostsAreOrderedHostByHost) {
  // A launcher that deals ranks round-robin over two nodes (--map-by node), keyed by the lowest
  // world rank of each node; hosts are numbered by that rank.
  const std::vector<int> keys = {0, 1, 0, 1, 0, 1};
  const HostLayout h = host_layout_from_keys(keys);
  EXPECT_EQ(h.host_of_rank, (std::vector<int>{0, 1, 0, 1, 0, 1}));
  EXPECT_EQ(h.order, (std::vector<int>{0, 2, 4, 1, 3, 5}));
  EXPECT_EQ(h.position, (std::vector<int>{0, 3, 1, 4, 2, 5}));
  // Uneven nodes, keys that are not ranks: numbered by first appearance.
  const HostLayout u = host_layout_from_keys(std::vector<int>{7, 7, 7, 2, 2});
  EXPECT_EQ(u.host_of_rank, (std::vector<int>{0, 0, 0, 1, 1}));
  EXPECT_EQ(u.ranks_on_host, (std::vector<int>{3, 2}));
  EXPECT_FALSE(u.uniform());
}

TEST(HostLayout, DescribesHowTheGroupsFollowTheHosts) {
  EXPECT_EQ(host_layout_describe(host_layout_blocks(8, 4), 4),
            "8 on 2 hosts x 4 (--ranks-per-host); EP groups of 4 inside each host, 2 replicas "
            "across hosts");
  EXPECT_EQ(host_layout_describe(host_layout_blocks(8, 4), 8),
            "8 on 2 hosts x 4 (--ranks-per-host); one EP group of 8 spanning 2 whole hosts, "
            "1 replica");
  EXPECT_EQ(host_layout_describe(host_layout_blocks(8, 2), 4),
            "8 on 4 hosts x 2 (--ranks-per-host); EP groups of 4 spanning 2 whole hosts, "
            "2 replicas across hosts");
  EXPECT_EQ(host_layout_describe(host_layout_blocks(8, 4), 2),
            "8 on 2 hosts x 4 (--ranks-per-host); EP groups of 2 inside each host, 4 replicas "
            "across hosts");
  EXPECT_EQ(host_layout_describe(host_layout_from_keys(std::vector<int>{0, 0, 0, 0}), 2),
            "4 on 1 host (from the launcher); EP groups of 2, 2 replicas on one host");
  EXPECT_EQ(
      host_layout_describe(host_layout_from_keys(std::vector<int>{0, 0, 0, 3, 3, 3, 3, 3}), 4),
      "8 on 2 hosts (3, 5 ranks) (from the launcher); EP groups of 4 spanning parts of up "
      "to 2 hosts, 2 replicas across hosts");
}

TEST(DispatchPlan, CrossHostRowsCountTheSendsToOtherHosts) {
  // E = 4 on P = 4 (expert e on EP rank e), EP ranks 0, 1 on host 0 and 2, 3 on host 1.
  // T = 3, K = 2: experts {0, 2}, {3, 1}, {2, 3}.
  const std::vector<int32_t> idx = {0, 2, 3, 1, 2, 3};
  const std::vector<int> hosts = {0, 0, 1, 1};
  DispatchPlan plan;
  dispatch_plan_build(plan, idx, 3, 2, ExpertPlacement{4, 4}, 1);
  EXPECT_EQ(dispatch_plan_cross_host_rows(plan, hosts), 4);  // rows to experts 2, 3, 2, 3
  dispatch_plan_build(plan, idx, 3, 2, ExpertPlacement{4, 4}, 3);
  EXPECT_EQ(dispatch_plan_cross_host_rows(plan, hosts), 2);  // rows to experts 0, 1
  // One host: nothing crosses. Every EP rank on its own host: every row but those to itself.
  EXPECT_EQ(dispatch_plan_cross_host_rows(plan, std::vector<int>{0, 0, 0, 0}), 0);
  EXPECT_EQ(dispatch_plan_cross_host_rows(plan, std::vector<int>{0, 1, 2, 3}), 4);
  EXPECT_THROW(dispatch_plan_cross_host_rows(plan, std::vector<int>{0, 1}), std::invalid_argument);
}

TEST(DispatchPlan, CrossHostTokensCountEachOtherHostOncePerToken) {
  // E = 8 on P = 4, EP ranks 0, 1 on host 0 (experts 0-3) and 2, 3 on host 1 (experts 4-7);
  // K = 3. From EP rank 0 (host 0): token 0 stays on host 0, token 1 reaches host 1 by two slots
  // (one copy), token 2 by all three (one copy), token 3 by one.
  const std::vector<int32_t> idx = {0, 1, 3, 4, 6, 2, 5, 7, 4, 0, 2, 7};
  const ExpertPlacement placement{8, 4};
  const std::vector<int> hosts = {0, 0, 1, 1};
  EXPECT_EQ(dispatch_cross_host_tokens(idx, 3, placement, 0, hosts), 3);
  // From EP rank 3 (host 1): tokens 0, 1 and 3 reach host 0, token 2 does not.
  EXPECT_EQ(dispatch_cross_host_tokens(idx, 3, placement, 3, hosts), 3);
  // Four hosts of one rank each: tokens 0..3 from rank 0 reach 1, 3, 2 and 2 other hosts.
  EXPECT_EQ(dispatch_cross_host_tokens(idx, 3, placement, 0, std::vector<int>{0, 1, 2, 3}),
            1 + 3 + 2 + 2);
  EXPECT_EQ(dispatch_cross_host_tokens(idx, 3, placement, 0, std::vector<int>{0, 0, 0, 0}), 0);
  EXPECT_THROW(dispatch_cross_host_tokens(idx, 5, placement, 0, hosts), std::invalid_argument);
  EXPECT_THROW(dispatch_cross_host_tokens(idx, 3, placement, 0, std::vector<int>{0}),
               std::invalid_argument);
}

TEST(DispatchPlan, CrossHostRowsAgreeWithACountPerAssignment) {
  // E = 8 on P = 4 (two experts per rank), hosts {0, 1 | 2, 3}, a routing that covers every
  // (source, expert) pair: the count equals a direct count over assignments.
  const ExpertPlacement placement{8, 4};
  const std::vector<int> hosts = {0, 0, 1, 1};
  std::vector<int32_t> idx;
  for (int t = 0; t < 16; ++t) {
    for (int j = 0; j < 3; ++j) idx.push_back((t * 3 + j * 5) % 8);
  }
  for (int src = 0; src < 4; ++src) {
    DispatchPlan plan;
    dispatch_plan_build(plan, idx, 16, 3, placement, src);
    int64_t direct = 0;
    for (const int32_t e : idx) direct += hosts[placement.owner(e)] != hosts[src];
    EXPECT_EQ(dispatch_plan_cross_host_rows(plan, hosts), direct) << "source " << src;
  }
}

}  // namespace
}  // namespace moe
