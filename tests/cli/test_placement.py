"""--expert-placement: any placement changes no bit (losses, loads, bias, parameters, checkpoints),
a run resumes under another placement bitwise, the statistics file records the placement and the
rank loads it gave, and bad placement files end with one clear line and exit 2 on every rank."""
import csv
import io
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

from test_bad_input import assert_one_clear_error
from test_checkpoint import (assert_continues_bitwise, assert_same_arrays, checkpoint_arrays, ok)

# micro: E = 4 experts, L = 3 layers (the first a hash layer); 2 ranks form one EP group.
MICRO = ["--model", "micro"]
HEADER = "moe_rt-placement 1\nexperts 4\nlayers 3\nranks 2\n"
# Uneven and permuted, every layer its own.
PERMUTED = HEADER + "layer 0: 3 | 0 1 2\nlayer 1: 2 0 | 3 1\nlayer 2: 1 2 3 | 0\n"
# With replicas: expert 0 on both ranks in layer 0, experts 1 and 3 in layer 1, all in layer 2.
REPLICATED = HEADER + ("layer 0: 0 3 | 0 1 2\nlayer 1: 1 2 3 | 0 1 3\n"
                       "layer 2: 0 1 2 3 | 3 2 1 0\n")


def write(tmp_path, text, name="placement.txt"):
    path = tmp_path / name
    path.write_text(text)
    return path


def digest(proc):
    lines = [line for line in proc.stdout.splitlines() if "digest" in line]
    assert lines, proc.stdout
    return lines[-1].split()[-1]


def test_placement_changes_no_bit(moe_rt_bin, tmp_path):
    base = MICRO + ["--steps", 6, "--checkpoint-every", 6]
    a = ok(moe_rt_bin, base + ["--stats", tmp_path / "a.h5"], 2)
    b = ok(moe_rt_bin, base + ["--stats", tmp_path / "b.h5",
                               "--expert-placement", write(tmp_path, PERMUTED)], 2)
    assert digest(a) == digest(b)
    assert_continues_bitwise(tmp_path / "a.h5", tmp_path / "b.h5",
                             tmp_path / "a-checkpoints" / "step-00000005.h5",
                             tmp_path / "b-checkpoints" / "step-00000005.h5")
    with h5py.File(tmp_path / "a.h5", "r") as fa, h5py.File(tmp_path / "b.h5", "r") as fb:
        contiguous, placed = fa["layers/placement"][...], fb["layers/placement"][...]
        assert contiguous.shape == placed.shape == (3, 2, 4)
        assert (contiguous[:, 0] == [1, 1, 0, 0]).all() and (contiguous[:, 1] == [0, 0, 1, 1]).all()
        assert placed[0].tolist() == [[0, 0, 0, 1], [1, 1, 1, 0]]
        assert placed[2].tolist() == [[0, 1, 1, 1], [1, 0, 0, 0]]
        assert fb["config"].attrs["expert-placement"] == str(tmp_path / "placement.txt")
        # Each rank receives the rows of the experts it holds: with one EP group and no drops, its
        # load is the sum of their loads, under either placement.
        for f, holds in ((fa, contiguous), (fb, placed)):
            load, rank_load = f["routing/expert_load"][...], f["routing/rank_load"][...]
            assert (rank_load == np.einsum("sle,lqe->slq", load, holds)).all()
            over = rank_load.max(axis=2) / rank_load.mean(axis=2)
            assert np.array_equal(f["routing/rank_overload"][...], over)
        assert not np.array_equal(fa["routing/rank_load"][...], fb["routing/rank_load"][...])


def test_replicated_experts_change_no_bit(moe_rt_bin, tmp_path):
    # A replica takes the rows of its chunk of the sequences (4 a rank here: 8 in the group),
    # and its gradient adds along the same tree; the checkpoint holds each expert once.
    base = MICRO + ["--steps", 6, "--checkpoint-every", 6, "--batch-per-rank", 4]
    a = ok(moe_rt_bin, base + ["--stats", tmp_path / "a.h5"], 2)
    b = ok(moe_rt_bin, base + ["--stats", tmp_path / "b.h5",
                               "--expert-placement", write(tmp_path, REPLICATED)], 2)
    assert digest(a) == digest(b)
    assert_continues_bitwise(tmp_path / "a.h5", tmp_path / "b.h5",
                             tmp_path / "a-checkpoints" / "step-00000005.h5",
                             tmp_path / "b-checkpoints" / "step-00000005.h5")
    with h5py.File(tmp_path / "b.h5", "r") as f:
        holds, load = f["layers/placement"][...], f["routing/expert_load"][...]
        rank_load = f["routing/rank_load"][...]
        assert holds[2].tolist() == [[1, 1, 1, 1], [1, 1, 1, 1]]
        # Every row is received once, by one replica: the ranks' loads add up to the experts'.
        assert (rank_load.sum(axis=2) == load.sum(axis=2)).all()
        # Layer 2: rank 0 takes the first 4 sequences of every expert, rank 1 the last 4.
        assert (rank_load[:, 2, 0] > 0).all() and (rank_load[:, 2, 1] > 0).all()
    # Four ranks in two EP groups of two, with the same replicated placement: the same bits.
    c = ok(moe_rt_bin, MICRO + ["--steps", 6, "--batch-per-rank", 2, "--ep", 2, "--stats", "none",
                                "--expert-placement", tmp_path / "placement.txt"], 4)
    assert digest(c) == digest(a)


def test_resume_under_another_placement(moe_rt_bin, tmp_path):
    # Checkpoints name experts by global id: a run placed one way resumes placed another, bitwise.
    base = MICRO + ["--checkpoint-every", 4, "--warmup-steps", 2]
    ok(moe_rt_bin, base + ["--steps", 8, "--stats", tmp_path / "full.h5"], 2)
    ok(moe_rt_bin, base + ["--steps", 4, "--lr-decay-steps", 8, "--stats", tmp_path / "a.h5",
                           "--expert-placement", write(tmp_path, PERMUTED)], 2)
    other = HEADER + "layer 0: 0 2 | 1 3 0\nlayer 1: 0 | 1 2 3\nlayer 2: 0 1 3 | 2 1\n"
    ok(moe_rt_bin, ["--resume", tmp_path / "a-checkpoints", "--steps", 8, "--stats",
                    tmp_path / "b.h5", "--expert-placement", write(tmp_path, other, "other.txt")], 2)
    assert_continues_bitwise(tmp_path / "full.h5", tmp_path / "b.h5",
                             tmp_path / "full-checkpoints" / "step-00000007.h5",
                             tmp_path / "a-checkpoints" / "step-00000007.h5")
    # And from a placed run back to contiguous blocks on one rank.
    ok(moe_rt_bin, ["--resume", tmp_path / "a-checkpoints" / "step-00000003.h5", "--steps", 8,
                    "--stats", tmp_path / "c.h5", "--checkpoint-dir", tmp_path / "c-ck"], 1)
    assert_same_arrays(checkpoint_arrays(tmp_path / "full-checkpoints" / "step-00000007.h5"),
                       checkpoint_arrays(tmp_path / "c-ck" / "step-00000007.h5"))


def layers(*lines):
    return HEADER + "".join(line + "\n" for line in lines)


GOOD = ["layer 0: 0 1 | 2 3", "layer 1: 0 1 | 2 3", "layer 2: 0 1 | 2 3"]


@pytest.mark.parametrize("text,words", [
    ("", ["empty", "moe_rt-placement 1"]),
    ("moe_rt-placement 2\n", ["line 1", "expected the header line"]),
    ("# only a comment\nexperts 4\n", ["line 2", "expected the header line"]),
    ("moe_rt-placement 1\nexperts 4\nlayers 3\n" + "\n".join(GOOD), ["no 'ranks' line"]),
    ("moe_rt-placement 1\nexperts 4\nexperts 4\n", ["line 3", "'experts' given twice"]),
    ("moe_rt-placement 1\nexperts -4\n", ["line 2", "'experts' needs one positive count"]),
    ("moe_rt-placement 1\nexperts 8\nlayers 3\nranks 2\nlayer 0: 0 | 1\n",
     ["8 experts in 3 layers", "model has 4 experts in 3 layers", "another model"]),
    ("moe_rt-placement 1\nexperts 4\nlayers 3\nranks 4\nlayer 0: 0 | 1 | 2 | 3\n",
     ["on 4 EP ranks", "EP group has 2"]),
    (layers(*GOOD[:2]), ["layer 2 has no line"]),
    (layers(*GOOD, "layer 1: 0 1 | 2 3"), ["line 8", "layer 1 given twice"]),
    (layers(GOOD[0], GOOD[1], "layer 3: 0 1 | 2 3"), ["line 7", "layer 3 outside [0, 3)"]),
    (layers(GOOD[0], "layer 1: 0 1 2 3", GOOD[2]), ["line 6", "layer 1 lists 1 ranks"]),
    (layers(GOOD[0], "layer 1: 0 | 1 | 2 3", GOOD[2]), ["layer 1 lists more than 2 ranks"]),
    (layers(GOOD[0], "layer 1: 0 1 | 2 4", GOOD[2]), ["line 6", "rank 1: expert 4 outside"]),
    (layers(GOOD[0], "layer 1: 0 1 2 3 |", GOOD[2]), ["layer 1: rank 1 holds no expert"]),
    (layers(GOOD[0], "layer 1: 0 1 1 | 2 3", GOOD[2]), ["rank 0 lists expert 1 twice"]),
    (layers(GOOD[0], "layer 1: 0 1 | 2", GOOD[2]), ["layer 1: expert 3 is on no rank"]),
    (layers(GOOD[0], "layer 1: 0 x | 2 3", GOOD[2]), ["'x' is not an expert id"]),
    (layers(GOOD[0], "layer 1: 0 +1 | 2 3", GOOD[2]), ["'+1' is not an expert id"]),
    (layers(GOOD[0], "layer 1: -0 1 | 2 3", GOOD[2]), ["'-0' is not an expert id"]),
    (layers(GOOD[0], "layer 1: 0 1 | 2 3" + " 9" * 4000, GOOD[2]), ["expert 9 outside [0, 4)"]),
    (layers(GOOD[0], "layer 1 0 1 | 2 3", GOOD[2]), ["expected 'layer N:"]),
    (layers(*GOOD, "ranks 2"), ["'ranks' after the first layer line"]),
    (layers(*GOOD, "shuffle experts"), ["unknown line 'shuffle experts'"]),
])
def test_bad_placement_file(run_moe, tmp_path, text, words):
    path = write(tmp_path, text)
    proc = run_moe(MICRO + ["--steps", "2", "--stats", "none", "--expert-placement", str(path)])
    assert proc.returncode == 2, proc.stderr
    assert_one_clear_error(proc, "expert placement file", str(path), *words)


@pytest.mark.parametrize("make,words", [
    (lambda p: p / "missing.txt", ["missing"]),
    (lambda p: p, ["not a regular file"]),
])
def test_placement_path_that_is_no_file(run_moe, tmp_path, make, words):
    proc = run_moe(MICRO + ["--steps", "2", "--stats", "none", "--expert-placement",
                            str(make(tmp_path))])
    assert proc.returncode == 2, proc.stderr
    assert_one_clear_error(proc, "expert placement file", *words)


def test_comments_blank_lines_and_any_order_are_read(run_moe, tmp_path):
    text = ("# written by hand\n\nmoe_rt-placement 1   # the format\nranks 2\nlayers 3\n"
            "experts 4\nlayer 2: 3 2 | 1 0\n  layer 0:1|0 2 3\t\nlayer 1: 0 3 | 1 2 # hot pair\n")
    proc = run_moe(MICRO + ["--steps", "2", "--stats", "none", "--expert-placement",
                            str(write(tmp_path, text))])
    assert proc.returncode == 0, proc.stderr


# ---- the replay against real runs -----------------------------------------------------------


def moe_stats(*args):
    script = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "moe_stats.py")
    proc = subprocess.run([sys.executable, script] + [str(a) for a in args], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def replayed_overload(path, policy, window=2):
    rows = csv.DictReader(io.StringIO(moe_stats("placement", path, "--ranks", 2, "--window",
                                                window, "--policies", policy, "--csv")))
    return {int(r["layers"]): float(r["mean_overload"]) for r in rows
            if r["policy"] == policy and r["layers"].isdigit()}  # per layer, not the summaries


def test_replayed_placements_run_and_predict_the_rank_loads(moe_rt_bin, tmp_path):
    # A run that balances badly; the replay's contiguous layout is its own rank overload; the
    # placements the replay writes run (the same bits), and the replay of each run's recorded
    # placement is that run's rank overload.
    base = MICRO + ["--steps", 8, "--force-balance", "zipf:1.2", "--batch-per-rank", 4]
    a = ok(moe_rt_bin, base + ["--stats", tmp_path / "a.h5"], 2)
    with h5py.File(tmp_path / "a.h5", "r") as f:
        own = f["routing/rank_overload"][...][2:].mean(axis=0)
        source = f["routing/source_expert_load"][...]
        load, dropped = f["routing/expert_load"][...], f["routing/dropped"][...]
        assert source.shape == (8, 3, 2, 4)
        assert (source.sum(axis=2) == load - dropped).all()
    assert np.allclose(list(replayed_overload(tmp_path / "a.h5", "contiguous").values()), own,
                       rtol=1e-12)
    moe_stats("placement", tmp_path / "a.h5", "--ranks", 2, "--window", 4,
              "--write", f"greedy:{tmp_path / 'greedy.txt'}")
    moe_stats("placement", tmp_path / "a.h5", "--ranks", 2, "--window", 4, "--redundant", 2,
              "--write", f"hierarchical:{tmp_path / 'replicated.txt'}")
    for name in ("greedy", "replicated"):
        b = ok(moe_rt_bin, base + ["--stats", tmp_path / f"{name}.h5", "--expert-placement",
                                   tmp_path / f"{name}.txt"], 2)
        assert digest(b) == digest(a), name
    with h5py.File(tmp_path / "greedy.h5", "r") as f:
        placed = f["routing/rank_overload"][...][2:].mean(axis=0)
    assert np.allclose(list(replayed_overload(tmp_path / "greedy.h5", "recorded").values()),
                       placed, rtol=1e-12)
    assert placed.mean() < own.mean()
