"""A disk that fills during a run: a checkpoint or a statistics row that cannot be written ends
the run with one line naming the file and the system's reason, exit status 3, every file it
closed intact, and no crash at exit (HDF5 1.10 used to segfault in its library shutdown after a
file close failed on ENOSPC).

Two ways of filling the disk. A small tmpfs is the real thing, where the test may mount one (as
root, with the right to mount); elsewhere those cases skip, saying why. The file-size limit
(RLIMIT_FSIZE, set on the running process with prlimit once it has started, SIGXFSZ ignored) is
the equivalent failure injected anywhere: writes past the limit fail with EFBIG through the same
paths, so those cases always run."""
import os
import resource
import signal
import subprocess
import time

import h5py
import pytest

from conftest import launcher, run_env

MICRO = ["--model", "micro"]


@pytest.fixture
def small_fs(tmp_path):
    """A 2 MiB tmpfs mounted at tmp_path/small, unmounted after the test; skips where mounting is
    not allowed."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2M", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root and the right to mount): "
                    + (proc.stderr.strip() or "mount failed"))
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill(mnt, leave_kib):
    """Fills the file system at mnt until about leave_kib KiB are free."""
    st = os.statvfs(mnt)
    free_kib = st.f_bavail * st.f_frsize // 1024
    with open(mnt / "filler", "wb") as f:
        f.write(b"\0" * max(0, free_kib - leave_kib) * 1024)


def run(moe_rt_bin, args, np_=1, timeout=120):
    try:
        return subprocess.run(launcher(np_) + [moe_rt_bin] + [str(a) for a in args],
                              env=run_env(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"moe_rt {args} hung for more than {timeout} s")


def error_lines(stderr):
    return [line for line in stderr.splitlines() if line.startswith("moe_rt: error")]


def assert_clean_end(proc, names):
    """Exit 3 from moe_rt itself (no signal, no crash), one error line naming `names`."""
    out = proc.stdout + proc.stderr
    assert proc.returncode == 3, out[-3000:]
    assert "Segmentation fault" not in out and "Signal: " not in out, out[-3000:]
    errors = error_lines(proc.stderr)
    assert len(errors) == 1, proc.stderr[-3000:]
    for name in names:
        assert name in errors[0], errors[0]
    return errors[0]


def test_full_disk_checkpoint(moe_rt_bin, small_fs, tmp_path):
    ck = small_fs / "ck"
    stats = tmp_path / "s.h5"
    proc = run(moe_rt_bin, MICRO + ["--steps", 100, "--checkpoint-every", 1,
                                    "--keep-checkpoints", 50, "--checkpoint-dir", ck,
                                    "--stats", stats])
    line = assert_clean_end(proc, [str(ck / "step-"), "No space left on device"])
    assert "after step" in line
    # Every checkpoint left under a final name is complete; no temporary file is left.
    names = sorted(os.listdir(ck))
    assert names and not [n for n in names if n.endswith(".tmp")], names
    for n in names:
        with h5py.File(ck / n, "r") as f:
            assert f.attrs["format"] == "moe_rt.checkpoint"
    # The statistics file (on a disk with room) was closed with every step that ran.
    last = int(line.split("after step ")[1].split(":")[0])
    with h5py.File(stats, "r") as f:
        assert list(f["steps/step"][...]) == list(range(last + 1))


@pytest.mark.parametrize("ranks", [1, 2])
def test_full_disk_statistics(moe_rt_bin, small_fs, tmp_path, ranks):
    # 520 KiB free: the file is created and the datasets' first chunks (256 rows of micro) fit;
    # the next chunks do not, and a flush fails.
    fill(small_fs, 520)
    stats = small_fs / "s.h5"
    ck = tmp_path / "ck"
    proc = run(moe_rt_bin, MICRO + ["--steps", 400, "--stats", stats, "--checkpoint-every", 5,
                                    "--checkpoint-dir", ck], np_=ranks)
    line = assert_clean_end(proc, [str(stats), "No space left on device", "stopped without a "
                                   "checkpoint"])
    failed_row = int(line.split("the row of step ")[1].split(" ")[0])
    # The file holds every row before the failed one, and the newest checkpoint lies before it:
    # a resumed run records the missing rows again.
    with h5py.File(stats, "r") as f:
        assert list(f["steps/step"][...]) == list(range(failed_row))
    newest = max(int(n[5:13]) for n in os.listdir(ck) if n.endswith(".h5"))
    assert newest < failed_row


def start_limited(moe_rt_bin, args, started, limit_of, tmp_path):
    """Starts moe_rt as one process (no launcher: the limit must reach the rank itself, and MPI's
    start-up needs files larger than the limit), waits until started() says it is writing, then
    limits the size of the files it writes to limit_of() bytes. SIGXFSZ is ignored, so a write
    past the limit fails with EFBIG instead of killing the process."""
    out_path, err_path = tmp_path / "out.txt", tmp_path / "err.txt"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen([moe_rt_bin] + [str(a) for a in args], env=run_env(), stdout=out,
                                stderr=err,
                                preexec_fn=lambda: signal.signal(signal.SIGXFSZ, signal.SIG_IGN))
        try:
            deadline = time.monotonic() + 60
            while not started():
                assert proc.poll() is None, "moe_rt ended before the limit was set"
                assert time.monotonic() < deadline, "moe_rt did not start writing in 60 s"
                time.sleep(0.02)
            limit = limit_of()
            resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (limit, limit))
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail(f"moe_rt {args} hung")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out_path.read_text(),
                                       err_path.read_text())


def test_file_size_limit_checkpoint(moe_rt_bin, tmp_path):
    ck = tmp_path / "ck"
    proc = start_limited(moe_rt_bin, MICRO + ["--steps", 2000, "--checkpoint-every", 1,
                                              "--checkpoint-dir", ck, "--stats", "none"],
                         lambda: ck.is_dir() and any(n.endswith(".h5") for n in os.listdir(ck)),
                         lambda: 64 * 1024,
                         tmp_path)
    assert_clean_end(proc, [str(ck / "step-"), "File too large"])
    # The checkpoints written before the limit stay; the failed one leaves no temporary file.
    names = os.listdir(ck)
    assert [n for n in names if n.endswith(".h5")] and not [n for n in names if n.endswith(".tmp")]


def test_file_size_limit_statistics(moe_rt_bin, tmp_path):
    stats = tmp_path / "s.h5"

    def limit():
        time.sleep(0.3)  # some rows first
        return os.path.getsize(stats) + 16 * 1024

    # The file appears under its name when set-up is done (before that it is s.h5.new).
    proc = start_limited(moe_rt_bin, MICRO + ["--steps", 2000, "--stats", stats],
                         stats.exists, limit, tmp_path)
    line = assert_clean_end(proc, [str(stats), "File too large", "stopped without a checkpoint"])
    failed_row = int(line.split("the row of step ")[1].split(" ")[0])
    # The failed write left the file shorter than the end HDF5 recorded, and the limit keeps the
    # run from extending it: the line says how, and then the file reads.
    assert "extend it with 'truncate -s " in line, line
    command = line.split("extend it with '")[1].split("'")[0].split()
    assert command[:2] == ["truncate", "-s"] and command[3] == str(stats), command
    subprocess.run(command, check=True)
    with h5py.File(stats, "r") as f:
        assert list(f["steps/step"][...]) == list(range(failed_row))
