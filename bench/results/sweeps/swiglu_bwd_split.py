"""Where the fused SwiGLU backward's time goes (issue 16): its tile's GEMM against cuBLAS's, and its epilogue.

GPU only, not a test. The fused kernel (runtime.swiglu_bwd, persistent 128x128, both consumers on one tile) ran
0.86-0.997x the default's path on an H100 (sweeps/2026-12-05-h100-swiglu-train.json). Two causes can add up: the
128x128 tile's GEMM is slower than cuBLAS's wider tiles, and the epilogue (G and U read from SMEM, two stores, each
waited for) runs while the CTA's tensor cores idle. At each shape, 3 interleaved do_bench rounds, medians (us):

* ``cublas``: ``torch.mm(dy, w)`` (dh alone);
* ``gemm_128x128``: our GEMM with the fused kernel's tile and no epilogue work (``ws_p_128x128``);
* ``gemm_128x256``: our large-GEMM pick (``ws_p_128x256``);
* ``residual_128x128`` / ``residual_128x256``: those tiles with one [M, N] operand by TMA added in the epilogue
  (``gemm(residual=)``, ``Options.epilogue_tma``): one tile read and one store, against the fused kernel's two and
  two;
* ``fused``: ``gemm_swiglu_bwd`` (config ``swiglu_bwd_p_128x128``); ``vendor``: cuBLAS + Inductor's pointwise kernel.

fused - gemm_128x128 is the epilogue's exposed cost; gemm_128x128 / gemm_128x256 the tile's. Run from the
repository root: ``PYTHONPATH=. python bench/results/sweeps/swiglu_bwd_split.py OUT.json``.

On an H100 (sweeps/2026-12-05-h100-swiglu-bwd-split.json, before the residual_128x256 column was added), us:
16384x14336x4096 cuBLAS 2603, gemm_128x128 2920, gemm_128x256 2632, residual_128x128 3499, fused 3521, vendor 3379;
4096x28672x8192 2618 / 2970 / 2833 / 3351 / 3505 / 3032. So the 128x128 tile costs ~12% in its GEMM, and its
epilogue ~20% more, and not because of what the fused epilogue computes: one TMA-loaded operand (the residual) costs
as much. A probe right after (same card, same timing) had the epilogue hidden on the wide tile: 16384x14336x4096
gemm_128x256 2736 and residual_128x256 2719 us against residual_128x128 3476 (cuBLAS 2610, cuBLAS + add 3075);
16384x4096x4096 805 / 826 against 946 (cuBLAS 794). The fused backward on a 128x256 tile would therefore be
expected near the GEMM's time (1.2x the vendor's path), but its epilogue spills ~2 KB there (G's and U's fp32
tiles beside the 128-register accumulator): an epilogue in column chunks of the accumulator is the way to fit it.
"""
from __future__ import annotations

import json
import statistics
import sys

import torch
from triton.testing import do_bench

from torch_autows.runtime import gemm as rg
from torch_autows.runtime import swiglu_bwd as rt

SHAPES = [(16384, 14336, 4096), (4096, 28672, 8192)]  # (M tokens, N ffn, K hidden)


def split(m: int, n: int, k: int) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(0)
    dy = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=gen) / k ** 0.5
    g, u, r = (torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
    out, out2 = (torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    runs = {"cublas": lambda: torch.mm(dy, w, out=out),
            "gemm_128x128": lambda: rg.gemm(dy, w, None, torch.bfloat16, config="ws_p_128x128", out=out),
            "gemm_128x256": lambda: rg.gemm(dy, w, None, torch.bfloat16, config="ws_p_128x256", out=out),
            "residual_128x128": lambda: rg.gemm(dy, w, None, torch.bfloat16, config="ws_p_128x128", out=out,
                                                residual=r),
            "residual_128x256": lambda: rg.gemm(dy, w, None, torch.bfloat16, config="ws_p_128x256", out=out,
                                                residual=r),
            "fused": lambda: rt.gemm_swiglu_bwd(dy, w, g, u, config=rt.PICK, out=(out, out2)),
            "vendor": lambda: rt.vendor_swiglu_bwd(dy, w, g, u, out, out2)}
    ok = {}
    for name, f in runs.items():
        try:
            f()
            ok[name] = f
        except Exception as e:  # a config that does not serve the call: recorded, not timed
            print(f"{name}: {type(e).__name__}: {str(e)[:200]}", flush=True)
    torch.cuda.synchronize()
    times: dict[str, list[float]] = {c: [] for c in ok}
    for _ in range(3):
        for name, f in ok.items():
            times[name].append(do_bench(f, warmup=10, rep=50))
    us = {c: statistics.median(t) * 1e3 for c, t in times.items()}
    return {"m": m, "n": n, "k": k, "us": us, "samples_ms": times}


def main(path: str) -> None:
    rows = []
    for m, n, k in SHAPES:
        row = split(m, n, k)
        rows.append(row)
        print(f"{m}x{n}x{k}: " + ", ".join(f"{c} {t:.1f}" for c, t in row["us"].items()) + " us", flush=True)
    with open(path, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "swiglu_bwd_split.json")
