"""Validation loss (--val-data, --eval-every, --eval-batches): when evaluations run, what they
write (the step table, the summary, /eval in the statistics file), that they equal the training
loss on the same sequences, change no training bit, give the same bits on any rank count, continue
across a resume, and that bad values are refused with one message."""
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

from conftest import launcher, run_env

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
from moe_stats_lib.chain import load_run  # noqa: E402

MICRO = ["--model", "micro"]
SHARD_MAGIC, SHARD_VERSION = 20240520, 1
EVAL_EXACT = ("eval/step", "eval/loss", "eval/tokens", "eval/expert_load", "eval/load_variance",
              "eval/max_violation")


def moe(moe_rt_bin, args, np_=2, timeout=120):
    try:
        return subprocess.run(launcher(np_) + [moe_rt_bin] + [str(a) for a in args],
                              env=run_env(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"moe_rt {args} hung for more than {timeout} s")


def ok(moe_rt_bin, args, np_=2):
    proc = moe(moe_rt_bin, args, np_)
    assert proc.returncode == 0, proc.stderr
    return proc


def write_shard(path, tokens):
    header = np.zeros(256, dtype="<i4")
    header[:3] = [SHARD_MAGIC, SHARD_VERSION, len(tokens)]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype="<u2").tobytes())


def read(path, names):
    with h5py.File(path, "r") as f:
        return {name: f[name][()] for name in names}


def test_evaluations_follow_eval_every_and_the_last_step(moe_rt_bin, tmp_path):
    stats = tmp_path / "run.h5"
    proc = ok(moe_rt_bin, MICRO + ["--steps", 12, "--val-data", "synthetic", "--eval-every", 5,
                                   "--eval-batches", 3, "--stats", stats])
    with h5py.File(stats, "r") as f:
        assert f["eval/step"][()].tolist() == [4, 9, 11]
        assert f["eval/tokens"][()].tolist() == [3 * 2 * 16] * 3  # K batches x W·B x S
        assert f["eval/expert_load"].shape == (3, 3, 4)
        # Every validation token is routed to K = 2 experts in every layer.
        assert (f["eval/expert_load"][()].sum(axis=2) == 2 * 96).all()
        assert f["eval/loss"].attrs["units"] == "nats/token"
        assert f.attrs["val_data"].startswith("synthetic")
        loss = f["eval/loss"][()]
    assert np.isfinite(loss).all() and loss[-1] < loss[0]
    # The step table: a val_loss column, filled on the evaluated steps only.
    lines = proc.stdout.splitlines()
    header = next(line for line in lines if line.split()[:2] == ["step", "loss"])
    assert header.split()[-2:] == ["val_loss", "val_viol"]
    rows = {int(line.split()[0]): line.split() for line in lines
            if line.split() and line.split()[0].isdigit() and len(line.split()) >= 9}
    assert sorted(rows) == list(range(12))
    for step, fields in rows.items():  # ... max_viol eta [val_loss val_viol]
        assert len(fields) == (11 if step in (4, 9, 11) else 9), fields
    assert float(rows[11][9]) == pytest.approx(loss[-1], abs=1e-4)
    assert f"validation loss {loss[-1]:.4f} after step 11" in proc.stdout


def test_no_val_data_no_eval_group_and_table_unchanged(moe_rt_bin, tmp_path):
    stats = tmp_path / "run.h5"
    proc = ok(moe_rt_bin, MICRO + ["--steps", 2, "--stats", stats])
    with h5py.File(stats, "r") as f:
        assert "eval" not in f and "val_data" not in f.attrs
    assert "val_loss" not in proc.stdout


def test_eval_loss_is_the_training_loss_of_the_same_sequences(moe_rt_bin, tmp_path):
    """The validation loss after step s over the sequences that step s + 1 trains on is that
    step's training loss, bit for bit: the same forward, the same sums. Training reads the file
    in sequence (--data-order sequential), so step s + 1's sequences start at token
    (s + 1)·G·S, where the validation file starts."""
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, 64, size=4096)
    S, G, s = 16, 2, 2  # micro: 2 ranks x 1 sequence
    write_shard(tmp_path / "train.bin", tokens)
    write_shard(tmp_path / "val.bin", tokens[(s + 1) * G * S:])
    stats = tmp_path / "run.h5"
    ok(moe_rt_bin, MICRO + ["--steps", 4, "--data", f"tokens:{tmp_path / 'train.bin'}",
                            "--data-order", "sequential",
                            "--val-data", f"tokens:{tmp_path / 'val.bin'}", "--eval-every", 3,
                            "--eval-batches", 1, "--stats", stats])
    got = read(stats, ["eval/step", "eval/loss", "steps/loss"])
    assert got["eval/step"].tolist() == [2, 3]
    assert got["eval/loss"][0] == got["steps/loss"][s + 1]


def test_evaluations_change_no_training_bit(moe_rt_bin, tmp_path):
    names = ["steps/loss", "steps/grad_norm", "routing/expert_load", "routing/bias"]
    plain, evaluated = tmp_path / "plain.h5", tmp_path / "eval.h5"
    ok(moe_rt_bin, MICRO + ["--steps", 8, "--stats", plain])
    ok(moe_rt_bin, MICRO + ["--steps", 8, "--val-data", "synthetic", "--eval-every", 1,
                            "--stats", evaluated])
    a, b = read(plain, names), read(evaluated, names)
    for name in names:
        assert a[name].tobytes() == b[name].tobytes(), name


def test_evaluations_are_the_same_bits_on_any_rank_count(moe_rt_bin, tmp_path):
    files = []
    for np_, batch in ((1, 4), (2, 2), (4, 1)):
        stats = tmp_path / f"np{np_}.h5"
        ok(moe_rt_bin, MICRO + ["--steps", 6, "--batch-per-rank", batch, "--val-data",
                                "synthetic", "--eval-every", 2, "--stats", stats], np_=np_)
        files.append(read(stats, EVAL_EXACT))
    for other in files[1:]:
        for name in EVAL_EXACT:
            assert files[0][name].tobytes() == other[name].tobytes(), name


def test_evaluations_continue_across_a_resume(moe_rt_bin, tmp_path):
    common = MICRO + ["--val-data", "synthetic", "--eval-every", 3]
    whole, first, second = tmp_path / "whole.h5", tmp_path / "first.h5", tmp_path / "second.h5"
    ok(moe_rt_bin, common + ["--steps", 9, "--stats", whole])
    ok(moe_rt_bin, common + ["--steps", 5, "--checkpoint-every", 3, "--stats", first])
    # Resumed from the checkpoint of step 2 (the folder also holds step 4's, the last): the
    # evaluation options are continued from it, --steps extends the run.
    folder = tmp_path / "first-checkpoints"
    oldest = sorted(os.listdir(folder))[0]
    ok(moe_rt_bin, ["--resume", folder / oldest, "--steps", 9, "--stats", second])
    run = load_run(str(second))
    expected = read(whole, EVAL_EXACT)
    # The first file's evaluation after step 4 (its last) is dropped with its rows after the
    # checkpoint; the second file evaluates after 5 and 8.
    assert run.eval["eval/step"].tolist() == [2, 5, 8] == expected["eval/step"].tolist()
    for name in EVAL_EXACT:
        assert run.eval[name].tobytes() == expected[name].tobytes(), name


@pytest.mark.parametrize("args, message", [
    (["--eval-every", 5], "--eval-every=5 needs --val-data"),
    (["--val-data", "bogus"], "--val-data: unknown data source 'bogus'"),
    (["--val-data", "tokens:"], "--val-data: 'tokens:' names no file"),
    (["--eval-batches", 0], "--eval-batches must be >= 1, got 0"),
    (["--val-data", "synthetic", "--eval-every", -1], "--eval-every must be >= 0"),
    (["--val-data", "tokens:/no/such/val.bin"], "--val-data: data file '/no/such/val.bin'"),
])
def test_bad_values_are_refused(moe_rt_bin, args, message):
    proc = moe(moe_rt_bin, MICRO + ["--steps", 2, "--stats", "none"] + args)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("moe_rt: error:")]
    assert len(errors) == 1 and message in errors[0], proc.stderr


def test_validation_file_too_short_and_stats_over_it_are_refused(moe_rt_bin, tmp_path):
    short = tmp_path / "short.bin"
    write_shard(short, np.arange(100) % 64)  # 4 batches x 2 sequences x 16 tokens need 129
    proc = moe(moe_rt_bin, MICRO + ["--steps", 2, "--stats", "none", "--val-data",
                                    f"tokens:{short}"])
    assert proc.returncode == 2
    assert "is too short for --eval-batches 4: 8 sequences of 16 tokens need 129 tokens" in \
        proc.stderr
    ok(moe_rt_bin, MICRO + ["--steps", 2, "--stats", "none", "--val-data", f"tokens:{short}",
                            "--eval-batches", 3])
    proc = moe(moe_rt_bin, MICRO + ["--steps", 2, "--val-data", f"tokens:{short}",
                                    "--eval-batches", 3, "--stats", short, "--overwrite"])
    assert proc.returncode == 2 and "is the --val-data file" in proc.stderr
    assert os.path.getsize(short) == 1024 + 200  # left as it was
