"""`moe_stats.py placement`: the offline replay of expert placement policies on a run's recorded
loads, and the placement file moe_rt --expert-placement reads. Checked: the contiguous layout
replays the file's own /routing/rank_overload; the file's reader and writer (round trip, every
kind of bad file); what each policy promises (greedy beats contiguous where it was computed,
replicas lower the max, hierarchical keeps equal counts and groups on hosts, every output a valid
placement); that the schedule never uses a scored step's loads; the command line's outputs and
its bad inputs."""
import csv
import io
import os

import numpy as np
import pytest

import moe_stats
import stats_fixture as sf
from moe_stats_lib import placement as pl
from moe_stats_lib.placement_file import (Placement, check_placement_fits, make_placement,
                                          placement_text, read_placement, write_placement)
from moe_stats_lib.placement_policies import (POLICIES, HostLayout, ModelShape, greedy,
                                              hierarchical, hierarchical_notes)


def write_loads(tmp_path, load, world, name="run.h5", **kwargs):
    return sf.write_stats(str(tmp_path / name), sf.build_loads_run(load, world, **kwargs))


def one_layer_overload(ranks, loads):
    """max / mean of the rank loads of one layer's [P] lists under the equal split."""
    placement = make_placement(len(loads), [ranks])
    return float(pl.overload(placement, np.asarray(loads, dtype=np.float64)[None, None])[0, 0])


# ---------------------------------------------------------------------------------------------
# The contiguous layout is what the run did


def test_contiguous_replays_the_files_rank_overload(run_a):
    run = moe_stats.load_run(run_a)
    for every, window in ((0, None), (1, 1), (4, 7)):
        replay = pl.replay(run, sf.WORLD, every=every, window=window, policies=("contiguous",))
        first, stop = replay.scored
        np.testing.assert_allclose(replay.policies[0].overload,
                                   run.data["routing/rank_overload"][first:stop], rtol=1e-12)
    every_row = pl.overload(pl.contiguous_placement(pl.model_shape(run), sf.WORLD),
                            pl.computed_loads(run))
    np.testing.assert_allclose(every_row, run.data["routing/rank_overload"], rtol=1e-12)


def test_contiguous_replays_uneven_blocks(tmp_path):
    """E = 10 on 3 ranks: blocks of 4, 3, 3, as moe_rt owns them."""
    load = np.random.default_rng(3).integers(0, 200, size=(12, 3, 10))
    run = moe_stats.load_run(write_loads(tmp_path, load, 3))
    replay = pl.replay(run, 3, policies=("contiguous",))
    assert replay.policies[0].placements[0].layers[0] == ((0, 1, 2, 3), (4, 5, 6), (7, 8, 9))
    np.testing.assert_allclose(replay.policies[0].overload,
                               run.data["routing/rank_overload"][3:], rtol=1e-12)


UNEVEN = [[[5, 0, 7], [1], [2, 6], [3, 4]], [[0, 1], [2, 3], [4, 5], [6, 7]]]   # [L][P]


def test_the_recorded_placement_replays_the_files_rank_overload(cli, tmp_path):
    """A run under another placement (/layers/placement): replaying it gives the file's rank
    overload; the contiguous layout does not."""
    load = np.random.default_rng(4).integers(0, 300, size=(16, 2, 8))
    path = write_loads(tmp_path, load, 4, placement=UNEVEN)
    run = moe_stats.load_run(path)
    assert run.segments[0].placement == (((0, 5, 7), (1,), (2, 6), (3, 4)),
                                         ((0, 1), (2, 3), (4, 5), (6, 7)))
    policies = pl.default_policies(run, 4)
    assert policies == ("recorded", "contiguous", "greedy", "hierarchical")
    recorded, contiguous = pl.replay(run, 4, policies=policies).policies[:2]
    stored = run.data["routing/rank_overload"][4:]
    np.testing.assert_allclose(recorded.overload, stored, rtol=1e-12)
    np.testing.assert_allclose(contiguous.overload[:, 1], stored[:, 1], rtol=1e-12)
    assert not np.allclose(contiguous.overload[:, 0], stored[:, 0])
    assert pl.default_policies(run, 2) == tuple(POLICIES)      # recorded on 4 ranks, not 2
    code, out, _ = cli("placement", path, "--ranks", "4")
    assert code == 0 and "\nrecorded      Top-K Routed" in out
    assert "recorded: the placement the run ran under" in out
    code, out, err = cli("placement", path, "--ranks", "2", "--policies", "recorded,greedy")
    assert code == 2 and "records no placement on 2 EP ranks" in err


def test_a_resumed_run_under_another_placement_moves_experts(tmp_path):
    load = np.random.default_rng(6).integers(0, 300, size=(20, 2, 8))
    first = sf.write_segment(str(tmp_path / "a.h5"), sf.build_loads_run(load, 4), 0, 10)
    first_run = moe_stats.load_run(first)
    contiguous = tuple(tuple(r) for r in pl.contiguous_placement(pl.model_shape(first_run),
                                                                  4).layers)
    assert first_run.segments[0].placement is None                # files before the dataset
    with_placement = sf.build_loads_run(load, 4, placement=[[[0, 1], [2, 3], [4, 5], [6, 7]]] * 2)
    first = sf.write_segment(str(tmp_path / "a.h5"), with_placement, 0, 10)
    uneven = sf.build_loads_run(load, 4, placement=UNEVEN)
    second = sf.write_segment(str(tmp_path / "b.h5"), uneven, 10, 20, predecessor=first)
    run = moe_stats.load_run(second)
    assert run.segments[0].placement == contiguous
    recorded = pl.replay(run, 4, policies=("recorded",)).policies[0]
    np.testing.assert_allclose(recorded.overload, run.data["routing/rank_overload"][5:],
                               rtol=1e-12)
    # Layer 0 at the resume: rank 0 newly holds 5 and 7, rank 1 expert 1, rank 2 experts 2 and
    # 6, rank 3 experts 3 and 4; layer 1 is contiguous in both files.
    assert recorded.moved.tolist() == [[7, 0]]


def test_a_bad_recorded_placement_is_refused(cli, tmp_path):
    load = np.ones((6, 2, 4), dtype=np.int64)
    run = sf.build_loads_run(load, 2, placement=[[[0, 1], [2, 3]]] * 2)
    for name, held in (("shape", np.ones((2, 2, 3), np.uint8)),
                       ("empty", np.array([[[1, 1, 1, 1], [0, 0, 0, 0]]] * 2, np.uint8))):
        path = sf.write_stats(str(tmp_path / f"{name}.h5"), {**run, "fixed": {
            "layers/placement": held}})
        code, out, err = cli("placement", path, "--ranks", "2")
        assert code == 2 and out == "" and len(err.splitlines()) == 1
        assert path in err and "/layers/placement" in err


def test_loads_are_what_the_experts_computed(run_a, tmp_path):
    """With a token capacity the loads are expert_load - dropped."""
    path = sf.write_stats(str(tmp_path / "capacity.h5"), sf.with_capacity(sf.build_run("A")))
    run = moe_stats.load_run(path)
    expected = run.data["routing/expert_load"] - run.data["routing/dropped"]
    assert run.data["routing/dropped"].any()
    np.testing.assert_array_equal(pl.computed_loads(run), expected)


# ---------------------------------------------------------------------------------------------
# The placement file


def sample_placement():
    """3 layers of 5 experts on 2 ranks: uneven counts and a replica (expert 2 in layer 1)."""
    return make_placement(5, [[[0, 1, 2], [3, 4]], [[4, 2, 0], [1, 3, 2]], [[3], [0, 1, 2, 4]]])


def test_round_trip(tmp_path):
    placement = sample_placement()
    path = write_placement(str(tmp_path / "p.txt"), placement,
                           ["policy greedy", "two lines\nof comment"])
    text = open(path).read()
    assert text.startswith("# policy greedy\n# two lines\n# of comment\nmoe_rt-placement 1\n")
    assert "layer 1: 0 2 4 | 1 2 3\n" in text        # a rank's experts in ascending order
    back = read_placement(path)
    assert back == placement
    assert back.replicas()[1].tolist() == [1, 1, 2, 1, 1]
    contiguous = pl.contiguous_placement(ModelShape(8, 7), 2)
    assert read_placement(write_placement(str(tmp_path / "c.txt"), contiguous)) == contiguous


def test_reader_takes_any_order_comments_and_blank_lines(tmp_path):
    path = tmp_path / "free.txt"
    path.write_text("\n  # made by hand\r\n moe_rt-placement   1 # the header\n\nranks 2\n"
                    "layers 2\nexperts 3  # sizes in any order\nlayer 1: 2 | 1 0\n"
                    "layer 0:2 1|0 # no spaces needed around ':' and '|'\n")
    placement = read_placement(str(path))
    assert placement == Placement(3, 2, (((1, 2), (0,)), ((2,), (0, 1))))


HEADER = "moe_rt-placement 1\nexperts 4\nlayers 2\nranks 2\n"
GOOD_LAYERS = "layer 0: 0 1 | 2 3\nlayer 1: 0 2 | 1 3\n"
BAD_FILES = {
    "empty": ("", ["empty", "moe_rt-placement 1"]),
    "missing_header": ("experts 4\nlayers 2\nranks 2\n" + GOOD_LAYERS,
                       ["line 1", "expected the header line"]),
    "wrong_version": ("# new\nmoe_rt-placement 2\n" + HEADER[19:] + GOOD_LAYERS,
                      ["line 2", "version 2"]),
    "experts_missing": ("moe_rt-placement 1\nlayers 2\nranks 2\n" + GOOD_LAYERS,
                        ["line 4", "no 'experts' line"]),
    "layers_missing": ("moe_rt-placement 1\nexperts 4\nranks 2\n", ["no 'layers' line"]),
    "ranks_missing": ("moe_rt-placement 1\nexperts 4\nlayers 2\n" + GOOD_LAYERS,
                      ["line 4", "no 'ranks' line"]),
    "experts_twice": (HEADER + "experts 4\n" + GOOD_LAYERS, ["line 5", "'experts' given twice"]),
    "ranks_twice": ("moe_rt-placement 1\nranks 2\nexperts 4\nlayers 2\nranks 2\n",
                    ["line 5", "'ranks' given twice"]),
    "size_not_positive": ("moe_rt-placement 1\nexperts 0\n", ["line 2", "one positive count"]),
    "size_after_layers": (HEADER + "layer 0: 0 1 | 2 3\nexperts 4\n",
                          ["line 6", "after the first layer line"]),
    "layer_missing": (HEADER + "layer 1: 0 1 | 2 3\n", ["layer 0 has no line"]),
    "layer_twice": (HEADER + GOOD_LAYERS + "layer 1: 0 1 | 2 3\n",
                    ["line 7", "layer 1 given twice (first on line 6)"]),
    "layer_outside": (HEADER + "layer 2: 0 1 | 2 3\n", ["line 5", "layer 2 outside [0, 2)"]),
    "no_colon": (HEADER + "layer 0 0 1 | 2 3\n", ["line 5", "expected 'layer N:"]),
    "too_few_groups": (HEADER + "layer 0: 0 1 2 3\n",
                       ["line 5", "layer 0 lists 1 ranks, the file says 'ranks 2'"]),
    "too_many_groups": (HEADER + "layer 0: 0 1 | 2 | 3\n", ["line 5", "lists 3 ranks"]),
    "expert_outside": (HEADER + "layer 0: 0 1 | 2 3\nlayer 1: 0 1 | 2 9\n",
                       ["line 6", "layer 1: rank 1: expert 9 outside [0, 4)"]),
    "empty_group": (HEADER + "layer 0: 0 1 2 3 |\n", ["line 5", "layer 0: rank 1 holds no expert"]),
    "twice_on_a_rank": (HEADER + "layer 0: 0 1 1 | 2 3\n",
                        ["line 5", "layer 0: rank 0 lists expert 1 twice"]),
    "on_no_rank": (HEADER + "layer 0: 0 1 | 2 3\nlayer 1: 0 1 | 1 2\n",
                   ["line 6", "layer 1: expert 3 is on no rank"]),
    "not_an_integer": (HEADER + "layer 0: 0 1.0 | 2 3\n",
                       ["line 5", "layer 0, rank 0: '1.0' is not an expert id"]),
    "negative": (HEADER + "layer 0: 0 1 | -2 3\n", ["'-2' is not an expert id"]),
    "unknown_line": (HEADER + "experts: 4\n", ["line 5", "unknown line 'experts: 4'"]),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_file_names_the_file_and_the_problem(tmp_path, case):
    text, words = BAD_FILES[case]
    path = tmp_path / f"{case}.txt"
    path.write_text(text)
    with pytest.raises(moe_stats.StatsError) as info:
        read_placement(str(path))
    message = str(info.value)
    assert message.startswith(str(path)), message
    assert "\n" not in message
    for word in words:
        assert word in message, message


def test_unreadable_files(tmp_path):
    for path, words in ((tmp_path / "gone.txt", "no such file"), (tmp_path, "is a directory")):
        with pytest.raises(moe_stats.StatsError, match=words):
            read_placement(str(path))
    (tmp_path / "binary.txt").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(moe_stats.StatsError, match="not a text file"):
        read_placement(str(tmp_path / "binary.txt"))


def test_file_checked_against_the_run(tmp_path):
    placement = make_placement(64, [[list(range(32)), list(range(32, 64))]])
    with pytest.raises(moe_stats.StatsError,
                       match=r"^placement.txt: the file places 64 experts, the run has 8$"):
        check_placement_fits(placement, "placement.txt", 8, 1)
    with pytest.raises(moe_stats.StatsError, match="places 2 EP ranks, the run has 4"):
        check_placement_fits(placement, "placement.txt", 64, 1, 4)
    check_placement_fits(placement, "placement.txt", 64, 1, 2)


# ---------------------------------------------------------------------------------------------
# Policies


SKEWED = np.array([56, 8, 8, 8, 8, 8, 8, 8])    # expert 0 takes half the load


def test_greedy_beats_contiguous_and_replicas_lower_the_max():
    model = ModelShape(8, 1)
    contiguous = one_layer_overload([[0, 1], [2, 3], [4, 5], [6, 7]], SKEWED)
    alone = greedy(SKEWED[None], 4, 0, HostLayout(1, 4), model)[0]
    replicated = greedy(SKEWED[None], 4, 3, HostLayout(1, 4), model)[0]
    assert contiguous == pytest.approx(64 / 28)
    assert one_layer_overload(alone, SKEWED) == pytest.approx(56 / 28)
    assert [0] in alone                                  # the hot expert alone on a rank
    assert one_layer_overload(replicated, SKEWED) == pytest.approx(30 / 28)
    assert sum(0 in rank for rank in replicated) == 4    # on every rank, a quarter each


def test_greedy_in_a_replay_beats_contiguous_where_it_was_computed(tmp_path):
    """Every step has the skewed loads: the window predicts the scored steps exactly."""
    load = np.tile(SKEWED, (8, 2, 1))
    run = moe_stats.load_run(write_loads(tmp_path, load, 4))
    by_name = {p.name: p for p in pl.replay(run, 4, redundant=0).policies}
    assert by_name["greedy"].overload.max() < by_name["contiguous"].overload.min()
    with_replicas = {p.name: p for p in pl.replay(run, 4, redundant=3).policies}
    assert with_replicas["greedy"].overload.max() < by_name["greedy"].overload.min()


def test_hierarchical_equal_counts_and_groups_on_one_host():
    rng = np.random.default_rng(5)
    loads = rng.integers(0, 1000, size=(3, 8)).astype(np.float64)
    loads[1, 5] = 20000                                     # a hot expert
    hosts = HostLayout(2, 2)
    for routing_groups, group_size in ((1, 4), (4, 2)):      # one group per host; the model's
        model = ModelShape(8, 3, routing_groups=routing_groups)
        for ranks in hierarchical(loads, 4, 0, hosts, model):
            assert [len(r) for r in ranks] == [2, 2, 2, 2]
            for g in range(8 // group_size):
                group = set(range(g * group_size, (g + 1) * group_size))
                on_hosts = {q // 2 for q, experts in enumerate(ranks) if group & set(experts)}
                assert len(on_hosts) == 1, (routing_groups, ranks)
    model = ModelShape(8, 3)
    for ranks in hierarchical(loads, 4, 4, hosts, model):       # (8 + 4) / 4 = 3 per rank
        assert [len(r) for r in ranks] == [3, 3, 3, 3]
    assert hierarchical_notes(4, 4, hosts, model) == [
        "2 expert groups of 4 (one per host), 1 per host"]


def test_hierarchical_balances_groups_over_hosts():
    """Four groups of two on two hosts: the two heaviest groups go to different hosts."""
    loads = np.array([[100, 100, 90, 90, 10, 10, 5, 5]], dtype=np.float64)
    ranks = hierarchical(loads, 4, 0, HostLayout(2, 2), ModelShape(8, 1, routing_groups=4))[0]
    host_experts = [set(ranks[0]) | set(ranks[1]), set(ranks[2]) | set(ranks[3])]
    assert {0, 1} <= host_experts[0] and {2, 3} <= host_experts[1]
    assert host_experts[0] == {0, 1, 6, 7}


def test_hierarchical_falls_back_and_says_so():
    model = ModelShape(12, 1, routing_groups=4)
    notes = hierarchical_notes(6, 2, HostLayout(3, 2), model)
    assert any("4 expert groups do not divide over 3 hosts" in n for n in notes)
    uneven = hierarchical_notes(3, 2, HostLayout(1, 3), ModelShape(8, 1))
    assert any("some ranks hold one more" in n for n in uneven)
    loads = np.arange(8, dtype=np.float64)[None] + 1
    counts = [len(r) for r in hierarchical(loads, 3, 2, HostLayout(1, 3), ModelShape(8, 1))[0]]
    assert sorted(counts) == [3, 3, 4]


@pytest.mark.parametrize("experts, ranks, redundant, hosts, groups", [
    (8, 2, 0, 1, 1), (8, 3, 2, 1, 1), (8, 4, 4, 2, 1), (8, 8, 8, 2, 4), (12, 6, 5, 3, 4),
    (16, 4, 12, 2, 4), (8, 8, 0, 4, 1), (5, 5, 20, 1, 1), (6, 4, 3, 2, 3)])
def test_every_policy_gives_a_valid_placement(experts, ranks, redundant, hosts, groups):
    rng = np.random.default_rng(experts * 100 + ranks * 10 + redundant)
    loads = rng.integers(0, 50, size=(4, experts)).astype(np.float64)
    loads[0] = 0                                              # a layer without load
    loads[1, :experts // 2] = 0                               # experts without load
    loads[2, 0] = 10000                                       # one expert takes nearly all
    model = ModelShape(experts, 4, routing_groups=groups)
    layout = HostLayout(hosts, ranks // hosts)
    for name, policy in POLICIES.items():
        layers = policy(loads, ranks, redundant, layout, model)
        placement = make_placement(experts, layers, what=name)    # raises when invalid
        assert placement.num_ranks == ranks and placement.num_layers == 4
        assert all(len(r) >= 1 for layer in placement.layers for r in layer)
        if name == "greedy":
            assert placement.replicas().sum(axis=1).tolist() == [experts + redundant] * 4


# ---------------------------------------------------------------------------------------------
# The schedule


def test_schedule_windows_end_before_their_segments():
    for rows, every, window in ((21, 0, None), (21, 0, 10), (40, 5, None), (40, 5, 12),
                                (40, 7, 3), (9, 1, 8)):
        segments, scored, used = pl.schedule(rows, every, window)
        assert segments[-1].stop == rows and scored[1] == rows
        for seg in segments:
            if seg.window is not None:
                assert seg.window[1] <= seg.start and seg.window[1] - seg.window[0] == used
                assert seg.start >= scored[0]
            else:
                assert seg.stop <= scored[0]          # contiguous rows are not scored


FLIP_A, FLIP_B = [50, 50, 14, 14], [50, 14, 50, 14]


def flip_run(tmp_path):
    """One layer of 4 experts, 24 steps: pattern A before step 12, pattern B from it."""
    load = np.array([FLIP_A] * 12 + [FLIP_B] * 12)[:, None, :]
    return moe_stats.load_run(write_loads(tmp_path, load, 2, name="flip.h5"))


def test_the_prediction_lags_a_change_of_loads(tmp_path):
    run = flip_run(tmp_path)
    replay = pl.replay(run, 2, every=6, window=6, policies=("contiguous", "greedy"))
    assert replay.scored == (6, 24)
    contiguous, greedy_replay = replay.policies
    over = greedy_replay.overload[:, 0]                          # steps 6..23
    # Steps 12..17 run the placement made from steps 6..11 (pattern A): {0, 2} | {1, 3}, bad
    # for B; from step 18 the placement made from B.
    assert greedy_replay.placements[2].layers[0] == ((0, 2), (1, 3))
    np.testing.assert_allclose(over[:6], 1.0)                    # A under A's placement
    np.testing.assert_allclose(over[6:12], 100 / 64)
    np.testing.assert_allclose(over[12:], 1.0)
    np.testing.assert_allclose(contiguous.overload[6:12, 0], 1.0)   # contiguous suits B
    assert greedy_replay.moved[:, 0].tolist() == [2, 0, 2]       # at steps 6, 12, 18
    static = pl.replay(run, 2, every=0, window=12, policies=("greedy",)).policies[0]
    np.testing.assert_allclose(static.overload[:, 0], 100 / 64)  # A's placement, scored on B


# ---------------------------------------------------------------------------------------------
# Rows crossing hosts, move costs


def test_cross_host_rows_from_the_sources_when_the_file_has_them(tmp_path):
    """Every expert's rows come from the rank that owns it under the contiguous layout: that
    layout crosses no host, while the equal-share assumption says half the rows cross."""
    load = np.random.default_rng(2).integers(1, 100, size=(8, 2, 4))
    run = sf.build_loads_run(load, 2)
    owner = np.array([0, 0, 1, 1])
    source = np.zeros(load.shape[:2] + (2,) + load.shape[2:], dtype=np.int64)    # [N, L, W, E]
    for e in range(4):
        source[:, :, owner[e], e] = load[:, :, e]
    path = str(tmp_path / "sources.h5")
    sf.write_stats(path, {**run, "datasets": {**run["datasets"],
                                              "routing/source_expert_load": source}})
    with_sources = moe_stats.load_run(path)
    replay = pl.replay(with_sources, 2, HostLayout(2, 1), policies=("contiguous",))
    assert replay.source_shares
    np.testing.assert_allclose(replay.policies[0].cross_host, 0.0)
    equal = pl.replay(moe_stats.load_run(write_loads(tmp_path, load, 2)), 2, HostLayout(2, 1),
                      policies=("contiguous",))
    assert not equal.source_shares
    np.testing.assert_allclose(equal.policies[0].cross_host, load[2:].sum(axis=2) / 2)


def test_move_bytes_follow_the_model(cli, tmp_path):
    load = np.array([FLIP_A] * 12 + [FLIP_B] * 12)[:, None, :]
    path = write_loads(tmp_path, load, 2, config={"d-model": 16, "ffn-dim": 32})
    code, out, err = cli("placement", path, "--ranks", "2", "--every", "6", "--policies",
                         "greedy", "--csv")
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    layer0 = next(r for r in rows if r["layers"] == "0")
    assert int(layer0["moved_instances"]) == 4
    assert int(layer0["moved_bytes"]) == 4 * 36 * 16 * 32


# ---------------------------------------------------------------------------------------------
# Command line


def test_text_table(cli, run_a):
    code, out, err = cli("placement", run_a, "--ranks", "2")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith("=== micro placement replay: run_a.h5, 4 experts x 6 layers on 2 "
                               "EP ranks")
    assert "scored on steps 5..20 (16 steps)" in lines[1]
    assert "from the loads of steps 0..4" in lines[1]
    summary = [line.split() for line in lines if line.startswith(("contiguous ", "greedy "))]
    means = {(cells[0], cells[1]): float(cells[3]) for cells in summary if len(cells) > 3
             and cells[1] in ("Top-K", "Hash")}
    assert means[("greedy", "Top-K")] <= means[("contiguous", "Top-K")]
    assert "mean overload per layer over the scored steps" in out


def test_markdown_and_csv(cli, run_a):
    code, out, _ = cli("placement", run_a, "--ranks", "2", "--markdown", "--every", "5")
    assert code == 0
    table = [line for line in out.splitlines() if line.startswith("|")]
    assert table[0].startswith("| Policy") and len(table) == 2 + 6 + 2 + 6
    code, out, _ = cli("placement", run_a, "--ranks", "2", "--csv", "--policies",
                       "contiguous,hierarchical")
    assert code == 0
    rows = list(csv.reader(io.StringIO(out)))
    assert tuple(rows[0]) == pl.CSV_HEADERS
    assert len(rows) == 1 + 2 * (sf.NUM_LAYERS + 2)
    run = moe_stats.load_run(run_a)
    layer2 = next(r for r in rows[1:] if r[:2] == ["contiguous", "2"])
    assert float(layer2[3]) == pytest.approx(run.data["routing/rank_overload"][5:, 2].mean(),
                                             rel=1e-12)
    assert layer2[-2:] == ["5", "20"]


def test_figure_and_written_placements(cli, run_a, tmp_path):
    figures = tmp_path / "figures"
    greedy_file, hier_file = tmp_path / "greedy.txt", tmp_path / "hier.txt"
    code, out, err = cli("placement", run_a, "--ranks", "2", "--redundant", "2", "--window", "4",
                         "--out", figures, "--write", f"greedy:{greedy_file}",
                         "--write", f"hierarchical:{hier_file}")
    assert code == 0, err
    assert os.listdir(figures) == ["placement.png"]
    assert str(figures / "placement.png") in out and str(greedy_file) in out
    run = moe_stats.load_run(run_a)
    for path in (greedy_file, hier_file):
        placement = read_placement(str(path))
        check_placement_fits(placement, str(path), run.num_experts, run.num_layers, 2)
        assert placement.replicas().sum() == (sf.NUM_EXPERTS + 2) * sf.NUM_LAYERS
    text = greedy_file.read_text()
    assert "policy greedy" in text and "steps 17..20" in text and os.path.abspath(run_a) in text
    assert "predicted max/mean rank load" in text
    # What the file says is what the policy gives from the last 4 steps.
    expected, _, _ = pl.next_placement(run, "greedy", 2, HostLayout(1, 2), 2, 4)
    assert read_placement(str(greedy_file)) == expected


def test_a_chain_is_replayed_whole(cli, tmp_path):
    run = sf.build_run("A")
    first = sf.write_segment(str(tmp_path / "r0.h5"), run, 0, 11)
    second = sf.write_segment(str(tmp_path / "r1.h5"), run, 11, 21, predecessor=first)
    code, out, _ = cli("placement", second, "--ranks", "2")
    assert code == 0 and "scored on steps 5..20" in out
    code, out, _ = cli("placement", second, "--ranks", "2", "--no-chain")
    assert code == 0 and "scored on steps 13..20" in out


def test_bad_inputs_are_one_line_and_exit_2(cli, run_a, tmp_path):
    no_load = sf.write_stats(str(tmp_path / "no_load.h5"), sf.build_run("A"),
                             drop=("routing/expert_load",))
    cases = [
        (["--ranks", "2", "--policies", "greedy,lpt"], "unknown policy 'lpt'"),
        (["--ranks", "0"], "--ranks 0"),
        (["--ranks", "5"], "--ranks 5: expected 1 to 4 EP ranks"),
        (["--ranks", "2", "--redundant", "-1"], "--redundant -1"),
        (["--ranks", "2", "--redundant", "5"], "at most 4 replicas fit"),
        (["--ranks", "2", "--hosts", "3"], "--hosts 3: the hosts must divide the 2 EP ranks"),
        (["--ranks", "4", "--ranks-per-host", "3"], "--ranks-per-host 3"),
        (["--ranks", "2", "--window", "21"], "--window 21 leaves no step to score"),
        (["--ranks", "2", "--window", "0"], "--window 0"),
        (["--ranks", "2", "--every", "-1"], "--every -1"),
        (["--ranks", "2", "--every", "30"], "no re-placement within the run's 21 steps"),
        (["--ranks", "2", "--every", "5", "--window", "21"], "no re-placement"),
        (["--ranks", "2", "--write", "greedy"], "expected POLICY:FILE"),
        (["--ranks", "2", "--write", "best:x.txt"], "unknown policy 'best'"),
        (["--ranks", "2", "--write", f"greedy:{tmp_path}/no/such/dir/p.txt"],
         "cannot write the placement"),
    ]
    for argv, words in cases:
        code, out, err = cli("placement", run_a, *argv)
        assert code == 2, (argv, out, err)
        assert out == ""
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("moe_stats.py: error: "), err
        assert words in lines[0], (argv, lines[0])
    code, out, err = cli("placement", no_load, "--ranks", "2")
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert no_load in err and "/routing/expert_load" in err


def test_placement_text_matches_the_format():
    text = placement_text(sample_placement(), ["a comment"])
    assert text.splitlines() == ["# a comment", "moe_rt-placement 1", "experts 5", "layers 3",
                                 "ranks 2", "layer 0: 0 1 2 | 3 4", "layer 1: 0 2 4 | 1 2 3",
                                 "layer 2: 3 | 0 1 2 4"]
