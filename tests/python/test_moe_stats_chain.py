"""Resumed runs: a file whose root attributes resumed_from / resumed_from_step name its
predecessor is read with all its predecessors as one run. Chains of 2 and 3 files read exactly like
the uninterrupted run; rows a predecessor wrote after the checkpoint are dropped; the world size
may change between files (rank axes padded with NaN); a moved folder, a killed writer's file and
files that contribute no rows are read; a missing predecessor, a loop, a gap or repeat of steps and
a change of model are errors naming the files; --no-chain reads one file alone."""
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest

import moe_stats
import stats_fixture as sf

WHOLE = sf.build_run("A")
OTHER = sf.build_run("B")   # different values at every step: what a predecessor ran after s


def with_redone_rows(start, stop, extra):
    """Run A's rows [start, stop) followed by run B's next `extra` rows: a predecessor that ran
    `extra` steps past its checkpoint (stop - 1) before it was interrupted."""
    datasets = {name: np.concatenate([data[start:stop],
                                      OTHER["datasets"][name][stop:stop + extra]])
                for name, data in WHOLE["datasets"].items()}
    return {**WHOLE, "datasets": datasets}


def write_chain(folder, bounds, extra=2):
    """Files seg0.h5, seg1.h5, ... holding run A's steps split at `bounds` (the first step of each
    file after the first), each predecessor with `extra` redone rows; returns their paths."""
    os.makedirs(folder, exist_ok=True)
    starts = [0] + list(bounds)
    stops = list(bounds) + [sf.NUM_STEPS]
    paths = []
    for i, (start, stop) in enumerate(zip(starts, stops)):
        path = os.path.join(str(folder), f"seg{i}.h5")
        redone = extra if i < len(starts) - 1 else 0
        run = sf.rows_of(with_redone_rows(0, stop, redone), start, stop + redone)
        attrs = sf.resume_attrs(paths[-1], start - 1) if paths else {}
        paths.append(sf.write_stats(path, run, attrs=attrs))
    return paths


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    return sf.write_stats(str(tmp_path_factory.mktemp("whole") / "whole.h5"), WHOLE)


def assert_same_arrays(run, reference):
    assert set(run.data) == set(reference.data)
    for name, data in reference.data.items():
        assert run.data[name].dtype == data.dtype, name
        np.testing.assert_array_equal(run.data[name], data, err_msg=name)
    assert run.routing == reference.routing and run.phases == reference.phases


@pytest.mark.parametrize("bounds", [(10,), (7, 14)], ids=["2 files", "3 files"])
def test_chain_reads_like_the_uninterrupted_run(tmp_path, whole, bounds):
    paths = write_chain(tmp_path, bounds)
    run = moe_stats.load_run(paths[-1])
    assert_same_arrays(run, moe_stats.load_run(whole))
    assert run.path == paths[-1] and run.is_chain
    with h5py.File(paths[-1], "r") as f:
        assert run.attrs["resumed_from"] == f.attrs["resumed_from"] == paths[-2]
    firsts = [0] + list(bounds)
    lasts = [b - 1 for b in bounds] + [sf.NUM_STEPS - 1]
    assert [(s.path, s.first_step, s.last_step, s.world_size) for s in run.segments] == [
        (p, a, b, sf.WORLD) for p, a, b in zip(paths, firsts, lasts)]
    assert [s.rows for s in run.segments] == [b - a + 1 for a, b in zip(firsts, lasts)]
    assert [s.rows_dropped for s in run.segments] == [2] * len(bounds) + [0]
    assert [s.resumed_from_step for s in run.segments] == [None] + [b - 1 for b in bounds]
    assert run.file_of_row(0) == paths[0] and run.file_of_row(sf.NUM_STEPS - 1) == paths[-1]


def test_rows_after_the_checkpoint_are_dropped(tmp_path):
    first, second = write_chain(tmp_path, (10,), extra=3)
    with h5py.File(first, "r") as f:   # the predecessor ran steps 10..12 before it was stopped
        assert list(f["steps/step"][-3:]) == [10, 11, 12]
        redone_loss = f["steps/loss"][-3:]
    run = moe_stats.load_run(second)
    np.testing.assert_array_equal(run.steps, np.arange(sf.NUM_STEPS))
    np.testing.assert_array_equal(run.data["steps/loss"][10:13],
                                  WHOLE["datasets"]["steps/loss"][10:13])
    assert not np.isin(redone_loss, run.data["steps/loss"]).any()


@pytest.mark.parametrize("kept", ["empty", "all rows redone"])
def test_a_file_may_contribute_no_rows(tmp_path, whole, kept):
    # seg1 resumed from seg0 after step 9 and died; seg2 resumed from seg1, from step 9 again.
    seg0 = sf.write_stats(str(tmp_path / "seg0.h5"), sf.rows_of(with_redone_rows(0, 10, 2), 0, 12))
    rows = (10, 10) if kept == "empty" else (10, 13)
    seg1 = sf.write_segment(str(tmp_path / "seg1.h5"), WHOLE, *rows, predecessor=seg0, step=9)
    seg2 = sf.write_segment(str(tmp_path / "seg2.h5"), WHOLE, 10, sf.NUM_STEPS, predecessor=seg1,
                            step=9)
    run = moe_stats.load_run(seg2)
    assert_same_arrays(run, moe_stats.load_run(whole))
    middle = run.segments[1]
    assert (middle.rows, middle.first_step, middle.last_step) == (0, None, None)
    assert middle.rows_dropped == (0 if kept == "empty" else 3)


def test_world_size_changes_from_8_to_2(tmp_path, cli):
    wide = sf.with_world(WHOLE, 8)
    first = sf.write_segment(str(tmp_path / "w8.h5"), wide, 0, 12)
    second = sf.write_segment(str(tmp_path / "w2.h5"), WHOLE, 12, sf.NUM_STEPS,
                              predecessor=first)
    run = moe_stats.load_run(second)
    load = run.data["routing/rank_load"]
    assert load.dtype == np.float64 and load.shape == (sf.NUM_STEPS, sf.NUM_LAYERS, 8)
    np.testing.assert_array_equal(load[:12], wide["datasets"]["routing/rank_load"][:12])
    np.testing.assert_array_equal(load[12:, :, :2], WHOLE["datasets"]["routing/rank_load"][12:])
    assert np.isnan(load[12:, :, 2:]).all()
    times = run.data["perf/phase_time"]
    assert times.shape == (sf.NUM_STEPS, 8, len(sf.PHASES))
    np.testing.assert_array_equal(times[12:, :2], WHOLE["datasets"]["perf/phase_time"][12:])
    assert np.isnan(times[12:, 2:]).all() and not np.isnan(times[:12]).any()
    np.testing.assert_array_equal(run.world_size_of_rows(), [8] * 12 + [2] * 9)
    assert [s.world_size for s in run.segments] == [8, 2]
    # Rank overload without the stored dataset: max/mean over the ranks that existed.
    derived = moe_stats.Run(run.path, run.attrs, run.routing,
                            {k: v for k, v in run.data.items() if k != "routing/rank_overload"},
                            run.phases, run.segments)
    np.testing.assert_allclose(moe_stats.rank_overload(derived),
                               run.data["routing/rank_overload"], rtol=1e-12)

    code, out, err = cli("summary", second)
    assert code == 0, err
    assert "2 (EP group 2); by file: 8, 2" in out
    assert "steps 0 .. 11 on 8 ranks" in out and "steps 12 .. 20 on 2 ranks" in out
    code, out, err = cli("plot", second, "--out", tmp_path / "figures")
    assert code == 0, err
    assert "ranks.png" in {os.path.basename(p) for p in out.split()}


def test_phases_matched_by_name_when_the_files_differ(tmp_path):
    # The older file names its phases in another order, lacks "allreduce" and has "legacy".
    names = list(sf.PHASES[-2::-1]) + ["legacy"]
    times = WHOLE["datasets"]["perf/phase_time"]
    older_times = np.concatenate([times[..., -2::-1], np.full(times.shape[:2] + (1,), 7.0)],
                                 axis=2)
    older = {**WHOLE, "strings": {**WHOLE["strings"], "perf/phases": names},
             "datasets": {**WHOLE["datasets"], "perf/phase_time": older_times}}
    first = sf.write_segment(str(tmp_path / "a.h5"), older, 0, 10)
    second = sf.write_segment(str(tmp_path / "b.h5"), WHOLE, 10, sf.NUM_STEPS, predecessor=first)
    run = moe_stats.load_run(second)
    assert run.phases == sf.PHASES + ("legacy",)
    joined = run.data["perf/phase_time"]
    np.testing.assert_array_equal(joined[:10, :, :-2], times[:10, :, :-1])
    assert np.isnan(joined[:10, :, -2]).all() and (joined[:10, :, -1] == 7.0).all()
    np.testing.assert_array_equal(joined[10:, :, :-1], times[10:])
    assert np.isnan(joined[10:, :, -1]).all()


def test_moved_folder_finds_predecessors_by_name(tmp_path, whole, cli):
    paths = write_chain(tmp_path / "old", (7, 14))
    shutil.move(str(tmp_path / "old"), str(tmp_path / "new"))
    newest = str(tmp_path / "new" / "seg2.h5")
    run = moe_stats.load_run(newest)
    assert_same_arrays(run, moe_stats.load_run(whole))
    assert [s.path for s in run.segments] == [str(tmp_path / "new" / os.path.basename(p))
                                              for p in paths]
    code, out, err = cli("summary", newest)
    assert code == 0, err
    assert f"from seg1.h5 (found next to it; named {paths[1]})" in out


def test_summary_of_a_chain(tmp_path, whole, cli):
    paths = write_chain(tmp_path, (7, 14))
    code, out, err = cli("summary", paths[-1])
    assert code == 0, err
    code, whole_out, _ = cli("summary", whole)
    lines = out.splitlines()
    start = lines.index("files     3, oldest first")
    assert lines[start + 1:start + 4] == [
        f"          steps 0 .. 6 on 2 ranks: {paths[0]} (2 later rows dropped: redone by its "
        f"successor)",
        f"          steps 7 .. 13 on 2 ranks: {paths[1]}, resumed after step 6 from seg0.h5 (2 "
        f"later rows dropped: redone by its successor)",
        f"          steps 14 .. 20 on 2 ranks: {paths[2]}, resumed after step 13 from seg1.h5"]
    # The figures are the whole run's; tokens/s leaves out the first step of each file.
    kept = [l for l in lines if not l.startswith(("file", "          steps", "tokens/s"))]
    assert kept == [l for l in whole_out.splitlines() if not l.startswith(("file", "tokens/s"))]
    tps = np.delete(WHOLE["datasets"]["steps/tokens_per_s"], [0, 7, 14])
    assert (f"tokens/s  {np.median(tps):.0f} (median over steps, without the first of each file)"
            in lines)


def test_variance_and_plot_of_a_chain(tmp_path, whole, cli):
    newest = write_chain(tmp_path, (7, 14))[-1]
    for args in (["--steps", "0,20"], ["--csv"], []):
        assert cli("variance", newest, *args) == cli("variance", whole, *args)
    code, out, err = cli("variance", whole, newest, "--steps", "3,17")
    assert code == 0 and err == "" and out.splitlines()[-1].endswith("0.00%")
    code, out, err = cli("plot", newest, whole, "--out", tmp_path / "figures")
    assert code == 0, err
    assert len(out.split()) == 8


def test_stored_variance_warning_names_the_file_of_the_row(tmp_path, cli):
    bad = {**WHOLE, "datasets": dict(WHOLE["datasets"])}
    bad["datasets"]["routing/load_variance"] = bad["datasets"]["routing/load_variance"] + 1.0
    first = sf.write_segment(str(tmp_path / "a.h5"), bad, 0, 10)
    second = sf.write_segment(str(tmp_path / "b.h5"), WHOLE, 10, sf.NUM_STEPS, predecessor=first)
    code, _, err = cli("variance", second, "--steps", "5,15")
    assert code == 0
    assert len(err.splitlines()) == sf.NUM_LAYERS and all(
        line.startswith(f"moe_stats.py: warning: {first}: /routing/load_variance at step 5")
        for line in err.splitlines())
    code, _, err = cli("summary", second)
    assert code == 0 and f"(first at step 0 layer 0 in {first}:" in err


def test_killed_writer_predecessor_is_read(tmp_path, whole):
    # The writer wrote steps 0..11 (and /steps/* of step 12), then was killed: its file is still
    # flagged as open for SWMR writing, which a plain HDF5 open refuses.
    first = str(tmp_path / "killed.h5")
    proc = subprocess.run([sys.executable, sf.__file__, "killed-writer", first, "12"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == -9, proc.stderr
    with pytest.raises(OSError, match="already open for write"):
        h5py.File(first, "r")
    second = sf.write_segment(str(tmp_path / "resumed.h5"), WHOLE, 8, sf.NUM_STEPS,
                              predecessor=first)
    run = moe_stats.load_run(second)
    assert_same_arrays(run, moe_stats.load_run(whole))
    assert (run.segments[0].rows, run.segments[0].rows_dropped) == (8, 4)


def test_no_chain_reads_one_file(tmp_path, cli):
    paths = write_chain(tmp_path, (7, 14))
    run = moe_stats.load_run(paths[-1], chain=False)
    np.testing.assert_array_equal(run.steps, np.arange(14, sf.NUM_STEPS))
    assert not run.is_chain and run.segments[0].resumed_from == paths[1]
    code, out, err = cli("summary", paths[-1], "--no-chain")
    assert code == 0, err
    assert f"resumed   after step 13 from {paths[1]} (not read: this file alone)" in out
    assert "7 (step 14 .. 20)" in out
    code, out, err = cli("variance", paths[-1], "--no-chain")
    assert code == 0 and "(Step 14 vs Step 20)" in out
    code, out, err = cli("variance", paths[-1], "--steps", "0,20", "--no-chain")
    assert code == 2 and "step 0 is not in the file" in err
    code, out, err = cli("plot", paths[-1], "--out", tmp_path / "figures", "--no-chain")
    assert code == 0, err


def test_resumed_from_a_run_without_statistics(tmp_path, cli):
    # Its run resumed one that ran with --stats none: resumed_from_step alone, no predecessor.
    first = sf.write_stats(str(tmp_path / "first.h5"), sf.rows_of(WHOLE, 7, 14),
                           attrs={"resumed_from_step": np.int64(6)})
    run = moe_stats.load_run(first)
    np.testing.assert_array_equal(run.steps, np.arange(7, 14))
    assert run.segments[0].resumed_from is None and run.segments[0].resumed_from_step == 6
    code, out, err = cli("summary", first)
    assert code == 0, err
    assert "resumed   after step 6 from a run that kept no statistics file" in out
    # As the oldest file of a chain.
    second = sf.write_segment(str(tmp_path / "second.h5"), WHOLE, 14, sf.NUM_STEPS, first)
    run = moe_stats.load_run(second)
    np.testing.assert_array_equal(run.steps, np.arange(7, sf.NUM_STEPS))
    code, out, err = cli("summary", second)
    assert code == 0, err
    assert "resumed   after step 6 from a run that kept no statistics file" in out
    assert "files" in out


def one_error_line(cli, *argv):
    code, out, err = cli(*argv)
    assert code == 2 and out == "" and len(err.splitlines()) == 1, err
    assert err.startswith("moe_stats.py: error: ")
    return err.strip()


@pytest.mark.parametrize("same_name", [False, True], ids=["other name", "same name"])
def test_missing_predecessor(tmp_path, cli, same_name):
    # same name: the predecessor was called run.h5 too, in a folder since deleted; the file
    # itself, run.h5 in its own folder, is not taken for it.
    (tmp_path / "gone").mkdir()
    gone = sf.write_segment(str(tmp_path / "gone" / ("run.h5" if same_name else "a.h5")), WHOLE,
                            0, 10)
    (tmp_path / "here").mkdir()
    newest = sf.write_segment(str(tmp_path / "here" / "run.h5"), WHOLE, 10, sf.NUM_STEPS,
                              predecessor=gone)
    shutil.rmtree(tmp_path / "gone")
    error = one_error_line(cli, "summary", newest)
    assert f"predecessor '{gone}' of '{newest}' not found" in error
    assert "pass --no-chain to read this file alone" in error
    assert cli("summary", newest, "--no-chain")[0] == 0


def test_missing_predecessor_of_a_predecessor(tmp_path, cli):
    paths = write_chain(tmp_path, (7, 14))
    os.remove(paths[0])
    error = one_error_line(cli, "variance", paths[2])
    assert (f"predecessor '{paths[0]}' of '{paths[1]}' not found; pass --no-chain to read "
            f"'{paths[2]}' alone") in error


def test_loop_of_predecessors(tmp_path, cli):
    a, b = str(tmp_path / "a.h5"), str(tmp_path / "b.h5")
    sf.write_segment(a, WHOLE, 0, 10, attrs=sf.resume_attrs(b, 20))
    sf.write_segment(b, WHOLE, 10, sf.NUM_STEPS, predecessor=a)
    error = one_error_line(cli, "variance", b)
    assert f"'{a}' resumed from '{b}'" in error and "loop" in error
    itself = sf.write_segment(str(tmp_path / "self.h5"), WHOLE, 10, sf.NUM_STEPS,
                              predecessor=str(tmp_path / "self.h5"))
    assert "loop" in one_error_line(cli, "summary", itself)


def narrower(run):
    """`run` with 3 experts instead of 4."""
    datasets = dict(run["datasets"])
    for name in ("routing/expert_load", "routing/bias"):
        datasets[name] = datasets[name][:, :, :3]
    return {**run, "datasets": datasets}


def rerouted(run):
    """`run` whose layer 1 is top-k instead of hash."""
    kinds = sf.routing_kinds()
    kinds[1] = "topk"
    return {**run, "strings": {**run["strings"], "layers/routing": kinds}}


@pytest.mark.parametrize("change, words", [(narrower, "has 6 layers x 3 experts"),
                                           (rerouted, "routes its layers")])
def test_model_must_not_change(tmp_path, cli, change, words):
    first = sf.write_segment(str(tmp_path / "a.h5"), change(WHOLE), 0, 10)
    second = sf.write_segment(str(tmp_path / "b.h5"), WHOLE, 10, sf.NUM_STEPS, predecessor=first)
    error = one_error_line(cli, "plot", second, "--out", tmp_path / "figures")
    assert f"'{first}' {words}" in error and f"successor '{second}'" in error


@pytest.mark.parametrize("rows, step, word", [((0, 8), 9, "gap"), ((0, 12), 10, "repeat")])
def test_steps_must_continue(tmp_path, cli, rows, step, word):
    # gap: the predecessor's rows end at step 7, the successor resumed after step 9; repeat: the
    # successor claims the checkpoint of step 10 but starts at step 10.
    first = sf.write_segment(str(tmp_path / "a.h5"), WHOLE, *rows)
    second = sf.write_segment(str(tmp_path / "b.h5"), WHOLE, 10, sf.NUM_STEPS, predecessor=first,
                              step=step)
    error = one_error_line(cli, "summary", second)
    assert f"'{second}' starts at step 10" in error and f"'{first}'" in error and word in error


def test_predecessor_must_be_the_run_that_was_resumed(tmp_path, cli):
    # The chain's second file resumed run 1111…; a file of another run (same model, same steps)
    # now stands at the predecessor's path.
    first = sf.write_segment(str(tmp_path / "a.h5"), WHOLE, 0, 10,
                             attrs={"run_id": "1111111111111111"})
    second = sf.write_segment(str(tmp_path / "b.h5"), WHOLE, 10, sf.NUM_STEPS, predecessor=first,
                              attrs={"run_id": "2222222222222222",
                                     "resumed_from_run": "1111111111111111"})
    assert cli("summary", second)[0] == 0
    sf.write_segment(str(tmp_path / "a.h5"), OTHER, 0, 10, attrs={"run_id": "3333333333333333"})
    error = one_error_line(cli, "summary", second)
    assert f"'{second}' resumed run 1111111111111111" in error
    assert f"'{first}'" in error and "is run 3333333333333333" in error
    assert "replaced by another run's" in error and "--no-chain" in error
    # A predecessor without a run id cannot be the run a successor names either.
    sf.write_segment(str(tmp_path / "a.h5"), WHOLE, 0, 10)
    assert "is a file without a run id" in one_error_line(cli, "summary", second)
    # Files of runs before run ids (no resumed_from_run) are joined as before.
    third = sf.write_segment(str(tmp_path / "c.h5"), WHOLE, 10, sf.NUM_STEPS, predecessor=first)
    assert cli("summary", third)[0] == 0
