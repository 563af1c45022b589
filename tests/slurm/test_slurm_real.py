"""scripts/slurm/moe_rt.sbatch under a real SLURM: a one-node cluster of 2 CPUs on this machine
(scripts/slurm/local_cluster.sh: munged, slurmctld, slurmd). The recipe is submitted as it is,
fitted to the node by sbatch's own options (which override its #SBATCH lines) and by its
environment (MOE_RT, CKPT, CKPT_EVERY). The job trains; the time limit's warning (--time=1
--signal=B:USR1@30) reaches the batch shell, moe_rt checkpoints and stops, the recipe requeues the
job, and the requeued run resumes from that checkpoint and finishes: its statistics chained to the
first run's, its final checkpoint and its parameter digest equal an uninterrupted run's bit for
bit. Skipped where SLURM cannot run (not root, slurm-wlm or munge not installed, munged does not
start). docs/cluster.md, "SLURM", says what this covers and what it does not.

Timing. slurmctld checks time limits every 30 s counted from its start (PERIODIC_TIMEOUT, fixed
when SLURM is built) and sends --signal's warning at the first check that finds the job within
sig_time + 30 s of its end: with a 60 s limit and sig_time 30, the first check after the job
started. So the job is submitted a few seconds (LEAD_S) before the cluster's first check, sized
to train for about RUN_S seconds on an idle machine: the fast steps of a short calibration run
(its 90th percentile of tokens/s: other work on the machine slows some steps a lot, and may
slow every step of so short a run) give the step count. The job would reach its end before the
check only if it trained RUN_S / LEAD_S times as fast as those steps; slowed by other work, it is
stopped earlier in its run. The uninterrupted run of the same count, compared with, runs while
the cluster waits for the check. The requeued run may start 6 s
after the first ended (cred_expire=5 in local_cluster.sh)."""
import datetime
import os
import re
import signal
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SLURM_DIR = os.path.join(ROOT, "scripts", "slurm")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from mpi_launch import launcher, moe_rt_bin, run_env  # noqa: E402,F401  (tests/mpi_launch.py)
from moe_stats_lib.chain import load_run  # noqa: E402  (scripts/moe_stats_lib)
from stats_read import checkpoint_arrays, step_lines  # noqa: E402  (tests/stats_read.py)

UNAVAILABLE = 3          # local_cluster.sh's status when SLURM cannot run here
CHECK_EVERY_S = 30       # slurmctld's time-limit checks: every 30 s from its start
RUN_S = 12               # the length of the training run on an idle machine, in seconds
LEAD_S = 3               # how long the job trains before the check that stops it (about)
CALIBRATION_STEPS = 100  # the steps of the run that measures a step
# micro with 64 sequences per rank: a step of milliseconds, mostly arithmetic, so that other work
# on the machine slows it less than one of micro's usual 0.3 ms steps, which waits on the other
# rank three times a layer.
CONFIG = ["--model", "micro", "--batch-per-rank", "64"]
LOG = ["--log-every", "200"]  # the job's and the uninterrupted run's step lines
TOKENS_PER_STEP = 2 * 64 * 16  # 2 ranks, 64 sequences each of micro's 16 tokens
# Everything per step but timings: equal bit for bit across a resume (docs/checkpoints.md).
EXACT = ("steps/step", "steps/loss", "steps/balance_loss", "steps/grad_norm", "steps/lr",
         "routing/expert_load", "routing/bias", "routing/load_variance", "routing/max_violation")
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE", "PREEMPTED"}


class Cluster:
    """A running local_cluster.sh: its slurm.conf and logs, and when it was started."""

    def __init__(self, proc, conf, launched, launched_wall):
        self.proc, self.conf = proc, conf
        self.launched, self.launched_wall = launched, launched_wall  # monotonic, and wall clock
        self.dir = os.path.dirname(conf)

    def env(self, **extra):
        return dict(run_env(), SLURM_CONF=self.conf, **extra)

    def command(self, args, timeout=30, **kwargs):
        return subprocess.run([str(a) for a in args], env=self.env(), capture_output=True,
                              text=True, timeout=timeout, **kwargs)

    def log(self):
        with open(os.path.join(self.dir, "slurmctld.log")) as f:
            return f.read()

    def job(self, job_id):
        """scontrol's fields of a job: {"JobState": "RUNNING", "Restarts": "0", ...}."""
        out = self.command(["scontrol", "-o", "show", "job", job_id]).stdout
        return dict(field.split("=", 1) for field in out.split() if "=" in field)


@pytest.fixture
def cluster():
    """A one-node SLURM for the test, stopped after it (passed or failed): local_cluster.sh stops
    when its standard input ends, so also when this process dies."""
    launched, launched_wall = time.monotonic(), time.time()
    proc = subprocess.Popen(["bash", os.path.join(SLURM_DIR, "local_cluster.sh")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    line = proc.stdout.readline()  # the ready line, or nothing when it exits
    if "ready: SLURM_CONF=" not in line:
        proc.stdin.close()
        err = proc.stderr.read()
        proc.wait(timeout=60)
        if proc.returncode == UNAVAILABLE:
            pytest.skip(err.strip().splitlines()[-1])
        pytest.fail(f"local_cluster.sh exited {proc.returncode}:\n{err}")
    c = Cluster(proc, line.split("SLURM_CONF=", 1)[1].strip(), launched, launched_wall)
    try:
        yield c
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
        err = proc.stderr.read()
        assert proc.returncode == 0, err
        assert not os.path.exists(c.dir), f"local_cluster.sh left {c.dir}"


def moe_rt(moe_rt_bin, args, out):
    """Starts moe_rt on 2 ranks outside SLURM, unbound (a job may share the cores); its output
    goes to the files `out`.out and `out`.err."""
    cmd = launcher(2) + ["--bind-to", "none", moe_rt_bin] + [str(a) for a in args]
    with open(f"{out}.out", "w") as o, open(f"{out}.err", "w") as e:
        proc = subprocess.Popen(cmd, env=run_env(), stdout=o, stderr=e, start_new_session=True)
    proc.out = out
    return proc


def finish(proc, timeout=180):
    """The standard output of a run started by moe_rt(), which must succeed within `timeout`
    seconds."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f"{' '.join(proc.args)} hung for more than {timeout} s")
    with open(f"{proc.out}.err") as f:
        assert proc.returncode == 0, f.read()
    with open(f"{proc.out}.out") as f:
        return f.read()


def training_seconds(stdout):
    """The training time of the run's summary line: `summary: 300 steps in 832 ms, ...`."""
    match = re.search(r"^summary: \d+ steps in ([0-9.]+) (ms|s),", stdout, re.M)
    assert match, stdout
    return float(match.group(1)) / (1000 if match.group(2) == "ms" else 1)


def fast_tokens_per_s(stdout):
    """The 90th percentile of the tokens/s of a run's step lines (every step logged), the first
    step (warm-up) left out."""
    rates = sorted(float(line.split()[6]) for line in stdout.splitlines()
                   if len(line.split()) == 9 and line.split()[0].isdigit()
                   and line.split()[0] != "0")
    assert len(rates) >= 10, stdout
    return rates[len(rates) * 9 // 10]


def param_digest(stdout):
    """The last `parameters after step S: digest D` of a run's (or a job's) output: (S, D)."""
    found = re.findall(r"parameters after step (\d+): digest ([0-9a-f]{16})", stdout)
    assert found, stdout
    return found[-1]


def wait_until(moment):
    time.sleep(max(0.0, moment - time.monotonic()))


def follow(cluster, job_id, limit):
    """Polls the job until it ends or `limit` seconds pass: its last fields and the changes of
    its state, as (seconds since the cluster's start, state, restarts)."""
    events, last, job = [], None, {}
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        job = cluster.job(job_id)
        state = (job.get("JobState"), job.get("Restarts"))
        if state != last:
            events.append((round(time.monotonic() - cluster.launched, 1), *state))
            last = state
        if state[0] in TERMINAL:
            break
        time.sleep(0.2)
    return job, events


def warning_times(cluster, job_id):
    """When slurmctld sent the job its --signal warning, in seconds since the cluster's start
    (its log's `[2026-01-02T03:04:05.678] debug:  send_job_warn_signal: warning signal 10 to
    JobId=7` lines, local time)."""
    found = re.findall(rf"^\[([0-9T:.-]+)\] .*warning signal 10 to JobId={job_id}$", cluster.log(),
                       re.M)
    return [round(datetime.datetime.fromisoformat(t).timestamp() - cluster.launched_wall, 1)
            for t in found]


def test_time_limit_stop_requeue_and_bitwise_resume(cluster, moe_rt_bin, tmp_path):
    # The step count of about RUN_S seconds, from a short run of the same configuration.
    calibration = finish(moe_rt(moe_rt_bin, CONFIG + ["--steps", CALIBRATION_STEPS,
                                                      "--stats", "none", "--log-every", 1],
                                tmp_path / "calibration"))
    steps = max(300, round(RUN_S * fast_tokens_per_s(calibration) / TOKENS_PER_STEP))
    every = steps // 4  # a periodic checkpoint or two before the stop's own
    # The uninterrupted run, while the cluster waits for its first time-limit check.
    ref = moe_rt(moe_rt_bin, CONFIG + LOG + ["--steps", steps, "--threads", 1,
                                             "--checkpoint-every", every,
                                             "--checkpoint-dir", tmp_path / "ref-ckpt",
                                             "--stats", tmp_path / "ref.h5"], tmp_path / "ref")
    try:
        job_id, job, events, log = submit_and_follow(cluster, moe_rt_bin, tmp_path, ref, steps,
                                                     every)
        ref_out = finish(ref)
    finally:
        if ref.poll() is None:
            os.killpg(ref.pid, signal.SIGKILL)
            ref.wait()
    timeline = "; ".join(f"{t} s {s} (restarts {r})" for t, s, r in events)
    print(f"\nslurm: {steps} steps, uninterrupted {training_seconds(ref_out):.1f} s of training; "
          f"seconds after the cluster's start: {timeline}; warning signals at "
          f"{warning_times(cluster, job_id)}; "
          + "; ".join(re.findall(r"^moe_rt\.sbatch: (.*)$", log, re.M)))
    assert job.get("JobState") == "COMPLETED", f"{job}\n{timeline}\n{log}"
    assert job.get("ExitCode") == "0:0", job

    # It trained, was stopped by the time limit's warning, and each run resumed from the
    # checkpoint the stop before it named.
    assert step_lines(log), log
    stops = re.findall(r"^moe_rt: stopped by SIGUSR1 after step (\d+); newest checkpoint "
                       r"'([^']+)'", log, re.M)
    assert stops, f"the job ran to its end before the time limit's signal\n{timeline}\n{log}"
    assert int(job["Restarts"]) == len(stops), (job, stops)
    assert len(warning_times(cluster, job_id)) == len(stops), cluster.log()
    banners = re.findall(r"resumed from: (\S+), after step (\d+) ", log)
    for (step, path), banner in zip(stops, banners, strict=True):
        assert banner == (path, step)
        assert re.search(rf"^moe_rt\.sbatch: .*{re.escape(path)}.*; requeued$", log, re.M), log
        assert 0 < int(step) < steps - 1
    assert log.rstrip().endswith("moe_rt.sbatch: every step ran; not requeued"), log

    # The same bits as the uninterrupted run: final parameters, checkpoint, every step's values.
    assert param_digest(ref_out)[0] == str(steps - 1)
    assert param_digest(log) == param_digest(ref_out)
    final = f"step-{steps - 1:08d}.h5"
    mine = checkpoint_arrays(tmp_path / "ckpt" / final)
    theirs = checkpoint_arrays(tmp_path / "ref-ckpt" / final)
    assert sorted(mine) == sorted(theirs)
    for name in mine:
        assert mine[name].tobytes() == theirs[name].tobytes(), name
    files = re.findall(r"^  statistics: (\S+)$", log, re.M)  # each run's, relative to tmp_path
    assert len(set(files)) == len(stops) + 1, files
    chained, full = load_run(str(tmp_path / files[-1])), load_run(str(tmp_path / "ref.h5"))
    assert len(chained.segments) == len(files)
    for name in EXACT:
        assert chained.data[name].tobytes() == full.data[name].tobytes(), name


def submit_and_follow(cluster, moe_rt_bin, tmp_path, ref, steps, every):
    """Submits the recipe LEAD_S seconds (and one to start) before a time-limit check, after the
    uninterrupted run `ref` if it is over by then (else the two share the machine). Returns the
    job's id, last fields, state changes and output."""
    # slurmctld starts a few tenths of a second after local_cluster.sh: its first check comes
    # 30.2 s to 30.4 s after local_cluster.sh was started (measured).
    submit_at = cluster.launched + CHECK_EVERY_S - LEAD_S - 1
    while submit_at < time.monotonic() - 1:  # over a second late for this check: the next one
        submit_at += CHECK_EVERY_S
    try:
        ref.wait(timeout=max(0.0, submit_at - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    wait_until(submit_at)

    env = cluster.env(MOE_RT=moe_rt_bin, CKPT=str(tmp_path / "ckpt"), CKPT_EVERY=str(every),
                      MOE_RT_SLURM_DIR=SLURM_DIR)
    sbatch = ["sbatch", "--parsable", "--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1",
              "--time=1", "--signal=B:USR1@30", f"--output={tmp_path}/job-%j.out",
              os.path.join(SLURM_DIR, "moe_rt.sbatch")] + CONFIG + LOG + ["--steps", str(steps)]
    proc = subprocess.run(sbatch, env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().split(";")[0]
    # Each run ends by the next check at the latest (stopped and requeued, or done); 4 checks.
    job, events = follow(cluster, job_id, 4 * CHECK_EVERY_S)
    return job_id, job, events, (tmp_path / f"job-{job_id}.out").read_text()
