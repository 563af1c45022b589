"""Ranks laid out over hosts (--ranks-per-host): the hosts and EP groups the banner states, the
statistics file's host map and cross-host row counts checked against an independent recount from
the per-token traces, the same arithmetic whatever the host layout, node-limited routing, and
clear errors for bad values."""
import h5py
import numpy as np
import pytest

from test_bad_input import assert_one_clear_error

MICRO = ["--model", "micro"]


def open_stats(path):
    return h5py.File(path, "r", libver="latest", swmr=True)


def owner_of_expert(E, P):
    """[E] EP rank owning each expert: contiguous blocks, the first E mod P ranks one more."""
    base, extra = divmod(E, P)
    owners = []
    for r in range(P):
        owners += [r] * (base + (1 if r < extra else 0))
    return np.array(owners)


def recount_cross_host(f):
    """([M, L] rows, [M, L] token copies) crossing hosts at each traced step, from the traces
    alone: each token's chosen experts, the rank that held it, and the host map; the EP groups
    are consecutive ranks (the hosts here are consecutive blocks, so the layout order is the
    world order). A token copy: a token and another host holding one of its experts."""
    W, P, E = (int(f.attrs[k]) for k in ("world_size", "ep_size", "num_experts"))
    host = f["/hosts/rank_host"][...]
    owner = owner_of_expert(E, P)
    rank = f["/trace/rank"][...]                      # [M, T]
    experts = f["/trace/experts"][...]                # [M, L, T, K]
    group_first = (rank // P) * P                     # first world rank of the token's EP group
    dest_host = host[group_first[:, None, :, None] + owner[experts]]
    crossing = dest_host != host[rank][:, None, :, None]
    other_hosts = np.zeros(crossing.shape[:3], dtype=np.int64)
    for h in range(int(host.max()) + 1):
        other_hosts += (crossing & (dest_host == h)).any(axis=3)
    return crossing.sum(axis=(2, 3)), other_hosts.sum(axis=2)


def test_two_hosts_of_two_ranks(run_moe, tmp_path):
    path = tmp_path / "hosts.h5"
    proc = run_moe(MICRO + ["--steps", "3", "--ranks-per-host", "2", "--trace-every", "1",
                            "--stats", str(path)], np_=4)
    assert proc.returncode == 0, proc.stderr
    assert ("ranks: 4 on 2 hosts x 2 (--ranks-per-host); one EP group of 4 spanning 2 whole "
            "hosts, 1 replica") in proc.stdout
    assert "rows crossing hosts in dispatch:" in proc.stdout
    assert "token copies crossing hosts (one per other host):" in proc.stdout
    with open_stats(path) as f:
        L, K = int(f.attrs["num_layers"]), int(f.attrs["top_k"])
        T = 4 * int(f.attrs["batch_per_rank"]) * int(f.attrs["seq_len"])
        assert int(f.attrs["num_hosts"]) == 2
        assert list(f["/hosts/rank_host"][...]) == [0, 0, 1, 1]
        assert f["/config"].attrs["ranks-per-host"] == "2"
        crossed = f["/routing/cross_host_rows"]
        dispatched = f["/routing/dispatch_rows"][...]
        assert crossed.shape == (3, L) and crossed.dtype == np.int64
        assert crossed.attrs["units"] == "assignments"
        assert [d.label for d in crossed.dims] == ["step", "layer"]
        assert (dispatched == T * K).all()
        assert (dispatched == f["/routing/expert_load"][...].sum(axis=2)).all()
        crossed = crossed[...]
        assert (crossed > 0).all() and (crossed < dispatched).all()
        rows, tokens = recount_cross_host(f)
        assert (crossed == rows).all()
        copies = f["/routing/cross_host_tokens"][...]
        assert f["/routing/cross_host_tokens"].attrs["units"] == "tokens"
        assert (copies == tokens).all()
        assert (copies <= T).all() and (copies <= crossed).all() and (copies > 0).all()


@pytest.mark.parametrize("layout", [["--ranks-per-host", "4"], ["--ranks-per-host", "auto"], []])
def test_one_host_crosses_nothing(run_moe, tmp_path, layout):
    path = tmp_path / "one.h5"
    proc = run_moe(MICRO + ["--steps", "2", "--stats", str(path)] + layout, np_=4)
    assert proc.returncode == 0, proc.stderr
    assert "ranks: 4 on 1 host" in proc.stdout
    assert "rows crossing hosts" not in proc.stdout
    with open_stats(path) as f:
        assert int(f.attrs["num_hosts"]) == 1
        assert list(f["/hosts/rank_host"][...]) == [0, 0, 0, 0]
        assert f["/routing/cross_host_rows"].shape == (2, int(f.attrs["num_layers"]))
        assert (f["/routing/cross_host_rows"][...] == 0).all()
        assert (f["/routing/cross_host_tokens"][...] == 0).all()


def test_host_layout_changes_no_bit_of_the_arithmetic(run_moe, tmp_path):
    """Hosts of consecutive ranks keep the EP groups and their order: the same losses, loads and
    gradient norms, bit for bit, as on one host; with --ep 2 the groups lie inside the hosts."""
    files = {}
    for name, args in {"one": [], "two": ["--ranks-per-host", "2"]}.items():
        for ep in ("4", "2"):
            path = tmp_path / f"{name}-{ep}.h5"
            proc = run_moe(MICRO + ["--steps", "3", "--ep", ep, "--stats", str(path)] + args,
                           np_=4)
            assert proc.returncode == 0, proc.stderr
            if name == "two" and ep == "2":
                assert ("EP groups of 2 inside each host, 2 replicas across hosts"
                        in proc.stdout)
            files[name, ep] = path
    for ep in ("4", "2"):
        with open_stats(files["one", ep]) as a, open_stats(files["two", ep]) as b:
            for name in ("/steps/loss", "/steps/grad_norm", "/routing/expert_load",
                         "/routing/rank_load", "/routing/bias"):
                assert np.array_equal(a[name][...], b[name][...]), (ep, name)
            if ep == "2":  # each EP group inside one host: nothing crosses
                assert (b["/routing/cross_host_rows"][...] == 0).all()


def test_node_limited_routing_keeps_each_token_on_one_host(run_moe, tmp_path):
    """--routing-groups 2 --group-topk 1 on 2 hosts of one EP group: the expert groups are the
    hosts' experts, so in every top-k layer each token's experts lie on one host."""
    path = tmp_path / "limited.h5"
    proc = run_moe(MICRO + ["--steps", "2", "--ranks-per-host", "2", "--routing-groups", "2",
                            "--group-topk", "1", "--trace-every", "1", "--stats", str(path)],
                   np_=4)
    assert proc.returncode == 0, proc.stderr
    with open_stats(path) as f:
        E, P = int(f.attrs["num_experts"]), int(f.attrs["ep_size"])
        host = f["/hosts/rank_host"][...]
        expert_host = host[owner_of_expert(E, P)]     # one EP group of all ranks
        routing = [s.decode() if isinstance(s, bytes) else s for s in f["/layers/routing"][...]]
        experts = f["/trace/experts"][...]            # [M, L, T, K]
        for layer, kind in enumerate(routing):
            hosts_used = expert_host[experts[:, layer]]
            if kind == "topk":
                assert (hosts_used == hosts_used[..., :1]).all(), layer
        rows, tokens = recount_cross_host(f)
        assert (f["/routing/cross_host_rows"][...] == rows).all()
        assert (f["/routing/cross_host_tokens"][...] == tokens).all()


@pytest.mark.parametrize("value,words", [
    ("3", ["--ranks-per-host=3", "must divide the number of ranks (4)"]),
    ("0", ["--ranks-per-host", "auto or a positive integer"]),
    ("many", ["--ranks-per-host", "'many'"]),
])
def test_bad_ranks_per_host(run_moe, value, words):
    proc = run_moe(MICRO + ["--steps", "1", "--stats", "none", "--ranks-per-host", value], np_=4)
    assert_one_clear_error(proc, *words)
    assert proc.returncode == 2


def test_ranks_must_agree_on_the_hosts(run_moe_mpmd):
    proc = run_moe_mpmd([MICRO + ["--steps", "1", "--stats", "none", "--ranks-per-host", "1"],
                         MICRO + ["--steps", "1", "--stats", "none", "--ranks-per-host", "2"]])
    assert_one_clear_error(proc, "--ranks-per-host", "'1' on rank 0", "'2' on rank 1")


def test_checkpoint_from_host_local_groups_resumes_on_another_layout(run_moe, tmp_path):
    """EP group 0 writes the experts; a run of EP groups inside hosts resumes, bit for bit, on
    one host, as it would have continued."""
    ckpt = tmp_path / "ckpt"
    common = MICRO + ["--ep", "2", "--checkpoint-dir", str(ckpt), "--checkpoint-every", "2"]
    whole = run_moe(common + ["--steps", "4", "--stats", str(tmp_path / "whole.h5"),
                              "--ranks-per-host", "2"], np_=4)
    assert whole.returncode == 0, whole.stderr
    resumed = run_moe(["--resume", str(ckpt / "step-00000001.h5"), "--ep", "2", "--stats",
                       str(tmp_path / "resumed.h5")], np_=4)
    assert resumed.returncode == 0, resumed.stderr
    with open_stats(tmp_path / "whole.h5") as a, open_stats(tmp_path / "resumed.h5") as b:
        assert np.array_equal(a["/steps/loss"][2:], b["/steps/loss"][...])
