// Where the ranks run: the host of each world rank, and the order in which the expert-parallel
// groups are cut from the ranks (docs/architecture.md, "Ranks and groups"). A host is a node as
// the launcher sees it (the ranks that share memory, MPI_COMM_TYPE_SHARED: with Open MPI, one
// hostfile entry), or, with --ranks-per-host N, a block of N consecutive world ranks.
//
// The layout order lists the ranks host by host (hosts in the order of their lowest world rank,
// then by world rank within a host); EP group g is positions [g·P, g·P + P) of it. So an EP group
// lies inside one host when P divides every host's rank count, and spans consecutive whole hosts
// when the hosts are equal and their rank count divides P. When the launcher numbers the ranks
// host by host (Open MPI's default, --map-by slot) the layout order is the world order.
// Legend: W ranks, H hosts, P EP group size.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "comm/communicator.hpp"

namespace moe {

struct HostLayout {
  std::vector<int> host_of_rank;   // [W] host index of each world rank
  std::vector<int> ranks_on_host;  // [H] ranks on each host
  std::vector<int> order;          // [W] world ranks in layout order (host, then world rank)
  std::vector<int> position;       // [W] position of each world rank in `order`
  int ranks_per_host = 0;          // --ranks-per-host N; 0 when the launcher told

  int num_hosts() const { return static_cast<int>(ranks_on_host.size()); }
  int world_size() const { return static_cast<int>(host_of_rank.size()); }
  // Every host holds the same number of ranks.
  bool uniform() const;
};

// Hosts of `ranks_per_host` consecutive world ranks. Throws std::invalid_argument naming
// --ranks-per-host unless it is positive and divides `world_size`.
HostLayout host_layout_blocks(int world_size, int ranks_per_host);

// The layout from each world rank's host key (any value shared by exactly the ranks of one host,
// e.g. the lowest world rank on it); hosts are numbered in the order of their lowest world rank.
HostLayout host_layout_from_keys(std::span<const int> key_of_rank);

// Collective over `world`: the hosts as the launcher sees them (MPI_COMM_TYPE_SHARED), from one
// communicator split and two small collectives.
HostLayout host_layout_discover(const Comm& world);

// The EP and replica communicators with EP groups cut from the layout order (see above);
// ParallelGroups::ep_hosts holds the host of each EP rank. Collective over `world`. Throws
// std::invalid_argument when P does not divide W or the layout is not of W ranks.
ParallelGroups parallel_groups_make(const Comm& world, int ep_size, const HostLayout& hosts);

// One line for the banner: how the ranks lie on the hosts and how the EP groups and replicas
// follow them, e.g. "8 on 2 hosts x 4 (--ranks-per-host); EP groups of 4 inside each host,
// 2 replicas across hosts".
std::string host_layout_describe(const HostLayout& hosts, int ep_size);

}  // namespace moe
