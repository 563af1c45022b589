"""`moe_stats.py variance`: the per-layer load-variance table (docs/load-balancing.md), checked
against variances computed here with numpy straight from the HDF5 datasets, against the
hand-computed values of stats_fixture.py, and across the text, markdown and CSV outputs."""
import csv
import io
import re

import h5py
import numpy as np
import pytest

import moe_stats
import stats_fixture as sf


def parse_text(text):
    """Cells of the aligned text table (header, layer rows, TOTAL), split on 2+ spaces."""
    lines = text.splitlines()[2:]  # title, blank line
    return [re.split(r"\s{2,}", line.strip()) for line in lines if set(line) - set("- ")]


def parse_markdown(text):
    """Cells of every table line; separator lines left out."""
    return [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in text.splitlines() if line.startswith("|") and set(line) - set("|-")]


def parse_csv(text):
    return list(csv.reader(io.StringIO(text)))


def percent(cell):
    return None if cell == "n/a" else float(cell.rstrip("%"))


def numpy_columns(path_a, path_b, step0, step1):
    """Independent computation: routing [L], var at step0 in A, at step1 in A and in B."""
    def variance(path, step):
        with h5py.File(path, "r") as f:
            row = int(np.flatnonzero(f["steps/step"][:] == step)[0])
            return f["routing/expert_load"][row].astype(np.float64).var(axis=1)

    with h5py.File(path_a, "r") as f:
        routing = [r.decode() if isinstance(r, bytes) else str(r) for r in f["layers/routing"][:]]
    return routing, variance(path_a, step0), variance(path_a, step1), variance(path_b, step1)


def expected_improvement(a, b):
    if a == 0 and b == 0:
        return 0.0
    if a == 0:
        return None
    return 100.0 * (a - b) / a


def test_layer_rows_match_numpy(cli, run_a, run_b):
    code, out, err = cli("variance", run_a, run_b, "--steps", "0,20")
    assert code == 0, err
    routing, v0, va, vb = numpy_columns(run_a, run_b, 0, 20)
    rows = parse_text(out)
    assert rows[0] == ["Layer Index", "Routing Type", "Step 0 Var (Baseline)",
                       "Step 20 Var (Run A)", "Step 20 Var (Run B)", "Improvement (A vs B)"]
    body = rows[1:-1]
    assert len(body) == len(routing)
    labels = {"hash": "Hash Routed", "topk": "Top-K Routed"}
    for layer, cells in enumerate(body):
        assert cells[0] == str(layer)
        assert cells[1] == labels[routing[layer]]
        assert [float(c) for c in cells[2:5]] == pytest.approx(
            [v0[layer], va[layer], vb[layer]], abs=0.005)
        want = expected_improvement(va[layer], vb[layer])
        got = percent(cells[5])
        assert got == want if want is None else got == pytest.approx(want, abs=0.005)


def test_layer_rows_match_hand_computed_values(cli, run_a, run_b):
    code, out, _ = cli("variance", run_a, run_b, "--steps", "0,20")
    assert code == 0
    for layer, cells in enumerate(parse_text(out)[1:-1]):
        v0, va, vb, improvement = sf.EXPECTED_VARIANCE[layer]
        assert cells[2:] == [f"{v0:.2f}", f"{va:.2f}", f"{vb:.2f}", improvement]


def test_total_row_sums_top_k_layers_only(cli, run_a, run_b):
    code, out, _ = cli("variance", run_a, run_b, "--steps", "0,20")
    assert code == 0
    routing, v0, va, vb = numpy_columns(run_a, run_b, 0, 20)
    topk = np.array([r == "topk" for r in routing])
    sums = [v0[topk].sum(), va[topk].sum(), vb[topk].sum()]
    total = parse_text(out)[-1]
    assert total[:2] == ["TOTAL/AVG", "Top-K Only"]
    assert [float(c) for c in total[2:5]] == pytest.approx(sums, abs=0.005)
    assert percent(total[5]) == pytest.approx(100.0 * (sums[1] - sums[2]) / sums[1], abs=0.005)
    assert total[2:] == ["%.2f" % v for v in sf.EXPECTED_TOTAL[:3]] + [sf.EXPECTED_TOTAL[3]]


@pytest.mark.parametrize("a,b,want", [
    (10.0, 5.0, 0.5), (68.0, 10.0, 58.0 / 68.0), (4.0, 16.0, -3.0), (3.0, 3.0, 0.0),
    (0.0, 0.0, 0.0), (0.0, 1.0, None),
])
def test_improvement_formula(a, b, want):
    got = moe_stats.improvement(a, b)
    assert got == want if want is None else got == pytest.approx(want, rel=1e-15)


def test_improvement_zero_cases_in_the_table(cli, run_a, run_b):
    _, out, _ = cli("variance", run_a, run_b, "--steps", "0,20")
    body = {cells[0]: cells for cells in parse_text(out)[1:-1]}
    assert body["3"][3:] == ["0.00", "0.00", "0.00%"]   # A == B == 0
    assert body["4"][3:] == ["0.00", "1.00", "n/a"]     # A == 0 != B
    assert body["5"][5] == "-300.00%"                   # B worse than A


def test_markdown_and_csv_give_the_same_numbers(cli, run_a, run_b):
    args = ("variance", run_a, run_b, "--steps", "0,20")
    text = parse_text(cli(*args)[1])
    markdown_out = cli(*args, "--markdown")[1]
    markdown = parse_markdown(markdown_out)
    table = parse_csv(cli(*args, "--csv")[1])
    assert markdown_out.splitlines()[0] == cli(*args)[1].splitlines()[0]  # same title
    assert markdown == text
    assert table[0] == text[0]
    for csv_row, text_row in zip(table[1:], text[1:]):
        assert csv_row[:2] == text_row[:2]
        assert [float(c) for c in csv_row[2:5]] == pytest.approx(
            [float(c) for c in text_row[2:5]], abs=0.005)
        if text_row[5] == "n/a":
            assert csv_row[5] == "n/a"
        else:
            assert float(csv_row[5]) == pytest.approx(percent(text_row[5]), abs=0.005)
    assert len(table) == len(text)


def test_csv_has_full_precision(cli, run_a, run_b):
    _, out, _ = cli("variance", run_a, run_b, "--steps", "0,20", "--csv")
    row2 = parse_csv(out)[3]
    assert float(row2[5]) == 100.0 * (68.0 - 10.0) / 68.0


def test_markdown_layout_follows_the_seed(cli, run_a, run_b):
    _, out, _ = cli("variance", run_a, run_b, "--steps", "0,20", "--markdown")
    lines = out.splitlines()
    assert lines[0] == "=== micro Load Balancing Variance Analysis (Step 0 vs Step 20) ==="
    assert lines[2].startswith("| Layer Index | Routing Type | Step 0 Var (Baseline) |")
    rules = [l for l in lines if l.startswith("|-")]
    assert len(rules) == 2 and rules[0] == rules[1]          # under the header, above TOTAL
    assert lines[-1].startswith("| TOTAL/AVG ")
    assert len({len(l) for l in lines[2:]}) == 1              # every line padded alike


def test_single_run_reports_the_change(cli, run_b):
    code, out, err = cli("variance", run_b, "--steps", "0,20")
    assert code == 0, err
    with h5py.File(run_b, "r") as f:
        load = f["routing/expert_load"][:].astype(np.float64)
    v0, v20 = load[0].var(axis=1), load[20].var(axis=1)
    rows = parse_text(out)
    assert rows[0] == ["Layer Index", "Routing Type", "Step 0 Var (Baseline)", "Step 20 Var",
                       "Change (Step 0 to 20)"]
    for layer, cells in enumerate(rows[1:-1]):
        assert [float(c) for c in cells[2:4]] == pytest.approx([v0[layer], v20[layer]], abs=5e-3)
        assert percent(cells[4]) == pytest.approx(100 * (v20[layer] - v0[layer]) / v0[layer],
                                                  abs=0.005)
    assert [rows[1 + layer][4] for layer in (0, 2, 5)] == ["0.00%", "-87.50%", "+300.00%"]


def test_default_steps_are_first_and_last(cli, run_a, run_b):
    assert cli("variance", run_a, run_b)[1] == cli("variance", run_a, run_b, "--steps", "0,20")[1]


def test_steps_are_step_values_not_row_indices(cli, tmp_path):
    run = sf.build_run("A")
    run["datasets"]["steps/step"] = run["datasets"]["steps/step"] + 100
    path = sf.write_stats(str(tmp_path / "shifted.h5"), run)
    code, out, err = cli("variance", path, "--steps", "100,120")
    assert code == 0, err
    assert "(Step 100 vs Step 120)" in out
    assert parse_text(out)[3][2:4] == ["80.00", "68.00"]


def test_missing_step_names_the_file_and_the_range(cli, run_a, run_b):
    code, out, err = cli("variance", run_a, run_b, "--steps", "0,25")
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1
    assert run_a in err and "step 25" in err and "0..20" in err


def test_missing_step_in_run_b_names_run_b(cli, run_a, tmp_path):
    short = sf.write_stats(str(tmp_path / "short.h5"), sf.build_run("B"), rows=11)
    code, _, err = cli("variance", run_a, short, "--steps", "0,20")
    assert code == 2 and short in err and "0..10" in err


@pytest.mark.parametrize("what", ["layers", "experts"])
def test_run_b_of_another_shape_is_an_error(cli, run_a, tmp_path, what):
    run = sf.build_run("B")
    for name, data in run["datasets"].items():
        if name.startswith("routing/") and data.ndim >= 2:
            run["datasets"][name] = data[:, :-1] if what == "layers" else data
        if what == "experts" and name in ("routing/expert_load", "routing/bias"):
            run["datasets"][name] = data[:, :, :-1]
    if what == "layers":
        run["strings"]["layers/routing"] = run["strings"]["layers/routing"][:-1]
    other = sf.write_stats(str(tmp_path / f"fewer_{what}.h5"), run)
    code, out, err = cli("variance", run_a, other, "--steps", "0,20")
    assert code == 2 and out == ""
    assert other in err and run_a in err and "same shape" in err


def test_stored_variance_is_cross_checked(cli, tmp_path):
    run = sf.build_run("A")
    run["datasets"]["routing/load_variance"] = run["datasets"]["routing/load_variance"].copy()
    run["datasets"]["routing/load_variance"][20, 2] += 1e-3
    path = sf.write_stats(str(tmp_path / "bad_var.h5"), run)
    code, out, err = cli("variance", path, "--steps", "0,20")
    assert code == 0
    warnings = err.splitlines()
    assert len(warnings) == 1 and "warning" in warnings[0] and path in warnings[0]
    assert "step 20 layer 2" in warnings[0]
    assert parse_text(out)[3][3] == "68.00"  # the recomputed value


def test_summary_uses_and_checks_the_recomputed_variance(cli, tmp_path):
    run = sf.build_run("A")
    run["datasets"]["routing/load_variance"] = run["datasets"]["routing/load_variance"].copy()
    run["datasets"]["routing/load_variance"][20, 2] = 1e9
    path = sf.write_stats(str(tmp_path / "bad_var.h5"), run)
    code, out, err = cli("summary", path)
    assert code == 0
    warnings = err.splitlines()
    assert len(warnings) == 1 and "1 of" in warnings[0] and "step 20 layer 2" in warnings[0]
    assert "1000000000.0" in warnings[0] and "np.float64" not in warnings[0]
    layer2 = next(l for l in out.splitlines() if l.split()[:1] == ["2"])
    assert layer2.split()[-3] == "68.00"  # last var: the recomputed value


def test_no_warning_when_stored_variance_agrees(cli, run_a, run_b):
    assert cli("variance", run_a, run_b, "--steps", "0,20")[2] == ""
    assert cli("summary", run_a)[2] == ""


@pytest.mark.parametrize("steps", ["0;20", "0,²", "--1,3", "0,20,3"])
def test_bad_steps_option(cli, run_a, steps):
    code, _, err = cli("variance", run_a, f"--steps={steps}")
    assert code == 2 and "--steps" in err and len(err.splitlines()) == 1


def with_routing(tmp_path, variant, kinds):
    run = sf.build_run(variant)
    run["strings"]["layers/routing"] = kinds
    return sf.write_stats(str(tmp_path / f"{variant}_{'_'.join(kinds)}.h5"), run)


def test_total_takes_the_layers_top_k_in_both_runs(cli, run_a, tmp_path):
    # Run B routes layer 2 by hash: it leaves TOTAL, which then sums layers 3..5 only.
    kinds = sf.routing_kinds()
    kinds[2] = "hash"
    b = with_routing(tmp_path, "B", kinds)
    code, out, err = cli("variance", run_a, b, "--steps", "0,20")
    assert code == 0 and "TOTAL takes the layers top-k in both" in err
    routing, v0, va, vb = numpy_columns(run_a, b, 0, 20)
    both = np.array([k == "topk" for k in kinds])
    total = parse_text(out)[-1]
    assert [float(c) for c in total[2:5]] == pytest.approx(
        [v0[both].sum(), va[both].sum(), vb[both].sum()], abs=0.005)


def test_total_is_na_without_top_k_layers(cli, tmp_path):
    a = with_routing(tmp_path, "A", ["hash"] * sf.NUM_LAYERS)
    code, out, _ = cli("variance", a, "--steps", "0,20")
    assert code == 0
    assert parse_text(out)[-1][-1] == "n/a"  # not 0.00%, which would read as "no change"
