"""Checkpoint folders shared by runs: one live run owns a folder (a second writer, or a --resume
that would write there, is refused naming the folder and its owner), and a run resumed from an
older checkpoint keeps its own branch: its checkpoints are pruned by branch, never the other
branch's, and --resume of the folder then continues the run that started last."""
import os
import shutil
import signal
import subprocess
import time

import h5py
import pytest

from conftest import launcher, run_env

MICRO = ["--model", "micro"]
LOCK = ".moe_rt.lock"


def moe(moe_rt_bin, args, np_=1, timeout=180):
    try:
        return subprocess.run(launcher(np_) + [moe_rt_bin] + [str(a) for a in args],
                              env=run_env(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"moe_rt {args} hung for more than {timeout} s")


def run_id_of(path):
    with h5py.File(path, "r") as f:
        return f.attrs["run_id"]


def steps_in(folder):
    return sorted(n for n in os.listdir(folder) if n.startswith("step-"))


def test_a_live_runs_folder_is_refused_to_a_second_writer(moe_rt_bin, tmp_path):
    ck = tmp_path / "ck"
    # One process without a launcher, so that SIGTERM reaches the rank itself at the end.
    first = subprocess.Popen([moe_rt_bin] + MICRO +
                             ["--steps", "1000000", "--checkpoint-every", "25",
                              "--checkpoint-dir", str(ck), "--stats", str(tmp_path / "a.h5")],
                             env=run_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True)
    try:
        deadline = time.monotonic() + 60
        while not (ck / LOCK).exists() or not [n for n in os.listdir(ck) if n.endswith(".h5")]:
            assert first.poll() is None, first.stderr.read()
            assert time.monotonic() < deadline, "the first run wrote no checkpoint in 60 s"
            time.sleep(0.05)
        holder = (ck / LOCK).read_text().strip()
        assert holder.startswith("run ") and f"process {first.pid} on " in holder, holder
        # A new run writing there, and a --resume of the live folder (which writes there too).
        for args in (MICRO + ["--steps", 40, "--checkpoint-every", 5, "--checkpoint-dir", ck,
                              "--stats", tmp_path / "b.h5"],
                     ["--resume", ck, "--steps", 2000000, "--stats", tmp_path / "c.h5"]):
            proc = moe(moe_rt_bin, args)
            assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr
            errors = [line for line in proc.stderr.splitlines() if "error" in line]
            assert len(errors) == 1, proc.stderr
            assert f"checkpoint folder '{ck}' is in use by another live run ({holder})" \
                in errors[0]
        assert not (tmp_path / "b.h5").exists() and not (tmp_path / "c.h5").exists()
        assert first.poll() is None, "the first run died"
        # Reading a live folder's newest complete checkpoint, writing elsewhere, is harmless. The
        # live run is paused meanwhile, so that the newest checkpoint is known (on a fast machine
        # it writes hundreds while the resumed run starts); the folder and its lock stay as they
        # are. Checkpoints pruned while a resumed run chooses one:
        # test_a_checkpoint_pruned_while_resolved_is_chosen_again.
        first.send_signal(signal.SIGSTOP)
        try:
            seen = max(int(n[5:13]) for n in os.listdir(ck) if n.endswith(".h5"))
            proc = moe(moe_rt_bin, ["--resume", ck, "--steps", seen + 80, "--checkpoint-dir",
                                    tmp_path / "other", "--stats", tmp_path / "d.h5"])
        finally:
            first.send_signal(signal.SIGCONT)
        assert proc.returncode == 0, proc.stderr
        with h5py.File(tmp_path / "d.h5", "r") as f:
            assert f.attrs["resumed_from_step"] == seen
        assert first.poll() is None, "the first run died"
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    # Stopped by the signal with its checkpoint; the folder's lock went with the run.
    assert first.returncode == 143, first.stderr.read()
    assert not (ck / LOCK).exists()
    assert len(steps_in(ck)) == 2
    assert not [n for n in os.listdir(ck) if n.endswith(".tmp")]


def test_a_branch_resumed_from_an_older_checkpoint_keeps_its_checkpoints(moe_rt_bin, tmp_path):
    first = tmp_path / "first"
    proc = moe(moe_rt_bin, MICRO + ["--steps", 24, "--checkpoint-every", 4,
                                    "--keep-checkpoints", 10, "--checkpoint-dir", first,
                                    "--stats", tmp_path / "a.h5"])
    assert proc.returncode == 0, proc.stderr
    ck = tmp_path / "ck"
    shutil.copytree(first, ck)
    run_a = run_id_of(ck / "step-00000023.h5")
    # Resume the copy from step 7, keeping 2: the new branch writes 11, 15 and 17.
    proc = moe(moe_rt_bin, ["--resume", ck / "step-00000007.h5", "--keep-checkpoints", 2,
                            "--steps", 18, "--stats", tmp_path / "b.h5"])
    assert proc.returncode == 0, proc.stderr
    assert f"checkpoint folder '{ck}' also holds 4 checkpoint(s) of other runs or branches" \
        in proc.stdout
    run_b = run_id_of(ck / "step-00000017.h5")
    assert run_b != run_a
    # A's branch after step 7 is untouched; B keeps its newest two (15 beside A's 15, and 17);
    # A's 3 and 7 are B's history too, and were pruned with it.
    assert steps_in(ck) == ["step-00000011.h5", f"step-00000015.{run_b}.h5", "step-00000015.h5",
                            "step-00000017.h5", "step-00000019.h5", "step-00000023.h5"]
    for name in ("step-00000011.h5", "step-00000015.h5", "step-00000019.h5", "step-00000023.h5"):
        assert run_id_of(ck / name) == run_a
        with open(ck / name, "rb") as a, open(first / name, "rb") as b:
            assert a.read() == b.read(), name
    # --resume of the folder continues B, and says which run it took and what else is there.
    proc = moe(moe_rt_bin, ["--resume", ck, "--steps", 20, "--stats", tmp_path / "c.h5"])
    assert proc.returncode == 0, proc.stderr
    assert f"continuing run {run_b} (the one started last) from its newest, " \
        f"'{ck}/step-00000017.h5'" in proc.stdout
    assert f"step 23 of run {run_a}" in proc.stdout
    with h5py.File(tmp_path / "c.h5", "r") as f:
        assert f.attrs["resumed_from_step"] == 17
        assert f.attrs["resumed_from_run"] == run_b
        assert list(f["steps/step"][...]) == [18, 19]


def test_a_checkpoint_pruned_while_resolved_is_chosen_again(moe_rt_bin, tmp_path):
    # A live run writing a checkpoint every step and keeping one: the newest a resumed run chooses
    # is often gone before it reads its header. Each --resume of the folder (written elsewhere)
    # chooses again, so that every one resolves; --print-config ends after the resolution.
    ck = tmp_path / "ck"
    first = subprocess.Popen([moe_rt_bin] + MICRO +
                             ["--steps", "1000000", "--checkpoint-every", "1",
                              "--keep-checkpoints", "1", "--checkpoint-dir", str(ck),
                              "--stats", "none"],
                             env=run_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True)
    try:
        deadline = time.monotonic() + 60
        while not ck.is_dir() or not [n for n in os.listdir(ck) if n.endswith(".h5")]:
            assert first.poll() is None, first.stderr.read()
            assert time.monotonic() < deadline, "the first run wrote no checkpoint in 60 s"
            time.sleep(0.05)
        def newest():
            return max((int(n[5:13]) for n in os.listdir(ck) if n.endswith(".h5")), default=-1)

        before = newest()
        for _ in range(12):
            proc = subprocess.run([moe_rt_bin, "--resume", str(ck), "--steps", "2000000",
                                   "--checkpoint-dir", str(tmp_path / "other"), "--print-config"],
                                  env=run_env(), capture_output=True, text=True, timeout=60)
            assert proc.returncode == 0, proc.stderr
        assert first.poll() is None, "the first run died"
        # The run went on meanwhile, removing a checkpoint with every one it wrote.
        assert newest() > before + 12
    finally:
        first.kill()
        first.wait()
