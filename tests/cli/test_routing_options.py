"""Routing options end to end: hash tables from a file, forced round-robin and skewed routing,
group-limited top-k and the run-time bias check, read back from the statistics file."""
import struct

import h5py
import numpy as np

from test_bad_input import assert_one_clear_error

MICRO = ["--model", "micro", "--steps", "3"]  # V=64, L=3 (1 hash layer), E=4, K=2


def write_hash_table(path, tables, magic=20261202):
    layers, vocab, k = tables.shape
    header = [magic, 1, layers, vocab, k] + [0] * 251
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(tables.astype("<i4").tobytes())


def stats(path):
    return h5py.File(path, "r", libver="latest", swmr=True)


def test_hash_table_from_file_routes_as_written(run_moe, tmp_path):
    vocab, k = 64, 2
    table = np.array([[[(v % 4), (v + 1) % 4] for v in range(vocab)]], dtype=np.int32)
    write_hash_table(tmp_path / "t.bin", table)
    out = tmp_path / "h.h5"
    proc = run_moe(MICRO + ["--hash-table", str(tmp_path / "t.bin"), "--stats", str(out),
                            "--trace-every", "1"])
    assert proc.returncode == 0, proc.stderr
    with stats(out) as f:
        assert (f["/layers/hash_table"][...] == table).all()
        ids = f["/trace/token_id"][0]
        experts = f["/trace/experts"][0, 0]  # layer 0 is the hash layer
        assert (experts == table[0][ids]).all()


def test_bad_hash_table_files(run_moe, tmp_path):
    wrong_shape = np.zeros((1, 32, 2), dtype=np.int32)
    write_hash_table(tmp_path / "shape.bin", wrong_shape)
    assert_one_clear_error(run_moe(MICRO + ["--hash-table", str(tmp_path / "shape.bin")]),
                           "shape.bin", "--vocab")
    repeated = np.zeros((1, 64, 2), dtype=np.int32)  # expert 0 twice in every row
    write_hash_table(tmp_path / "rep.bin", repeated)
    assert_one_clear_error(run_moe(MICRO + ["--hash-table", str(tmp_path / "rep.bin")]),
                           "rep.bin", "layer 0")
    write_hash_table(tmp_path / "magic.bin", wrong_shape, magic=7)
    assert_one_clear_error(run_moe(MICRO + ["--hash-table", str(tmp_path / "magic.bin")]),
                           "magic.bin", "magic")


def test_forced_round_robin_is_exactly_balanced(run_moe, tmp_path):
    out = tmp_path / "rr.h5"
    proc = run_moe(MICRO + ["--force-balance", "round-robin", "--stats", str(out)], np_=4)
    assert proc.returncode == 0, proc.stderr
    with stats(out) as f:
        load = f["/routing/expert_load"][...]
        assert (load == load[:, :, :1]).all()  # T·K = 4·2·16·2 is a multiple of E = 4
        assert (f["/routing/load_variance"][...] == 0).all()
        routing = [s.decode() if isinstance(s, bytes) else s for s in f["/layers/routing"][...]]
        assert routing == ["forced"] * 3


def test_skewed_forced_routing_loads_the_hot_expert(run_moe, tmp_path):
    out = tmp_path / "hot.h5"
    proc = run_moe(MICRO + ["--force-balance", "hot:0.8", "--batch-per-rank", "8",
                            "--stats", str(out)])
    assert proc.returncode == 0, proc.stderr
    with stats(out) as f:
        load = f["/routing/expert_load"][...]
        assert (load[:, :, 0] > 1.5 * load[:, :, 1:].max(axis=2)).all()


def test_group_limited_routing_and_bias_check_run(run_moe, tmp_path):
    out = tmp_path / "g.h5"
    proc = run_moe(MICRO + ["--routing-groups", "2", "--group-topk", "1", "--check-bias",
                            "--bias-update-center", "--stats", str(out)], np_=2)
    assert proc.returncode == 0, proc.stderr
    with stats(out) as f:
        bias = f["/routing/bias"][...]
        # Centred updates keep every layer's bias mean at zero, while the biases move: with
        # steps of exactly ±γ they may well all be back at 0 at some step, the last included.
        assert (np.abs(bias.sum(axis=2)) < 1e-5).all()
        assert np.abs(bias).sum() > 0


def test_router_z_loss_is_recorded_per_layer(run_moe, tmp_path):
    """--z-loss-weight: /routing/z_loss holds each layer's value (every layer, the hash layer
    too), /steps/z_loss their sum; without it both are 0; a negative weight is refused."""
    on, off = tmp_path / "z.h5", tmp_path / "off.h5"
    proc = run_moe(MICRO + ["--z-loss-weight", "0.01", "--stats", str(on)], np_=2)
    assert proc.returncode == 0, proc.stderr
    with stats(on) as f:
        layers = f["/routing/z_loss"][...]
        total = f["/steps/z_loss"][...]
        assert layers.shape == (3, 3)
        assert (layers > 0).all()
        np.testing.assert_allclose(total, layers.sum(axis=1), rtol=1e-12)
        assert f["/routing/z_loss"].attrs["units"] == "1"
        assert "z-loss-weight = 0.01" in f.attrs["config"]
    proc = run_moe(MICRO + ["--stats", str(off)], np_=2)
    assert proc.returncode == 0, proc.stderr
    with stats(off) as f:
        assert (f["/routing/z_loss"][...] == 0).all() and (f["/steps/z_loss"][...] == 0).all()
    assert_one_clear_error(run_moe(MICRO + ["--z-loss-weight", "-1"]), "--z-loss-weight")


def test_shadow_balancers_are_recorded_and_resume_bit_for_bit(run_moe, tmp_path):
    """--shadow: a group /shadow/<rule> per rule with its loads, violations and bias; training's
    own datasets are those of the run without shadows; a resumed run (at another rank count)
    continues the shadows' series bit for bit from the checkpoint; a resume that names other
    shadows, and malformed rules, are refused in one line."""
    rules = "sign:0.01,proportional:0.05,none"
    full, plain = tmp_path / "full.h5", tmp_path / "plain.h5"
    args = ["--model", "micro", "--steps", "6"]
    proc = run_moe(args + ["--shadow", rules, "--stats", str(full), "--checkpoint-every", "3",
                           "--checkpoint-dir", str(tmp_path / "ck")], np_=2)
    assert proc.returncode == 0, proc.stderr
    proc = run_moe(args + ["--stats", str(plain)], np_=2)
    assert proc.returncode == 0, proc.stderr
    with stats(full) as f, stats(plain) as g:
        assert "shadow" not in g
        assert sorted(f["/shadow"]) == sorted(rules.split(","))
        for name in ("steps/loss", "steps/grad_norm", "routing/expert_load", "routing/bias"):
            assert f[name][...].tobytes() == g[name][...].tobytes(), name
        topk = f["/layers/routing"][...].astype(str) == "topk"
        own = f["/shadow/sign:0.01"]
        assert own.attrs["rule"] == "sign:0.01"
        assert (own["expert_load"][:, topk] == f["/routing/expert_load"][:, topk]).all()
        assert (own["bias"][...] == f["/routing/bias"][...]).all()
        assert (f["/shadow/none/bias"][...] == 0).all()
        assert (f["/shadow/proportional:0.05/bias"][-1] != 0).any()
        assert (own["expert_load"][:, ~topk] == 0).all()
        assert own["max_violation"].attrs["units"] == "1"
        assert own["expert_load"].dims[2].label == "expert"
        want = {r: {k: f[f"/shadow/{r}/{k}"][3:] for k in ("expert_load", "bias", "max_violation")}
                for r in rules.split(",")}
    resumed = tmp_path / "resumed.h5"
    proc = run_moe(["--resume", str(tmp_path / "ck" / "step-00000002.h5"), "--steps", "6",
                    "--stats", str(resumed)], np_=1)
    assert proc.returncode == 0, proc.stderr
    with stats(resumed) as f:
        assert list(f["/steps/step"][...]) == [3, 4, 5]
        for r, datasets in want.items():
            for k, values in datasets.items():
                assert f[f"/shadow/{r}/{k}"][...].tobytes() == values.tobytes(), (r, k)
    refused = run_moe(["--resume", str(tmp_path / "ck"), "--steps", "9", "--shadow", "none",
                       "--stats", "none"], np_=1)
    assert_one_clear_error(refused, "--shadow")
    for bad in ("sign", "sign:-1", "bogus:1", "none,none", "sign:0.1,"):
        assert_one_clear_error(run_moe(args + ["--shadow", bad]), "--shadow")


def test_token_capacity_drops_are_recorded(run_moe, tmp_path):
    """--capacity-factor: /routing/dropped counts the assignments over each expert's capacity,
    within the selection's loads; what was dispatched and received is the rest; validation rows
    count theirs; a dropless run drops nothing; bad values are refused in one line."""
    out, plain = tmp_path / "c.h5", tmp_path / "p.h5"
    common = MICRO + ["--val-data", "synthetic", "--eval-every", "2"]
    proc = run_moe(common + ["--capacity-factor", "1", "--drop-policy", "position",
                             "--stats", str(out)], np_=2)
    assert proc.returncode == 0, proc.stderr
    assert "of the assignments dropped over the run" in proc.stdout
    with stats(out) as f:
        load, dropped = f["/routing/expert_load"][...], f["/routing/dropped"][...]
        assert dropped.shape == load.shape and f["/routing/dropped"].attrs["units"] == "assignments"
        assert (dropped >= 0).all() and (dropped <= load).all() and dropped.sum() > 0
        kept = (load - dropped).sum(axis=2)
        assert (f["/routing/dispatch_rows"][...] == kept).all()
        assert (f["/routing/rank_load"][...].sum(axis=2) == kept).all()
        # S = 16, K = 2, E = 4 and C = 1: at most 8 of a sequence's assignments per expert, and
        # a step holds 2 sequences (2 ranks x 1).
        assert (load - dropped <= 8 * 2).all()
        assert f["/eval/dropped"].shape == f["/eval/expert_load"].shape
        assert (f["/eval/dropped"][...] <= f["/eval/expert_load"][...]).all()
        assert f["/eval/dropped"][...].sum() > 0
        assert "capacity-factor = 1" in f.attrs["config"]
    proc = run_moe(common + ["--stats", str(plain)], np_=2)
    assert proc.returncode == 0, proc.stderr
    assert "dropped" not in proc.stdout
    with stats(plain) as f:
        assert (f["/routing/dropped"][...] == 0).all() and (f["/eval/dropped"][...] == 0).all()
    for option, bad in (("--capacity-factor", "-1"), ("--capacity-factor", "x"),
                        ("--drop-policy", "random"), ("--capacity-unit", "host")):
        assert_one_clear_error(run_moe(MICRO + [option, bad]), option)
