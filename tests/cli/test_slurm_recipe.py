"""scripts/slurm/moe_rt.sbatch's requeue decision (stop_outcome.sh), on fake outcomes and through
the whole recipe with a fake mpirun and scontrol: a stop on SIGUSR1 whose checkpoint is there is
requeued whatever mpirun's exit status (Open MPI's mpirun can crash with 139 after the ranks
stopped cleanly); anything else is not. With MOE_RT_BIN, the recipe runs the real moe_rt under
the real mpirun, sent SIGUSR1 and then SIGTERM."""
import os
import signal
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mpi_launch import run_env  # noqa: E402  (tests/mpi_launch.py, shared)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SLURM = os.path.join(ROOT, "scripts", "slurm")
DECIDE = os.path.join(SLURM, "stop_outcome.sh")


def stop_line(signame, checkpoint):
    return (f"moe_rt: stopped by {signame} after step 450; newest checkpoint '{checkpoint}'; "
            f"continue with --resume {os.path.dirname(checkpoint)}\n")


def decide(status, log_text, tmp_path):
    log = tmp_path / "stderr.log"
    log.write_text(log_text)
    return subprocess.run(["bash", DECIDE, str(status), str(log)], capture_output=True,
                          text=True, timeout=30)


@pytest.fixture
def checkpoint(tmp_path):
    path = tmp_path / "ckpt" / "step-00000450.h5"
    path.parent.mkdir()
    path.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(100))
    return path


@pytest.mark.parametrize("status", [138, 139])
def test_a_sigusr1_stop_with_its_checkpoint_is_requeued(status, checkpoint, tmp_path):
    # moe_rt prints its summary on a stop too: the stop message decides.
    proc = decide(status, "mpirun: Forwarding signal 10 to job\n"
                  + "summary: 450 steps in 61.2 s, median 5453 tokens/s\n"
                  + stop_line("SIGUSR1", checkpoint) + "[vm:1] *** Process received signal\n",
                  tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "requeued" in proc.stdout and str(checkpoint) in proc.stdout


@pytest.mark.parametrize("status, text, why", [
    (139, "[vm:1] *** Process received signal ***\n", "no stop message"),
    (138, "", "no stop message (mpirun's status alone)"),
    (143, "STOP SIGTERM", "stopped by SIGTERM: scancel, not the recipe's signal"),
    (139, "STOP SIGUSR1 MISSING", "the checkpoint named is not there"),
    (0, "", "every step ran"),
    (138, "summary: 450 steps in 61.2 s, median 5453 tokens/s\n",
     "every step ran before the signal reached mpirun (no stop message)"),
])
def test_anything_else_is_not_requeued(status, text, why, checkpoint, tmp_path):
    if text.startswith("STOP"):
        _, signame, *missing = text.split()
        named = tmp_path / "gone.h5" if missing else checkpoint
        text = stop_line(signame, named)
    proc = decide(status, text, tmp_path)
    assert proc.returncode == 1, why
    assert "not requeued" in proc.stdout, proc.stdout


def test_bad_arguments_are_one_line():
    proc = subprocess.run(["bash", DECIDE, "x"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and proc.stderr == "usage: stop_outcome.sh STATUS LOG\n"


def fake_tools(folder, mpirun_body):
    """A folder with fake mpirun (a bash script) and scontrol (records its arguments)."""
    folder.mkdir()
    (folder / "mpirun").write_text("#!/bin/bash\n" + mpirun_body)
    (folder / "scontrol").write_text(f"#!/bin/bash\necho \"$*\" >> {folder}/scontrol.calls\n")
    for name in ("mpirun", "scontrol"):
        (folder / name).chmod(0o755)
    return folder


def recipe_env(tmp_path, tools):
    env = dict(run_env(), SLURM_SUBMIT_DIR=str(tmp_path), SLURM_JOB_ID="4242",
               SLURM_JOB_NAME="moe_rt", SLURM_NTASKS_PER_NODE="2", SLURM_CPUS_PER_TASK="1",
               CKPT=str(tmp_path / "ckpt"), MOE_RT_SLURM_DIR=SLURM, TMPDIR=str(tmp_path))
    if tools is not None:
        env["PATH"] = f"{tools}:{env['PATH']}"
    return env


def run_recipe(tmp_path, tools):
    """The recipe of a 5-step run, with the fake tools in `tools` first on the PATH."""
    return subprocess.run(["bash", os.path.join(SLURM, "moe_rt.sbatch"), "--steps", "5"],
                          env=recipe_env(tmp_path, tools), capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("stops, requeued", [(True, True), (False, False)])
def test_the_recipe_decides_from_what_moe_rt_left(stops, requeued, tmp_path):
    # mpirun crashes with 139 in both cases; only the first left a stop message and checkpoint.
    ckpt = tmp_path / "ckpt"
    body = (f"mkdir -p {ckpt}; head -c 2048 /dev/zero > {ckpt}/step-00000450.h5\n"
            f"echo \"moe_rt: stopped by SIGUSR1 after step 450; newest checkpoint "
            f"'{ckpt}/step-00000450.h5'; continue with --resume {ckpt}\" >&2\n"
            if stops else "") + "exit 139\n"
    tools = fake_tools(tmp_path / "bin", body)
    proc = run_recipe(tmp_path, tools)
    assert proc.returncode == 139, proc.stdout + proc.stderr
    calls = tools / "scontrol.calls"
    assert (calls.read_text() if calls.exists() else "") == ("requeue 4242\n" if requeued else "")
    assert ("exited 139 while finishing; requeued" in proc.stdout) == requeued, proc.stdout
    assert [p for p in os.listdir(tmp_path) if p.startswith("moe_rt-stop.")] == []


def test_a_run_that_finished_as_the_signal_came_ends_the_job_cleanly(tmp_path):
    # The time limit's signal reached mpirun after the last step, while it was exiting: 138, no
    # stop message, but the summary is there. Not requeued (its checkpoint has run every step),
    # and the job succeeds.
    body = ("echo 'summary: 5 steps in 0.1 s, median 100 tokens/s'\n"
            "kill -USR1 $$\nexit 138\n")
    tools = fake_tools(tmp_path / "bin", body)
    proc = run_recipe(tmp_path, tools)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "summary: 5 steps" in proc.stdout, proc.stdout
    assert "every step ran (mpirun exited 138 while finishing); not requeued" in proc.stdout
    assert not (tools / "scontrol.calls").exists()


def test_a_signal_as_mpirun_starts_is_passed_on(tmp_path):
    # SLURM's warning reaches the batch shell just after mpirun started (here: sent by the fake
    # mpirun itself, to its parent, before it has done anything): the recipe passes it on and
    # the stop is requeued as any other. (Whether the shell already knew mpirun's process id is
    # up to the scheduler; both paths of the trap lead to the same kill.)
    ckpt = tmp_path / "ckpt"
    body = ("stop() {\n"
            f"  echo \"moe_rt: stopped by SIGUSR1 after step 3; newest checkpoint "
            f"'{ckpt}/step-00000003.h5'; continue with --resume {ckpt}\" >&2\n"
            "  exit 138\n}\n"
            "trap stop USR1\n"
            f"mkdir -p {ckpt}; head -c 2048 /dev/zero > {ckpt}/step-00000003.h5\n"
            "kill -USR1 $PPID\n"
            "for _ in $(seq 200); do sleep 0.05; done\nexit 1\n")
    tools = fake_tools(tmp_path / "bin", body)
    proc = run_recipe(tmp_path, tools)
    assert proc.returncode == 138, proc.stdout + proc.stderr
    assert "unbound variable" not in proc.stderr, proc.stderr
    assert (tools / "scontrol.calls").read_text() == "requeue 4242\n", proc.stdout + proc.stderr


def test_a_signal_before_mpirun_starts_ends_the_job_with_a_reason(tmp_path):
    # The warning before training could start (a --time shorter than --signal's lead): sent here
    # by a mktemp that the recipe runs before mpirun. One line, exit 2, no mpirun, no requeue.
    tools = fake_tools(tmp_path / "bin", f"touch {tmp_path}/mpirun.ran\nexit 0\n")
    (tools / "mktemp").write_text("#!/bin/bash\nkill -USR1 $PPID\nexec /usr/bin/mktemp \"$@\"\n")
    (tools / "mktemp").chmod(0o755)
    proc = run_recipe(tmp_path, tools)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "warning came before moe_rt started" in proc.stderr, proc.stderr
    assert not (tmp_path / "mpirun.ran").exists() and not (tools / "scontrol.calls").exists()


def test_the_recipe_requeues_a_real_run_whose_mpirun_crashes(moe_rt_bin, tmp_path):
    # The real moe_rt under the real mpirun: SIGUSR1 to the batch shell (as SLURM sends it), then
    # SIGTERM to mpirun, which has made Open MPI 4.1's mpirun crash after the ranks stopped.
    # Open MPI is kept from SLURM's launcher and allocation (SLURM_JOB_ID is set for scontrol).
    tools = fake_tools(tmp_path / "bin", "")
    (tools / "mpirun").unlink()
    env = recipe_env(tmp_path, tools)
    env.update(MOE_RT=moe_rt_bin, OMPI_MCA_plm="^slurm", OMPI_MCA_ras="^slurm",
               OMPI_MCA_ess="^slurm")
    recipe = subprocess.Popen(["bash", os.path.join(SLURM, "moe_rt.sbatch"), "--model", "micro",
                               "--steps", "1000000", "--stats", "none"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not any(p.name == "mpirun" for p in psutil_children(recipe.pid)):
            assert time.monotonic() < deadline and recipe.poll() is None, recipe.communicate()
            time.sleep(0.2)
        time.sleep(3)                                   # a few steps
        os.kill(recipe.pid, signal.SIGUSR1)
        time.sleep(0.3)
        for child in psutil_children(recipe.pid):
            if child.name == "mpirun":
                os.kill(child.pid, signal.SIGTERM)
        out, err = recipe.communicate(timeout=120)
    finally:
        if recipe.poll() is None:
            recipe.kill()
    assert recipe.returncode in (138, 139), out + err
    assert (tools / "scontrol.calls").read_text() == "requeue 4242\n", out + err
    assert list((tmp_path / "ckpt").glob("step-*.h5")), out + err


class Proc:
    def __init__(self, pid, name):
        self.pid, self.name = pid, name


def psutil_children(parent):
    """The direct children of `parent` (pid, command name), read from /proc."""
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        if ppid == parent:
            children.append(Proc(int(entry), name))
    return children
