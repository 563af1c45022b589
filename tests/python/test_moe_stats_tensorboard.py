"""`moe_stats.py tensorboard`: event files written with the tensorboard package's writer, read
back with its EventAccumulator."""
import glob
import os

import numpy as np
import pytest

import moe_stats
import stats_fixture as sf

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing import event_accumulator  # noqa: E402


def accumulate(folder):
    acc = event_accumulator.EventAccumulator(
        folder, size_guidance={event_accumulator.SCALARS: 0, event_accumulator.HISTOGRAMS: 0})
    acc.Reload()
    return acc


def test_events_read_back(cli, run_b, tmp_path):
    code, out, err = cli("tensorboard", run_b, tmp_path / "logs")
    assert code == 0, err
    folder = tmp_path / "logs" / "run_b"
    assert out.strip().startswith(str(folder / "events.out.tfevents."))
    acc = accumulate(str(folder))
    tags = acc.Tags()
    run = moe_stats.load_run(run_b)
    scalars = set(tags["scalars"])
    for tag in ("loss/train", "loss/balance", "optim/lr", "optim/grad_norm",
                "throughput/tokens_per_s", "throughput/step_time_s",
                "phase_time_ms/attention", "assignments/rank00", "assignments/rank01"):
        assert tag in scalars, tag
    # Metric first: one section (the part before the first "/") per metric, every layer in it.
    for name in ("violation", "variance", "cv", "entropy", "balance_loss", "bias_norm",
                 "rank_overload", "dead", "diversity"):
        assert {t for t in scalars if t.startswith(name + "/")} == {
            f"{name}/layer{layer:02d}" for layer in range(sf.NUM_LAYERS)}, name
    assert not [t for t in scalars if t.count("/") != 1]
    loss = acc.Scalars("loss/train")
    assert [e.step for e in loss] == list(range(sf.NUM_STEPS))
    assert [e.value for e in loss] == pytest.approx(run.data["steps/loss"].tolist(), rel=1e-6)
    viol = acc.Scalars("violation/layer02")
    assert [e.value for e in viol] == pytest.approx(run.data["routing/max_violation"][:, 2],
                                                    rel=1e-6)
    # Wall times follow the step times from the file's creation time.
    times = [e.wall_time for e in loss]
    assert np.all(np.diff(times) > 0)
    assert times[0] == pytest.approx(1767225600 + run.data["steps/step_time_s"][0])
    ranks = acc.Scalars("assignments/rank01")
    assert [e.value for e in ranks] == pytest.approx(
        run.data["routing/rank_load"][:, :, 1].sum(axis=1), rel=1e-6)
    phase = acc.Scalars("phase_time_ms/router")
    assert phase[3].value == pytest.approx(
        1e3 * run.data["perf/phase_time"][3, :, 1].mean(), rel=1e-6)
    assert set(tags["histograms"]) == {f"expert_load/layer{l:02d}" for l in range(sf.NUM_LAYERS)}
    hist = acc.Histograms("expert_load/layer00")
    assert len(hist) == sf.NUM_STEPS
    h = hist[20].histogram_value
    load = run.data["routing/expert_load"][20, 0]
    assert (h.num, h.min, h.max, h.sum) == (sf.NUM_EXPERTS, load.min(), load.max(), load.sum())
    assert sum(h.bucket) == sf.NUM_EXPERTS


def test_a_second_export_is_refused_unless_overwrite(cli, run_a, tmp_path):
    assert cli("tensorboard", run_a, tmp_path, "--label", "A")[0] == 0
    code, out, err = cli("tensorboard", run_a, tmp_path, "--label", "A")
    assert code == 2 and "--overwrite" in err
    code, out, err = cli("tensorboard", run_a, tmp_path, "--label", "A", "--overwrite")
    assert code == 0, err
    assert len(glob.glob(os.path.join(tmp_path, "A", "events.out.tfevents.*"))) == 1


def test_a_custom_scalars_layout_puts_every_layer_in_one_chart(cli, run_b, tmp_path):
    # The custom scalars dashboard reads its layout from the tag custom_scalars__config__, a
    # string tensor holding a serialised Layout (as the plugin's own reader decodes it).
    import re
    from tensorboard.plugins.custom_scalar import layout_pb2, metadata
    from tensorboard.util import tensor_util
    code, out, err = cli("tensorboard", run_b, tmp_path / "logs")
    assert code == 0, err
    acc = event_accumulator.EventAccumulator(
        str(tmp_path / "logs" / "run_b"),
        size_guidance={event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0})
    acc.Reload()
    assert acc.SummaryMetadata(metadata.CONFIG_SUMMARY_TAG).plugin_data.plugin_name == \
        metadata.PLUGIN_NAME
    [event] = acc.Tensors(metadata.CONFIG_SUMMARY_TAG)
    layout = layout_pb2.Layout.FromString(tensor_util.make_ndarray(event.tensor_proto).item())
    scalars = set(acc.Tags()["scalars"])
    charts = {(category.title, chart.title): list(chart.multiline.tag)
              for category in layout.category for chart in category.chart}
    # Every metric with more than one tag has one chart, whose expression matches exactly its tags.
    metrics = {}
    for tag in scalars:
        metrics.setdefault(tag.split("/")[0], set()).add(tag)
    assert {title for _, title in charts} == {m for m, tags in metrics.items() if len(tags) > 1}
    for (category, title), [regex] in charts.items():
        assert {t for t in scalars if re.search(regex, t)} == metrics[title], title
    assert ("per layer", "violation") in charts and ("per rank", "assignments") in charts
    assert ("other", "loss") in charts and ("other", "phase_time_ms") in charts
    assert {t for t in scalars if re.search(charts["per layer", "violation"][0], t)} == {
        f"violation/layer{layer:02d}" for layer in range(sf.NUM_LAYERS)}
