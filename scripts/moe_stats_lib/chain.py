"""A resumed run as one Run: the chain of statistics files that name their predecessors.

A run resumed from a checkpoint writes a new file whose root attributes say where it came from:
`resumed_from` (the predecessor file's path, absolute as written) and `resumed_from_step` (the
step s of the checkpoint; the file's rows start at step s + 1). The predecessor may itself be
resumed, may hold rows past s (steps that ran after the checkpoint and were redone by the
successor: dropped) and may be the file of a killed writer (read as any file is, for SWMR).

The chain rule (docs/hdf5-schema.md, "Resumed runs"):
    - resumed_from is looked for as written (a relative path: from the folder of the file that
      names it), then under its own name in the folder of the file that names it, so that a
      folder of runs can be moved or copied; else StatsError. A file met twice is a loop.
    - From each predecessor, the rows with step <= s are kept, s being the smallest
      resumed_from_step of the files after it (a file may contribute no rows).
    - The predecessor must be the file of the run whose checkpoint was resumed: its run_id is
      the successor's resumed_from_run (when the successor records one).
    - Layers, experts and layer routing must agree between every file and its successor.
    - The concatenated steps must rise by exactly 1 from row to row: a gap or a repeat is an
      error naming the two files.
    - Per-step datasets: those in every file. The W axis of /routing/rank_load [N, L, W] and of
      /perf/phase_time [N, W, num_phases] is padded to the largest W with NaN when the files'
      W differ (rank_load is then float64); otherwise the arrays keep their dtype. Phase columns
      are matched by name when the files' /perf/phases differ (NaN where a file lacks one).
    - Validation rows (/eval) are kept by the same rule on the step they followed, from the
      files that have them; an optional validation dataset (eval/dropped) only when every file
      with validation rows has it, as for the per-step datasets.
    - attrs are the newest file's; Run.segments lists each file, oldest first.

Shapes: N rows (steps) of the whole run, L layers, E experts, W ranks.
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np

from .stats_file import Run, StatsError, empty_file_error, read_file

# Per-step datasets with a rank axis, and that axis.
RANK_AXIS = {"routing/rank_load": 2, "perf/phase_time": 1, "routing/source_expert_load": 2}


def load_run(path, chain=True):
    """The run of `path`: with chain=True (the default), the file and all its predecessors as
    one Run; with chain=False the file alone. Raises StatsError naming the file at fault."""
    run = read_file(path)
    if chain and run.segments[0].resumed_from is not None:
        run = join_files(read_predecessors(run))
    if len(run.steps) == 0:
        raise empty_file_error(path)
    return run


def predecessor_path(holder, source, newest=None):
    """Where the predecessor named `source` by the file `holder` is: as written, else under its
    own name next to `holder`. newest: the file the caller named, for the error's hint."""
    folder = os.path.dirname(holder)
    candidates = [os.path.join(folder, source), os.path.join(folder, os.path.basename(source))]
    if os.path.exists(candidates[0]):
        return candidates[0]
    # Not the holder itself: a predecessor may share its name in another folder.
    if os.path.exists(candidates[1]) and not os.path.samefile(candidates[1], holder):
        return candidates[1]
    tried = "" if candidates[1] == source else f" (nor '{candidates[1]}')"
    alone = "this file" if newest in (None, holder) else f"'{newest}'"
    raise StatsError(f"predecessor '{source}' of '{holder}' not found{tried}; pass --no-chain "
                     f"to read {alone} alone")


def read_predecessors(newest):
    """[(run, cutoff)] newest first: every file of the chain and the last step kept from it
    (None: all its rows). Follows resumed_from until a file that did not resume."""
    files = [(newest, None)]
    seen = {file_identity(newest.path): newest.path}
    run, cutoff = newest, None
    while run.segments[0].resumed_from is not None:
        source, step = run.segments[0].resumed_from, run.segments[0].resumed_from_step
        path = predecessor_path(run.path, source, newest.path)
        identity = file_identity(path)
        if identity in seen:
            raise StatsError(f"'{run.path}' resumed from '{source}', which is '{seen[identity]}', "
                             f"already read in this chain: the predecessors form a loop")
        seen[identity] = path
        predecessor = read_file(path)
        check_same_run(predecessor, run, source)
        check_same_model(predecessor, run)
        cutoff = step if cutoff is None else min(cutoff, step)
        files.append((predecessor, cutoff))
        run = predecessor
    return files


def file_identity(path):
    """(device, inode): the same file under two names, or through a link, is one file."""
    info = os.stat(path)
    return info.st_dev, info.st_ino


def check_same_run(predecessor, successor, source):
    """The predecessor is the file of the run whose checkpoint the successor resumed: its run_id
    is the successor's resumed_from_run. Files written before runs had ids carry neither, and
    are joined as before."""
    expected = successor.attrs.get("resumed_from_run") or ""
    found = predecessor.attrs.get("run_id")
    if expected and found != expected:
        what = f"run {found}" if found else "a file without a run id"
        raise StatsError(f"'{successor.path}' resumed run {expected}, but its predecessor "
                         f"'{predecessor.path}' (resumed_from '{source}') is {what}: the file was "
                         f"replaced by another run's; pass --no-chain to read '{successor.path}' "
                         f"alone")


def check_same_model(predecessor, successor):
    """Layers, experts and layer routing agree (world size and phases may differ)."""
    if (predecessor.num_layers, predecessor.num_experts) != (successor.num_layers,
                                                             successor.num_experts):
        raise StatsError(f"'{predecessor.path}' has {predecessor.num_layers} layers x "
                         f"{predecessor.num_experts} experts, but its successor "
                         f"'{successor.path}' has {successor.num_layers} x "
                         f"{successor.num_experts}; the files of one run must agree (pass "
                         f"--no-chain to read one file alone)")
    if predecessor.routing != successor.routing:
        raise StatsError(f"'{predecessor.path}' routes its layers {list(predecessor.routing)}, "
                         f"but its successor '{successor.path}' routes them "
                         f"{list(successor.routing)}; the files of one run must agree (pass "
                         f"--no-chain to read one file alone)")


def join_files(files):
    """One Run from read_predecessors' [(run, cutoff)] (newest first)."""
    parts, segments = [], []
    for run, cutoff in reversed(files):   # oldest first
        keep = np.ones(len(run.steps), dtype=bool) if cutoff is None else run.steps <= cutoff
        rows = int(keep.sum())
        steps = run.steps[keep]
        parts.append((run, keep))
        segments.append(dataclasses.replace(
            run.segments[0], rows=rows, rows_dropped=len(keep) - rows,
            first_step=int(steps[0]) if rows else None,
            last_step=int(steps[-1]) if rows else None))
    check_consecutive(parts)
    newest = files[0][0]
    names = [name for name in newest.data if all(name in run.data for run, _ in parts)]
    phases = (chain_phases([run for run, _ in parts]) if "perf/phase_time" in names
              else newest.phases)
    data = {name: join_dataset(name, parts, phases) for name in names}
    return Run(path=newest.path, attrs=newest.attrs, routing=newest.routing, data=data,
               phases=phases, segments=tuple(segments), eval=join_eval(files))


def join_eval(files):
    """The validation rows of read_predecessors' [(run, cutoff)] (newest first), oldest first:
    from each file that has them, those after a step <= its cutoff."""
    parts = []
    for run, cutoff in reversed(files):
        if not run.eval:
            continue
        keep = (np.ones(len(run.eval["eval/step"]), dtype=bool) if cutoff is None
                else run.eval["eval/step"] <= cutoff)
        parts.append({name: values[keep] for name, values in run.eval.items()})
    if not parts:
        return {}
    names = [name for name in parts[-1] if all(name in p for p in parts)]
    return {name: np.concatenate([p[name] for p in parts]) for name in names}


def check_consecutive(parts):
    """The kept steps, file after file, rise by exactly 1 from row to row."""
    previous = None   # (step, path) of the last row kept so far
    for run, keep in parts:
        steps = run.steps[keep]
        if len(steps) == 0:
            continue
        if previous is not None and steps[0] != previous[0] + 1:
            raise StatsError(f"'{run.path}' starts at step {int(steps[0])} but the rows kept "
                             f"from its predecessor '{previous[1]}' end at step {previous[0]}; "
                             f"a resumed run must continue at the next step (a "
                             f"{'repeat' if steps[0] <= previous[0] else 'gap'})")
        bad = np.nonzero(np.diff(steps) != 1)[0]
        if bad.size:
            i = int(bad[0])
            raise StatsError(f"'{run.path}': step {int(steps[i])} is followed by step "
                             f"{int(steps[i + 1])}; the steps of a resumed run must rise by 1")
        previous = (int(steps[-1]), run.path)


def chain_phases(runs):
    """Phase names of the joined /perf/phase_time: the newest file's, then any only older files
    name (in the order they first appear, newest file first)."""
    phases = []
    for run in reversed(runs):
        phases += [name for name in run.phases if name not in phases]
    return tuple(phases)


def join_dataset(name, parts, phases):
    """The kept rows of dataset `name` of every file, oldest first, with the rank axis padded to
    the largest W (NaN) and phase columns matched by name where the files differ."""
    arrays = [run.data[name][keep] for run, keep in parts]
    if name == "perf/phase_time" and any(run.phases != phases for run, _ in parts):
        arrays = [by_phase_name(array, run, phases) for array, (run, _) in zip(arrays, parts)]
    axis = RANK_AXIS.get(name)
    if axis is not None:
        width = max(array.shape[axis] for array in arrays)
        if any(array.shape[axis] != width for array in arrays):
            arrays = [pad_axis(array, axis, width) for array in arrays]
    return np.concatenate(arrays, axis=0)


def by_phase_name(array, run, phases):
    """[n, W, num_phases of the file] -> [n, W, len(phases)], NaN where the file has no phase."""
    if len(run.phases) != array.shape[2]:
        raise StatsError(f"{run.path}: /perf/phases names {len(run.phases)} phases but "
                         f"/perf/phase_time has {array.shape[2]}")
    out = np.full(array.shape[:2] + (len(phases),), np.nan)
    out[:, :, [phases.index(p) for p in run.phases]] = array
    return out


def pad_axis(array, axis, width):
    """array as float64, `axis` extended to `width` with NaN."""
    shape = list(array.shape)
    shape[axis] = width
    out = np.full(shape, np.nan)
    out[tuple(slice(0, n) for n in array.shape)] = array
    return out
