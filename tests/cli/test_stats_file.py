"""The statistics file of a real run: contents consistent with what the run computed and printed,
bitwise identical for the same command apart from timings, dates and the run id, readable while
the run goes on (SWMR) and after the run is killed with SIGKILL, and clear errors for bad output
paths."""
import os
import re
import signal
import subprocess
import time

import h5py
import numpy as np
import pytest

from conftest import launcher, run_env
from stats_read import complete_rows, open_stats, step_lines  # tests/stats_read.py

MICRO = ["--model", "micro"]
TIMING_DATASETS = {"/steps/tokens_per_s", "/steps/step_time_s", "/perf/phase_time"}




def test_contents_match_what_the_run_printed_and_counted(run_moe, tmp_path):
    path = tmp_path / "run.h5"
    proc = run_moe(MICRO + ["--steps", "6", "--stats", str(path), "--trace-every", "2"], np_=2)
    assert proc.returncode == 0, proc.stderr
    assert str(path) in proc.stdout
    with open_stats(path) as f:
        a = f.attrs
        assert a["format"] == "moe_rt.stats" and a["format_version"] == 2
        assert a["world_size"] == 2 and a["model"] == "micro"
        L, E, K = int(a["num_layers"]), int(a["num_experts"]), int(a["top_k"])
        T = 2 * int(a["batch_per_rank"]) * int(a["seq_len"])
        assert complete_rows(f) == 6
        assert list(f["/steps/step"][...]) == list(range(6))
        load = f["/routing/expert_load"][...]
        assert load.shape == (6, L, E)
        # Every token makes K assignments in every layer, and every assignment lands on a rank.
        assert (load.sum(axis=2) == T * K).all()
        assert (f["/routing/rank_load"][...].sum(axis=2) == T * K).all()
        np.testing.assert_allclose(f["/routing/load_variance"][...], load.var(axis=2), rtol=1e-12)
        mean = load.mean(axis=2)
        np.testing.assert_allclose(f["/routing/max_violation"][...],
                                   (load.max(axis=2) - mean) / mean, rtol=1e-12)
        routing = [s.decode() if isinstance(s, bytes) else s for s in f["/layers/routing"][...]]
        assert routing == ["hash"] + ["topk"] * (L - 1)
        # The printed loss is the stored loss rounded to 4 decimals.
        for step, loss in step_lines(proc.stdout):
            assert abs(f["/steps/loss"][step] - loss) <= 5e-5
        # Traces at steps 0, 2, 4: selected experts agree with the counted loads.
        assert list(f["/trace/step"][...]) == [0, 2, 4]
        experts = f["/trace/experts"][...]
        for m, step in enumerate([0, 2, 4]):
            counts = np.stack([np.bincount(experts[m, l].ravel(), minlength=E) for l in range(L)])
            assert (counts == load[step]).all()
        assert sorted(set(f["/trace/rank"][0])) == [0, 1]


def test_same_command_gives_identical_statistics(run_moe, tmp_path):
    path = tmp_path / "same.h5"
    args = MICRO + ["--steps", "4", "--stats", str(path), "--overwrite", "--trace-every", "3"]
    snapshots, run_ids = [], []
    for _ in range(2):
        proc = run_moe(args, np_=2)
        assert proc.returncode == 0, proc.stderr
        items = {}
        with open_stats(path) as f:
            # The creation time and the run's id name this run, not its configuration.
            items.update({f"@{k}": v for k, v in f.attrs.items() if k not in ("created", "run_id")})
            run_ids.append(str(f.attrs["run_id"]))
            f.visititems(lambda name, obj: items.__setitem__(
                "/" + name, obj[...]) if isinstance(obj, h5py.Dataset) else None)
        snapshots.append(items)
    a, b = snapshots
    assert a.keys() == b.keys()
    assert all(re.fullmatch("[0-9a-f]{16}", i) for i in run_ids) and run_ids[0] != run_ids[1]
    for key in a:
        if key in TIMING_DATASETS:
            continue
        assert np.array_equal(np.asarray(a[key]), np.asarray(b[key])), key


def rank_process(launcher_pid, rank):
    """(pid, environment) of world rank `rank` among the launcher's descendants, from /proc, or
    (None, {})."""
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        except OSError:
            continue
        if env.get(b"OMPI_COMM_WORLD_RANK") != str(rank).encode():
            continue
        ancestor = int(entry)
        while ancestor > 1:  # a descendant of this test's launcher, not another job's
            try:
                with open(f"/proc/{ancestor}/stat") as f:
                    ancestor = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                break
            if ancestor == launcher_pid:
                return int(entry), env
    return None, {}


def remove_shared_memory_of(env):
    """Open MPI's shared-memory segments of the job a rank's environment names: a job killed
    whole (launcher too) leaves them in /dev/shm, one per rank, for ever."""
    jobid = env.get(b"OMPI_MCA_ess_base_jobid")
    if not jobid or not os.path.isdir("/dev/shm"):
        return
    suffix = "." + format(int(jobid), "x") + "."
    for name in os.listdir("/dev/shm"):
        if name.startswith("vader_segment.") and suffix in name:
            os.remove(os.path.join("/dev/shm", name))


def test_live_reader_sees_steps_appear_and_sigkill_keeps_completed_steps(moe_rt_bin, tmp_path):
    path = tmp_path / "killed.h5"
    proc = subprocess.Popen(launcher(2) + [moe_rt_bin] + MICRO +
                            ["--steps", "1000000", "--stats", str(path)],
                            env=run_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        seen = []
        deadline = time.time() + 120
        while time.time() < deadline and (len(seen) < 3 or seen[-1] < 10):
            time.sleep(0.2)
            if not path.exists():
                continue
            try:
                with open_stats(path) as f:
                    seen.append(complete_rows(f))
            except OSError:
                continue  # the file is being created
        assert len(seen) >= 3 and seen[-1] >= 10, f"rows seen by the live reader: {seen}"
        assert seen == sorted(seen) and seen[-1] > seen[0], seen
    finally:
        _, env = rank_process(proc.pid, 0)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        remove_shared_memory_of(env)
    with open_stats(path) as f:
        n = complete_rows(f)
        assert n >= seen[-1]
        assert list(f["/steps/step"][:n]) == list(range(n))
        assert np.isfinite(f["/steps/loss"][:n]).all()
        load = f["/routing/expert_load"][:n]
        assert (load.sum(axis=2) == load.sum(axis=2)[0, 0]).all()  # every row complete


def test_a_rank_killed_mid_run_ends_the_job_and_keeps_every_printed_step(moe_rt_bin, tmp_path):
    # Rank 1 dies (SIGKILL) while the run goes on: the launcher ends the job, no rank waits for
    # ever in a collective, and every step rank 0 printed has its complete row in the file.
    path = tmp_path / "rank_killed.h5"
    proc = subprocess.Popen(launcher(2) + [moe_rt_bin] + MICRO +
                            ["--steps", "1000000", "--stats", str(path)],
                            env=run_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        deadline = time.time() + 120
        rows = 0
        while time.time() < deadline and rows < 5:
            time.sleep(0.2)
            try:
                with open_stats(path) as f:
                    rows = complete_rows(f)
            except OSError:
                continue  # the file is being created
        victim, _ = rank_process(proc.pid, 1)
        assert rows >= 5 and victim is not None, (rows, victim)
        os.kill(victim, signal.SIGKILL)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
    assert proc.returncode != 0
    printed = step_lines(out)
    assert printed, out
    with open_stats(path) as f:
        n = complete_rows(f)
        loss = f["/steps/loss"][:n]
    assert n >= printed[-1][0] + 1, (n, printed[-1])
    for step, value in printed:
        assert loss[step] == pytest.approx(value, abs=5e-5), step


def test_default_path_is_new_for_each_run(run_moe, tmp_path):
    """Each run gets a new name under runs/, and runs/latest.h5 links to the newest by its name."""
    runs = tmp_path / "runs"
    for n in (1, 2):
        proc = run_moe(MICRO + ["--steps", "1"], np_=2, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        names = sorted(p.name for p in runs.iterdir() if p.name != "latest.h5")
        assert len(names) == n and all(m.startswith("micro-") and m.endswith(".h5") for m in names)
        newest = re.search(r"statistics written to runs/(\S+\.h5)", proc.stdout).group(1)
        assert os.readlink(runs / "latest.h5") == newest
    with open_stats(runs / "latest.h5") as f:
        assert complete_rows(f) == 1


def test_latest_link_leaves_a_users_file_alone(run_moe, tmp_path):
    """A regular file named runs/latest.h5 is not replaced: the run warns and still succeeds."""
    (tmp_path / "runs").mkdir()
    mine = tmp_path / "runs" / "latest.h5"
    mine.write_bytes(b"mine")
    proc = run_moe(MICRO + ["--steps", "1"], np_=1, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert mine.read_bytes() == b"mine" and not mine.is_symlink()
    assert "latest.h5' exists and is not a link" in proc.stderr, proc.stderr
    assert not [p for p in mine.parent.iterdir() if p.name.startswith("latest.h5.")]


def test_explicit_stats_path_makes_no_latest_link(run_moe, tmp_path):
    proc = run_moe(MICRO + ["--steps", "1", "--stats", str(tmp_path / "a.h5")], np_=1, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "latest.h5").exists() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("make,words", [
    (lambda d: d / "missing" / "x.h5", ["missing", "director"]),
    (lambda d: d, ["directory"]),
])
def test_bad_output_path(run_moe, tmp_path, make, words):
    from test_bad_input import assert_one_clear_error
    path = make(tmp_path)
    assert_one_clear_error(run_moe(MICRO + ["--steps", "1", "--stats", str(path)]), str(path),
                           *words)


def test_existing_file_needs_overwrite(run_moe, tmp_path):
    from test_bad_input import assert_one_clear_error
    path = tmp_path / "exists.h5"
    assert run_moe(MICRO + ["--steps", "1", "--stats", str(path)]).returncode == 0
    assert_one_clear_error(run_moe(MICRO + ["--steps", "1", "--stats", str(path)]), str(path),
                           "--overwrite")
    assert run_moe(MICRO + ["--steps", "1", "--stats", str(path), "--overwrite"]).returncode == 0
