"""`moe_stats.py mlflow`: runs logged to a local MLflow file store, read back with MLflow's own
client (MlflowClient): the configuration as parameters, metric histories whose steps, values and
times are the file's, under the names of the TensorBoard export; the figures as artifacts; a
resumed chain as one run of consecutive steps; the default store ./mlruns and MLFLOW_TRACKING_URI;
no network; bad input as one line and exit code 2.

Only the first test draws figures (seconds); the others log with --no-figures."""
import io
import os
import socket
import sys

import h5py
import numpy as np
import pytest

import moe_stats
import stats_fixture as sf

pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

CREATED_MS = 1767225600000    # the fixture's created attribute, 2026-01-01T00:00:00Z


def call(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = moe_stats.main([str(a) for a in argv], out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def logged_run(out):
    """(client, run id) of the run a successful `mlflow` command reports."""
    words = out.split()
    assert words[:2] == ["mlflow", "run"], out
    uri = words[words.index("in") + 1].rstrip(":")
    return MlflowClient(tracking_uri=uri), words[2]


def history(client, run_id, name):
    """(steps, values, timestamps) of metric `name`."""
    metrics = client.get_metric_history(run_id, name)
    return ([m.step for m in metrics], [m.value for m in metrics],
            [m.timestamp for m in metrics])


@pytest.fixture(scope="module")
def run_b_logged(runs, tmp_path_factory):
    """Run B logged once, figures included: (client, run id, stdout)."""
    store = tmp_path_factory.mktemp("mlflow") / "store"
    code, out, err = call("mlflow", runs[1], "--tracking-uri", store, "--experiment", "fixture")
    assert code == 0, err
    assert err == ""
    client, run_id = logged_run(out)
    assert out.splitlines()[0].split(" in ")[1].startswith(store.as_uri() + ":")
    return client, run_id, out


def test_parameters_are_the_configuration(run_b_logged):
    client, run_id, _ = run_b_logged
    lines = sf.config_text(sf.BIAS_RATE).splitlines()
    expected = dict(line.split(" = ", 1) for line in lines if not line.startswith("#"))
    run = client.get_run(run_id)
    assert run.data.params == expected
    assert run.info.run_name == "run_b"
    assert client.get_experiment(run.info.experiment_id).name == "fixture"
    assert run.info.status == "FINISHED"
    assert run.data.tags["moe_rt.file"].endswith(os.sep + "run_b.h5")


def test_metric_histories_are_the_file(run_b_logged, run_b):
    client, run_id, _ = run_b_logged
    with h5py.File(run_b) as f:
        data = {name: f[name][()] for name in ("steps/loss", "steps/lr", "steps/step_time_s",
                                               "routing/max_violation", "routing/rank_load",
                                               "perf/phase_time", "routing/expert_load")}
    steps, values, times = history(client, run_id, "loss/train")
    assert steps == list(range(sf.NUM_STEPS))
    assert values == data["steps/loss"].tolist()                 # float64, exactly
    ends = CREATED_MS + 1000 * np.cumsum(data["steps/step_time_s"])
    assert np.abs(np.array(times) - ends).max() <= 1
    run = client.get_run(run_id)
    assert run.info.start_time == CREATED_MS and run.info.end_time == times[-1]
    assert history(client, run_id, "optim/lr")[1] == data["steps/lr"].tolist()
    for layer in range(sf.NUM_LAYERS):
        steps, values, _ = history(client, run_id, f"violation/layer{layer:02d}")
        assert steps == list(range(sf.NUM_STEPS))
        assert values == pytest.approx(data["routing/max_violation"][:, layer], rel=1e-12)
        loads = data["routing/expert_load"][:, layer]
        assert history(client, run_id, f"max/layer{layer:02d}")[1] == loads.max(axis=1).tolist()
    rank1 = data["routing/rank_load"][:, :, 1].sum(axis=1)
    assert history(client, run_id, "assignments/rank01")[1] == rank1.tolist()
    router = 1e3 * data["perf/phase_time"][:, :, sf.PHASES.index("router")].mean(axis=1)
    assert history(client, run_id, "phase_time_ms/router")[1] == pytest.approx(router,
                                                                              rel=1e-12)
    # NaN metrics (no /routing/dropped, no cross-host counts, no z-loss) are not logged.
    names = set(run.data.metrics)
    assert not [n for n in names if n.split("/")[0] in ("drop_rate", "cross_host_frac",
                                                        "z_loss")]


def test_metric_names_are_the_tensorboard_tags(run_b_logged, run_b, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing import event_accumulator
    client, run_id, _ = run_b_logged
    assert call("tensorboard", run_b, tmp_path, "--label", "b")[0] == 0
    acc = event_accumulator.EventAccumulator(str(tmp_path / "b"))
    acc.Reload()
    names = set(client.get_run(run_id).data.metrics)
    assert names == set(acc.Tags()["scalars"])
    assert {"violation/layer05", "entropy/layer00", "assignments/rank00"} <= names


def test_figures_are_artifacts(run_b_logged, tmp_path):
    client, run_id, out = run_b_logged
    files = client.list_artifacts(run_id, "figures")
    names = {os.path.basename(f.path) for f in files}
    assert {"expert_load_A.png", "balance.png", "metrics.png", "loss.png", "ranks.png",
            "phases.png"} <= names
    assert f"{len(names)} figures" in out
    assert all(f.file_size > 0 for f in files)
    local = client.download_artifacts(run_id, "figures/loss.png", str(tmp_path))
    with open(local, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_a_resumed_chain_is_one_run(tmp_path):
    whole = sf.build_run("A")
    first = sf.write_segment(str(tmp_path / "seg0.h5"), whole, 0, 12)
    # The newest file's configuration (TOML, tables by topic) gives the parameters.
    toml = '[run]\nsteps = 21\nmodel = "micro"\n\n[optimizer]\nlr = 0.003\n'
    newest = sf.write_segment(str(tmp_path / "seg1.h5"), whole, 12, sf.NUM_STEPS,
                              predecessor=first, attrs={"config": toml})
    store = tmp_path / "store"
    code, out, err = call("mlflow", newest, "--tracking-uri", store, "--no-figures")
    assert code == 0, err
    assert out.rstrip().endswith(f"view: MLFLOW_ALLOW_FILE_STORE=true mlflow ui "
                                 f"--backend-store-uri {store.as_uri()}")
    client, run_id = logged_run(out)
    steps, values, times = history(client, run_id, "loss/train")
    assert steps == list(range(sf.NUM_STEPS))
    assert values == whole["datasets"]["steps/loss"].tolist()
    assert all(np.diff(times) >= 0) and times[-1] > times[0]     # steps of 0.4 ms
    run = client.get_run(run_id)
    assert run.data.params == {"steps": "21", "model": "micro", "lr": "0.003"}
    assert run.data.tags["moe_rt.files"].splitlines() == [first, newest]
    assert client.list_artifacts(run_id) == []
    code, out, err = call("mlflow", newest, "--tracking-uri", store, "--no-figures",
                          "--no-chain", "--run-name", "alone")
    assert code == 0, err
    client, alone = logged_run(out)
    assert history(client, alone, "loss/train")[0] == list(range(12, sf.NUM_STEPS))
    assert client.get_run(alone).info.run_name == "alone"


def test_shadow_names_keep_the_rule(tmp_path):
    path = sf.write_stats(str(tmp_path / "s.h5"), sf.build_run("B", shadows=sf.SHADOW_RULES))
    code, out, err = call("mlflow", path, "--tracking-uri", tmp_path / "store", "--no-figures")
    assert code == 0, err
    client, run_id = logged_run(out)
    names = {n for n in client.get_run(run_id).data.metrics if n.startswith("worst_violation/")}
    assert names == {f"worst_violation/{p}" for p in ("real",) + sf.SHADOW_RULES}
    with h5py.File(path) as f:
        stored = f["shadow/sign:0.001/max_violation"][()][:, sf.NUM_HASH:]
    assert history(client, run_id, "worst_violation/sign:0.001")[1] == pytest.approx(
        stored.max(axis=1), rel=1e-12)


def test_default_store_and_environment(run_a, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    code, out, err = call("mlflow", run_a, "--no-figures")
    assert code == 0, err
    client, run_id = logged_run(out)
    assert client.tracking_uri == (tmp_path / "mlruns").as_uri()
    assert client.get_experiment(client.get_run(run_id).info.experiment_id).name == "Default"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "elsewhere").as_uri())
    code, out, err = call("mlflow", run_a, "--no-figures")
    assert code == 0, err
    assert logged_run(out)[0].tracking_uri == (tmp_path / "elsewhere").as_uri()


def test_no_network(run_a, tmp_path, monkeypatch):
    tried = []

    def refuse(*args, **kwargs):
        tried.append(args)
        raise OSError("no network in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    code, out, err = call("mlflow", run_a, "--tracking-uri", tmp_path / "store", "--no-figures")
    assert code == 0, err
    assert tried == []
    assert os.environ["MLFLOW_DISABLE_TELEMETRY"] == "true"


def test_without_mlflow(run_a, tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "mlflow" or m.startswith("mlflow.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "mlflow", None)
    code, out, err = call("mlflow", run_a, "--tracking-uri", tmp_path / "store")
    assert code == 2 and out == ""
    assert err == ("moe_stats.py: error: mlflow needs the mlflow-skinny package, or mlflow "
                   "(scripts/setup.sh installs mlflow-skinny)\n")
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize("case", ["scheme", "under_a_file", "not_hdf5", "deleted_experiment"])
def test_errors_are_one_line(case, run_a, tmp_path):
    path, uri, extra = run_a, str(tmp_path / "store"), []
    if case == "scheme":
        uri, expected = "bogus://somewhere", "bogus://somewhere"
    elif case == "under_a_file":
        (tmp_path / "file").write_text("x")
        uri = str(tmp_path / "file" / "store")
        expected = (tmp_path / "file" / "store").as_uri()
    elif case == "not_hdf5":
        path = tmp_path / "notes.h5"
        path.write_text("not HDF5")
        expected = str(path)
    else:
        client = MlflowClient(tracking_uri=(tmp_path / "store").as_uri())
        client.delete_experiment(client.create_experiment("gone"))
        extra, expected = ["--experiment", "gone"], "experiment 'gone' is deleted"
    code, out, err = call("mlflow", path, "--tracking-uri", uri, "--no-figures", *extra)
    assert code == 2 and out == ""
    assert err.startswith("moe_stats.py: error: ") and err.count("\n") == 1, err
    assert expected in err
    if case == "not_hdf5":
        assert not os.path.exists(uri)        # the file is read before the store is touched
