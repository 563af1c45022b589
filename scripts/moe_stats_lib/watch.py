"""`moe_stats.py watch`: follows a statistics file while moe_rt writes it (SWMR reading): one line
per new step, and a per-layer balance table of the latest step, redrawn in place on a terminal
(printed once at the end otherwise). It ends when the writer closes the file, when the writer is
gone without closing it (killed: the file keeps its "open for writing" flags and no process holds
its lock), on Ctrl-C, or after --timeout seconds.

How the writer's state is told, without HDF5:
    closed      the superblock's file-consistency flags (byte 11 of a version 2 or 3 superblock
                at offset 0: bit 0 open for writing, bit 2 open for SWMR writing) are 0 in the
                file first opened, or the path now names another file (moe_rt's compaction at
                close puts a rewritten copy there)
    alive       another open file holds a lock on the file (moe_rt's writer holds an
                open-file-description write lock from creation to close: F_OFD_GETLK sees it)
    gone        flags still set and no lock: the writer died (or is a program that takes no
                lock; the file is then reported as it is and the watch ends)
Where the file system has no locks (ENOLCK), the watch cannot tell a dead writer from a live one
and runs until the flags clear, Ctrl-C or --timeout.

A file that exists but is too short to open (a writer that has only just created it) is retried
for OPEN_GRACE_S seconds, then refused as not a statistics file. The watch follows the one file
named: a resumed run's file is followed from its first row, and the watch says which file it was
resumed from (summary and the other commands read the whole chain).

Exit codes: 0 the writer closed the file (or it was closed already), 1 the writer is gone, 124
--timeout, 130 Ctrl-C; 2 an error (as every command), a damaged file included.

Shapes: L layers, E experts.
"""
from __future__ import annotations

import errno
import fcntl
import os
import struct
import time

import numpy as np

from .metrics import load_metrics
from .stats_file import (StatsError, check_format, complete_rows, decode, open_stats_file,
                         read_strings, resume_attributes, routing_label)

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
F_OFD_GETLK = getattr(fcntl, "F_OFD_GETLK", 36)   # Linux; Python >= 3.9 names it
FLOCK_FORMAT = "hhqqi4x"                          # struct flock on Linux: type, whence, start,
#                                                   len, pid (padded to 8 bytes)
STEP_NAMES = ("steps/step", "steps/loss", "steps/balance_loss", "steps/grad_norm", "steps/lr",
              "steps/tokens_per_s", "routing/expert_load")
EXIT_CLOSED, EXIT_GONE, EXIT_TIMEOUT, EXIT_INTERRUPTED = 0, 1, 124, 130
# A file shorter than this cannot be opened yet: its writer has only just created it. How long the
# watch waits for such a file to become readable before refusing it.
SUPERBLOCK_MIN_BYTES = 512
OPEN_GRACE_S = 10.0


def superblock_flags(fd):
    """The file-consistency flags of the superblock at offset 0 (versions 2 and 3, as moe_rt and
    h5py with libver latest write), or None for another superblock version."""
    head = os.pread(fd, 12, 0)
    if len(head) < 12 or head[:8] != HDF5_SIGNATURE or head[8] not in (2, 3):
        return None
    return head[11]


def lock_holder(fd):
    """True when another open file description holds a lock on the file, False when none does,
    None when the file system has no locks."""
    query = struct.pack(FLOCK_FORMAT, fcntl.F_RDLCK, os.SEEK_SET, 0, 0, 0)
    try:
        answer = fcntl.fcntl(fd, F_OFD_GETLK, query)
    except OSError as err:
        if err.errno in (errno.ENOLCK, errno.EINVAL, errno.EOPNOTSUPP):
            return None
        raise
    return struct.unpack(FLOCK_FORMAT, answer)[0] != fcntl.F_UNLCK


def writer_state(fd, path):
    """"closed", "alive", "gone" or "unknown" (flags set, no locks on this file system)."""
    flags = superblock_flags(fd)
    if flags == 0:
        return "closed"
    try:
        now = os.stat(path)
        mine = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (mine.st_dev, mine.st_ino):
            return "closed"        # replaced: moe_rt's compacted copy, written after closing
    except FileNotFoundError:
        pass                       # removed while written: judged by the lock alone
    if flags is None:
        return "unknown"
    held = lock_holder(fd)
    return "unknown" if held is None else "alive" if held else "gone"


class Follower:
    """An open statistics file and the rows read so far."""

    def __init__(self, path):
        self.path = path
        self.fd = os.open(path, os.O_RDONLY)
        try:
            self.f = open_stats_file(path)
        except BaseException:
            os.close(self.fd)
            raise
        try:
            self.read_header(path)
        except BaseException as err:
            self.close()
            if isinstance(err, (OSError, RuntimeError, KeyError)):  # HDF5 could not read it
                raise StatsError(f"{path}: cannot read, the file is truncated or damaged "
                                 f"({str(err).splitlines()[0]})") from None
            raise
        self.rows = 0

    def read_header(self, path):
        attrs = {k: decode(v) for k, v in self.f.attrs.items()}
        check_format(path, attrs)
        self.top_k = attrs.get("top_k")
        self.resumed = resume_attributes(path, attrs)
        missing = [name for name in STEP_NAMES if name not in self.f]
        if missing or "layers/routing" not in self.f:
            raise StatsError(f"{path}: missing dataset /{(missing or ['layers/routing'])[0]}")
        self.routing = read_strings(self.f, "layers/routing")
        self.optional = [name for name in ("routing/balance_loss", "routing/rank_overload")
                         if name in self.f]

    def close(self):
        self.f.close()
        os.close(self.fd)

    def refresh(self):
        """The rows complete now: {name: array of the new rows} (may be empty), and n."""
        names = list(STEP_NAMES) + self.optional
        try:
            if self.f.swmr_mode:
                self.f["steps/step"].refresh()      # the step column first: see hdf5-schema.md
                for name in names[1:]:
                    self.f[name].refresh()
            n = complete_rows(self.path, self.f, names)
            new = {name: self.f[name][self.rows:n] for name in names} if n > self.rows else {}
        except (OSError, RuntimeError, KeyError) as err:
            raise StatsError(f"{self.path}: cannot read, the file is truncated or damaged "
                             f"({str(err).splitlines()[0]})") from None
        self.rows = max(self.rows, n)
        return new


STEP_HEADER = (f"{'step':>7} {'loss':>9} {'balance':>10} {'grad norm':>10} {'lr':>10} "
               f"{'tokens/s':>10} {'worst viol':>11}")


def step_lines(new):
    lines = []
    if not new:
        return lines
    metrics = load_metrics(new["routing/expert_load"])      # [n, L]
    for i, step in enumerate(new["steps/step"]):
        viol = metrics["violation"][i]
        worst = int(np.argmax(viol))
        lines.append(f"{int(step):>7} {new['steps/loss'][i]:>9.4f} "
                     f"{new['steps/balance_loss'][i]:>10.3e} {new['steps/grad_norm'][i]:>10.4f} "
                     f"{new['steps/lr'][i]:>10.3e} {new['steps/tokens_per_s'][i]:>10.0f} "
                     f"{viol[worst]:>6.3f} (L{worst})")
    return lines


def layer_table(follower, last):
    """The per-layer balance lines of the last row read (`last`: that row's datasets)."""
    load = last["routing/expert_load"]                      # [L, E]
    m = load_metrics(load)
    ceiling = (f", collapse at max/mean = E/K = {load.shape[1] / follower.top_k:g}"
               if isinstance(follower.top_k, (int, float)) and follower.top_k > 0 else "")
    lines = [f"per-layer balance at step {int(last['steps/step'])} (load per expert: "
             f"assignments{ceiling})",
             f"{'layer':>5}  {'routing':<12} {'min/mean':>8} {'max/mean':>8} {'cv':>6} "
             f"{'dead':>4} {'diversity':>9} {'bal loss':>9} {'rank over':>9}"]
    mean = load.mean(axis=1)
    for layer in range(load.shape[0]):
        lo = m["min"][layer] / mean[layer] if mean[layer] > 0 else 1.0
        bal = last.get("routing/balance_loss")
        over = last.get("routing/rank_overload")
        lines.append(f"{layer:>5}  {routing_label(follower.routing[layer]):<12} {lo:>8.3f} "
                     f"{m['max_ratio'][layer]:>8.3f} {m['cv'][layer]:>6.3f} "
                     f"{int(m['dead'][layer]):>4d} {m['diversity'][layer]:>9.3f} "
                     + (f"{bal[layer]:>9.2e} " if bal is not None else f"{'-':>9} ")
                     + (f"{over[layer]:>9.3f}" if over is not None else f"{'-':>9}"))
    return lines


def wait_for_file(path, deadline, out, sleep):
    """Waits until `path` exists; False when the deadline passed first."""
    said = False
    while not os.path.exists(path):
        if deadline is not None and time.monotonic() >= deadline:
            return False
        if not said:
            out.write(f"waiting for {path} to appear ...\n")
            out.flush()
            said = True
        sleep(0.2)
    return True


def watch(path, out, interval=2.0, timeout=None, tty=None, sleep=time.sleep, grace=None):
    """Follows `path`; returns the exit code (EXIT_*). Raises StatsError for a bad file, and for
    one still too short to read after `grace` seconds (default OPEN_GRACE_S)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    tty = out.isatty() if tty is None else tty
    try:
        if not wait_for_file(path, deadline, out, sleep):
            out.write(f"{path}: did not appear within {timeout:g} s\n")
            return EXIT_TIMEOUT
        follower = open_with_retry(path, deadline, sleep,
                                   OPEN_GRACE_S if grace is None else grace)
        if follower is None:
            out.write(f"{path}: not readable within {timeout:g} s\n")
            return EXIT_TIMEOUT
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    if follower.resumed[0] is not None:
        out.write(f"{path} resumed after step {follower.resumed[1]} from {follower.resumed[0]}; "
                  f"watch follows this file only (summary reads the whole run)\n")
    table_height = 0
    last = None
    code = None
    try:
        out.write(STEP_HEADER + "\n")
        while True:
            state = writer_state(follower.fd, path)    # before reading: rows then are final
            new = follower.refresh()
            lines = step_lines(new)
            if new:
                last = {name: values[-1] for name, values in new.items()}
            if tty and table_height:
                out.write(f"\x1b[{table_height}F\x1b[J")   # up to the table's start, erase
                table_height = 0
            out.write("".join(line + "\n" for line in lines))
            if state == "closed":
                code, end = EXIT_CLOSED, f"the writer closed {path}: {follower.rows} steps"
            elif state == "gone":
                code, end = EXIT_GONE, (f"the writer of {path} is gone without closing it "
                                        f"(killed?): {follower.rows} complete steps")
            elif deadline is not None and time.monotonic() >= deadline:
                code, end = EXIT_TIMEOUT, (f"stopped after {timeout:g} s: {follower.rows} "
                                           f"steps so far")
            if last is not None and (tty or code is not None):
                table = layer_table(follower, last)
                out.write("\n" + "\n".join(table) + "\n")
                table_height = len(table) + 1
            if code is not None:
                out.write(end + "\n")
            out.flush()
            if code is not None:
                return code
            sleep(interval)
    except KeyboardInterrupt:
        out.write(f"\nstopped: {follower.rows} steps so far\n")
        return EXIT_INTERRUPTED
    finally:
        follower.close()


def open_with_retry(path, deadline, sleep, grace):
    """A Follower of `path`, or None when the deadline passed first. A file too short to hold a
    superblock is retried (a writer that has just created it) for at most `grace` seconds: moe_rt
    writes the superblock as it creates the file, so a file still that short after the grace
    period is not a statistics file being written (an empty file left by something else) and is
    refused with StatsError."""
    grace_end = time.monotonic() + grace
    while True:
        try:
            return Follower(path)
        except StatsError:
            try:
                size = os.path.getsize(path)
            except FileNotFoundError:
                raise StatsError(f"{path}: removed while opening it") from None
            if size >= SUPERBLOCK_MIN_BYTES:
                raise
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return None
            if now >= grace_end:
                raise StatsError(f"{path}: not a statistics file ({size} bytes, still too short "
                                 f"to read after {grace:g} s)") from None
            sleep(0.2)
        except FileNotFoundError:
            raise StatsError(f"{path}: removed while opening it") from None
