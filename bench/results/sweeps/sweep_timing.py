"""What the kernel sweeps of session 31-32 (swiglu_bwd_wide.py, gemm_large_depth.py, rope_epilogue.py) share: each
variant run once before any check (a variant that raises is recorded and left out of the timing, the others still
run), then ``ROUNDS`` interleaved ``do_bench`` rounds of every variant that ran, medians in microseconds. GPU only.
Imported by the scripts beside it (run as ``python bench/results/sweeps/<script>.py``: their folder is on sys.path)."""
from __future__ import annotations

import statistics
from collections.abc import Callable

import torch
from triton.testing import do_bench

ROUNDS, WARMUP_MS, REP_MS = 3, 10, 60


def first_runs(runs: dict[str, Callable[[], object]]) -> dict[str, str]:
    """Run each variant once (then synchronise); the ones that raised, with the error (300 characters)."""
    failed = {}
    for c, f in runs.items():
        try:
            f()
        except Exception as e:  # noqa: BLE001 - a variant that fails is recorded, the others still run
            failed[c] = repr(e)[:300]
    torch.cuda.synchronize()
    return failed


def interleaved_us(runs: dict[str, Callable[[], object]], failed: dict) -> dict[str, float]:
    """Median microseconds of every variant not in ``failed`` over ``ROUNDS`` rounds that each time all of them in
    turn (drift hits every variant alike)."""
    t = {c: [] for c in runs if c not in failed}
    for _ in range(ROUNDS):
        for c in t:
            t[c].append(do_bench(runs[c], warmup=WARMUP_MS, rep=REP_MS))
    return {c: round(statistics.median(v) * 1e3, 1) for c, v in t.items()}
