"""Fixtures for the benchmark-harness tests: recorded sample rows (no GPU needed)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # run without installing the package
    sys.path.insert(0, str(REPO_ROOT))


def _r(case, impl, tflops=None, ms=None, rel_err=None, error=None, **extra):
    from torch_autows.bench.results import make_row

    return make_row("gemm", case, impl, tflops=tflops, ms=ms, rel_err=rel_err, error=error, **extra)


@pytest.fixture
def gemm_rows() -> list[dict]:
    """Three cases: autows wins; autows loses (and a peer crashed); autows fell back (failed)."""
    return [
        _r("4096x4096x4096", "cublas", 700.0, 0.196, 0.003, spread=0.02),
        _r("4096x4096x4096", "inductor-max-autotune", 650.0, 0.211, 0.003),
        _r("4096x4096x4096", "triton-autows", 500.0, 0.275, 0.003, note="ttg.warp_specialize absent from ttgir"),
        _r("4096x4096x4096", "autows", 770.0, 0.178, 0.003, spread=0.01),
        _r("8192x8192x8192", "cublas", 760.0, 1.447, 0.002),
        _r("8192x8192x8192", "inductor-max-autotune", error="RuntimeError: autotune | failed\nbadly"),
        _r("8192x8192x8192", "triton-autows", 600.0, 1.832, 0.002),
        _r("8192x8192x8192", "autows", 684.0, 1.607, 0.002),
        _r("bmm:32x2048x2048x128", "cublas", 400.0, 0.086, 0.004),
        _r("bmm:32x2048x2048x128", "autows", error="fell back to torch"),
        _r("addmm:8192x4096x4096", "cublas", 690.0, 0.398, 0.003),
        _r("addmm:8192x4096x4096", "autows", rel_err=0.31, error="rel_err 3.100e-01 > tolerance 1e-02"),
    ]


@pytest.fixture
def model_rows() -> list[dict]:
    from torch_autows.bench.results import make_row

    split = {"gemm_ms": 35.0, "attention_ms": 2.5, "rest_ms": 2.5,
             "top_kernels": [["nvjet_tst_256x128_64x4_1x2_h_bz_coopB_NNT", 20.0, "gemm"]]}
    return [
        make_row("model", "8x2048", "eager", tflops=600.0, ms=49.5, rel_err=0.006, split=split),
        make_row("model", "8x2048", "inductor", tflops=690.0, ms=43.0, rel_err=0.006, split=split),
        make_row("model", "8x2048", "autows", error="RuntimeError: autows backend not importable: No module"),
    ]
