"""A statistics file is never lost to another run or to a failed set-up: a run refuses a path a
live run writes (even with --overwrite) and leaves that file alone; a set-up that fails on any
rank leaves the old file byte for byte; --stats naming one of the run's input files is refused; a
file removed during the run is reported as removed at the end, not as written."""
import contextlib
import os
import signal
import subprocess
import time

import numpy as np
import pytest

from conftest import launcher, run_env
from test_bad_input import assert_one_clear_error, write_shard
from test_routing_options import write_hash_table
from test_stats_file import complete_rows, open_stats, rank_process, remove_shared_memory_of

MICRO = ["--model", "micro"]  # V=64, L=3 (1 hash layer), E=4, K=2
SHARD = [t % 64 for t in range(400)]


def rows_of(path):
    """Complete rows of a live file; 0 while it is not there yet."""
    try:
        with open_stats(path) as f:
            return complete_rows(f)
    except OSError:
        return 0


def wait_for_rows(path, rows, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if rows_of(path) >= rows:
            return
        time.sleep(0.1)
    pytest.fail(f"{path} did not reach {rows} rows within {timeout} s")


@contextlib.contextmanager
def background_run(moe_rt_bin, args):
    """A 2-rank moe_rt run for as long as the block lasts, then killed (SIGKILL, the whole job)."""
    proc = subprocess.Popen(launcher(2) + [moe_rt_bin] + MICRO + args, env=run_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        yield proc
    finally:
        _, env = rank_process(proc.pid, 0)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        remove_shared_memory_of(env)


def test_a_file_a_live_run_writes_is_never_replaced(moe_rt_bin, run_moe, tmp_path):
    path = tmp_path / "live.h5"
    with background_run(moe_rt_bin, ["--steps", "1000000", "--stats", str(path)]):
        wait_for_rows(path, 5)
        inode = path.stat().st_ino
        second = run_moe(MICRO + ["--steps", "5", "--stats", str(path), "--overwrite"], np_=1)
        assert_one_clear_error(second, f"statistics file '{path}'",
                               "is being written by another running moe_rt",
                               "choose another --stats")
        assert path.stat().st_ino == inode
        assert not (tmp_path / "live.h5.new").exists()
        seen = rows_of(path)
        wait_for_rows(path, seen + 5)  # the first run goes on, in the same file
    with open_stats(path) as f:  # the first run ended (killed): its file is whole
        n = complete_rows(f)
        assert n >= seen + 5
        assert list(f["/steps/step"][:n]) == list(range(n))
        assert np.isfinite(f["/steps/loss"][:n]).all()


def test_a_set_up_failing_on_one_rank_leaves_the_old_file_byte_for_byte(moe_rt_bin, run_moe,
                                                                        tmp_path):
    path = tmp_path / "old.h5"
    assert run_moe(MICRO + ["--steps", "2", "--stats", str(path)]).returncode == 0
    old = path.read_bytes()
    # Rank 0 reads a good shard and creates its statistics file; rank 1 reads a bad one and fails.
    # Each rank runs in a directory of its own, where the same relative --data names its file.
    good, bad = tmp_path / "rank0", tmp_path / "rank1"
    for directory, magic in ((good, 20240520), (bad, 12345)):
        directory.mkdir()
        write_shard(directory / "shard.bin", SHARD, magic=magic)
    args = [moe_rt_bin] + MICRO + ["--steps", "2", "--data", "tokens:shard.bin", "--stats",
                                   str(path), "--overwrite"]
    command = (launcher(2)[:1] + launcher(2)[3:] + ["-n", "1", "--wdir", str(good)] + args +
               [":", "-n", "1", "--wdir", str(bad)] + args)
    proc = subprocess.run(command, env=run_env(), capture_output=True, text=True, timeout=120)
    assert_one_clear_error(proc, "shard.bin", "magic")
    assert path.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.h5", "rank0", "rank1"]


def write_input(path, option):
    """An input file for `option` that the micro model accepts; the arguments that name it."""
    if option == "--data":
        write_shard(path, SHARD)
        return ["--data", f"tokens:{path}"]
    if option == "--config":
        path.write_text("steps = 2\n")
        return ["--config", str(path)]
    table = np.array([[[v % 4, (v + 1) % 4] for v in range(64)]], dtype=np.int32)
    write_hash_table(path, table)
    return ["--hash-table", str(path)]


@pytest.mark.parametrize("option", ["--data", "--config", "--hash-table"])
def test_stats_naming_an_input_file_is_refused(run_moe, tmp_path, option):
    path = tmp_path / "input.bin"
    args = write_input(path, option)
    old = path.read_bytes()
    link = tmp_path / "link.h5"
    link.symlink_to(path)
    for stats in (path, link):  # by its own name, or through a link
        proc = run_moe(MICRO + ["--steps", "2"] + args + ["--stats", str(stats), "--overwrite"])
        assert_one_clear_error(proc, f"statistics file '{stats}'", f"is the {option} file",
                               "choose another --stats")
        assert path.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["input.bin", "link.h5"]


def test_a_file_removed_during_the_run_is_reported_removed(moe_rt_bin, tmp_path):
    path = tmp_path / "gone.h5"
    proc = subprocess.Popen(launcher(2) + [moe_rt_bin] + MICRO +
                            ["--steps", "1000", "--stats", str(path)],
                            env=run_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.time() + 120
        while not path.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.01)
        path.unlink()  # published at the start of the steps: the run goes on without it
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
    assert proc.returncode == 0, err
    assert f"statistics file {path} was removed (or replaced) during the run" in out, out
    assert "statistics written to" not in out
    assert list(tmp_path.iterdir()) == []  # not recreated, no compaction copy left
