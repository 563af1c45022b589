"""Opening, checking and reading one moe_rt statistics file (HDF5, format "moe_rt.stats"), and the
facts of a run that every report derives from it (the step's row, routing labels, top-k layers,
rank overload). chain.py joins the files of a resumed run into one Run.

A file that is still being written, or whose writer was killed, is opened for SWMR reading; only
rows present in every per-step dataset count as complete. Every problem with the input raises
StatsError naming the file.

The expert placement a file records (/layers/placement [L, P, E], files written since moe_rt
took --expert-placement) is read into its Segment, as the [L][P] expert ids each EP rank holds.

The shadow balancers of a run with --shadow (/shadow/RULE/..., one subgroup per rule, named by
the rule's text) are per-step datasets like the others: read into Run.data as
"shadow/RULE/max_violation" and so on, cut to the same complete rows, joined the same way in a
chain; shadow_rules(run) lists the rules.

Shapes: N complete rows (steps), L layers, E experts, W ranks (in a run whose files differ in W,
the largest; the W axes then hold NaN for the ranks a file did not have).
"""
from __future__ import annotations

import ctypes
import functools
import math
import os
import tomllib
from dataclasses import dataclass, field

import h5py
import numpy as np

FORMAT_NAME = "moe_rt.stats"
FORMAT_VERSION = 2  # the newest version this script reads (and every one before it)
# Version 2 adds units, descriptions, dimension scales (/dims) and the typed /config group; the
# datasets read here are the same in both.

# Per-step datasets: every one has N rows first; a file without one of the first group is refused
# (docs/hdf5-schema.md).
REQUIRED_PER_STEP = (
    "steps/step", "steps/loss", "steps/balance_loss", "steps/grad_norm", "steps/lr",
    "steps/tokens_per_s", "routing/expert_load", "routing/rank_load", "routing/bias",
    "routing/load_variance", "routing/max_violation",
)
OPTIONAL_PER_STEP = (
    "steps/step_time_s", "routing/load_cv", "routing/rank_overload", "routing/balance_loss",
    "perf/phase_time", "routing/dispatch_rows", "routing/cross_host_rows",
    "routing/cross_host_tokens", "steps/z_loss", "routing/z_loss", "routing/dropped",
    "routing/source_expert_load",
)
# /routing/source_expert_load [N, L, W, E] (rows rank w's tokens sent to expert e), absent from
# files written before moe_rt recorded it; `placement` takes the sources' shares from it.
# Dimensions of every per-step dataset, rows first: [N], [N, L], [N, L, E], [N, L, W], ...
PER_STEP_NDIM = {name: 1 for name in REQUIRED_PER_STEP + OPTIONAL_PER_STEP
                 if name.startswith("steps/")}
PER_STEP_NDIM.update({"routing/expert_load": 3, "routing/rank_load": 3, "routing/bias": 3,
                      "routing/load_variance": 2, "routing/max_violation": 2,
                      "routing/load_cv": 2, "routing/rank_overload": 2,
                      "routing/balance_loss": 2, "perf/phase_time": 3,
                      "routing/dispatch_rows": 2, "routing/cross_host_rows": 2,
                      "routing/cross_host_tokens": 2, "routing/z_loss": 2,
                      "routing/dropped": 3, "routing/source_expert_load": 4})
assert set(PER_STEP_NDIM) == set(REQUIRED_PER_STEP + OPTIONAL_PER_STEP)

# The datasets of each shadow balancer, /shadow/RULE/NAME (runs with --shadow; every rule has all
# three), and their dimensions, rows first: the counterparts of /routing/expert_load,
# /routing/max_violation and /routing/bias under the shadow's own bias.
SHADOW_NDIM = {"expert_load": 3, "max_violation": 2, "bias": 3}

# The validation rows (/eval, present when the run had --val-data): one per evaluation, with the
# training step it followed in eval/step. Their dimensions, rows first.
EVAL_NDIM = {"eval/step": 1, "eval/loss": 1, "eval/time_s": 1, "eval/tokens": 1,
             "eval/expert_load": 3, "eval/load_variance": 2, "eval/max_violation": 2}
# Validation datasets that files written before them lack (read when present, like
# OPTIONAL_PER_STEP): the assignments the token capacity dropped, [M, L, E] as eval/expert_load.
OPTIONAL_EVAL_NDIM = {"eval/dropped": 3}
ROUTING_LABELS = {"hash": "Hash Routed", "topk": "Top-K Routed", "forced": "Forced"}
# A SWMR reader retries a metadata block whose checksum fails, sleeping twice as long each time;
# at HDF5's default of 100 attempts a truncated or damaged file holds the reader for ever.
SWMR_READ_ATTEMPTS = 20


class StatsError(Exception):
    """A problem with the input, reported as one line on stderr and exit code 2."""


@dataclass(frozen=True)
class Segment:
    """One file of a run and the rows the Run holds from it. A run that was never resumed, or a
    file read alone (--no-chain), is one segment; a resumed run is one per file, oldest first."""

    path: str                     # the file read (a predecessor: where resumed_from was found)
    first_step: int | None        # first and last step of the rows kept; None when rows == 0
    last_step: int | None
    rows: int                     # rows of the Run taken from this file
    world_size: int               # W of this file (the last axis of its /routing/rank_load)
    resumed_from: str | None = None       # its root attribute resumed_from, as written
    resumed_from_step: int | None = None  # its root attribute resumed_from_step
    rows_dropped: int = 0         # complete rows after the successor's checkpoint, left out
    # The expert placement the file records (/layers/placement): [L][P] tuples of the expert ids
    # EP rank q holds in layer l; None for files written before moe_rt recorded it.
    placement: tuple | None = None
    # /hosts/rank_host: the host of each world rank; None for files written before it existed.
    rank_host: tuple | None = None


@dataclass(frozen=True)
class Run:
    """Everything moe_stats reads from one statistics file, or from the chain of files of a resumed
    run, cut to its N complete rows (a chain: concatenated in step order)."""

    path: str                # the file named by the caller (of a chain, the newest)
    attrs: dict              # its root attributes: strings decoded, numbers as Python scalars
    routing: tuple           # [L] "hash" | "topk" | "forced"
    data: dict               # "steps/loss" -> [N], "routing/expert_load" -> [N, L, E], ...,
                             # "shadow/RULE/max_violation" -> [N, L] (runs with --shadow)
    phases: tuple = ()       # [num_phases] names of /perf/phase_time's last axis
    segments: tuple = ()     # Segment per file, oldest first; their rows add up to N
    # "eval/loss" -> [M], ... the M complete validation rows (empty without /eval), in step order
    eval: dict = field(default_factory=dict)

    @property
    def steps(self):
        return self.data["steps/step"]

    @property
    def is_chain(self):
        """True when the Run was read from more than one file."""
        return len(self.segments) > 1

    def file_of_row(self, row):
        """The path of the file that holds row `row` (a row index of this Run)."""
        start = 0
        for segment in self.segments:
            start += segment.rows
            if row < start:
                return segment.path
        return self.path

    def world_size_of_rows(self):
        """[N] int: W of the file each row comes from (ranks r >= it are padding)."""
        if not self.segments:
            return np.full(len(self.steps), self.data["routing/rank_load"].shape[2])
        return np.concatenate([np.full(seg.rows, seg.world_size, dtype=np.int64)
                               for seg in self.segments])

    @property
    def num_layers(self):
        return self.data["routing/expert_load"].shape[1]

    @property
    def num_experts(self):
        return self.data["routing/expert_load"].shape[2]

    @property
    def name(self):
        """The file's name; of a link (runs/latest.h5), the name of the file it points to, so
        that a run keeps its own name in TensorBoard, MLflow and legends."""
        return os.path.basename(os.path.realpath(self.path))


# ---------------------------------------------------------------------------------------------
# Reading


def decode(value):
    """An HDF5 attribute or string element as a plain Python value (str, int, float or list)."""
    if isinstance(value, bytes):  # includes numpy.bytes_
        return value.decode("utf-8", "replace")
    if isinstance(value, np.ndarray):
        if value.size == 1:
            return decode(value.reshape(-1)[0])
        return [decode(v) for v in value.reshape(-1)]
    if isinstance(value, np.generic):
        return decode(value.item())
    return value


# Why ctypes: no public interface sets the number of metadata read attempts.
#   - h5py (3.16 included) wraps neither H5Pset_metadata_read_attempts nor HDF5's generic
#     H5Pset, so h5py.h5p.PropFAID has no call for it;
#   - HDF5 reads no environment variable for it: an unset value (0) becomes 100 for a SWMR open
#     (H5F_SWMR_METADATA_READ_ATTEMPTS), 1 otherwise.
# So the public C function is called through ctypes on the property list h5py made (its public
# `.id`), in the very library h5py uses: dlopen of h5py's own h5p extension module (already
# loaded) and symbol lookup through its dependencies. tests/python/test_moe_stats_summary.py checks
# with the installed h5py that the library found is h5py's (same version) and that a file opened
# by open_swmr really reads with SWMR_READ_ATTEMPTS. Where the lookup fails, the open is unbounded.
@functools.lru_cache(maxsize=None)
def hdf5_library():
    """The HDF5 C library h5py itself calls, through ctypes: h5py's own extension module resolves
    the symbols through its dependencies, so a second libhdf5 in the process cannot be picked by
    mistake. None where that fails (h5py built another way)."""
    try:
        lib = ctypes.CDLL(h5py.h5p.__file__)
        for name in ("H5Pset_metadata_read_attempts", "H5Pget_metadata_read_attempts",
                     "H5get_libversion"):
            getattr(lib, name).restype = ctypes.c_int
        lib.H5Pset_metadata_read_attempts.argtypes = [ctypes.c_int64, ctypes.c_uint]
        lib.H5Pget_metadata_read_attempts.argtypes = [ctypes.c_int64,
                                                      ctypes.POINTER(ctypes.c_uint)]
        lib.H5get_libversion.argtypes = [ctypes.POINTER(ctypes.c_uint)] * 3
    except (OSError, AttributeError):
        return None
    return lib


def swmr_fapl():
    """A file-access property list with SWMR_READ_ATTEMPTS metadata read attempts (h5py has no
    call for the setting), or None where the HDF5 library cannot be reached."""
    lib = hdf5_library()
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    if lib is None or lib.H5Pset_metadata_read_attempts(fapl.id, SWMR_READ_ATTEMPTS) < 0:
        return None
    return fapl


def open_swmr(path):
    """h5py.File opened for SWMR reading, with bounded read attempts so that a damaged file fails
    in a millisecond instead of hanging."""
    fapl = swmr_fapl()
    if fapl is None:
        return h5py.File(path, "r", libver="latest", swmr=True)
    flags = h5py.h5f.ACC_RDONLY | h5py.h5f.ACC_SWMR_READ
    return h5py.File(h5py.h5f.open(os.fsencode(path), flags, fapl=fapl))


def open_stats_file(path):
    """h5py.File for reading: a plain open, which checks a closed file's length; a file being
    written (or whose writer died) refuses that, and is opened for SWMR reading instead."""
    if not os.path.exists(path):
        raise StatsError(f"{path}: no such file")
    if os.path.isdir(path):
        raise StatsError(f"{path}: is a directory, not a statistics file")
    try:
        is_hdf5 = h5py.is_hdf5(path)
    except OSError as err:
        raise StatsError(f"{path}: cannot read ({err})") from None
    if not is_hdf5:
        raise StatsError(f"{path}: not an HDF5 file")
    try:
        return h5py.File(path, "r")
    except OSError as err:
        plain_error = str(err).splitlines()[0]
    if "truncated" in plain_error:
        raise StatsError(f"{path}: truncated file ({plain_error})")
    try:
        return open_swmr(path)
    except (OSError, ValueError, RuntimeError):
        raise StatsError(f"{path}: cannot open as HDF5 ({plain_error})") from None


def check_format(path, attrs):
    fmt = attrs.get("format")
    if fmt is None:
        raise StatsError(f"{path}: not a moe_rt statistics file (no 'format' attribute)")
    if fmt != FORMAT_NAME:
        raise StatsError(f"{path}: not a moe_rt statistics file "
                         f"(format is {fmt!r}, expected {FORMAT_NAME!r})")
    version = attrs.get("format_version")
    if isinstance(version, float) and version.is_integer():
        version = int(version)
    if not isinstance(version, int) or isinstance(version, bool):
        raise StatsError(f"{path}: no integer 'format_version' attribute "
                         f"(this script reads versions 1 to {FORMAT_VERSION})")
    if version > FORMAT_VERSION:
        raise StatsError(f"{path}: format_version {version} is newer than this moe_stats.py "
                         f"supports (version {FORMAT_VERSION}); use the moe_stats.py of the "
                         f"moe_rt that wrote the file")
    if version < 1:
        raise StatsError(f"{path}: unknown format_version {version} "
                         f"(this script reads versions 1 to {FORMAT_VERSION})")


def check_per_step_shapes(path, f, names):
    """Each per-step dataset is a numeric dataset of PER_STEP_NDIM dimensions, and they agree on
    L, E and W: [N, L, E] for the expert load and bias, [N, L] for per-layer values, [N, L, W]."""
    for name in names:
        obj = f[name]
        if not isinstance(obj, h5py.Dataset):
            raise StatsError(f"{path}: /{name} is not a dataset")
        if obj.ndim != PER_STEP_NDIM[name]:
            raise StatsError(f"{path}: /{name} has {obj.ndim} dimensions, expected "
                             f"{PER_STEP_NDIM[name]} (rows first)")
        if not np.issubdtype(obj.dtype, np.number):
            raise StatsError(f"{path}: /{name} holds {obj.dtype}, expected numbers")
    layers, experts = f["routing/expert_load"].shape[1:]
    want = {"routing/bias": (layers, experts), "routing/rank_load": (layers, None),
            "routing/dropped": (layers, experts),
            "routing/source_expert_load": (layers, None, experts)}
    want.update({name: (layers,) for name in names if PER_STEP_NDIM[name] == 2})
    for name, dims in want.items():
        if name in names and any(d is not None and d != got
                                 for d, got in zip(dims, f[name].shape[1:])):
            raise StatsError(f"{path}: /{name} has row shape {f[name].shape[1:]}, but "
                             f"/routing/expert_load has {layers} layers x {experts} experts")


def complete_rows(path, f, names):
    """N: the number of rows present in every per-step dataset (a writer appends one by one),
    less trailing rows whose /steps/step still holds the fill value -1 (not yet written); may be
    0 (load_run refuses a run without rows; a chain may hold an empty file)."""
    n = min(f[name].shape[0] for name in names)  # every one has rows (check_per_step_shapes)
    steps = f["steps/step"][:n]
    while n > 0 and steps[n - 1] < 0:
        n -= 1
    return n


def empty_file_error(path):
    return StatsError(f"{path}: empty statistics file (no complete steps yet)")


def read_per_step(path, f):
    for name in REQUIRED_PER_STEP:
        if name not in f:
            raise StatsError(f"{path}: missing dataset /{name} "
                             f"(required by format_version {FORMAT_VERSION})")
    names = list(REQUIRED_PER_STEP) + [n for n in OPTIONAL_PER_STEP if n in f]
    check_per_step_shapes(path, f, names)
    names += shadow_datasets(path, f)
    n = complete_rows(path, f, names)
    return {name: f[name][:n] for name in names}


def shadow_datasets(path, f):
    """The names of the /shadow datasets, rule by rule in the order of their names ([] without
    /shadow), each checked to be numbers of the shape of its /routing counterpart: [N, L, E]
    expert_load and bias, [N, L] max_violation."""
    if "shadow" not in f:
        return []
    if not isinstance(f["shadow"], h5py.Group):
        raise StatsError(f"{path}: /shadow is not a group")
    layers, experts = f["routing/expert_load"].shape[1:]
    names = []
    for rule in sorted(f["shadow"]):
        if not isinstance(f["shadow"][rule], h5py.Group):
            raise StatsError(f"{path}: /shadow/{rule} is not a group (one per --shadow rule)")
        for dataset, ndim in SHADOW_NDIM.items():
            name = f"shadow/{rule}/{dataset}"
            obj = f.get(name)
            if not isinstance(obj, h5py.Dataset):
                raise StatsError(f"{path}: /shadow/{rule} lacks the dataset /{name}")
            if obj.ndim != ndim or not np.issubdtype(obj.dtype, np.number):
                raise StatsError(f"{path}: /{name} has {obj.ndim} dimensions of {obj.dtype}, "
                                 f"expected {ndim} of numbers (rows first)")
            if obj.shape[1:] != (layers, experts)[:ndim - 1]:
                raise StatsError(f"{path}: /{name} has row shape {obj.shape[1:]}, but "
                                 f"/routing/expert_load has {layers} layers x {experts} experts")
            names.append(name)
    return names


def read_eval(path, f):
    """The complete rows of /eval (those whose eval/step is written), {} when the file has none."""
    if "eval" not in f:
        return {}
    for name in EVAL_NDIM:
        if name not in f:
            raise StatsError(f"{path}: /eval lacks /{name}")
    ndims = {**EVAL_NDIM, **{name: ndim for name, ndim in OPTIONAL_EVAL_NDIM.items()
                             if name in f}}
    for name, ndim in ndims.items():
        if f[name].ndim != ndim or not np.issubdtype(f[name].dtype, np.number):
            raise StatsError(f"{path}: /{name} has {f[name].ndim} dimensions of {f[name].dtype}, "
                             f"expected {ndim} of numbers (rows first)")
    if "eval/dropped" in ndims and f["eval/dropped"].shape[1:] != f["eval/expert_load"].shape[1:]:
        raise StatsError(f"{path}: /eval/dropped has row shape {f['eval/dropped'].shape[1:]}, "
                         f"but /eval/expert_load has {f['eval/expert_load'].shape[1:]}")
    n = min(f[name].shape[0] for name in ndims)
    steps = f["eval/step"][:n]
    while n > 0 and steps[n - 1] < 0:
        n -= 1
    return {name: f[name][:n] for name in ndims}


def read_placement_dataset(path, f):
    """/layers/placement [L, P, E] (1 where EP rank q holds expert e in layer l) as [L][P] tuples
    of expert ids, or None when the file has none; StatsError when it is no placement of the
    file's L layers and E experts (a rank holding nothing, an expert on no rank)."""
    if "layers/placement" not in f:
        return None
    layers, experts = f["routing/expert_load"].shape[1:]
    obj = f["layers/placement"]
    if (not isinstance(obj, h5py.Dataset) or obj.ndim != 3 or obj.shape[0] != layers
            or obj.shape[2] != experts or obj.shape[1] < 1
            or not np.issubdtype(obj.dtype, np.number)):
        raise StatsError(f"{path}: /layers/placement has shape {getattr(obj, 'shape', None)}, "
                         f"expected [{layers} layers, EP ranks, {experts} experts] of 0 and 1")
    held = obj[()]
    if not np.isin(held, (0, 1)).all() or not held.any(axis=2).all() \
            or not held.any(axis=1).all():
        raise StatsError(f"{path}: /layers/placement is no placement: it must hold 0 and 1, "
                         f"every rank at least one expert, every expert on a rank")
    return tuple(tuple(tuple(int(e) for e in np.nonzero(row)[0]) for row in layer)
                 for layer in held)


def read_strings(f, name):
    if name not in f or f[name].size == 0:
        return ()
    return tuple(decode(v) for v in f[name][()].reshape(-1))


def resume_attributes(path, attrs):
    """(resumed_from, resumed_from_step) of a resumed run's file, (None, None) of any other;
    (None, step) of a run resumed from one that kept no statistics file (--stats none)."""
    source, step = attrs.get("resumed_from"), attrs.get("resumed_from_step")
    if source is None and step is None:
        return None, None
    if step is None:
        raise StatsError(f"{path}: root attribute resumed_from without resumed_from_step "
                         f"(a resumed run's file has both)")
    if source is not None and (not isinstance(source, str) or not source):
        raise StatsError(f"{path}: root attribute resumed_from is {source!r}, expected the "
                         f"predecessor's path as a string")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise StatsError(f"{path}: root attribute resumed_from_step is {step!r}, expected a "
                         f"step number >= 0")
    return source, step


def read_file(path):
    """Reads and checks one statistics file alone, as a Run of one Segment; raises StatsError
    naming the file. The Run may have no rows (load_run refuses that)."""
    with open_stats_file(path) as f:
        try:
            attrs = {key: decode(value) for key, value in f.attrs.items()}
            check_format(path, attrs)
            if "layers/routing" not in f:
                raise StatsError(f"{path}: missing dataset /layers/routing")
            routing = read_strings(f, "layers/routing")
            data = read_per_step(path, f)
            placement = read_placement_dataset(path, f)
            rank_host = (tuple(int(h) for h in f["hosts/rank_host"][...])
                         if "hosts/rank_host" in f else None)
            evals = read_eval(path, f)
            phases = read_strings(f, "perf/phases")
        except (OSError, RuntimeError, KeyError) as err:  # HDF5 could not read what the file holds
            raise StatsError(f"{path}: cannot read, the file is truncated or damaged "
                             f"({str(err).splitlines()[0]})") from None
    unknown = sorted({str(kind) for kind in routing} - set(ROUTING_LABELS))
    if unknown:
        raise StatsError(f"{path}: /layers/routing holds {', '.join(unknown)}; expected "
                         f"{', '.join(ROUTING_LABELS)}")
    resumed_from, resumed_from_step = resume_attributes(path, attrs)
    steps = data["steps/step"]
    segment = Segment(path=path, first_step=int(steps[0]) if len(steps) else None,
                      last_step=int(steps[-1]) if len(steps) else None, rows=len(steps),
                      world_size=int(data["routing/rank_load"].shape[2]),
                      resumed_from=resumed_from, resumed_from_step=resumed_from_step,
                      placement=placement, rank_host=rank_host)
    run = Run(path=path, attrs=attrs, routing=routing, data=data, phases=phases,
              segments=(segment,), eval=evals)
    if len(routing) != run.num_layers:
        raise StatsError(f"{path}: /layers/routing has {len(routing)} layers but "
                         f"/routing/expert_load has {run.num_layers}")
    return run


# ---------------------------------------------------------------------------------------------
# Facts of a run


def parse_config_text(text):
    """The configuration of the config attribute as {long option name: value as text}: TOML (its
    tables by topic flattened: every key is an option's long name), or the `key = value` lines
    of files written before moe_rt wrote TOML. Reals read as written, booleans true/false."""
    try:
        document = tomllib.loads(text or "", parse_float=str)  # reals as written
    except tomllib.TOMLDecodeError:
        return _parse_old_config_text(text)
    config = {}
    for key, value in document.items():
        items = value.items() if isinstance(value, dict) else [(key, value)]
        for name, item in items:
            config[name] = _config_value_text(item)
    return config


def _config_value_text(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _parse_old_config_text(text):
    """The old format: `key = value` lines, plain values up to a ` #` comment, or quoted."""
    config = {}
    for line in (text or "").splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        value = value.strip()
        if value.startswith('"'):
            end = value.find('"', 1)
            while end > 0 and value[end - 1] == "\\":
                end = value.find('"', end + 1)
            value = value[1:end] if end > 0 else value[1:]
        else:
            cut = [i for i, c in enumerate(value)
                   if c == "#" and (i == 0 or value[i - 1] in " \t")]
            value = value[:cut[0]].strip() if cut else value
        config[key.strip()] = value
    return config


def entropy_floor(run):
    """The data's entropy floor in nats per token, or None when unknown (NaN or absent)."""
    value = run.attrs.get("entropy_floor")
    if not isinstance(value, (int, float)) or math.isnan(value):
        return None
    return float(value)


def row_of_step(run, step):
    """The row index holding step `step` (a /steps/step value, not a row index)."""
    rows = np.nonzero(run.steps == step)[0]
    if rows.size == 0:
        raise StatsError(f"{run.path}: step {step} is not in the file (it holds steps "
                         f"{int(run.steps[0])}..{int(run.steps[-1])}, {len(run.steps)} rows)")
    return int(rows[0])


def routing_label(kind):
    return ROUTING_LABELS.get(kind, kind)


def topk_mask(run):
    """[L] bool: the top-k layers, the only ones the bias and the balance loss act on."""
    return np.array([kind == "topk" for kind in run.routing], dtype=bool)


def shadow_rules(run):
    """The rules of the run's shadow balancers (their /shadow subgroups' names, e.g. "sign:0.001",
    "none"), in the order read; () for a run without --shadow. Of a chain: the rules every file
    has."""
    return tuple(dict.fromkeys(name.split("/")[1] for name in run.data
                               if name.startswith("shadow/")))


def balance_layers(run):
    """Layers whose balance the plots follow: the top-k layers, or all when there are none."""
    mask = topk_mask(run)
    return np.nonzero(mask)[0] if mask.any() else np.arange(run.num_layers)


def rank_overload(run):
    """[N, L] overload of the most loaded rank: the stored dataset, else max/mean of rank_load
    over the ranks that existed (a chain pads missing ranks with NaN; every row has a rank)."""
    if "routing/rank_overload" in run.data:
        return run.data["routing/rank_overload"]
    load = run.data["routing/rank_load"].astype(np.float64)
    mean = np.nanmean(load, axis=2)
    return np.divide(np.nanmax(load, axis=2), mean, out=np.ones_like(mean), where=mean > 0)


def capacity_factor(run):
    """The run's --capacity-factor C from its configuration text (root attribute config; of a
    chain, the newest file's): 0.0 for a dropless run and for files written before the option
    existed, None when the text gives something that is not a number."""
    text = parse_config_text(run.attrs.get("config", "")).get("capacity-factor", "0")
    try:
        return float(text)
    except ValueError:
        return None


def cross_host_fraction(run):
    """[N, L] share of each layer's dispatched rows that crossed hosts (0 on one host), or None
    when the file does not count them (written before the count existed)."""
    crossed, dispatched = (run.data.get(f"routing/{name}")
                           for name in ("cross_host_rows", "dispatch_rows"))
    if crossed is None or dispatched is None:
        return None
    crossed, dispatched = (np.asarray(a, dtype=np.float64) for a in (crossed, dispatched))
    return np.divide(crossed, dispatched, out=np.zeros_like(crossed), where=dispatched > 0)


def check_same_shape(run_a, run_b):
    if (run_a.num_layers, run_a.num_experts) != (run_b.num_layers, run_b.num_experts):
        raise StatsError(f"{run_b.path}: {run_b.num_layers} layers x {run_b.num_experts} experts, "
                         f"but {run_a.path} has {run_a.num_layers} x {run_a.num_experts}; "
                         f"runs compared in one table must have the same shape")
