"""Bad input ends with one clear message naming the problem and a non-zero exit on every rank,
never a hang (each run has a time limit) and never a silent partial run (no step line printed)."""
import struct

import pytest

MICRO = ["--model", "micro", "--steps", "2"]


def error_lines(proc):
    return [l for l in (proc.stdout + proc.stderr).splitlines() if l.startswith("moe_rt: error")]


def assert_one_clear_error(proc, *words):
    assert proc.returncode != 0, proc.stdout + proc.stderr
    lines = error_lines(proc)
    assert len(lines) == 1, f"expected one error line, got {lines!r}\n{proc.stderr}"
    for w in words:
        assert w in lines[0], f"{w!r} not in {lines[0]!r}"
    # Nothing trained: no step line from rank 0's table.
    assert "summary:" not in proc.stdout


def write_shard(path, tokens, magic=20240520, version=1, count=None):
    header = [0] * 256
    header[0], header[1], header[2] = magic, version, len(tokens) if count is None else count
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))


@pytest.mark.parametrize("args,words", [
    (["--bogus", "1"], ["--bogus"]),
    (["--top-k", "abc"], ["--top-k", "abc"]),
    (["--top-k", "9", "--experts", "8"], ["--top-k"]),
    (["--top-k", "0"], ["--top-k"]),
    (["--d-model", "-4"], ["--d-model"]),
    (["--score-func", "relu"], ["--score-func", "sqrtsoftplus"]),
    (["--force-balance", "sometimes"], ["--force-balance"]),
    (["--ep", "3"], ["--ep"]),
    (["--data", "parquet:/x"], ["--data"]),
    (["--data", "synthetic:zipf=-1"], ["--data", "Zipf exponent", "synthetic:zipf=-1"]),
    (["--val-data", "synthetic:zipf=x"], ["--val-data", "Zipf exponent"]),
    (["--threads", "100000"], ["--threads", "1024"]),
    (["--lr", "1e308"], ["--lr", "float range"]),
    (["--force-balance", "zipf: 1"], ["--force-balance", "zipf:"]),
    (["--hash-layers", "0", "--hash-table", "/x"], ["--hash-table", "--hash-layers"]),
    # Sizes no machine holds: refused in set-up, before any allocation (which used to hang or be
    # killed for memory), naming the tensor or the memory needed.
    (["--seq-len", "2000000000"], ["--seq-len", "2^31"]),
    (["--experts", "100000000", "--ep", "1"], ["GiB per rank", "--experts"]),
])
def test_bad_option(run_moe, args, words):
    assert_one_clear_error(run_moe(MICRO + args), *words)


def test_decay_horizon_within_the_warmup_is_refused(run_moe):
    # The cosine starts after the warmup: --lr-decay-steps 5 after 20 warmup steps used to be
    # accepted, and the learning rate never decayed.
    proc = run_moe(MICRO + ["--warmup-steps", "20", "--lr-decay-steps", "5", "--stats", "none"])
    assert proc.returncode == 2, proc.stderr
    assert_one_clear_error(proc, "--lr-decay-steps=5", "--warmup-steps=20")


def test_unknown_preset_lists_the_valid_ones(run_moe):
    assert_one_clear_error(run_moe(["--model", "nope"]), "--model", "deepseek4-tiny", "micro")


@pytest.mark.parametrize("args,words", [
    (["--expert-placment", "x"], ["'--expert-placment'", "did you mean --expert-placement?"]),
    (["--setps", "2"], ["did you mean --steps?"]),
    (["--model", "deepseek4-tinny"], ["'deepseek4-tinny'", "did you mean deepseek4-tiny?"]),
    (["--model", "deepseek4-fin"], ["did you mean deepseek4-fine?"]),
])
def test_a_slip_gets_the_nearest_name(run_moe, args, words):
    assert_one_clear_error(run_moe(args), *words)


def test_nothing_near_suggests_nothing(run_moe):
    proc = run_moe(["--frobnicate-everything", "1"])
    assert_one_clear_error(proc, "'--frobnicate-everything'")
    assert "did you mean" not in proc.stdout + proc.stderr


def test_a_config_key_slip_gets_the_nearest_key(run_moe, tmp_path):
    cfg = tmp_path / "run.toml"
    cfg.write_text("steps = 2\n[routing]\nbias-update-rat = 0.01\n")
    assert_one_clear_error(run_moe(["--model", "micro", "--config", str(cfg)]),
                           "unknown key 'bias-update-rat'", "did you mean 'bias-update-rate'?")


def test_ep_larger_than_experts(run_moe):
    assert_one_clear_error(run_moe(MICRO + ["--experts", "2", "--top-k", "2", "--ep", "4"], np_=4),
                           "--ep")


def test_config_file_unknown_key(run_moe, tmp_path):
    cfg = tmp_path / "run.cfg"
    cfg.write_text("steps = 2\nno-such-key = 3\n")
    assert_one_clear_error(run_moe(["--model", "micro", "--config", str(cfg)]), "no-such-key",
                           str(cfg))


def test_config_file_that_is_a_directory(run_moe, tmp_path):
    # A directory opens as an empty stream: it used to be read as no keys and the run went on.
    assert_one_clear_error(run_moe(MICRO + ["--config", str(tmp_path)]), str(tmp_path),
                           "not a regular file")


def test_stats_path_that_is_a_dangling_link(run_moe, tmp_path):
    link = tmp_path / "run.h5"
    link.symlink_to(tmp_path / "absent" / "run.h5")
    assert_one_clear_error(run_moe(MICRO + ["--stats", str(link)]), str(link), "does not exist")


def test_config_file_missing(run_moe, tmp_path):
    missing = tmp_path / "absent.cfg"
    assert_one_clear_error(run_moe(["--config", str(missing)]), str(missing))


def test_data_file_missing(run_moe, tmp_path):
    path = tmp_path / "absent.bin"
    assert_one_clear_error(run_moe(MICRO + ["--data", f"tokens:{path}"]), str(path), "missing")


def test_data_file_bad_magic(run_moe, tmp_path):
    path = tmp_path / "bad.bin"
    write_shard(path, list(range(60)) * 4, magic=12345)
    assert_one_clear_error(run_moe(MICRO + ["--data", f"tokens:{path}"]), str(path), "magic")


def test_data_file_truncated(run_moe, tmp_path):
    path = tmp_path / "short.bin"
    write_shard(path, list(range(60)) * 4, count=10_000)
    assert_one_clear_error(run_moe(MICRO + ["--data", f"tokens:{path}"]), str(path), "truncated")


def test_data_token_out_of_vocab(run_moe, tmp_path):
    path = tmp_path / "big.bin"
    write_shard(path, [1, 2, 3, 64] + [5] * 200)  # micro has V = 64
    assert_one_clear_error(run_moe(MICRO + ["--data", f"tokens:{path}"]), str(path), "64")


@pytest.mark.parametrize("np_,bad", [(1, [100, 250]), (2, [250]), (2, [100, 250]), (4, [299]),
                                     (4, [100, 250])])
def test_data_token_out_of_vocab_is_the_first_one(run_moe, tmp_path, np_, bad):
    # Each rank checks its part of the file; the job reports the first bad token in the file,
    # whichever rank found it and however many ranks there are.
    tokens = [5] * 300
    for offset in bad:
        tokens[offset] = 64 + offset
    path = tmp_path / "bad_tokens.bin"
    write_shard(path, tokens)
    assert_one_clear_error(run_moe(MICRO + ["--data", f"tokens:{path}"], np_=np_), str(path),
                           f"token {64 + bad[0]} at offset {bad[0]} ")


def test_data_file_2gib_bad_magic(run_moe, tmp_path):
    # A sparse 2 GiB file that is not a shard: refused from its 1 KiB header (it used to be read
    # whole first, by every rank; tests/io/test_token_mapping.cpp counts the bytes read).
    path = tmp_path / "big.bin"
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 12345, 1, 100, *([0] * 253)))
        f.truncate(2 << 30)
    assert_one_clear_error(run_moe(MICRO + ["--data", f"tokens:{path}"], timeout=60), str(path),
                           "bad magic 12345")


@pytest.mark.parametrize("kind", ["tokens", "text"])
def test_data_file_special_of_size_zero(run_moe, kind):
    # procfs files report size 0 but are readable: named as such, not as "cannot open".
    proc = run_moe(MICRO + ["--vocab", "256", "--data", f"{kind}:/proc/self/status"])
    assert_one_clear_error(proc, "/proc/self/status", "reports size 0")


def test_data_shorter_than_one_sample(run_moe, tmp_path):
    path = tmp_path / "tiny.bin"
    write_shard(path, [1, 2, 3])
    assert_one_clear_error(run_moe(MICRO + ["--data", f"tokens:{path}"]), str(path), "shorter")


def test_text_data_trains(run_moe, tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    proc = run_moe(MICRO + ["--vocab", "256", "--data", f"text:{path}"])
    assert proc.returncode == 0, proc.stderr
    assert "summary:" in proc.stdout
    # The file is mapped, not copied into each rank: the banner says so, apart from the per-rank
    # figure.
    assert "MiB mapped read-only, shared page cache (not per rank)" in proc.stdout
