"""--data-order on a real text file: the shuffled order (the default) gives the same bits on any
rank count, as the sequential one does, and another run than the sequential order; the banner and
the statistics file's /config name it; and a checkpoint written before the option existed (its
configuration has no data-order line) resumes in the sequential order it trained in, bit for bit
the run it continues."""

import h5py
import numpy as np
import pytest

from conftest import moe_run

# micro with byte tokens; a global batch of 4 sequences of 16 tokens.
MICRO = ["--model", "micro", "--vocab", 256, "--seed", 7]
STEPS = 6


def moe(moe_rt_bin, args, np_, timeout=120):
    return moe_run(moe_rt_bin, args, np_, timeout)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """12 windows of 16 bytes and a short tail: 6 steps of 4 sequences are two epochs."""
    path = tmp_path_factory.mktemp("order") / "corpus.txt"
    rng = np.random.default_rng(11)
    path.write_bytes(rng.integers(32, 127, size=12 * 16 + 1 + 5, dtype=np.uint8).tobytes())
    return path


def train(moe_rt_bin, corpus, stats, ranks, extra=(), steps=STEPS):
    args = MICRO + ["--data", f"text:{corpus}", "--batch-per-rank", 4 // ranks, "--steps", steps,
                    "--stats", stats, "--overwrite"] + list(extra)
    proc = moe(moe_rt_bin, args, ranks)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr
    return proc


def bits(stats, first=0):
    """The run's arithmetic: each step's loss, gradient norm and expert loads, from step `first`."""
    with h5py.File(stats, "r") as f:
        steps = f["steps/step"][...]
        rows = steps >= first
        return {name: f[name][...][rows].tobytes()
                for name in ("steps/loss", "steps/grad_norm", "routing/expert_load")}


def config_of(stats):
    with h5py.File(stats, "r") as f:
        return dict(f["config"].attrs)


def test_shuffled_is_the_same_on_any_rank_count_and_not_the_sequential_run(moe_rt_bin, corpus,
                                                                            tmp_path):
    one = tmp_path / "one.h5"
    proc = train(moe_rt_bin, corpus, one, 1)
    four = tmp_path / "four.h5"
    train(moe_rt_bin, corpus, four, 4)
    assert bits(one) == bits(four)
    assert config_of(one)["data-order"] == "shuffled"  # the default
    assert any(line.split() == ["data-order", "shuffled"] for line in proc.stdout.splitlines())
    sequential = tmp_path / "sequential.h5"
    train(moe_rt_bin, corpus, sequential, 2, ["--data-order", "sequential"])
    assert config_of(sequential)["data-order"] == "sequential"
    with h5py.File(one, "r") as f, h5py.File(sequential, "r") as g:
        # The first batch already differs: the shuffle reads other windows than 0..3.
        assert f["steps/loss"][0] != g["steps/loss"][0]


def test_a_checkpoint_from_before_the_option_resumes_in_the_sequential_order(moe_rt_bin, corpus,
                                                                              tmp_path):
    whole = tmp_path / "whole.h5"
    train(moe_rt_bin, corpus, whole, 2, ["--data-order", "sequential"])
    train(moe_rt_bin, corpus, tmp_path / "first.h5", 2,
          ["--data-order", "sequential", "--checkpoint-every", 3, "--checkpoint-dir",
           tmp_path / "ck"], steps=3)
    checkpoint = tmp_path / "ck" / "step-00000002.h5"
    # What a version without --data-order wrote: the same configuration, less that line.
    with h5py.File(checkpoint, "r+") as f:
        text = f.attrs["config"]
        assert '\ndata-order = "sequential"\n' in text
        f.attrs["config"] = text.replace('data-order = "sequential"\n', "")
    resumed = tmp_path / "resumed.h5"
    proc = moe(moe_rt_bin, ["--resume", checkpoint, "--steps", STEPS, "--stats", resumed,
                            "--checkpoint-every", 0], 2)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr
    assert config_of(resumed)["data-order"] == "sequential"
    assert bits(resumed, first=3) == bits(whole, first=3)
    # Shuffling it would change the arithmetic of the run it continues: refused.
    proc = moe(moe_rt_bin, ["--resume", checkpoint, "--steps", STEPS, "--stats", "none",
                            "--data-order", "shuffled"], 1)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("moe_rt: error")]
    assert len(errors) == 1 and "data-order = sequential" in errors[0], proc.stderr
