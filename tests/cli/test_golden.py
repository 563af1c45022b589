"""The same bits on every machine: the default preset's first steps against committed exact values.

tests/golden/deepseek4_tiny.json holds, for the first steps of the README's default run
(`moe_rt --model deepseek4-tiny`: seed 1234, synthetic data, a global batch of 8 sequences), each
step's loss and gradient norm (float64, as hex), its expert loads [L, E] and routing bias [L, E],
and a SHA-256 of every parameter after the step's AdamW (the step's checkpoint's param/*
datasets, sorted by name, float32 little-endian). These are what the run computes on any x86-64
machine, whatever its vector width or BLAS kernel, on any rank count: each case below runs them
on several EP groups (--ep: replicas of every expert), under another OpenBLAS kernel
(OPENBLAS_CORETYPE; the model does not call OpenBLAS, so that must change nothing), another GEMM
level (MOE_RT_GEMM) or elementwise level (MOE_RT_SIMD), or another rank count. A level this CPU
lacks is reported as skipped, never passed.

The values change only when the model's arithmetic changes on purpose; then
`MOE_GOLDEN_WRITE=1 pytest tests/cli/test_golden.py -k default` rewrites the file (commit it, and
say why in the commit).
"""
import hashlib
import json
import os

import h5py
import numpy as np
import pytest

GOLDEN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "golden",
                      "deepseek4_tiny.json")
STEPS = 3


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


FLAGS = cpu_flags()
HAS_AVX2 = {"avx2", "fma"} <= FLAGS
HAS_AVX512 = {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= FLAGS

# (id, ranks, environment or options, what the CPU needs). Each changes one thing against the
# default: 2 ranks of 4 sequences. The portable level (scalar std::fma) is about 35 times slower:
# one step.
CASES = [
    ("default", 2, {}, True),
    ("one-rank", 1, {}, True),
    ("eight-ranks", 8, {}, True),
    ("eight-ranks-two-ep-groups", 8, {"--ep": "4"}, True),
    ("four-ranks-four-ep-groups", 4, {"--ep": "1"}, True),
    ("openblas-haswell", 2, {"OPENBLAS_CORETYPE": "Haswell"}, HAS_AVX2),
    ("openblas-sandybridge", 2, {"OPENBLAS_CORETYPE": "Sandybridge"}, True),
    ("openblas-skylakex", 2, {"OPENBLAS_CORETYPE": "SkylakeX"}, HAS_AVX512),
    ("gemm-portable", 2, {"MOE_RT_GEMM": "portable"}, True),
    ("gemm-fma128", 2, {"MOE_RT_GEMM": "fma128"}, "fma" in FLAGS),
    ("gemm-avx2", 2, {"MOE_RT_GEMM": "avx2"}, HAS_AVX2),
    ("gemm-avx512", 2, {"MOE_RT_GEMM": "avx512"}, HAS_AVX512),
    ("simd-sse2", 2, {"MOE_RT_SIMD": "sse2"}, True),
    ("simd-avx2", 2, {"MOE_RT_SIMD": "avx2"}, HAS_AVX2),
    ("simd-avx512", 2, {"MOE_RT_SIMD": "avx512"}, HAS_AVX512),
    # glibc told the CPU has no AVX, AVX2, FMA or AVX-512: its string and math functions take
    # their baseline builds, as on an SSE2-only machine (nothing of libm may reach the bits).
    ("glibc-baseline", 2, {"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX,-AVX2,-FMA,-AVX512F"}, True),
    ("narrowest", 2, {"MOE_RT_GEMM": "fma128", "MOE_RT_SIMD": "sse2",
                      "OPENBLAS_CORETYPE": "Sandybridge"}, "fma" in FLAGS),
]


GLOBAL_BATCH = 8


def run_golden(run_moe, tmp_path, ranks, env, steps):
    """`env`: environment variables, and options (the keys starting with --)."""
    stats = tmp_path / "g.h5"
    ckpt = tmp_path / "ck"
    options = [str(x) for k, v in env.items() if k.startswith("--") for x in (k, v)]
    env = {k: v for k, v in env.items() if not k.startswith("--")}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # run_moe passes the test process's environment on
    try:
        r = run_moe(["--model", "deepseek4-tiny", "--steps", str(steps),
                     "--batch-per-rank", str(GLOBAL_BATCH // ranks), "--stats", str(stats),
                     "--checkpoint-every", "1", "--keep-checkpoints", str(steps),
                     "--checkpoint-dir", str(ckpt)] + options, np_=ranks, timeout=300)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert r.returncode == 0, r.stdout + r.stderr
    with h5py.File(stats, "r") as f:
        loss = f["steps/loss"][:steps]
        grad_norm = f["steps/grad_norm"][:steps]
        load = f["routing/expert_load"][:steps]
        bias = np.asarray(f["routing/bias"][:steps], dtype="<f4")
    digests = []
    for step in range(steps):
        digest = hashlib.sha256()
        with h5py.File(ckpt / f"step-{step:08d}.h5", "r") as f:
            for name in sorted(f["param"].keys()):
                digest.update(name.encode())
                digest.update(np.asarray(f["param"][name][...], dtype="<f4").tobytes())
        digests.append(digest.hexdigest())
    return {
        "loss": [float(x).hex() for x in loss],
        "grad_norm": [float(x).hex() for x in grad_norm],
        "expert_load": [json.dumps(np.asarray(x).tolist()) for x in load],
        "bias": [" ".join(float(v).hex() for v in b.ravel()) for b in bias],
        "params_sha256": digests,
    }


@pytest.mark.parametrize("case_id,ranks,env,available", CASES, ids=[c[0] for c in CASES])
def test_first_steps_are_the_committed_bits(run_moe, tmp_path, case_id, ranks, env, available):
    if not available:
        pytest.skip(f"{case_id}: this CPU lacks the instructions ({env})")
    steps = 1 if env.get("MOE_RT_GEMM") == "portable" else STEPS
    got = run_golden(run_moe, tmp_path, ranks, env, steps)
    if os.environ.get("MOE_GOLDEN_WRITE") == "1" and case_id == "default":
        with open(GOLDEN, "w") as f:
            json.dump(got, f, indent=1)
            f.write("\n")
    with open(GOLDEN) as f:
        want = json.load(f)
    # Bitwise, step by step and field by field, so that a failure says what moved first.
    for step in range(steps):
        for key in ("loss", "grad_norm", "expert_load", "bias", "params_sha256"):
            assert got[key][step] == want[key][step], (
                f"{case_id}: step {step}'s {key} differs from the committed bits")


def test_moe_rt_does_not_link_a_blas_library(moe_rt_bin):
    """The model's GEMMs are its own (model/gemm/): no BLAS library is loaded by moe_rt, so none of
    its kernels can reach a run's bits (the OPENBLAS_CORETYPE cases above then prove nothing more
    than this does, and both are kept)."""
    import shutil
    import subprocess
    if not shutil.which("ldd"):
        pytest.skip("no ldd on this machine")
    libs = subprocess.run(["ldd", moe_rt_bin], capture_output=True, text=True, check=True).stdout
    for name in ("openblas", "libblas", "mkl", "blis"):
        assert name not in libs, f"moe_rt loads {name}:\n{libs}"
