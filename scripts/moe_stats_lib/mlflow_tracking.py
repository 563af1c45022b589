"""`moe_stats.py mlflow`: a run (a resumed chain: one run) logged to an MLflow tracking store with
MLflow's own client (MlflowClient, from the mlflow-skinny package or the full mlflow), so the MLflow
UI shows it beside other runs and compares them.

What one MLflow run holds:
    parameters   the run's configuration (the root attribute config: the options of /config,
                 valued as written in the text; of a chain, the newest file's), one per option
    metrics      every scalar of scalars.scalar_series under the same names as the TensorBoard
                 tags (violation/layer03, assignments/rank01, loss/train, ...), at
                 step = /steps/step and the step's wall time; values NaN at a step are not logged
    artifacts    the figures of `plot` (PNG) under figures/, unless figures=False
    tags         moe_rt.file (the file named), moe_rt.files (the files read, oldest first),
                 moe_rt.run_id and moe_rt.program_version where the file has them
Start and end time are those of the run's first and last step. Each call logs a new MLflow run.

The tracking store: --tracking-uri, else the environment's MLFLOW_TRACKING_URI, else the folder
mlruns in the working folder, as a file store (MLflow's own default before it moved to a
database); a plain path is a file store folder. MLflow 3 refuses a file store unless
MLFLOW_ALLOW_FILE_STORE is true; this process sets it unless the environment says otherwise.
Nothing is sent anywhere but the store: MLflow's usage telemetry is switched off
(MLFLOW_DISABLE_TELEMETRY).

Entries are logged with log_batch in batches within MLflow's limits (MAX_* below), so a run of a
few hundred steps takes seconds.

Shapes: N complete rows (steps).
"""
from __future__ import annotations

import os
import pathlib
import tempfile
import types
import urllib.parse

import numpy as np

from .plot import write_plots
from .scalars import name_part, scalar_series, wall_times
from .stats_file import StatsError, parse_config_text

DEFAULT_STORE = "mlruns"
DEFAULT_EXPERIMENT = "Default"     # the experiment MLflow puts a run in when none is named
FIGURES_FOLDER = "figures"
# MLflow's limits on one log_batch request (mlflow.utils.validation): entries of each kind, all
# entries together, and the length of a parameter's and a tag's value.
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_PER_BATCH = 100
MAX_ENTITIES_PER_BATCH = 1000
MAX_PARAM_VALUE = 6000
MAX_TAG_VALUE = 8000


def mlflow_modules():
    """MlflowClient, the entity classes and MlflowException; StatsError without mlflow."""
    # Before the import: MLflow 3 would otherwise send usage records (and fetch their settings)
    # over the network, and refuse to open the file store the default store is.
    os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    try:
        from mlflow.entities import Metric, Param
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise StatsError("mlflow needs the mlflow-skinny package, or mlflow (scripts/setup.sh "
                         "installs mlflow-skinny)") from None
    return types.SimpleNamespace(MlflowClient=MlflowClient, Metric=Metric, Param=Param,
                                 MlflowException=MlflowException)


def tracking_uri(text=None):
    """The tracking URI: `text`, else MLFLOW_TRACKING_URI, else ./mlruns; a plain path (no
    scheme) as an absolute file: URI."""
    text = text or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_STORE
    if urllib.parse.urlparse(text).scheme or text == "databricks":
        return text
    return pathlib.Path(text).absolute().as_uri()


def run_params(run, Param):
    """[Param] of the run's configuration, names and values within MLflow's limits."""
    config = parse_config_text(run.attrs.get("config", ""))
    return [Param(name_part(name), value[:MAX_PARAM_VALUE]) for name, value in config.items()]


def run_tags(run):
    tags = {"moe_rt.file": os.path.abspath(run.path),
            "moe_rt.files": "\n".join(os.path.abspath(s.path) for s in run.segments)}
    for key in ("run_id", "program_version"):
        if run.attrs.get(key):
            tags[f"moe_rt.{key}"] = str(run.attrs[key])
    return {key: value[:MAX_TAG_VALUE] for key, value in tags.items()}


def run_metrics(run, Metric, times_ms):
    """Metric of every finite value of every scalar, name after name, steps in order (a
    generator: a long run's values are made a batch at a time)."""
    steps = [int(step) for step in run.steps]
    times = [int(t) for t in times_ms]
    for name, values in scalar_series(run):
        values = np.asarray(values, dtype=np.float64)
        for row in np.nonzero(np.isfinite(values))[0]:
            yield Metric(name, float(values[row]), times[row], steps[row])


def log_batches(client, run_id, params, metrics):
    """Every parameter and metric, in log_batch requests within MLflow's limits; returns the
    number of metric values logged."""
    for i in range(0, len(params), MAX_PARAMS_PER_BATCH):
        client.log_batch(run_id, params=params[i:i + MAX_PARAMS_PER_BATCH])
    size, batch, count = min(MAX_METRICS_PER_BATCH, MAX_ENTITIES_PER_BATCH), [], 0
    for metric in metrics:
        batch.append(metric)
        if len(batch) == size:
            client.log_batch(run_id, metrics=batch)
            count, batch = count + len(batch), []
    if batch:
        client.log_batch(run_id, metrics=batch)
    return count + len(batch)


def experiment_id(client, name):
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        return client.create_experiment(name)
    if experiment.lifecycle_stage != "active":
        raise StatsError(f"experiment '{name}' is deleted; restore it (mlflow experiments "
                         f"restore) or name another with --experiment")
    return experiment.experiment_id


def log_run(run, uri, experiment=None, run_name=None, figures=True):
    """Logs `run` as a new MLflow run; returns a namespace: run_id, experiment_id, uri, and the
    counts params, metrics, figures."""
    ml = mlflow_modules()
    times = wall_times(run)
    first = (np.nan_to_num(run.data["steps/step_time_s"][0])
             if "steps/step_time_s" in run.data else 0.0)
    start_ms = int(round(1000 * (times[0] - first)))
    times_ms = np.round(1000 * times).astype(np.int64)
    params = run_params(run, ml.Param)
    metrics = run_metrics(run, ml.Metric, times_ms)
    try:
        client = ml.MlflowClient(tracking_uri=uri)
        exp_id = experiment_id(client, experiment or DEFAULT_EXPERIMENT)
        run_id = client.create_run(exp_id, start_time=start_ms, tags=run_tags(run),
                                   run_name=run_name or os.path.splitext(run.name)[0]).info.run_id
        try:
            logged = log_batches(client, run_id, params, metrics)
            drawn = log_figures(client, run_id, run) if figures else []
        except BaseException:
            mark_failed(client, run_id, ml.MlflowException)
            raise
        client.set_terminated(run_id, status="FINISHED", end_time=int(times_ms[-1]))
    except ml.MlflowException as err:
        raise StatsError(f"{uri}: {first_line(err.message)}") from None
    except OSError as err:
        raise StatsError(f"{uri}: {first_line(str(err))}") from None
    return types.SimpleNamespace(run_id=run_id, experiment_id=exp_id, uri=uri,
                                 params=len(params), metrics=logged, figures=len(drawn))


def log_figures(client, run_id, run):
    """The figures of `plot` (PNG, 80 dpi), drawn into a temporary folder and logged under
    FIGURES_FOLDER; returns their file names."""
    with tempfile.TemporaryDirectory(prefix="moe_stats_mlflow.") as folder:
        paths = write_plots([run], folder)
        client.log_artifacts(run_id, folder, artifact_path=FIGURES_FOLDER)
    return [os.path.basename(path) for path in paths]


def mark_failed(client, run_id, MlflowException):
    """Marks the run FAILED, as far as the store lets it: the error that stopped the logging is
    the one reported."""
    try:
        client.set_terminated(run_id, status="FAILED")
    except (MlflowException, OSError):
        pass


def first_line(text):
    lines = str(text).strip().splitlines()
    return lines[0] if lines else "failed"
