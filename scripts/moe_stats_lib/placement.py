"""`moe_stats.py placement`: an offline replay of expert placement policies on a run's recorded
loads: how evenly each policy would have spread the experts' rows over P EP ranks, what crossed
hosts, and what re-placing the experts would have moved; and the placement file a policy would
give moe_rt (--expert-placement) for the next steps.

What it computes (docs/analysis.md, "Placement replay"):
- Loads: /routing/expert_load - /routing/dropped, the rows the experts computed (a run without a
  token capacity has no drops). Rank q's load in layer l is the sum over the experts it holds of
  the expert's load divided by the expert's number of replicas. moe_rt splits a replicated
  expert's rows among its replicas by the sources' sequences, so the equal split is the
  expectation, not the exact count.
- Overload: max / mean of the P rank loads, per step and layer (1 = even): the busiest rank sets
  when the layer's step ends.
- Schedule: a placement is a prediction from steps before the ones it is scored on. --every 0: one
  placement from the loads of the first W steps (default the first quarter), scored on the rest.
  --every N: re-placed at rows k·N (counted from the run's first row) from the loads of the W
  rows before (default W = N), the first re-placement at the first k·N with W rows of history;
  before it every policy runs the contiguous layout, and only the rows from it on are scored.
- Rows crossing hosts: from /routing/source_expert_load [N, L, W, E] when the file has it (each
  source's share of an expert's rows; world rank w is EP rank w mod P), else each of the P
  source ranks sends an equal share of every expert's rows, which makes the count the same for
  every placement ((H - 1)/H of the rows on H equal hosts).
- Moves: at each re-placement, the expert instances a rank newly holds; each costs its three
  matrices w1, w3 (D x F) and w2 (F x D) in float32 with AdamW's two moments: 36·D·F bytes.
- RECORDED, beside the policies: the placement the run ran under where its files record it
  (/layers/placement), over the same scored rows.

Shapes: N complete rows (steps), S scored rows, L layers, E experts, P EP ranks, H hosts.
"""
from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass

import numpy as np

from .placement_file import contiguous_layer, make_placement, write_placement
from .placement_policies import POLICIES, HostLayout, ModelShape, hierarchical_notes
from .stats_file import StatsError, parse_config_text, routing_label
from .variance import markdown_line, pad_rows

# Bytes moved per expert instance, per D·F: w1, w3 [D, F] and w2 [F, D] in float32 (4 bytes),
# each with AdamW's first and second moments beside the parameters.
MOVE_BYTES_PER_DF = 3 * 4 * 3
PERCENTILE = 95
# Not a policy: the placement the run itself ran under, as its files record it (/layers/placement).
RECORDED = "recorded"
LINE_STYLES = ("-", "--", ":")


@dataclass(frozen=True)
class PlacementSegment:
    """Rows [start, stop) run one placement, computed from the loads of rows window (None: the
    contiguous layout, the runtime's start)."""

    start: int
    stop: int
    window: tuple | None    # (first row, stop row) of the history, stop <= start


@dataclass(frozen=True)
class PolicyReplay:
    name: str
    overload: np.ndarray      # [S, L] max / mean rank load over the scored rows
    cross_host: np.ndarray    # [S, L] rows sent from a rank on one host to another
    moved: np.ndarray         # [num re-placements, L] instances a rank newly holds
    placements: tuple         # Placement per segment


@dataclass(frozen=True)
class Replay:
    run: object               # the Run replayed
    num_ranks: int            # P
    hosts: HostLayout
    redundant: int            # R
    every: int                # 0: one static placement
    window: int               # W
    segments: tuple           # PlacementSegment, in row order
    scored: tuple             # (first row, stop row) scored
    model: ModelShape
    source_shares: bool       # True: /routing/source_expert_load gave the sources' shares
    policies: tuple           # PolicyReplay per policy asked
    notes: tuple              # lines on how the policies treated these sizes

    @property
    def scored_steps(self):
        return self.run.steps[self.scored[0]:self.scored[1]]

    def move_bytes(self):
        """Bytes per instance moved, or None when the configuration lacks d-model or ffn-dim."""
        if self.model.d_model is None or self.model.ffn_dim is None:
            return None
        return MOVE_BYTES_PER_DF * self.model.d_model * self.model.ffn_dim


# ---------------------------------------------------------------------------------------------
# Inputs


def computed_loads(run):
    """[N, L, E] float64: the rows each expert computed, expert_load - dropped."""
    load = np.asarray(run.data["routing/expert_load"], dtype=np.float64)
    if "routing/dropped" in run.data:
        load = load - np.asarray(run.data["routing/dropped"], dtype=np.float64)
    return load


def model_shape(run):
    """ModelShape from the run's configuration text (of a chain, the newest file's)."""
    config = parse_config_text(run.attrs.get("config", ""))

    def count(key, default=None):
        text = config.get(key)
        return int(text) if text is not None and text.isdigit() and int(text) > 0 else default

    return ModelShape(num_experts=run.num_experts, num_layers=run.num_layers,
                      routing_groups=count("routing-groups", 1), d_model=count("d-model"),
                      ffn_dim=count("ffn-dim"))


def host_layout(num_ranks, num_hosts=None, ranks_per_host=None):
    """HostLayout of P EP ranks from --hosts H or --ranks-per-host N (default: one host). N a
    multiple of P puts the whole EP group on one host."""
    if num_hosts is not None:
        if num_hosts < 1 or num_ranks % num_hosts:
            raise StatsError(f"--hosts {num_hosts}: the hosts must divide the {num_ranks} EP "
                             f"ranks (--ranks) into equal blocks")
        return HostLayout(num_hosts, num_ranks // num_hosts)
    if ranks_per_host is not None:
        if ranks_per_host >= 1 and ranks_per_host % num_ranks == 0:
            return HostLayout(1, num_ranks)
        if ranks_per_host < 1 or num_ranks % ranks_per_host:
            raise StatsError(f"--ranks-per-host {ranks_per_host}: must divide the {num_ranks} "
                             f"EP ranks (--ranks), or be a multiple of them")
        return HostLayout(num_ranks // ranks_per_host, ranks_per_host)
    return HostLayout(1, num_ranks)


def schedule(num_rows, every, window):
    """(segments, scored (first row, stop row), window W) of the placement schedule; StatsError
    when it leaves nothing to score. Every segment's window ends at or before its first row."""
    if every < 0:
        raise StatsError(f"--every {every}: expected 0 (one placement) or a number of steps >= 1")
    if window is not None and window < 1:
        raise StatsError(f"--window {window}: expected a number of steps >= 1")
    if every == 0:
        window = window or max(1, num_rows // 4)
        if window >= num_rows:
            raise StatsError(f"--window {window} leaves no step to score: the run has "
                             f"{num_rows} steps, the placement is scored on those after its "
                             f"window")
        return (PlacementSegment(window, num_rows, (0, window)),), (window, num_rows), window
    window = window or every
    first = -(-window // every) * every          # the first multiple of N with W rows before it
    if first >= num_rows:
        raise StatsError(f"--every {every} --window {window}: no re-placement within the run's "
                         f"{num_rows} steps (the first needs {window} steps of history and "
                         f"falls on a multiple of {every}); use a smaller --every or --window")
    starts = list(range(first, num_rows, every))
    segments = [PlacementSegment(0, first, None)] + [
        PlacementSegment(start, min(start + every, num_rows), (start - window, start))
        for start in starts]
    return tuple(segments), (first, num_rows), window


def check_sizes(run, num_ranks, redundant, policies):
    num_experts = run.num_experts
    if num_ranks < 1 or num_ranks > num_experts:
        raise StatsError(f"--ranks {num_ranks}: expected 1 to {num_experts} EP ranks (the run "
                         f"has {num_experts} experts; every rank holds at least one)")
    if redundant < 0:
        raise StatsError(f"--redundant {redundant}: expected a number of replicas >= 0")
    if redundant > num_experts * (num_ranks - 1):
        raise StatsError(f"--redundant {redundant}: at most {num_experts * (num_ranks - 1)} "
                         f"replicas fit on {num_ranks} ranks ({num_experts} experts, each held "
                         f"at most once per rank)")
    unknown = [name for name in policies if name not in POLICIES and name != RECORDED]
    if unknown or not policies:
        raise StatsError(f"--policies: unknown policy '{unknown[0] if unknown else ''}' "
                         f"(known: {', '.join((RECORDED,) + tuple(POLICIES))})")


# ---------------------------------------------------------------------------------------------
# Scoring


def rank_loads(placement, loads):
    """[n, L, P] float64: each rank's share of loads [n, L, E] under `placement`."""
    return np.einsum("lpe,nle->nlp", placement.shares(), loads)


def overload(placement, loads):
    """[n, L]: max / mean of the rank loads (1 where a layer has no load)."""
    ranks = rank_loads(placement, loads)
    mean = ranks.mean(axis=2)
    return np.divide(ranks.max(axis=2), mean, out=np.ones_like(mean), where=mean > 0)


def source_host_shares(run, rows, num_ranks, hosts):
    """[n, L, H, E] share of each expert's rows sent from each host's ranks, for the rows `rows`
    (a slice), from /routing/source_expert_load when uses_source_shares; else [1, 1, H, 1], an
    equal share per source rank (G/P per host) for every row, expert and layer."""
    equal = np.full((1, 1, hosts.num_hosts, 1), hosts.ranks_per_host / num_ranks)
    if not uses_source_shares(run, num_ranks):
        return equal
    source = run.data["routing/source_expert_load"]
    source = np.nan_to_num(np.asarray(source[rows], dtype=np.float64))    # [n, L, W, E]
    host_of_world = np.array([hosts.host_of(w % num_ranks) for w in range(source.shape[2])])
    by_host = np.stack([source[:, :, host_of_world == h].sum(axis=2)
                        for h in range(hosts.num_hosts)], axis=2)         # [n, L, H, E]
    total = by_host.sum(axis=2, keepdims=True)
    return np.where(total > 0, by_host / np.where(total > 0, total, 1.0), equal)


def uses_source_shares(run, num_ranks):
    """Whether the file gives the sources' shares: it has /routing/source_expert_load, its world
    ranks are whole EP groups of P, and world rank w is EP rank w mod P: moe_rt cuts the EP groups
    from the ranks listed host by host, which is the world order when every file's
    /hosts/rank_host is non-decreasing (Open MPI's default numbering, --ranks-per-host blocks);
    a launcher that deals ranks round-robin over the hosts is not, and the equal share is used."""
    source = run.data.get("routing/source_expert_load")
    if source is None or source.shape[2] % num_ranks != 0:
        return False
    return all(seg.rank_host is None or list(seg.rank_host) == sorted(seg.rank_host)
               for seg in run.segments)


def cross_host_rows(placement, loads, from_host, hosts):
    """[n, L] rows sent across hosts: an expert's rows from host hs land on host hq in proportion
    to the shares the ranks of hq hold of it; what stays is sum over h of from[h]·to[h]."""
    shares = placement.shares()                                            # [L, P, E]
    to_host = np.stack([shares[:, [q for q in range(placement.num_ranks)
                                   if hosts.host_of(q) == h]].sum(axis=1)
                        for h in range(hosts.num_hosts)], axis=1)          # [L, H, E]
    stays = (from_host * to_host[None]).sum(axis=2)                        # [n, L, E]
    return (loads * (1.0 - stays)).sum(axis=2)


def moved_instances(old, new):
    """[L] instances a rank holds under `new` and did not under `old`."""
    return np.array([len(new.instances(l) - old.instances(l)) for l in range(new.num_layers)])


def place(policy, loads, num_ranks, redundant, hosts, model):
    """The Placement `policy` gives for window loads [L, E], checked as a file would be."""
    layers = POLICIES[policy](loads, num_ranks, redundant, hosts, model)
    return make_placement(model.num_experts, layers, what=f"policy {policy}")


def contiguous_placement(model, num_ranks):
    return make_placement(model.num_experts,
                          [contiguous_layer(model.num_experts, num_ranks)] * model.num_layers)


def recorded_parts(run, num_ranks, scored):
    """[(first row, stop row, Placement)] of the scored rows under the placement each file of the
    run records, or None when a file holding scored rows records none on P ranks."""
    parts, start = [], 0
    for segment in run.segments:
        stop = start + segment.rows
        first, last = max(start, scored[0]), min(stop, scored[1])
        if first < last:
            if segment.placement is None or len(segment.placement[0]) != num_ranks:
                return None
            parts.append((first, last, make_placement(run.num_experts, segment.placement,
                                                      what=f"{segment.path}: /layers/placement")))
        start = stop
    return parts


def default_policies(run, num_ranks, every=0, window=None):
    """RECORDED where the files record the placement the run ran on P ranks, then every policy."""
    _, scored, _ = schedule(len(run.steps), every, window)
    recorded = recorded_parts(run, num_ranks, scored) is not None
    return ((RECORDED,) if recorded else ()) + tuple(POLICIES)


def replay(run, num_ranks, hosts=None, redundant=0, every=0, window=None,
           policies=tuple(POLICIES)):
    """The Replay of `policies` on the run's loads under the schedule of every/window. RECORDED
    among them replays the placement the run's files record, file by file, over the same rows."""
    hosts = hosts or HostLayout(1, num_ranks)
    check_sizes(run, num_ranks, redundant, policies)
    segments, scored, window = schedule(len(run.steps), every, window)
    loads = computed_loads(run)                                            # [N, L, E]
    model = model_shape(run)
    start = contiguous_placement(model, num_ranks)
    rows = slice(*scored)
    from_host = source_host_shares(run, rows, num_ranks, hosts)

    def from_host_of(first, stop):
        return from_host if len(from_host) == 1 else from_host[first - scored[0]:stop - scored[0]]

    results = []
    for name in policies:
        if name == RECORDED:
            results.append(recorded_replay(run, num_ranks, scored, loads, from_host_of, hosts))
            continue
        placements = [start if seg.window is None else
                      place(name, loads[slice(*seg.window)].sum(axis=0), num_ranks, redundant,
                            hosts, model)
                      for seg in segments]
        scored_segments = [(seg, p) for seg, p in zip(segments, placements)
                           if seg.start >= scored[0]]
        over = np.concatenate([overload(p, loads[seg.start:seg.stop])
                               for seg, p in scored_segments])
        cross = np.concatenate([
            cross_host_rows(p, loads[seg.start:seg.stop], from_host_of(seg.start, seg.stop), hosts)
            for seg, p in scored_segments])
        previous = [start] + placements
        moved = np.array([moved_instances(previous[i], placements[i])
                          for i, seg in enumerate(segments) if seg.window is not None])
        results.append(PolicyReplay(name, over, cross, moved, tuple(placements)))
    notes = (tuple(f"hierarchical: {line}"
                   for line in hierarchical_notes(num_ranks, redundant, hosts, model))
             if "hierarchical" in policies else ())
    return Replay(run=run, num_ranks=num_ranks, hosts=hosts, redundant=redundant, every=every,
                  window=window, segments=segments, scored=scored, model=model,
                  source_shares=uses_source_shares(run, num_ranks), policies=tuple(results),
                  notes=notes)


def recorded_replay(run, num_ranks, scored, loads, from_host_of, hosts):
    """PolicyReplay of the placement the run ran under; its moves are those between files of a
    resumed run that recorded different placements."""
    parts = recorded_parts(run, num_ranks, scored)
    if parts is None:
        raise StatsError(f"--policies {RECORDED}: {run.path} records no placement on "
                         f"{num_ranks} EP ranks for its scored steps (/layers/placement, written "
                         f"by moe_rt since it took --expert-placement)")
    over = np.concatenate([overload(p, loads[a:b]) for a, b, p in parts])
    cross = np.concatenate([cross_host_rows(p, loads[a:b], from_host_of(a, b), hosts)
                            for a, b, p in parts])
    moved = np.array([moved_instances(old, new) for (_, _, old), (_, _, new)
                      in zip(parts, parts[1:])], dtype=np.int64).reshape(-1, run.num_layers)
    return PolicyReplay(RECORDED, over, cross, moved, tuple(p for _, _, p in parts))


# ---------------------------------------------------------------------------------------------
# Summaries and tables


def layer_scopes(run):
    """[(label, routing label, [layers])]: each layer, then each kind of layer the run has, hash
    layers (routed by a fixed table) apart from top-k layers."""
    scopes = [(str(l), routing_label(kind), [l]) for l, kind in enumerate(run.routing)]
    for kind in ("topk", "hash", "forced"):
        layers = [l for l, k in enumerate(run.routing) if k == kind]
        if layers:
            scopes.append((kind, routing_label(kind), layers))
    return scopes


def summarise(policy, layers):
    """{mean, p95, worst, cross_host, moved} of `policy` over `layers`. Per scored step, the mean
    overload over the layers (a step costs the sum of its layers' stragglers), then its mean, 95th
    percentile and worst over the steps; rows crossing hosts per step; instances moved in all."""
    per_step = policy.overload[:, layers].mean(axis=1)
    return {"mean": float(per_step.mean()), "p95": float(np.percentile(per_step, PERCENTILE)),
            "worst": float(per_step.max()),
            "cross_host": float(policy.cross_host[:, layers].sum(axis=1).mean()),
            "moved": int(policy.moved[:, layers].sum()) if policy.moved.size else 0}


def describe(replay):
    """The lines above the tables: what was replayed, which steps were scored, the assumptions."""
    run, steps = replay.run, replay.scored_steps
    first_window = next(seg.window for seg in replay.segments if seg.window is not None)
    window_steps = run.steps[first_window[0]], run.steps[first_window[1] - 1]
    host_text = (f"{replay.hosts.num_hosts} hosts x {replay.hosts.ranks_per_host}"
                 if replay.hosts.num_hosts > 1 else "1 host")
    lines = [f"=== {run.attrs.get('model', 'moe_rt')} placement replay: {run.name}, "
             f"{replay.model.num_experts} experts x {replay.model.num_layers} layers on "
             f"{replay.num_ranks} EP ranks ({host_text}), {replay.redundant} redundant ==="]
    if replay.every == 0:
        lines.append(f"schedule: one placement from the loads of steps {window_steps[0]}.."
                     f"{window_steps[1]} (--window {replay.window}), scored on steps "
                     f"{steps[0]}..{steps[-1]} ({len(steps)} steps)")
    else:
        lines.append(f"schedule: re-placed every {replay.every} steps from the loads of the "
                     f"{replay.window} before, first at step {steps[0]} (from steps "
                     f"{window_steps[0]}..{window_steps[1]}); contiguous before it; scored on "
                     f"steps {steps[0]}..{steps[-1]} ({len(steps)} steps, "
                     f"{sum(s.window is not None for s in replay.segments)} re-placements)")
    lines.append("loads: expert_load - dropped; a replicated expert's rows split equally among "
                 "its replicas (the expectation of moe_rt's split by sequences)")
    lines.append("overload: max / mean rank load (1 = even); a row's value at a step is the mean "
                 "over its layers, then mean, p95 and worst over the scored steps")
    if replay.hosts.num_hosts > 1:
        if replay.source_shares:
            lines.append("cross-host rows: each source's share from /routing/source_expert_load")
        else:
            source = run.data.get("routing/source_expert_load")
            why = ("the file has no /routing/source_expert_load" if source is None else
                   f"/routing/source_expert_load has {source.shape[2]} ranks, not whole EP "
                   f"groups of {replay.num_ranks}")
            lines.append(f"cross-host rows: each source rank sends an equal share of every "
                         f"expert's rows ({why}), so every placement crosses the same "
                         f"{replay.hosts.num_hosts - 1}/{replay.hosts.num_hosts}")
    moves = "moves: instances a rank newly holds at a re-placement"
    if replay.every == 0:
        moves += " (the static placement: from the contiguous layout, once)"
    per_instance = replay.move_bytes()
    if per_instance is None:
        moves += "; bytes unknown (the configuration names no d-model or ffn-dim)"
    else:
        moves += (f", {format_bytes(per_instance)} each (36·D·F: w1, w3, w2 in float32 with "
                  f"AdamW's two moments; D={replay.model.d_model}, F={replay.model.ffn_dim})")
    lines.append(moves)
    if any(p.name == RECORDED for p in replay.policies):
        lines.append(f"{RECORDED}: the placement the run ran under, as its file records it "
                     f"(/layers/placement), over the same steps")
    lines += [f"note: {note}" for note in replay.notes]
    return lines


def format_bytes(value):
    if value is None:
        return "n/a"
    for unit, size in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{int(value)} B"


SUMMARY_HEADERS = ("Policy", "Layers", "Mean overload", f"P{PERCENTILE}", "Worst",
                   "Cross-host rows/step", "Moved instances", "Moved bytes")


def summary_rows(replay):
    """Per policy and kind of layer: the cells of the summary table."""
    per_instance = replay.move_bytes()
    rows = []
    for policy in replay.policies:
        for label, routing, layers in layer_scopes(replay.run):
            if label.isdigit():
                continue
            s = summarise(policy, layers)
            rows.append([policy.name, routing, f"{s['mean']:.3f}", f"{s['p95']:.3f}",
                         f"{s['worst']:.3f}", f"{s['cross_host']:.1f}", str(s["moved"]),
                         format_bytes(None if per_instance is None else s["moved"] * per_instance)])
    return rows


def layer_rows(replay):
    """Per layer: its mean overload over the scored steps under each policy."""
    return [[label, routing] + [f"{policy.overload[:, layers].mean():.3f}"
                                for policy in replay.policies]
            for label, routing, layers in layer_scopes(replay.run) if label.isdigit()]


def grids(replay):
    """The two tables as padded cells: summary (per policy and kind of layer), per layer."""
    summary = [list(SUMMARY_HEADERS)] + summary_rows(replay)
    per_layer = ([["Layer", "Routing"] + [p.name for p in replay.policies]]
                 + layer_rows(replay))
    return [pad_rows(table, [["<", "<"] + [">"] * (len(table[0]) - 2)] * len(table))
            for table in (summary, per_layer)]


PER_LAYER_TITLE = "mean overload per layer over the scored steps"


def render_text(replay):
    lines = describe(replay) + [""]
    summary, per_layer = grids(replay)
    for i, table in enumerate((summary, per_layer)):
        if i:
            lines += ["", PER_LAYER_TITLE]
        lines.append("  ".join(table[0]).rstrip())
        lines.append("  ".join("-" * len(cell) for cell in table[0]))
        lines += ["  ".join(row).rstrip() for row in table[1:]]
    return "\n".join(lines) + "\n"


def render_markdown(replay):
    lines = describe(replay) + [""]
    summary, per_layer = grids(replay)
    for i, table in enumerate((summary, per_layer)):
        if i:
            lines += ["", PER_LAYER_TITLE, ""]
        lines.append(markdown_line(table[0]))
        lines.append("|" + "|".join("-" * (len(cell) + 2) for cell in table[0]) + "|")
        lines += [markdown_line(row) for row in table[1:]]
    return "\n".join(lines) + "\n"


CSV_HEADERS = ("policy", "layers", "routing", "mean_overload", f"p{PERCENTILE}_overload",
               "worst_overload", "cross_host_rows_per_step", "moved_instances", "moved_bytes",
               "first_scored_step", "last_scored_step")


def render_csv(replay):
    """One row per policy and scope (each layer, then each kind of layer), full precision."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_HEADERS)
    per_instance = replay.move_bytes()
    steps = replay.scored_steps
    for policy in replay.policies:
        for label, routing, layers in layer_scopes(replay.run):
            s = summarise(policy, layers)
            writer.writerow([policy.name, label, routing, repr(s["mean"]), repr(s["p95"]),
                             repr(s["worst"]), repr(s["cross_host"]), s["moved"],
                             "" if per_instance is None else s["moved"] * per_instance,
                             int(steps[0]), int(steps[-1])])
    return out.getvalue()


# ---------------------------------------------------------------------------------------------
# Figure and files


def plot_replay(replay, out_dir, dpi=80):
    """out_dir/placement.png: the overload over the scored steps per policy (mean over the top-k
    layers, or all layers without any), and a bar per layer and policy of its mean."""
    from .plot import pyplot, save
    plt = pyplot()
    run = replay.run
    topk = [l for l, kind in enumerate(run.routing) if kind == "topk"]
    layers = topk or list(range(run.num_layers))
    fig, (ax_steps, ax_layers) = plt.subplots(2, 1, figsize=(8, 6.5), layout="constrained")
    steps = replay.scored_steps
    for i, policy in enumerate(replay.policies):
        # Line styles too: two policies that agree (hierarchical on one group is contiguous)
        # would hide one another.
        ax_steps.plot(steps, policy.overload[:, layers].mean(axis=1), LINE_STYLES[i % 3],
                      color=f"C{i}", lw=1.2, label=policy.name)
    for seg in replay.segments[1:] if replay.every else ():
        ax_steps.axvline(run.steps[seg.start] - 0.5, color="0.6", ls=":", lw=0.8)
    ax_steps.set_title(f"Rank overload per scored step ({'top-k' if topk else 'all'} layers' "
                       f"mean), {replay.num_ranks} EP ranks, {replay.redundant} redundant")
    ax_steps.set_xlabel("step")
    ax_steps.set_ylabel("max / mean rank load (1)")
    # Bars rise from 1, the even spread: their height is the excess the busiest rank carries.
    width = 0.8 / len(replay.policies)
    x = np.arange(run.num_layers)
    for i, policy in enumerate(replay.policies):
        ax_layers.bar(x + (i - (len(replay.policies) - 1) / 2) * width,
                      policy.overload.mean(axis=0) - 1.0, width, bottom=1.0, color=f"C{i}",
                      label=policy.name)
    ax_layers.set_xticks(x, [f"{l}\n{'hash' if k == 'hash' else k}"
                             for l, k in enumerate(run.routing)])
    ax_layers.set_title("Mean rank overload per layer over the scored steps")
    ax_layers.set_xlabel("layer")
    ax_layers.set_ylabel("max / mean rank load (1)")
    ax_layers.set_ylim(bottom=1.0)
    for ax in (ax_steps, ax_layers):
        ax.grid(alpha=0.3)
        ax.axhline(1.0, color="gray", lw=0.8)
    ax_steps.legend(loc="best", frameon=False)
    os.makedirs(out_dir, exist_ok=True)
    return save(plt, fig, out_dir, "placement.png", dpi)


def next_placement(run, policy, num_ranks, hosts, redundant, window):
    """(Placement, first row, stop row) that `policy` gives from the last `window` rows of the
    run: the placement for the steps after the run's last."""
    first = max(0, len(run.steps) - window)
    loads = computed_loads(run)[first:]
    placement = place(policy, loads.sum(axis=0), num_ranks, redundant, hosts, model_shape(run))
    return placement, first, len(run.steps)


def write_next_placement(path, run, policy, num_ranks, hosts, redundant, window):
    """Writes the placement `policy` would use after the run (from its last `window` steps) to
    `path`, with comment lines saying how it was made. Returns path."""
    placement, first, stop = next_placement(run, policy, num_ranks, hosts, redundant, window)
    window_loads = computed_loads(run)[first:stop].sum(axis=0, keepdims=True)     # [1, L, E]
    predicted = overload(placement, window_loads)[0]
    comments = [f"written by moe_stats.py placement, policy {policy}, {num_ranks} EP ranks on "
                f"{hosts.num_hosts} host(s), {redundant} redundant experts",
                f"from {os.path.abspath(run.path)}: the loads (expert_load - dropped) of steps "
                f"{int(run.steps[first])}..{int(run.steps[stop - 1])}, summed",
                "predicted max/mean rank load on those loads, per layer: "
                + " ".join(f"{v:.3f}" for v in predicted)]
    if policy == "hierarchical":
        comments += [f"note: {note}"
                     for note in hierarchical_notes(num_ranks, redundant, hosts, model_shape(run))]
    if int(placement.replicas().max()) > 1:
        comments.append("replicated experts: each replica takes the rows of a share of the EP "
                        "group's sequences")
    return write_placement(path, placement, comments)
