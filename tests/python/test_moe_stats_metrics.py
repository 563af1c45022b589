"""The per-layer expert-load metrics (moe_stats_lib/metrics.py) on loads whose values are known by
hand, and their place in `summary`."""
import math

import numpy as np
import pytest

import moe_stats
from moe_stats_lib import metrics as metrics_lib
import stats_fixture as sf


def test_metrics_of_known_loads():
    # One step, three layers of E = 4: balanced, one dead expert, collapsed onto one expert.
    load = np.array([[[8, 8, 8, 8], [12, 12, 8, 0], [32, 0, 0, 0]]])
    m = metrics_lib.load_metrics(load)
    assert m["cv"][0].tolist() == pytest.approx([0.0, np.std([12, 12, 8, 0]) / 8, math.sqrt(3)])
    assert m["min"][0].tolist() == [8, 0, 0] and m["max"][0].tolist() == [8, 12, 32]
    assert m["p50"][0].tolist() == [8, 10, 0]
    assert m["p25"][0].tolist() == [8, 6, 0]          # linear interpolation between 0 and 8
    assert m["dead"][0].tolist() == [0, 1, 3] and m["dead_frac"][0].tolist() == [0, 0.25, 0.75]
    assert m["max_ratio"][0].tolist() == [1.0, 1.5, 4.0]
    assert m["violation"][0].tolist() == [0.0, 0.5, 3.0]
    assert m["entropy"][0, 0] == pytest.approx(math.log(4))
    assert m["entropy"][0, 2] == 0.0
    assert m["diversity"][0].tolist() == pytest.approx(
        [1.0, math.exp(-(2 * 0.375 * math.log(0.375) + 0.25 * math.log(0.25))) / 4, 0.25])
    assert m["variance"][0].tolist() == pytest.approx([0, np.var([12, 12, 8, 0]), 192])


def test_metrics_of_an_all_zero_layer_are_defined():
    m = metrics_lib.load_metrics(np.zeros((1, 1, 4)))
    assert m["cv"][0, 0] == 0 and m["max_ratio"][0, 0] == 1 and m["diversity"][0, 0] == 0
    assert m["dead"][0, 0] == 4


def test_layer_metrics_of_a_run(run_b):
    run = moe_stats.load_run(run_b)
    m = metrics_lib.layer_metrics(run)
    assert list(m) == list(metrics_lib.METRICS)
    for values in m.values():
        assert values.shape == (sf.NUM_STEPS, sf.NUM_LAYERS)
    assert np.array_equal(m["balance_loss"], run.data["routing/balance_loss"])
    bias = run.data["routing/bias"]
    assert np.allclose(m["bias_spread"], bias.max(axis=2) - bias.min(axis=2))
    assert m["bias_spread"][:, :sf.NUM_HASH].max() == 0 and m["bias_spread"][-1, 2] > 0
    assert np.allclose(m["cv"], run.data["routing/load_cv"])
    assert np.allclose(m["violation"], run.data["routing/max_violation"])
    assert metrics_lib.collapse_ceiling(run) == sf.NUM_EXPERTS / sf.TOP_K


def test_summary_shows_the_load_distribution(cli, run_a):
    code, out, err = cli("summary", run_a)
    assert code == 0, err
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("expert load at the last"))
    assert "collapse at max = E/K x mean = 64" in lines[start]
    header = lines[start + 1].split()
    assert header[:6] == ["layer", "min", "p25", "p50", "p75", "max"]
    # Layer 0 at step 20 of run A: loads 32 + (8, 4, -4, -8) = 40, 36, 28, 24.
    row = lines[start + 2].split()
    assert row[:6] == ["0", "24", "27", "32", "37", "40"]
    assert row[header.index("dead")] == "0"
    assert lines[start + 2 + sf.NUM_LAYERS].startswith("across top-k layers at the last step: ")
