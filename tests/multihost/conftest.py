"""Fixtures of the multihost tests: a fresh set of simulated hosts per test (scripts/netns_hosts.sh
up, then down whatever the outcome), and jobs launched across them by mpirun in host 0.

Names: the set of a test process is mht<pid>-h0, mht<pid>-h1, ... with the switch mht<pid>-br,
so two runs at once do not collide and run_tests.py can tell a dead run's leftovers."""
import json
import os
import signal
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
NETNS_HOSTS = os.path.join(ROOT, "scripts", "netns_hosts.sh")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from mpi_launch import moe_rt_bin  # noqa: E402,F401  (tests/mpi_launch.py: the binary fixture)
from stats_read import (  # noqa: E402,F401  (tests/stats_read.py)
    complete_rows, open_stats, step_lines, wait_for_rows)


class Hosts:
    """N simulated hosts of `slots` slots; host i is namespace `{prefix}-h{i}`. `switch`: "veth"
    (a bridge) or "delay" (bench/netdelay, the delay switch; MOE_NETDELAY_BIN, else next to
    MOE_RT_BIN in build/bench)."""

    def __init__(self, n, slots, tmp_path, switch="veth"):
        self.n, self.slots, self.switch = n, slots, switch
        self.prefix = f"mht{os.getpid()}"
        self.state = tmp_path / "netns"
        self.env = dict(os.environ, MOE_NETNS_PREFIX=self.prefix, MOE_NETNS_DIR=str(self.state),
                        OPENBLAS_NUM_THREADS="1", MOE_NETNS_SWITCH=switch)
        if switch == "delay" and "MOE_NETDELAY_BIN" not in self.env:
            built = os.path.dirname(os.environ.get("MOE_RT_BIN", "build/moe_rt"))
            self.env["MOE_NETDELAY_BIN"] = os.path.join(built, "bench", "netdelay")
        self.jobs = []

    def name(self, i):
        return f"{self.prefix}-h{i}"

    def script(self, *args, check=True, timeout=60):
        proc = subprocess.run(["bash", NETNS_HOSTS, *map(str, args)], env=self.env,
                              capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"netns_hosts.sh {' '.join(map(str, args))}: {proc.stderr}")
        return proc

    def up(self):
        self.script("up", self.n, self.slots)

    def down(self):
        for job in self.jobs:  # mpirun and what it started: all in our namespaces, bar the wrapper
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait(timeout=30)
        proc = self.script("down", check=False, timeout=120)
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        left = [line for line in listed.splitlines() if line.startswith(self.prefix + "-")]
        assert proc.returncode == 0 and not left, (proc.stderr, left)

    def command(self, args, host=0):
        """`netns_hosts.sh exec HOST args...` (mpirun's settings in its environment)."""
        return ["bash", NETNS_HOSTS, "exec", str(host)] + [str(a) for a in args]

    def run(self, args, host=0, timeout=180):
        """Runs a command in a host's namespace; a hang fails the test."""
        try:
            return subprocess.run(self.command(args, host), env=self.env, capture_output=True,
                                  text=True, timeout=timeout, start_new_session=True)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{' '.join(map(str, args))} hung for more than {timeout} s")

    def start(self, args, out, err, host=0):
        """Starts a command in a host's namespace, output to the files `out` and `err`."""
        with open(out, "w") as o, open(err, "w") as e:
            job = subprocess.Popen(self.command(args, host), env=self.env, stdout=o, stderr=e,
                                   start_new_session=True)
        self.jobs.append(job)
        return job

    def pids(self, i):
        out = subprocess.run(["ip", "netns", "pids", self.name(i)], capture_output=True,
                             text=True).stdout
        return [int(p) for p in out.split()]

    def rank_pids(self, i):
        """The MPI ranks running on host i (processes with a world rank in their environment)."""
        ranks = []
        for pid in self.pids(i):
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if b"OMPI_COMM_WORLD_RANK=" in f.read():
                        ranks.append(pid)
            except OSError:
                continue
        return ranks

    def link_bytes(self, i):
        """Bytes through host i's link (both directions), counted at its eth0 (with either
        switch: the bridge's end of a veth counts the same)."""
        out = subprocess.run(["ip", "-n", self.name(i), "-j", "-s", "link", "show", "eth0"],
                             capture_output=True, text=True, check=True).stdout
        stats = json.loads(out)[0]["stats64"]
        return stats["rx"]["bytes"] + stats["tx"]["bytes"]


@pytest.fixture
def hosts(tmp_path, request):
    """Two hosts of 4 slots joined by a bridge (a test marked @pytest.mark.hosts(n, slots) or
    hosts(n, slots, switch="delay") chooses), up for the test and removed after it, passed or
    failed. Where they cannot be made (`netns_hosts.sh check` says why), the test is skipped."""
    marker = request.node.get_closest_marker("hosts")
    n, slots = marker.args if marker else (2, 4)
    h = Hosts(n, slots, tmp_path, **(marker.kwargs if marker else {}))
    check = h.script("check", check=False)
    if check.returncode != 0:
        pytest.skip(check.stderr.strip())
    try:
        h.up()
        yield h
    finally:
        h.down()


def pytest_configure(config):
    config.addinivalue_line("markers", "hosts(n, slots, switch='veth'): the simulated hosts a "
                            "test needs, joined by a bridge (veth) or the delay switch (delay)")
