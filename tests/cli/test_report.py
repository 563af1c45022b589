"""What a run says at its end: sizes and times in units that fit, the worst violation at the
run's own first step (a resumed run's included), and the next commands for its statistics file,
which work as printed."""
import os
import re
import shlex
import subprocess
import sys

from test_checkpoint import ok

MICRO = ["--model", "micro", "--warmup-steps", "1"]
SCRIPTS = os.path.join(os.path.dirname(__file__), "..", "..", "scripts")


def test_units_that_fit_and_the_next_commands_work(moe_rt_bin, tmp_path):
    stats = tmp_path / "a run's stats.h5"  # a name the shell must quote
    proc = ok(moe_rt_bin, MICRO + ["--steps", 4, "--stats", stats], 2)
    memory = re.search(r"memory per rank: about ([0-9.]+) (\w+)", proc.stdout)
    assert memory and memory.group(2) == "KiB" and float(memory.group(1)) >= 1, proc.stdout
    assert re.search(r"summary: 4 steps in [0-9.]+ (ms|s),", proc.stdout), proc.stdout
    assert "worst load violation: " in proc.stdout and " at step 0, " in proc.stdout
    commands = [line.split("next:", 1)[-1].strip() for line in proc.stdout.splitlines()
                if line.strip().startswith(("next:", "python3 scripts/moe_stats.py"))]
    assert [shlex.split(c)[2] for c in commands] == ["summary", "plot"], proc.stdout
    for command in commands:
        argv = shlex.split(command)
        assert argv[:2] == ["python3", "scripts/moe_stats.py"] and argv[3] == str(stats)
        done = subprocess.run([sys.executable, os.path.join(SCRIPTS, "moe_stats.py")] + argv[2:],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    assert os.listdir(tmp_path / "a run's stats-plots")


def test_a_resumed_run_names_its_own_first_step(moe_rt_bin, tmp_path):
    ok(moe_rt_bin, MICRO + ["--steps", 4, "--checkpoint-every", 2, "--stats", tmp_path / "a.h5"],
       2)
    proc = ok(moe_rt_bin, ["--resume", tmp_path / "a-checkpoints" / "step-00000001.h5",
                           "--steps", 4, "--stats", tmp_path / "b.h5"], 2)
    assert re.search(r"worst load violation: [0-9.]+ at step 2, ", proc.stdout), proc.stdout


def step_rows(stdout):
    return [line.split() for line in stdout.splitlines()
            if line.split() and line.split()[0].isdigit() and len(line.split()) >= 9]


def test_eta_log_every_checkpoint_lines_and_the_resume_banner(moe_rt_bin, tmp_path):
    proc = ok(moe_rt_bin, MICRO + ["--steps", 12, "--log-every", 5, "--checkpoint-every", 4,
                                   "--stats", tmp_path / "a.h5"], 2)
    header = next(line for line in proc.stdout.splitlines() if line.split()[:2] == ["step", "loss"])
    assert header.split()[-1] == "eta"
    rows = step_rows(proc.stdout)
    # The first, every 5th (steps 4 and 9), the last; each with a one-word remaining time.
    assert [int(r[0]) for r in rows] == [0, 4, 9, 11]
    assert all(re.fullmatch(r"(\d+h)?(\d+m)?\d+[sm]", r[8]) for r in rows), rows
    assert rows[-1][8] == "0s"
    # The statistics file still has every step.
    import h5py
    with h5py.File(tmp_path / "a.h5", "r") as f:
        assert list(f["steps/step"][...]) == list(range(12))
    checkpoints = re.findall(r"^  checkpoint: (\S+) \(([0-9.]+ \w+), ([0-9.]+ m?s)\)$",
                             proc.stdout, re.M)
    assert [os.path.basename(c[0]) for c in checkpoints] == [
        "step-00000003.h5", "step-00000007.h5", "step-00000011.h5"], proc.stdout
    resumed = ok(moe_rt_bin, ["--resume", tmp_path / "a-checkpoints" / "step-00000007.h5",
                              "--steps", 14, "--stats", tmp_path / "b.h5"], 2)
    banner = re.search(r"^  resumed from: (\S+), after step 7 of run [0-9a-f]{16}; steps 8 to 13$",
                       resumed.stdout, re.M)
    assert banner and banner.group(1).endswith("step-00000007.h5"), resumed.stdout
    # --log-every is continued from the checkpoint unless given again.
    assert [int(r[0]) for r in step_rows(resumed.stdout)] == [8, 9, 13]
