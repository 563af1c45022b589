"""Long runs through the command line: checkpoints and --resume (bitwise at the same rank count,
the exact state at another), the statistics chain of a resumed run, stop signals (a rank's own,
and mpirun's), the non-finite stop, a kill during checkpoint writes, and bad checkpoints.
docs/checkpoints.md says what each promise is."""
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib

import h5py
import numpy as np
import pytest

from conftest import launcher, run_env
from stats_read import checkpoint_arrays, wait_for_rows  # tests/stats_read.py
from test_stats_file import complete_rows, open_stats, rank_process, remove_shared_memory_of

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
from moe_stats_lib.chain import load_run  # noqa: E402

MICRO = ["--model", "micro"]
# Per-step values that must continue bit for bit: everything but timings.
EXACT = ("steps/step", "steps/loss", "steps/balance_loss", "steps/grad_norm", "steps/lr",
         "routing/expert_load", "routing/bias", "routing/load_variance",
         "routing/max_violation")
def moe(moe_rt_bin, args, np_, timeout=180):
    try:
        proc = subprocess.run(launcher(np_) + [moe_rt_bin] + [str(a) for a in args],
                              env=run_env(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"moe_rt {args} hung for more than {timeout} s")
    return proc


def ok(moe_rt_bin, args, np_):
    proc = moe(moe_rt_bin, args, np_)
    assert proc.returncode == 0, proc.stderr
    return proc


def assert_same_arrays(a, b):
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].tobytes() == b[name].tobytes(), name


def error_lines(stderr):
    return [line for line in stderr.splitlines() if line.startswith("moe_rt: error:")]


def listing(path):
    return sorted(os.listdir(path))


# ---- bitwise continuation -------------------------------------------------------------------


def assert_continues_bitwise(full_stats, resumed_stats, full_checkpoint, resumed_checkpoint):
    full, chained = load_run(str(full_stats)), load_run(str(resumed_stats))
    for name in EXACT:
        assert chained.data[name].tobytes() == full.data[name].tobytes(), name
    if full_checkpoint is not None:
        assert_same_arrays(checkpoint_arrays(full_checkpoint), checkpoint_arrays(resumed_checkpoint))
    return chained


# micro with 8 experts: one EP group spans 8 ranks, as it does 2 and 1 (bitwise rank-count
# invariance needs that, and a power-of-two number of sequences per rank).
MICRO8 = MICRO + ["--experts", "8"]


def test_resume_bitwise_at_8_ranks_and_from_8_to_2(moe_rt_bin, tmp_path):
    # 24 uninterrupted steps on 8 ranks; 12 steps (the schedule planned for 24) + 12 resumed.
    base = MICRO8 + ["--checkpoint-every", "6"]
    ok(moe_rt_bin, base + ["--steps", 24, "--stats", tmp_path / "full.h5"], 8)
    ok(moe_rt_bin, base + ["--steps", 12, "--lr-decay-steps", 24, "--stats", tmp_path / "a.h5"], 8)
    first = tmp_path / "a-checkpoints"
    assert listing(first) == ["step-00000005.h5", "step-00000011.h5"]
    # 8 -> 2 first, into a folder of its own (the 8 -> 8 run below prunes the shared one).
    ok(moe_rt_bin, ["--resume", first / "step-00000011.h5", "--steps", 24,
                    "--stats", tmp_path / "b2.h5", "--checkpoint-dir", tmp_path / "b2ck"], 2)
    ok(moe_rt_bin, ["--resume", first, "--steps", 24, "--stats", tmp_path / "b8.h5"], 8)
    # The resumed run continues in its checkpoint's folder, keeping the newest two.
    assert listing(first) == ["step-00000017.h5", "step-00000023.h5"]
    final = tmp_path / "full-checkpoints" / "step-00000023.h5"
    chained = assert_continues_bitwise(tmp_path / "full.h5", tmp_path / "b8.h5", final,
                                       first / "step-00000023.h5")
    assert [s.world_size for s in chained.segments] == [8, 8]
    chained = assert_continues_bitwise(tmp_path / "full.h5", tmp_path / "b2.h5", final,
                                       tmp_path / "b2ck" / "step-00000023.h5")
    assert [s.world_size for s in chained.segments] == [8, 2]


def test_resume_bitwise_from_2_ranks_on_1(moe_rt_bin, tmp_path):
    base = MICRO + ["--checkpoint-every", "4"]
    ok(moe_rt_bin, base + ["--steps", 12, "--stats", tmp_path / "full.h5"], 2)
    ok(moe_rt_bin, base + ["--steps", 8, "--lr-decay-steps", 12, "--stats", tmp_path / "a.h5"], 2)
    proc = ok(moe_rt_bin, ["--resume", tmp_path / "a-checkpoints", "--steps", 12,
                           "--stats", tmp_path / "b.h5"], 1)
    assert "batch-per-rank         2" in proc.stdout  # the global batch of 2, on one rank
    assert_continues_bitwise(tmp_path / "full.h5", tmp_path / "b.h5",
                             tmp_path / "full-checkpoints" / "step-00000011.h5",
                             tmp_path / "a-checkpoints" / "step-00000011.h5")
    with h5py.File(tmp_path / "b.h5", "r") as f:
        assert f.attrs["resumed_from"] == str(tmp_path / "a.h5")
        assert f.attrs["resumed_from_step"] == 7
        assert f["steps/step"][0] == 8


def test_resume_of_a_run_without_statistics_records_its_step(moe_rt_bin, tmp_path):
    # The first run kept no statistics file: the resumed run's file has no predecessor to name,
    # but still says where its rows begin (it used to say nothing, and read as a run from step 0).
    ok(moe_rt_bin, MICRO + ["--steps", 4, "--stats", "none", "--checkpoint-every", 2,
                            "--checkpoint-dir", tmp_path / "ck"], 1)
    ok(moe_rt_bin, ["--resume", tmp_path / "ck", "--steps", 6, "--stats", tmp_path / "b.h5"], 1)
    with h5py.File(tmp_path / "b.h5", "r") as f:
        assert "resumed_from" not in f.attrs
        assert f.attrs["resumed_from_step"] == 3
        assert list(f["steps/step"][...]) == [4, 5]
    run = load_run(str(tmp_path / "b.h5"))
    assert list(run.steps) == [4, 5] and run.segments[0].resumed_from_step == 3


def test_resume_bitwise_from_two_ep_groups_to_one(moe_rt_bin, tmp_path):
    # micro has 4 experts: 8 ranks form two EP groups of 4, whose expert gradients are added
    # along the sequence tree (model/expert_grads.hpp); resumed on 2 ranks (one group).
    base = MICRO + ["--checkpoint-every", "4"]
    ok(moe_rt_bin, base + ["--steps", 12, "--stats", tmp_path / "full.h5"], 8)
    ok(moe_rt_bin, base + ["--steps", 8, "--lr-decay-steps", 12, "--stats", tmp_path / "a.h5"], 8)
    ok(moe_rt_bin, ["--resume", tmp_path / "a-checkpoints", "--steps", 12,
                    "--stats", tmp_path / "b.h5"], 2)
    chained = assert_continues_bitwise(tmp_path / "full.h5", tmp_path / "b.h5",
                                       tmp_path / "full-checkpoints" / "step-00000011.h5",
                                       tmp_path / "a-checkpoints" / "step-00000011.h5")
    assert [s.world_size for s in chained.segments] == [8, 2]


# ---- signals --------------------------------------------------------------------------------


def start(moe_rt_bin, args, np_):
    return subprocess.Popen(launcher(np_) + [moe_rt_bin] + [str(a) for a in args], env=run_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def finish(proc, limit):
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        _, env = rank_process(proc.pid, 0)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        remove_shared_memory_of(env)
        pytest.fail(f"the job did not end within {limit} s of the signal")
    return out, err


def assert_closed_cleanly(path):
    with h5py.File(path, "r") as f:  # plain open: no SWMR-write flag left
        n = complete_rows(f)
        assert list(f["steps/step"][...]) == list(range(n))
    subprocess.run(["h5dump", "-H", str(path)], check=True, capture_output=True)
    return n


def test_sigterm_stops_at_a_step_boundary_and_resume_is_identical(moe_rt_bin, tmp_path):
    stats, horizon = tmp_path / "s.h5", 10**6
    # No periodic checkpoint however far the run gets before the signal: the stop's is the only.
    proc = start(moe_rt_bin, MICRO + ["--steps", horizon, "--stats", stats,
                                      "--checkpoint-every", horizon], 2)
    wait_for_rows(stats, 10, proc)
    victim, _ = rank_process(proc.pid, 1)  # one rank only: the other learns of it in the step
    os.kill(victim, signal.SIGTERM)
    _, err = finish(proc, 30)
    assert proc.returncode == 128 + signal.SIGTERM, err
    n = assert_closed_cleanly(stats)
    assert f"stopped by SIGTERM after step {n - 1};" in err, err
    assert listing(tmp_path / "s-checkpoints") == [f"step-{n - 1:08d}.h5"]

    end = n + 10  # a run as long as the first planned would take minutes: 10 steps more
    ok(moe_rt_bin, ["--resume", tmp_path / "s-checkpoints", "--steps", end,
                    "--stats", tmp_path / "r.h5"], 2)
    ok(moe_rt_bin, MICRO + ["--steps", end, "--lr-decay-steps", horizon,
                            "--stats", tmp_path / "full.h5"], 2)
    assert_continues_bitwise(tmp_path / "full.h5", tmp_path / "r.h5", None, None)


@pytest.mark.parametrize("np_", [2, 8])
def test_sigint_to_mpirun_ends_within_seconds_with_a_closed_file(moe_rt_bin, tmp_path, np_):
    # Ctrl-C reaches mpirun, which passes SIGTERM to the ranks one second later and kills them
    # one second after that (Open MPI's odls_base_sigkill_timeout): the ranks stop in between.
    stats = tmp_path / "i.h5"
    proc = start(moe_rt_bin, MICRO + ["--steps", 10**6, "--stats", stats], np_)
    wait_for_rows(stats, 5, proc)
    sent = time.time()
    os.kill(proc.pid, signal.SIGINT)
    _, err = finish(proc, 30)
    assert time.time() - sent < 10
    assert proc.returncode != 0
    assert "stopped by SIGTERM after step" in err, err
    assert assert_closed_cleanly(stats) >= 5


def test_stop_message_is_a_line_of_its_own_in_a_merged_log(moe_rt_bin, tmp_path):
    # mpirun forwards the ranks' stdout (step lines) and stderr (the stop message) separately;
    # once signalled it reads the rest of stdout only as the job ends, in pieces, and the message
    # overtook them, landing inside a step line (3 of 4 runs). A few runs, each logged as
    # `mpirun ... 2>&1` would.
    for attempt in range(3):
        stats = tmp_path / f"m{attempt}.h5"
        proc = subprocess.Popen(launcher(2) + [moe_rt_bin] + MICRO +
                                ["--steps", str(10**6), "--stats", str(stats)],
                                env=run_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        wait_for_rows(stats, 200, proc)
        os.kill(proc.pid, signal.SIGTERM)
        log, _ = finish(proc, 30)
        stops = [line for line in log.splitlines() if "stopped by SIGTERM" in line]
        assert len(stops) == 1, log[-2000:]
        assert stops[0].startswith("moe_rt: stopped by SIGTERM after step "), stops[0]


def test_a_second_signal_ends_the_rank_at_once(moe_rt_bin, tmp_path):
    # The first signal asks for a stop after the step; the second, while that step, its
    # checkpoint and the close still run (100+ ms for deepseek4-tiny), takes the default action.
    stats = tmp_path / "twice.h5"
    proc = start(moe_rt_bin, ["--steps", 10**6, "--stats", stats, "--checkpoint-every", 1000,
                              "--checkpoint-dir", tmp_path / "ck"], 1)
    wait_for_rows(stats, 2, proc)
    victim, _ = rank_process(proc.pid, 0)
    os.kill(victim, signal.SIGTERM)
    time.sleep(0.02)
    os.kill(victim, signal.SIGTERM)
    _, err = finish(proc, 30)
    assert proc.returncode != 0
    assert "stopped by" not in err and "signal 15" in err, err
    # Rows flushed before the kill are complete; the file is read as a killed run's.
    with open_stats(stats) as f:
        assert complete_rows(f) >= 2


def test_a_checkpoint_that_cannot_be_written_stops_the_run_cleanly(moe_rt_bin, tmp_path):
    stats, folder = tmp_path / "w.h5", tmp_path / "ck"
    proc = start(moe_rt_bin, MICRO + ["--steps", 10**6, "--stats", stats, "--checkpoint-every", 50,
                                      "--checkpoint-dir", folder], 2)
    wait_for_rows(stats, 60, proc)  # a checkpoint written, the folder in use
    # Moved away in one step (the run keeps writing into it), then a file takes its name.
    folder.rename(tmp_path / "moved")
    folder.write_text("the folder is gone: a file of its name stands there")
    _, err = finish(proc, 60)
    assert proc.returncode == 3, err
    errors = error_lines(err)
    assert len(errors) == 1 and "checkpoint" in errors[0] and "stopped" in errors[0], err
    assert assert_closed_cleanly(stats) >= 60


# ---- non-finite values ----------------------------------------------------------------------


@pytest.mark.parametrize("routing", [[], ["--force-balance", "round-robin"]])
def test_a_non_finite_loss_stops_the_run(moe_rt_bin, tmp_path, routing):
    stats = tmp_path / "n.h5"
    proc = moe(moe_rt_bin, MICRO + routing + ["--steps", 30, "--lr", "1e6", "--grad-clip", 0,
                                              "--stats", stats, "--checkpoint-every", 1], 2)
    assert proc.returncode == 4, proc.stderr
    errors = error_lines(proc.stderr)
    assert len(errors) == 1, proc.stderr
    with h5py.File(stats, "r") as f:
        loss = f["steps/loss"][...]
    bad = len(loss) - 1
    assert f"step {bad}: loss" in errors[0] and "not finite" in errors[0], errors[0]
    assert np.isfinite(loss[:bad]).all() and not np.isfinite(loss[bad])
    # The newest checkpoint is the last finite step's.
    assert listing(tmp_path / "n-checkpoints")[-1] == f"step-{bad - 1:08d}.h5"
    assert f"step-{bad - 1:08d}.h5" in errors[0]


# ---- a kill during checkpoint writes ------------------------------------------------------


def test_sigkill_during_checkpoint_writes_then_resume(moe_rt_bin, tmp_path):
    # A checkpoint every step: a kill lands in or near a write. The newest complete checkpoint
    # resumes, and the chain (the killed file's rows past it dropped) equals an uninterrupted run.
    stats = tmp_path / "k.h5"
    horizon = 10**6
    proc = start(moe_rt_bin, MICRO + ["--steps", horizon, "--stats", stats,
                                      "--checkpoint-every", 1, "--keep-checkpoints", 3], 2)
    wait_for_rows(stats, 8, proc)
    # Every rank at once (Open MPI gives each rank a process group of its own), then mpirun.
    ranks = [rank_process(proc.pid, r) for r in range(2)]
    for pid, _ in ranks:
        os.kill(pid, signal.SIGKILL)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    remove_shared_memory_of(ranks[0][1])
    kept = [n for n in listing(tmp_path / "k-checkpoints") if n.endswith(".h5")]
    newest = int(kept[-1][5:13])
    end = newest + 6
    ok(moe_rt_bin, ["--resume", tmp_path / "k-checkpoints", "--steps", end,
                    "--stats", tmp_path / "r.h5"], 2)
    ok(moe_rt_bin, MICRO + ["--steps", end, "--lr-decay-steps", horizon,
                            "--stats", tmp_path / "full.h5"], 2)
    assert_continues_bitwise(tmp_path / "full.h5", tmp_path / "r.h5", None, None)


# ---- bad checkpoints and options ---------------------------------------------------------------


@pytest.fixture(scope="module")
def good_checkpoint(moe_rt_bin, tmp_path_factory):
    d = tmp_path_factory.mktemp("good")
    ok(moe_rt_bin, MICRO + ["--steps", 4, "--stats", d / "g.h5", "--checkpoint-every", 2], 2)
    return d / "g-checkpoints" / "step-00000003.h5"


def corrupt_tensor(path):
    with h5py.File(path, "r") as f:
        offset = f["param/embed"].id.get_chunk_info(0).byte_offset
    with open(path, "r+b") as f:
        f.seek(offset + 16)
        f.write(b"\xde\xad\xbe\xef")


def set_version(path):
    with h5py.File(path, "r+") as f:
        f.attrs.modify("format_version", np.int32(99))


def truncate(path):
    os.truncate(path, os.path.getsize(path) // 2)


def empty_dir(path):
    os.remove(path)
    os.mkdir(path)
    with open(os.path.join(path, "step-00000009.h5.tmp"), "wb") as f:
        f.write(b"half written")


def not_hdf5(path):
    with open(path, "w") as f:
        f.write("a text file\n")


@pytest.mark.parametrize("damage, words", [
    (os.remove, ["no such file"]),
    (truncate, ["cannot be opened"]),
    (corrupt_tensor, ["param/embed"]),
    (set_version, ["format version 99"]),
    (empty_dir, ["no complete checkpoint"]),
    (not_hdf5, ["not an HDF5 file"]),
])
def test_bad_checkpoint_is_refused_before_any_step(moe_rt_bin, good_checkpoint, tmp_path, damage,
                                                    words):
    path = tmp_path / "c.h5"
    shutil.copy(good_checkpoint, path)
    damage(str(path))
    old = tmp_path / "old.h5"
    old.write_bytes(b"an earlier statistics file")
    proc = moe(moe_rt_bin, ["--resume", path, "--steps", 8, "--stats", old, "--overwrite"], 2)
    assert proc.returncode == 2, proc.stderr
    errors = error_lines(proc.stderr)
    assert len(errors) == 1, proc.stderr
    assert str(path) in errors[0] and all(w in errors[0] for w in words), errors[0]
    assert old.read_bytes() == b"an earlier statistics file"
    assert "step " not in proc.stdout


@pytest.mark.parametrize("args, words", [
    (["--lr", "0.001"], ["--lr=0.001 conflicts", "lr = 0.003"]),
    (["--model", "deepseek4-tiny"], ["--model=deepseek4-tiny conflicts"]),
    (["--seed", "7"], ["--seed=7 conflicts"]),
    (["--steps", "4"], ["has already run 4 steps"]),
    (["--batch-per-rank", "2"], ["makes 4 sequences per step", "trains 2"]),
])
def test_options_that_change_the_arithmetic_are_the_checkpoints(moe_rt_bin, good_checkpoint,
                                                                 args, words):
    steps = [] if "--steps" in args else ["--steps", 8]
    proc = moe(moe_rt_bin, ["--resume", good_checkpoint] + steps + args, 2)
    assert proc.returncode == 2, proc.stderr
    errors = error_lines(proc.stderr)
    assert len(errors) == 1 and all(w in errors[0] for w in words), proc.stderr


def test_documented_dataset_shapes_are_the_files(good_checkpoint):
    # docs/checkpoints.md's table of what a checkpoint holds: every tensor (param/, adam_m/,
    # adam_v/) is 1-D, and the routing datasets have the shapes given there.
    doc = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "checkpoints.md")).read()
    shapes = dict(re.findall(r"^\| `(routing/\w+)` \| `\[([^\]]*)\]`", doc, re.M))
    assert sorted(shapes) == ["routing/bias", "routing/hash_tables"], shapes
    assert "one 1-D dataset per tensor" in doc
    with h5py.File(good_checkpoint, "r") as f:
        config = tomllib.loads(f.attrs["config"])["architecture"]
        size = {"L": config["layers"], "E": config["experts"], "L_h": config["hash-layers"],
                "V": config["vocab"], "K": config["top-k"]}
        for name, shape in shapes.items():
            dims = [int(np.prod([int(size[s]) for s in d.strip().split("·")]))
                    for d in shape.split(",")]
            assert list(f[name].shape) == dims, (name, shape)
        for group in ("param", "adam_m", "adam_v"):
            assert all(f[group][n].ndim == 1 for n in f[group]), group


def test_resume_prints_the_checkpoints_configuration(moe_rt_bin, good_checkpoint):
    # The same values are accepted; this run's own options are its own.
    proc = moe(moe_rt_bin, ["--resume", good_checkpoint, "--lr", "3e-3", "--steps", 9,
                            "--stats", "none", "--print-config"], 1)
    assert proc.returncode == 0, proc.stderr
    config = tomllib.loads(proc.stdout)
    assert config["model"] == "micro" and config["steps"] == 9, proc.stdout
    assert config["optimizer"]["lr"] == 0.003 and config["optimizer"]["lr-decay-steps"] == 4
    assert config["data"]["batch-per-rank"] == 2 and config["output"]["stats"] == "none"
    assert config["checkpoint"]["checkpoint-every"] == 2


def test_rank_count_must_divide_the_global_batch(moe_rt_bin, good_checkpoint):
    proc = moe(moe_rt_bin, ["--resume", good_checkpoint, "--steps", 8], 3)
    assert proc.returncode == 2
    errors = error_lines(proc.stderr)
    assert len(errors) == 1 and "3 ranks cannot share evenly" in errors[0], proc.stderr
