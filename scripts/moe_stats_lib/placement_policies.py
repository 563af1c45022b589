"""Expert placement policies: from the expert loads of a window of steps, which EP rank holds which
experts in each layer, for `moe_stats.py placement`.

Every policy is a function policy(loads, num_ranks, redundant, hosts, model) -> [L][P] lists of
expert ids, where loads [L, E] are the loads summed over the window, num_ranks P the EP ranks,
redundant R the extra expert instances (replicas) to place beyond the E experts, hosts a
HostLayout of the P ranks and model the ModelShape. Policies are deterministic: ties go to the
lower expert id, then to the lower rank.

    contiguous    moe_rt's default: E experts in contiguous blocks, the first E mod P ranks one
                  more (ignores the loads and R)
    greedy        R replicas to the experts of highest load per replica, then longest-processing-
                  time packing: the heaviest instance first, each to the least loaded rank that
                  does not hold its expert yet; counts may be uneven
    hierarchical  DeepSeek's EPLB (github.com/deepseek-ai/EPLB), its hierarchical policy as the
                  project describes it: expert groups packed onto hosts with an equal number of
                  groups per host, the host's share of the R replicas to its heaviest experts, then
                  its instances packed onto its ranks with an equal number per rank

hierarchical_notes() says where the sizes make EPLB's equal counts impossible and what the policy
does instead.

Shapes: L layers, E experts, P EP ranks, H hosts, G = P/H ranks per host.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .placement_file import contiguous_layer


@dataclass(frozen=True)
class HostLayout:
    """The replayed EP ranks on hosts: H hosts of G consecutive EP ranks (rank q on host q // G),
    as moe_rt cuts EP groups from ranks listed host by host."""

    num_hosts: int        # H
    ranks_per_host: int   # G

    def host_of(self, rank):
        return rank // self.ranks_per_host


@dataclass(frozen=True)
class ModelShape:
    """What the policies and the move cost need of the model (from the run's configuration)."""

    num_experts: int              # E
    num_layers: int               # L
    routing_groups: int = 1       # --routing-groups G (1: no expert groups)
    d_model: int | None = None    # D, None when the configuration does not say
    ffn_dim: int | None = None    # F, None when the configuration does not say


# ---------------------------------------------------------------------------------------------
# Building blocks


def replicate(loads, redundant, limit):
    """[E] int: instances of each expert after adding `redundant` replicas one at a time, each to
    the expert of the highest load per instance (ties: lower id), none past `limit` instances
    (an expert is held once per rank). Replicas that fit nowhere are left out."""
    counts = np.ones(len(loads), dtype=np.int64)
    loads = np.asarray(loads, dtype=np.float64)
    for _ in range(redundant):
        per_instance = np.where(counts < limit, loads / counts, -np.inf)
        if not np.isfinite(per_instance).any():
            break
        counts[int(np.argmax(per_instance))] += 1      # argmax: the first (lowest id) of ties
    return counts


def instances_heaviest_first(experts, loads, counts):
    """[(load per instance, expert)] of every instance of `experts`, heaviest first (ties: lower
    expert id), a replicated expert's instances next to each other."""
    items = [(float(loads[e]) / counts[e], int(e)) for e in experts for _ in range(counts[e])]
    return sorted(items, key=lambda item: (-item[0], item[1]))


def pack(items, num_bins, capacity=None):
    """Longest-processing-time packing of `items` [(weight, key)], taken in the order given (the
    heaviest first), into num_bins bins holding at most `capacity` items each (None: no limit),
    no bin holding a key twice. Each item goes to the bin of least weight among those it may
    enter; ties: fewer items, then the lower bin. The item-count tie is why no bin stays empty
    while items remain: an empty bin weighs 0, the least there is, and holds nothing to clash.
    Returns [num_bins] lists of keys.

    With a capacity, the bins that may take an item can all hold its key already (a replica
    arriving last); then one swap makes room: a full bin X without the key gives one of its items
    that the lightest open bin b lacks to b, and takes the item. Such a pair exists whenever an
    expert has no more instances than bins: b holds fewer items than X, so one of X's distinct
    keys is missing from b."""
    bins = [[] for _ in range(num_bins)]          # [(weight, key)] per bin
    weight = [0.0] * num_bins
    keys = [set() for _ in range(num_bins)]

    def put(b, item):
        bins[b].append(item)
        weight[b] += item[0]
        keys[b].add(item[1])

    def take(b, item):
        bins[b].remove(item)
        weight[b] -= item[0]
        keys[b].discard(item[1])

    def is_open(b):
        return capacity is None or len(bins[b]) < capacity

    def order(b):
        return (weight[b], len(bins[b]), b)

    for item in items:
        allowed = [b for b in range(num_bins) if is_open(b) and item[1] not in keys[b]]
        if allowed:
            put(min(allowed, key=order), item)
            continue
        target = min((b for b in range(num_bins) if is_open(b)), key=order)
        full = min((b for b in range(num_bins) if item[1] not in keys[b]), key=order)
        give = min((x for x in bins[full] if x[1] not in keys[target]),
                   key=lambda x: (x[0], x[1]))
        take(full, give)
        put(target, give)
        put(full, item)
    return [[key for _, key in b] for b in bins]


# ---------------------------------------------------------------------------------------------
# Policies


def contiguous(loads, num_ranks, redundant, hosts, model):
    """moe_rt's default layout, the same in every layer."""
    return [contiguous_layer(model.num_experts, num_ranks) for _ in range(model.num_layers)]


def greedy(loads, num_ranks, redundant, hosts, model):
    """Replicas by load per instance, then longest-processing-time packing onto all P ranks."""
    layers = []
    for layer_loads in loads:
        counts = replicate(layer_loads, redundant, num_ranks)
        items = instances_heaviest_first(range(model.num_experts), layer_loads, counts)
        layers.append(pack(items, num_ranks))
    return layers


def expert_groups(num_experts, hosts, model):
    """The number of expert groups of the hierarchical policy: the model's routing groups when it
    has some, else one per host when the hosts divide E, else 1."""
    if model.routing_groups > 1 and num_experts % model.routing_groups == 0:
        return model.routing_groups
    if hosts.num_hosts > 1 and num_experts % hosts.num_hosts == 0:
        return hosts.num_hosts
    return 1


def hierarchical_sizes(num_ranks, redundant, hosts, model):
    """(groups, hosts used) of the hierarchical policy: EPLB's hierarchical rule needs the groups
    to divide over the hosts; otherwise its global rule, one group on one host of all P ranks."""
    groups = expert_groups(model.num_experts, hosts, model)
    if groups % hosts.num_hosts:
        return 1, HostLayout(1, num_ranks)
    return groups, hosts


def hierarchical(loads, num_ranks, redundant, hosts, model):
    """EPLB's hierarchical policy: groups to hosts, replicas within hosts, instances to ranks."""
    num_groups, hosts = hierarchical_sizes(num_ranks, redundant, hosts, model)
    group_size = model.num_experts // num_groups
    per_host = num_groups // hosts.num_hosts
    layers = []
    for layer_loads in np.asarray(loads, dtype=np.float64):
        group_loads = layer_loads.reshape(num_groups, group_size).sum(axis=1)
        group_items = sorted(((float(w), g) for g, w in enumerate(group_loads)),
                             key=lambda item: (-item[0], item[1]))
        host_groups = pack(group_items, hosts.num_hosts, capacity=per_host)
        # The R replicas split over the hosts; where H does not divide R, the heaviest hosts
        # (ties: lower host) take one more.
        host_loads = [sum(group_loads[g] for g in gs) for gs in host_groups]
        by_load = sorted(range(hosts.num_hosts), key=lambda h: (-host_loads[h], h))
        extra = {h: i < redundant % hosts.num_hosts for i, h in enumerate(by_load)}
        ranks = []
        for h, groups in enumerate(host_groups):
            experts = sorted(e for g in groups for e in range(g * group_size, (g + 1) * group_size))
            share = redundant // hosts.num_hosts + extra[h]
            counts = np.ones(model.num_experts, dtype=np.int64)
            counts[experts] = replicate(layer_loads[experts], share, hosts.ranks_per_host)
            items = instances_heaviest_first(experts, layer_loads, counts)
            # Equal counts per rank where they divide; else at most one more on some ranks.
            capacity = math.ceil(len(items) / hosts.ranks_per_host)
            ranks += pack(items, hosts.ranks_per_host, capacity=capacity)
        layers.append(ranks)
    return layers


def hierarchical_notes(num_ranks, redundant, hosts, model):
    """Lines saying how the hierarchical policy treats these sizes: its groups, and where EPLB's
    equal counts cannot be kept."""
    num_groups, used = hierarchical_sizes(num_ranks, redundant, hosts, model)
    wanted = expert_groups(model.num_experts, hosts, model)
    notes = []
    if used is not hosts:
        notes.append(f"{wanted} expert groups do not divide over {hosts.num_hosts} hosts: EPLB's "
                     f"global rule instead (one group, replicas and packing over all "
                     f"{num_ranks} ranks)")
    elif num_groups > 1:
        source = ("the model's routing groups" if num_groups == model.routing_groups
                  else "one per host")
        notes.append(f"{num_groups} expert groups of {model.num_experts // num_groups} "
                     f"({source}), {num_groups // used.num_hosts} per host")
    if redundant % used.num_hosts:
        notes.append(f"{redundant} redundant experts do not divide over {used.num_hosts} hosts: "
                     f"the {redundant % used.num_hosts} heaviest hosts take one more")
    experts_per_host = model.num_experts // used.num_hosts
    most = math.ceil(redundant / used.num_hosts)
    if most > experts_per_host * (used.ranks_per_host - 1):
        notes.append(f"a rank holds an expert once, so a host of {used.ranks_per_host} "
                     f"rank(s) and {experts_per_host} experts takes at most "
                     f"{experts_per_host * (used.ranks_per_host - 1)} replicas: those beyond "
                     f"are left out")
    elif ((experts_per_host + redundant // used.num_hosts) % used.ranks_per_host
          or (redundant % used.num_hosts and (experts_per_host + most) % used.ranks_per_host)):
        notes.append("a host's experts and replicas do not divide over its ranks: some ranks "
                     "hold one more than others")
    return notes


POLICIES = {"contiguous": contiguous, "greedy": greedy, "hierarchical": hierarchical}
