"""The swiglu GEMM with the gate and up tiles stacked into one m64n256 wgmma (``Options.stack_weights``,
``swiglu_p_128x128_sw``) against the two-wgmma kernel (``swiglu_p_128x128``), what torch.compile's default runs for
the site (``vendor_swiglu``: two cuBLAS GEMMs and one pointwise kernel), and our plain 128x256 GEMM over both
weights at once (one [M, 2N] product: the tile shape the stacked kernel copies, without the epilogue's halving), on
the Llama-3 8B / 70B MLP at prefill row counts, nn.Linear's weight layout, bf16. One process, median of 3
interleaved rounds of triton.testing.do_bench (us); relative error against fp32 per variant.

    PYTHONPATH=. python bench/results/sweeps/swiglu_stacked.py <out.json>
"""
import json
import statistics
import sys

import torch
import triton

from torch_autows.runtime import gemm as rtg
from torch_autows.runtime import swiglu as rt

BF = torch.bfloat16
SHAPES = [(2048, 14336, 4096), (4096, 14336, 4096), (16384, 14336, 4096), (4096, 28672, 8192), (16384, 28672, 8192)]


def measure(M, N, K):
    g = torch.Generator(device="cuda").manual_seed(M + N)
    a = torch.randn(M, K, device="cuda", dtype=BF, generator=g)
    wg, wu = (torch.randn(N, K, device="cuda", dtype=BF, generator=g) / K ** 0.5 for _ in range(2))
    w2 = torch.cat([wg, wu])  # [2N, K]: the plain GEMM over both weights
    ref = torch.nn.functional.silu(a.float() @ wg.float().t()) * (a.float() @ wu.float().t())
    outs = {n: torch.empty(M, N, device="cuda", dtype=BF) for n in ("two", "stacked", "vendor")}
    c2 = torch.empty(M, 2 * N, device="cuda", dtype=BF)
    fns = {
        "swiglu_p_128x128": lambda: rt.gemm_swiglu(a, wg.t(), wu.t(), BF, config="swiglu_p_128x128", out=outs["two"]),
        "swiglu_p_128x128_sw": lambda: rt.gemm_swiglu(a, wg.t(), wu.t(), BF, config="swiglu_p_128x128_sw",
                                                      out=outs["stacked"]),
        "vendor": lambda: rt.vendor_swiglu(a, wg.t(), wu.t(), outs["vendor"]),
        "plain_128x256_2N": lambda: rtg.gemm(a, w2.t(), None, BF, config="ws_p_128x256", out=c2),
    }
    errs = {}
    for n, f in fns.items():
        for t in (*outs.values(), c2):
            t.fill_(float("nan"))
        out = f()
        torch.cuda.synchronize()
        if n != "plain_128x256_2N":
            errs[n] = ((out.float() - ref).norm() / ref.norm()).item()
    times = {n: [] for n in fns}
    for _ in range(3):
        for n, f in fns.items():
            times[n].append(triton.testing.do_bench(f, warmup=10, rep=100))
    row = {"shape": f"{M}x{N}x{K}", **{n: round(statistics.median(t) * 1e3, 1) for n, t in times.items()},
           **{f"{n}_err": e for n, e in errs.items()}}
    flop = 2 * 2 * M * N * K
    row["tflops"] = {n: round(flop / (row[n] * 1e-6) / 1e12, 1) for n in fns}
    print(json.dumps(row), flush=True)
    return row


res = [measure(*shape) for shape in SHAPES]
json.dump(res, open(sys.argv[1], "w"), indent=1)
