"""Rows and tokens crossing hosts (/routing/cross_host_rows, /routing/cross_host_tokens,
/routing/dispatch_rows): `moe_stats.py summary` states their shares over the run, at the last
step and per layer, the ranks line the host count; `export --what layers` has the per-layer
fraction; files written before the counts existed read as before."""
import numpy as np
import pytest

import stats_fixture as sf

ROWS = sf.TOKENS * sf.TOP_K   # 128 rows dispatched per layer per step


def with_hosts(run):
    """`run` on 2 hosts: layer l sends (8 + 4l + (step mod 2)) rows across hosts and half as many
    token copies, out of T·K rows and T tokens."""
    steps = run["datasets"]["steps/step"]
    crossed = (8 + 4 * np.arange(sf.NUM_LAYERS)[None, :] + (steps % 2)[:, None]).astype(np.int64)
    datasets = {**run["datasets"],
                "routing/dispatch_rows": np.full(crossed.shape, ROWS, dtype=np.int64),
                "routing/cross_host_rows": crossed,
                "routing/cross_host_tokens": crossed // 2}
    return {**run, "attrs": {**run["attrs"], "num_hosts": 2}, "datasets": datasets}


@pytest.fixture(scope="module")
def hosts_file(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("hosts") / "hosts.h5")
    return sf.write_stats(path, with_hosts(sf.build_run("A")))


def lines_after(out, start):
    lines = out.splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith(start))
    return lines[i], lines[i + 1]


def test_summary_states_the_cross_host_shares(cli, hosts_file):
    code, out, err = cli("summary", hosts_file)
    assert code == 0, err
    assert next(l for l in out.splitlines() if l.startswith("ranks ")).endswith(
        "2 (EP group 2) on 2 hosts")
    run = with_hosts(sf.build_run("A"))["datasets"]
    crossed, copies = run["routing/cross_host_rows"], run["routing/cross_host_tokens"]
    total = sf.NUM_STEPS * sf.NUM_LAYERS * ROWS
    head, per_layer = lines_after(out, "rows crossing hosts in dispatch:")
    assert f"{100 * crossed.sum() / total:.1f}% over the run" in head
    assert f"{100 * crossed[-1].sum() / (sf.NUM_LAYERS * ROWS):.1f}% at the last step" in head
    for layer in range(sf.NUM_LAYERS):
        share = 100 * crossed[:, layer].sum() / (sf.NUM_STEPS * ROWS)
        assert f"{layer}: {share:.1f}%" in per_layer
    head, per_layer = lines_after(out, "token copies crossing hosts:")
    assert f"{100 * copies.sum() / (total / sf.TOP_K):.1f}% over the run" in head
    assert f"0: {100 * copies[:, 0].sum() / (sf.NUM_STEPS * sf.TOKENS):.1f}%" in per_layer


def test_export_has_the_cross_host_fraction(cli, hosts_file, tmp_path):
    pd = pytest.importorskip("pandas")
    code, out, err = cli("export", hosts_file, "--format", "csv", "--what", "layers",
                         "-o", tmp_path / "out")
    assert code == 0, err
    layers = pd.read_csv(out.split()[0]).sort_values(["step", "layer"])
    crossed = with_hosts(sf.build_run("A"))["datasets"]["routing/cross_host_rows"]
    assert layers["cross_host_frac"].to_numpy().reshape(crossed.shape) == pytest.approx(
        crossed / ROWS)


def test_a_file_without_the_counts_reads_as_before(cli, run_a, tmp_path):
    code, out, err = cli("summary", run_a)
    assert code == 0, err
    assert "crossing hosts" not in out
    assert " host" not in next(l for l in out.splitlines() if l.startswith("ranks "))
    pd = pytest.importorskip("pandas")
    code, out, err = cli("export", run_a, "--format", "csv", "--what", "layers",
                         "-o", tmp_path / "out")
    assert code == 0, err
    assert pd.read_csv(out.split()[0])["cross_host_frac"].isna().all()
