// Host layout: the host of each rank (from the launcher or from --ranks-per-host), the layout
// order the EP groups are cut from, and the EP and replica communicators (host_layout.hpp).
#include "comm/host_layout.hpp"

#include <algorithm>
#include <set>
#include <stdexcept>
#include <string>

namespace moe {

bool HostLayout::uniform() const {
  return std::all_of(ranks_on_host.begin(), ranks_on_host.end(),
                     [&](int n) { return n == ranks_on_host.front(); });
}

HostLayout host_layout_from_keys(std::span<const int> key_of_rank) {
  const int W = static_cast<int>(key_of_rank.size());
  HostLayout h;
  h.host_of_rank.assign(W, -1);
  // Hosts numbered as first met in world order: by their lowest world rank.
  for (int r = 0; r < W; ++r) {
    if (h.host_of_rank[r] >= 0) continue;
    const int host = h.num_hosts();
    h.ranks_on_host.push_back(0);
    for (int q = r; q < W; ++q) {
      if (key_of_rank[q] == key_of_rank[r]) {
        h.host_of_rank[q] = host;
        ++h.ranks_on_host[host];
      }
    }
  }
  // Layout order: host by host, world order within a host (a stable sort by host).
  h.order.resize(W);
  for (int r = 0; r < W; ++r) h.order[r] = r;
  std::stable_sort(h.order.begin(), h.order.end(),
                   [&](int a, int b) { return h.host_of_rank[a] < h.host_of_rank[b]; });
  h.position.resize(W);
  for (int i = 0; i < W; ++i) h.position[h.order[i]] = i;
  return h;
}

HostLayout host_layout_blocks(int world_size, int ranks_per_host) {
  if (ranks_per_host <= 0 || world_size % ranks_per_host != 0) {
    throw std::invalid_argument("--ranks-per-host=" + std::to_string(ranks_per_host) +
                                " must divide the number of ranks (" + std::to_string(world_size) +
                                "): hosts are blocks of that many consecutive ranks");
  }
  std::vector<int> keys(world_size);
  for (int r = 0; r < world_size; ++r) keys[r] = r / ranks_per_host;
  HostLayout h = host_layout_from_keys(keys);
  h.ranks_per_host = ranks_per_host;
  return h;
}

HostLayout host_layout_discover(const Comm& world) {
  // The key of a host: the lowest world rank on it, which is rank 0 of the shared-memory
  // communicator (split_shared orders it by world rank).
  const Comm node = world.split_shared();
  std::vector<int> key = {world.rank()};
  node.broadcast(std::span<int>(key), 0);
  std::vector<int> keys(world.size());
  world.allgather(std::span<const int>(key), std::span<int>(keys));
  return host_layout_from_keys(keys);
}

ParallelGroups parallel_groups_make(const Comm& world, int ep_size, const HostLayout& hosts) {
  const int W = world.size();
  if (ep_size <= 0 || W % ep_size != 0) {
    throw std::invalid_argument("--ep=" + std::to_string(ep_size) +
                                " must divide the number of ranks (" + std::to_string(W) + ")");
  }
  if (hosts.world_size() != W) {
    throw std::invalid_argument("parallel_groups_make: a host layout of " +
                                std::to_string(hosts.world_size()) + " ranks for a world of " +
                                std::to_string(W));
  }
  const int position = hosts.position[world.rank()];
  const int group = position / ep_size, ep_rank = position % ep_size;
  ParallelGroups g{
      world.split(group, ep_rank), world.split(ep_rank, group), ep_size, W / ep_size, group,
      std::vector<int>(ep_size)};
  for (int d = 0; d < ep_size; ++d) {
    g.ep_hosts[d] = hosts.host_of_rank[hosts.order[group * ep_size + d]];
  }
  return g;
}

ParallelGroups parallel_groups_make(const Comm& world, int ep_size) {
  return parallel_groups_make(world, ep_size, host_layout_blocks(world.size(), world.size()));
}

namespace {

// The hosts of the ranks at layout positions [first, first + count).
std::set<int> hosts_at(const HostLayout& h, int first, int count) {
  std::set<int> out;
  for (int i = first; i < first + count; ++i) out.insert(h.host_of_rank[h.order[i]]);
  return out;
}

}  // namespace

std::string host_layout_describe(const HostLayout& h, int P) {
  const int W = h.world_size(), H = h.num_hosts(), R = W / P;
  std::string text = std::to_string(W) + " on " + std::to_string(H) + (H == 1 ? " host" : " hosts");
  if (H > 1 && h.uniform()) {
    text += " x " + std::to_string(h.ranks_on_host[0]);
  } else if (H > 1) {
    text += " (";
    for (int i = 0; i < H; ++i) text += (i ? ", " : "") + std::to_string(h.ranks_on_host[i]);
    text += " ranks)";
  }
  text += h.ranks_per_host > 0 ? " (--ranks-per-host)" : " (from the launcher)";
  // EP groups: inside one host each, over whole hosts, or across host boundaries.
  int max_hosts = 1;
  bool whole = true;
  for (int g = 0; g < R; ++g) {
    const std::set<int> in = hosts_at(h, g * P, P);
    max_hosts = std::max(max_hosts, static_cast<int>(in.size()));
    int covered = 0;
    for (int host : in) covered += h.ranks_on_host[host];
    whole = whole && covered == P;
  }
  text += "; ";
  const std::string groups =
      R == 1 ? "one EP group of " + std::to_string(P) : "EP groups of " + std::to_string(P);
  if (H == 1) {
    text += groups;
  } else if (max_hosts == 1) {
    text += groups + (R == 1 ? " inside one host" : " inside each host");
  } else if (whole) {
    text += groups + " spanning " + std::to_string(max_hosts) + " whole hosts";
  } else {
    text += groups + " spanning parts of up to " + std::to_string(max_hosts) + " hosts";
  }
  // Replicas: the W/P ranks holding the same experts, on one host or across hosts.
  text += ", " + std::to_string(R) + (R == 1 ? " replica" : " replicas");
  if (R > 1) {
    bool across = false;
    for (int r = 0; r < P && !across; ++r) {
      std::set<int> in;
      for (int g = 0; g < R; ++g) in.insert(h.host_of_rank[h.order[g * P + r]]);
      across = in.size() > 1;
    }
    text += across ? " across hosts" : " on one host";
  }
  return text;
}

}  // namespace moe
