"""A checkpoint's contents are checked as the file readers check their input, before the resumed
run replaces anything: hash tables (every id an expert, no expert twice in a row, as for a
--hash-table file), finite parameters, moments and bias, non-negative second moments. A bad one
ends set-up with one line naming the checkpoint and what is wrong, exit status 2, and the
statistics file at --stats (--overwrite) left as it was."""
import hashlib

import h5py
import numpy as np
import pytest

from conftest import moe_run

MICRO = ["--model", "micro"]


def moe(moe_rt_bin, args, np_=1, timeout=120):
    return moe_run(moe_rt_bin, args, np_, timeout)


@pytest.fixture(scope="module")
def checkpoint(moe_rt_bin, tmp_path_factory):
    folder = tmp_path_factory.mktemp("contents")
    proc = moe(moe_rt_bin, MICRO + ["--steps", 4, "--checkpoint-every", 4, "--checkpoint-dir",
                                    folder / "ck", "--stats", folder / "a.h5"], np_=2)
    assert proc.returncode == 0, proc.stderr
    return folder / "ck" / "step-00000003.h5"


def hash_row_repeat(values):
    values[0, 5, 1] = values[0, 5, 0]


def hash_out_of_range(values):
    values[0, 0, 0] = 99


def nan_parameter(values):
    values[3] = np.nan


def negative_second_moment(values):
    values[0] = -1e-6


def infinite_bias(values):
    values[1] = np.inf


CASES = [
    ("routing/hash_tables", hash_out_of_range, ["routing/hash_tables, layer 0", "99"]),
    ("routing/hash_tables", hash_row_repeat, ["routing/hash_tables, layer 0", "twice"]),
    ("param/embed", nan_parameter, ["param/embed", "non-finite parameter"]),
    ("adam_v/embed", negative_second_moment, ["adam_v/embed", "negative AdamW second moment"]),
    ("routing/bias", infinite_bias, ["routing/bias", "non-finite"]),
]


@pytest.mark.parametrize("dataset,change,words", CASES,
                         ids=[c[1].__name__ for c in CASES])
@pytest.mark.parametrize("ranks", [1, 2])
def test_a_bad_checkpoint_is_refused_before_anything_is_replaced(moe_rt_bin, checkpoint, tmp_path,
                                                                 dataset, change, words, ranks):
    bad = tmp_path / "bad.h5"
    bad.write_bytes(checkpoint.read_bytes())
    with h5py.File(bad, "r+") as f:  # h5py rewrites the chunk's Fletcher-32 checksum
        values = f[dataset][...]
        change(values)
        f[dataset][...] = values
    stats = tmp_path / "old.h5"
    stats.write_bytes(b"an earlier statistics file, to be left as it is")
    before = hashlib.sha256(stats.read_bytes()).hexdigest()
    proc = moe(moe_rt_bin, ["--resume", bad, "--steps", 8, "--stats", stats, "--overwrite"],
               np_=ranks)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("moe_rt: error")]
    assert len(errors) == 1, proc.stderr
    assert f"checkpoint '{bad}'" in errors[0], errors[0]
    for word in words:
        assert word in errors[0], errors[0]
    assert hashlib.sha256(stats.read_bytes()).hexdigest() == before
    assert not list(tmp_path.glob("old.h5.*"))  # no staging file left either


def test_a_data_file_changed_in_place_is_refused_on_resume(moe_rt_bin, tmp_path):
    # A text file a little over two checksum blocks (1 MiB each), so that the ranks share them.
    rng = np.random.default_rng(5)
    text = tmp_path / "corpus.txt"
    original = rng.integers(0, 256, size=(2 << 20) + 4321, dtype=np.uint8).tobytes()
    text.write_bytes(original)
    data = ["--vocab", 256, "--data", f"text:{text}"]
    proc = moe(moe_rt_bin, MICRO + data + ["--steps", 4, "--checkpoint-every", 4,
                                           "--checkpoint-dir", tmp_path / "ck", "--stats", "none"],
               np_=2)
    assert proc.returncode == 0, proc.stderr
    checkpoint = tmp_path / "ck" / "step-00000003.h5"
    with h5py.File(checkpoint, "r") as f:
        recorded = f.attrs["data_checksum"]
    assert len(recorded) == 16
    # One byte of the last, short block changed: same size, same token count.
    changed = bytearray(original)
    changed[-7] ^= 0x40
    text.write_bytes(bytes(changed))
    for ranks in (1, 2):
        proc = moe(moe_rt_bin, ["--resume", checkpoint, "--steps", 6, "--stats", "none",
                                "--checkpoint-every", 0], np_=ranks)
        assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr
        errors = [line for line in proc.stderr.splitlines() if line.startswith("moe_rt: error")]
        assert len(errors) == 1, proc.stderr
        assert f"text:{text}" in errors[0] and f"then {recorded}" in errors[0]
        assert "changed in place" in errors[0]
    # Restored, the file is the one the checkpoint trained on, at any rank count.
    text.write_bytes(original)
    for ranks in (1, 2):
        proc = moe(moe_rt_bin, ["--resume", checkpoint, "--steps", 6, "--stats", "none",
                                "--checkpoint-every", 0], np_=ranks)
        assert proc.returncode == 0, proc.stderr
