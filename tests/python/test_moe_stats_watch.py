"""`moe_stats.py watch`: follows a file being written and ends when the writer closes it, says so
when the writer is gone (killed), and stops at --timeout. On fixture writers (h5py in SWMR mode,
holding the lock moe_rt's writer holds) and on real moe_rt runs (MOE_RT_BIN)."""
import io
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

import moe_stats
import stats_fixture as sf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mpi_launch import launcher, run_env  # noqa: E402  (tests/mpi_launch.py, shared)

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))), "scripts", "moe_stats.py")


def watch(path, *args, timeout=120):
    return subprocess.run([sys.executable, SCRIPT, "watch", str(path), "--interval", "0.1",
                           *args], capture_output=True, text=True, timeout=timeout)


def step_numbers(out):
    """The step column of the step lines, in order."""
    steps = []
    for line in out.splitlines():
        cells = line.split()
        if len(cells) >= 8 and cells[0].isdigit() and cells[-1].startswith("(L"):
            steps.append(int(cells[0]))
    return steps


def test_a_closed_file_is_printed_whole(run_a):
    proc = watch(run_a)
    assert proc.returncode == 0, proc.stderr
    assert step_numbers(proc.stdout) == list(range(sf.NUM_STEPS))
    assert "per-layer balance at step 20" in proc.stdout
    assert proc.stdout.rstrip().endswith(f"closed {run_a}: 21 steps")


def test_a_live_writer_is_followed_until_the_timeout(tmp_path):
    path = tmp_path / "live.h5"
    writer = subprocess.Popen([sys.executable, sf.__file__, "swmr-writer", str(path), "5"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "ready"
        proc = watch(path, "--timeout", "0.5")
        assert proc.returncode == 124, proc.stdout + proc.stderr
        assert step_numbers(proc.stdout) == [0, 1, 2, 3, 4]     # the sixth row is incomplete
        assert "stopped after 0.5 s: 5 steps so far" in proc.stdout
    finally:
        writer.communicate("done\n", timeout=30)
    proc = watch(path)                     # the fixture writer closed it: flags cleared
    assert proc.returncode == 0 and "closed" in proc.stdout, proc.stdout


def test_a_killed_writer_is_reported_gone(tmp_path):
    path = tmp_path / "killed.h5"
    subprocess.run([sys.executable, sf.__file__, "killed-writer", str(path), "5"], timeout=60)
    proc = watch(path, "--timeout", "30")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert step_numbers(proc.stdout) == [0, 1, 2, 3, 4]
    assert "is gone without closing it (killed?): 5 complete steps" in proc.stdout


def test_a_file_that_never_appears(tmp_path):
    proc = watch(tmp_path / "never.h5", "--timeout", "0.3")
    assert proc.returncode == 124 and "did not appear" in proc.stdout


@pytest.fixture
def binary():
    path = os.environ.get("MOE_RT_BIN")
    if not path:
        pytest.skip("MOE_RT_BIN is not set: point it at the built moe_rt to watch a real run")
    return path


def test_a_real_run_is_followed_to_its_end(binary, tmp_path):
    # The watch starts first and waits for the file; the run writes 400 steps and closes it.
    path = tmp_path / "run.h5"
    watcher = subprocess.Popen([sys.executable, SCRIPT, "watch", str(path), "--interval", "0.05",
                                "--timeout", "240"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        run = subprocess.run(launcher(2) + [binary, "--model", "micro", "--steps", "400",
                                            "--stats", str(path)],
                             env=run_env(), capture_output=True, text=True, timeout=240)
        assert run.returncode == 0, run.stdout + run.stderr
        out, err = watcher.communicate(timeout=60)
    finally:
        if watcher.poll() is None:
            watcher.kill()
    assert watcher.returncode == 0, out + err
    assert step_numbers(out) == list(range(400))
    assert "per-layer balance at step 399" in out
    assert out.rstrip().endswith("400 steps")


def live_descendants(pid):
    """The processes below `pid` that have not exited (zombies left out), from /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue                                 # gone meanwhile
            if fields[0] != b"Z":
                children.setdefault(int(fields[1]), []).append(int(entry))
    found, pending = [], list(children.get(pid, []))
    while pending:
        found.append(pending.pop())
        pending.extend(children.get(found[-1], []))
    return found


def kill_tree(pid):
    """SIGKILL to `pid` and every process below it. Open MPI's launcher puts each rank in a process
    group of its own, so killing mpiexec's group leaves the ranks running (about a second, until
    they notice): the writer would still be appending. mpiexec is stopped first, so that it starts
    no rank while the ranks it started are killed, and killed last."""
    try:
        os.kill(pid, signal.SIGSTOP)
    except ProcessLookupError:
        pass                                             # exited, not yet reaped: still a parent
    for _ in range(100):
        below = live_descendants(pid)
        if not below:
            break
        for p in below:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_a_killed_real_run_is_reported_gone(binary, tmp_path):
    path = tmp_path / "killed.h5"
    run = subprocess.Popen(launcher(2) + [binary, "--model", "micro", "--steps", "1000000",
                                          "--stats", str(path)],
                           env=run_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
    try:
        live = watch(path, "--timeout", "3")          # waits for the file, follows it
        assert live.returncode == 124, live.stdout + live.stderr
        assert len(step_numbers(live.stdout)) > 0
    finally:
        kill_tree(run.pid)                             # mpiexec and the ranks it started
        run.wait(timeout=60)
    proc = watch(path, "--timeout", "60")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    steps = step_numbers(proc.stdout)
    assert steps == list(range(len(steps))) and len(steps) >= len(step_numbers(live.stdout))
    assert "is gone without closing it (killed?)" in proc.stdout


def test_on_a_terminal_the_table_is_redrawn_in_place(tmp_path):
    import io
    import moe_stats
    path = tmp_path / "live.h5"
    writer = subprocess.Popen([sys.executable, sf.__file__, "swmr-writer", str(path), "3"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "ready"
        out = io.StringIO()
        code = moe_stats._watch.watch(str(path), out, interval=0.05, timeout=0.3, tty=True)
    finally:
        writer.communicate("done\n", timeout=30)
    text = out.getvalue()
    assert code == 124
    table = "per-layer balance at step 2"
    # Drawn at every refresh; each redraw first moves up over the last one and erases it.
    assert text.count(table) >= 2
    height = 1 + 2 + sf.NUM_LAYERS          # blank line, title, header, a line per layer
    assert text.count(f"\x1b[{height}F\x1b[J") == text.count(table) - 1


def damaged_copies(source, folder):
    """Copies of `source` with 8 bytes of 0xff written over its metadata, one every 97 bytes
    (root attributes, group and dataset headers): the reads HDF5 fails in several ways."""
    data = open(source, "rb").read()
    for offset in range(48, 4096, 97):
        path = folder / f"damaged{offset}.h5"
        path.write_bytes(data[:offset] + b"\xff" * 8 + data[offset + 8:])
        yield path


def test_a_damaged_file_is_one_line_and_exit_2(cli, run_a, tmp_path):
    # Without the header's reads wrapped, HDF5's KeyError, RuntimeError or OSError ended the
    # watch in a traceback and exit 1, the code that means "the writer was killed".
    refused = 0
    for path in damaged_copies(run_a, tmp_path):
        code, out, err = cli("watch", path, "--interval", "0.05", "--timeout", "2")
        assert code in (0, 2), (path, code, out, err)
        if code == 2:
            refused += 1
            assert err.count("\n") == 1 and err.startswith(f"moe_stats.py: error: {path}: "), err
    assert refused > 0


def test_an_empty_file_is_refused_after_the_grace_period(tmp_path):
    # A 0-byte file no writer fills: refused once the grace period has passed, instead of a wait
    # without end (no --timeout).
    path = tmp_path / "empty.h5"
    path.write_bytes(b"")
    proc = watch(path, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr == (f"moe_stats.py: error: {path}: not a statistics file (0 bytes, still "
                           f"too short to read after {moe_stats._watch.OPEN_GRACE_S:g} s)\n")


def test_an_empty_file_within_the_timeout_is_a_timeout(cli, tmp_path):
    path = tmp_path / "empty.h5"
    path.write_bytes(b"")
    code, out, err = cli("watch", path, "--interval", "0.05", "--timeout", "0.3")
    assert code == 124 and f"{path}: not readable within 0.3 s" in out, out + err


def test_a_file_that_is_filled_within_the_grace_period_is_followed(run_a, tmp_path):
    # A writer that created the file and writes its superblock a moment later.
    path = tmp_path / "late.h5"
    path.write_bytes(b"")
    sleeps = []

    def sleep_then_fill(seconds):
        sleeps.append(seconds)
        if len(sleeps) == 2:
            shutil.copyfile(run_a, path)

    code = moe_stats._watch.watch(str(path), io.StringIO(), interval=0.05, sleep=sleep_then_fill)
    assert code == 0 and len(sleeps) >= 2


def test_a_resumed_file_says_that_only_it_is_followed(cli, tmp_path):
    first, second = tmp_path / "a.h5", tmp_path / "b.h5"
    sf.write_segment(str(first), sf.build_run("A"), 0, 10)
    sf.write_segment(str(second), sf.build_run("A"), 10, sf.NUM_STEPS, predecessor=str(first),
                     step=9)
    code, out, err = cli("watch", second, "--interval", "0.05")
    assert code == 0, out + err
    assert out.startswith(f"{second} resumed after step 9 from {first}; watch follows this file "
                          f"only (summary reads the whole run)\n")
    assert step_numbers(out) == list(range(10, sf.NUM_STEPS))
