// Typed collectives and the expert-parallel sub-communicators, at whatever rank count CTest uses.
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/host_layout.hpp"

namespace moe {
namespace {

TEST(Comm, AllreduceSumEachType) {
  const Comm world = Comm::world();
  const int W = world.size(), r = world.rank();
  std::vector<float> f = {1.0f * r, 0.5f};
  world.allreduce_sum(std::span<float>(f));
  EXPECT_EQ(f[0], 0.5f * W * (W - 1));
  EXPECT_EQ(f[1], 0.5f * W);
  std::vector<double> d = {1.0 + r};
  world.allreduce_sum(std::span<double>(d));
  EXPECT_EQ(d[0], 0.5 * W * (W + 1));
  std::vector<int64_t> i = {int64_t{1} << 40, r};
  world.allreduce_sum(std::span<int64_t>(i));
  EXPECT_EQ(i[0], (int64_t{1} << 40) * W);
  EXPECT_EQ(i[1], int64_t{W} * (W - 1) / 2);
}

TEST(Comm, AlltoallAndAlltoallvMoveTaggedValues) {
  const Comm world = Comm::world();
  const int W = world.size(), r = world.rank();
  std::vector<int> send(W), recv(W);
  for (int d = 0; d < W; ++d) send[d] = 100 * r + d;
  world.alltoall(std::span<const int>(send), std::span<int>(recv));
  for (int s = 0; s < W; ++s) EXPECT_EQ(recv[s], 100 * s + r);

  // Rank r sends (r + d) % 3 values to rank d, each tagged 1000·r + d + k/10.
  std::vector<int> sc(W), sd(W), rc(W), rd(W);
  for (int d = 0; d < W; ++d) sc[d] = (r + d) % 3;
  for (int s = 0; s < W; ++s) rc[s] = (s + r) % 3;
  std::exclusive_scan(sc.begin(), sc.end(), sd.begin(), 0);
  std::exclusive_scan(rc.begin(), rc.end(), rd.begin(), 0);
  std::vector<double> sv(sd.back() + sc.back()), rv(rd.back() + rc.back(), -1.0);
  for (int d = 0; d < W; ++d) {
    for (int k = 0; k < sc[d]; ++k) sv[sd[d] + k] = 1000.0 * r + d + k / 10.0;
  }
  world.alltoallv(std::span<const double>(sv), std::span<const int>(sc), std::span<const int>(sd),
                  std::span<double>(rv), std::span<const int>(rc), std::span<const int>(rd));
  for (int s = 0; s < W; ++s) {
    for (int k = 0; k < rc[s]; ++k) EXPECT_EQ(rv[rd[s] + k], 1000.0 * s + r + k / 10.0);
  }
}

TEST(Comm, BroadcastAndAllgather) {
  const Comm world = Comm::world();
  std::vector<int64_t> v = {world.rank() == 0 ? 42 : -1};
  world.broadcast(std::span<int64_t>(v), 0);
  EXPECT_EQ(v[0], 42);
  const std::vector<int> mine = {world.rank(), 7};
  std::vector<int> all(2 * world.size());
  world.allgather(std::span<const int>(mine), std::span<int>(all));
  for (int s = 0; s < world.size(); ++s) {
    EXPECT_EQ(all[2 * s], s);
    EXPECT_EQ(all[2 * s + 1], 7);
  }
}

TEST(Comm, FailedCallThrowsMpiErrorNamingCallAndRank) {
  const Comm world = Comm::world();
  std::vector<int> v(1);
  try {
    world.broadcast(std::span<int>(v), world.size());  // no such root: MPI reports an error
    FAIL() << "expected MpiError";
  } catch (const MpiError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("MPI_Bcast"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank " + std::to_string(world.rank())), std::string::npos) << msg;
    EXPECT_NE(msg.find("communicator.cpp"), std::string::npos) << msg;
  }
  world.barrier();
}

TEST(ParallelGroups, EpGroupsAreContiguousAndReplicasStrided) {
  const Comm world = Comm::world();
  const int W = world.size();
  for (int P = 1; P <= W; ++P) {
    if (W % P != 0) continue;
    const ParallelGroups g = parallel_groups_make(world, P);
    EXPECT_EQ(g.ep.size(), P);
    EXPECT_EQ(g.ep.rank(), world.rank() % P);
    EXPECT_EQ(g.replica.size(), W / P);
    EXPECT_EQ(g.replica.rank(), world.rank() / P);
    // The EP group's members are world ranks [g·P, g·P + P).
    std::vector<int> me = {world.rank()}, members(P);
    g.ep.allgather(std::span<const int>(me), std::span<int>(members));
    for (int i = 0; i < P; ++i) EXPECT_EQ(members[i], (world.rank() / P) * P + i);
  }
  if (W > 1) {
    EXPECT_THROW(parallel_groups_make(world, W + 1), std::invalid_argument);
  }
}

TEST(ParallelGroups, EpGroupsFollowTheHostsOfTheLayout) {
  // Two hosts dealt round-robin (as a launcher's --map-by node would): the layout order lists
  // host 0's ranks, then host 1's, and the EP groups are cut from it.
  const Comm world = Comm::world();
  const int W = world.size();
  std::vector<int> keys(W);
  for (int r = 0; r < W; ++r) keys[r] = r % 2;
  const HostLayout hosts = host_layout_from_keys(keys);
  for (int P = 1; P <= W; ++P) {
    if (W % P != 0) continue;
    const ParallelGroups g = parallel_groups_make(world, P, hosts);
    const int position = hosts.position[world.rank()];
    EXPECT_EQ(g.ep_group, position / P);
    EXPECT_EQ(g.ep.rank(), position % P);
    EXPECT_EQ(g.replica.rank(), position / P);
    std::vector<int> me = {world.rank()}, members(P);
    g.ep.allgather(std::span<const int>(me), std::span<int>(members));
    for (int i = 0; i < P; ++i) {
      EXPECT_EQ(members[i], hosts.order[g.ep_group * P + i]);
      EXPECT_EQ(g.ep_hosts[i], members[i] % 2);
    }
  }
  // World rank 0 is always EP rank 0 of group 0 (the checkpoint's writer).
  const ParallelGroups g = parallel_groups_make(world, W, hosts);
  if (world.rank() == 0) {
    EXPECT_EQ(g.ep.rank(), 0);
  }
}

}  // namespace
}  // namespace moe
