"""docs/notebooks/load_balance.ipynb: kept without outputs, its run named by a parameter cell, and
run from top to bottom by nbclient on fixture run A (MOE_STATS_RUN), in a kernel of this Python
with scripts/ on its path (what `pip install -e .` gives). It must draw its two figures, and its
per-layer table and chosen layer must be those computed here from the file's expert loads."""
import json
import os
import sys

import h5py
import nbclient
import nbformat
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOK = os.path.join(ROOT, "docs", "notebooks", "load_balance.ipynb")

# Appended to the notebook: what it computed, for the test to check.
REPORT = """import json
print(json.dumps({"layer": int(layer), "last": table["last"].tolist(),
                  "last_quarter_mean": table["last_quarter_mean"].tolist(),
                  "worst": table["worst"].tolist(), "ratio_shape": list(ratio.shape)}))"""


def kernel_env(monkeypatch, tmp_path, run):
    """The kernel: this Python (a kernel spec of our own, first on JUPYTER_PATH, so that none
    installed elsewhere is picked), scripts/ on its path, Jupyter's and IPython's files in
    tmp_path, the run in MOE_STATS_RUN, and matplotlib's inline backend (no MPLBACKEND)."""
    spec = tmp_path / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (os.path.join(ROOT, "scripts"), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setenv("MOE_STATS_RUN", run)
    monkeypatch.delenv("MPLBACKEND", raising=False)


def test_notebook_is_kept_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert code and all(cell.outputs == [] and cell.execution_count is None for cell in code)
    parameters = [cell for cell in code if "parameters" in cell.metadata.get("tags", [])]
    assert len(parameters) == 1 and "MOE_STATS_RUN" in parameters[0].source


def test_notebook_runs_on_a_fixture_run(run_a, monkeypatch, tmp_path):
    kernel_env(monkeypatch, tmp_path, run_a)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(REPORT))
    # Raises CellExecutionError, with the cell and its traceback, where a cell fails.
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": os.path.dirname(NOTEBOOK)}}).execute()

    images = [cell.id for cell in nb.cells if cell.cell_type == "code"
              for out in cell.outputs if "image/png" in out.get("data", {})]
    assert images == ["violation-plot", "heatmap"]

    with h5py.File(run_a, "r") as f:
        steps = f["steps/step"][:]
        load = f["routing/expert_load"][:].astype(np.float64)            # [N, L, E]
        topk = [kind == "topk" for kind in f["layers/routing"].asstr()[:]]
    (loaded,) = [cell for cell in nb.cells if cell.id == "load"]
    printed = "".join(out.text for out in loaded.outputs if out.output_type == "stream")
    assert printed.startswith(f"{os.path.basename(run_a)}: steps {steps[0]}..{steps[-1]} "
                              f"({len(steps)} rows), {load.shape[1]} layers ")
    assert f"{sum(topk)} topk" in printed and f"{len(topk) - sum(topk)} hash" in printed
    assert printed.endswith(f"), {load.shape[2]} experts\n")
    mean = load.mean(axis=2)
    violation = (load.max(axis=2) - mean) / mean                           # [N, L]
    last_quarter = violation[-max(1, len(violation) // 4):].mean(axis=0)
    report = json.loads(nb.cells[-1].outputs[0].text)
    np.testing.assert_allclose(report["last"], violation[-1])
    np.testing.assert_allclose(report["last_quarter_mean"], last_quarter)
    np.testing.assert_allclose(report["worst"], violation.max(axis=0))
    assert report["layer"] == int(np.argmax(np.where(topk, last_quarter, -np.inf)))
    assert report["ratio_shape"] == [load.shape[2], load.shape[0]]
