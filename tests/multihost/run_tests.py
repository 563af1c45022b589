"""CTest entry point of the multihost tests: hosts simulated by network namespaces
(scripts/netns_hosts.sh). Where namespaces cannot be made (not root, no `ip`, no permission) it
prints one line saying why and exits 77, which CTest reports as skipped (SKIP_RETURN_CODE), not
passed. Otherwise it runs the pytest suite of this folder and exits with its status.

Every set of hosts a test makes is removed by the test's fixture, also when the test fails; a
SIGTERM or SIGINT to this process removes the set in use too. A run killed outright (SIGKILL)
cannot clean up: the next run removes the namespaces of runs whose process is gone (prefix
mht<pid>, see conftest.py)."""
import os
import re
import signal
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
NETNS_HOSTS = os.path.join(HERE, "..", "..", "scripts", "netns_hosts.sh")
STALE = re.compile(r"^mht(\d+)-(?:h\d+|br)$")


def netns_hosts(prefix, *args):
    env = dict(os.environ, MOE_NETNS_PREFIX=prefix, MOE_NETNS_DIR=f"/tmp/{prefix}-netns")
    return subprocess.run(["bash", NETNS_HOSTS, *args], env=env, capture_output=True, text=True,
                          timeout=120)


def remove_stale_sets():
    """Sets of hosts left by earlier runs of this suite that were killed outright."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    owners = {int(m.group(1)) for m in map(STALE.match, (line.split()[0] for line in
                                                         listed.splitlines() if line.strip())) if m}
    for pid in sorted(owners):
        if not os.path.exists(f"/proc/{pid}"):
            print(f"multihost: removing namespaces left by an earlier run (mht{pid})")
            netns_hosts(f"mht{pid}", "down")


def main():
    check = netns_hosts("mhcheck", "check")
    if check.returncode != 0:
        reason = (check.stderr.strip().splitlines() or ["netns_hosts.sh check failed"])[-1]
        print(f"multihost tests SKIPPED: {reason}")
        return 77
    remove_stale_sets()

    def stop(signum, _frame):
        netns_hosts(f"mht{os.getpid()}", "down")
        sys.exit(128 + signum)

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, stop)
    import pytest  # only now: a machine that skips needs no pytest

    # -s: the measured times and bytes the tests print appear in the CTest log.
    return pytest.main(["-q", "-rs", "-s", "-p", "no:cacheprovider", HERE] + sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
