"""Where a small decode GEMM's time goes (issue 14): kernel time on the GPU against the do_bench figure.

GPU only, not a test. At the decode shapes whose weights are small (34-50 MB: 4096x4096, 4096x6144) cuBLAS and our
swap-AB kernel both run at 1.8-2.3 TB/s in do_bench (about 17-22 us) while a large weight streams at 4.0-4.2 TB/s,
so the small ones lose half the bandwidth to something that is not HBM. This separates the parts: for cuBLAS, our
measured pick and a few fixed configs, at M = 1 and 16 rows,

* ``bench_us``: triton.testing.do_bench's median (L2 flushed before each call: what the bench and the choice see);
* ``kernel_us``: the kernel's own duration from torch.profiler (CUDA activity of the same calls, L2 flushed), i.e.
  without launch gaps;
* ``graph_us``: the call replayed 20 times in one CUDA graph, per call (launch overhead gone, L2 warm after the first);
* the same three for a device-to-device copy of the weight's bytes (the ceiling) and an empty kernel (the floor).

Writes JSON to argv[1] and prints one line per (shape, side). Run from the repository root:
``PYTHONPATH=. python bench/results/sweeps/decode_latency.py $OUT/decode_latency.json``.
"""
from __future__ import annotations

import functools
import json
import statistics
import sys

import torch
from triton.testing import do_bench

from torch_autows.runtime import gemm as rg

SHAPES = [(4096, 4096), (4096, 6144), (14336, 4096), (8192, 57344)]  # (K, N): small, small, medium, large weight
MS = [1, 16]
CONFIGS = ["decs_64x128_m16_s1", "decs_64x128_m16_s2", "decs_128x128_m16_s1", "dec_64x128_s2"]


def _kernel_us(fn, reps: int = 20) -> float:
    """Median GPU duration (us) of the kernels one call of ``fn`` launches (summed per call), L2 flushed before each
    call as do_bench does."""
    from torch.profiler import ProfilerActivity, profile

    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush.zero_()
            fn()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type.name == "CUDA" and "fill" not in e.name.lower()
              and "zero" not in e.name.lower()]
    per_call = sum(e.device_time for e in events) / reps  # us
    return per_call


def _graph_us(fn, reps: int = 20) -> float:
    """Per-call time (us) of ``reps`` calls replayed in one CUDA graph."""
    fn()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay()
    torch.cuda.synchronize()
    return statistics.median(do_bench(g.replay, warmup=5, rep=30) for _ in range(3)) * 1e3 / reps


def measure(fn) -> dict:
    return {"bench_us": do_bench(fn, warmup=10, rep=50) * 1e3, "kernel_us": _kernel_us(fn), "graph_us": _graph_us(fn)}


def main(path: str) -> None:
    torch.manual_seed(0)
    res: dict = {"device": torch.cuda.get_device_name(), "rows": [], "errors": []}
    empty = torch.empty(1, device="cuda")
    res["empty_kernel"] = measure(lambda: empty.add_(0))
    print(f"empty kernel: {res['empty_kernel']}", flush=True)
    for k, n in SHAPES:
        src = torch.empty(k * n, dtype=torch.bfloat16, device="cuda")
        dst = torch.empty_like(src)
        copy = measure(functools.partial(dst.copy_, src))
        res["rows"].append(dict(K=k, N=n, side="copy", **copy))
        print(f"K={k:5d} N={n:5d} copy of the weight: {copy}", flush=True)
        for m in MS:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            sides = {"cublas": functools.partial(torch.mm, x, w.t(), out=out)}
            for cfg in CONFIGS:
                try:
                    rg.gemm(x, w.t(), None, torch.bfloat16, config=cfg, out=out)
                    sides[cfg] = functools.partial(rg.gemm, x, w.t(), None, torch.bfloat16, config=cfg, out=out)
                except Exception as e:  # recorded, not timed
                    res["errors"].append(dict(K=k, N=n, M=m, side=cfg, err=repr(e)[:300]))
            for side, fn in sides.items():
                row = dict(K=k, N=n, M=m, side=side, **measure(fn))
                row["weight_tbps_kernel"] = 2 * k * n / row["kernel_us"] / 1e6
                res["rows"].append(row)
                print(f"K={k:5d} N={n:5d} M={m:2d} {side:22s} bench {row['bench_us']:6.1f} us  kernel "
                      f"{row['kernel_us']:6.1f} us ({row['weight_tbps_kernel']:.2f} TB/s)  graph {row['graph_us']:6.1f}"
                      f" us", flush=True)
            with open(path, "w") as f:
                json.dump(res, f, indent=1)
    with open(path, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: PYTHONPATH=. python bench/results/sweeps/decode_latency.py OUT.json")
    main(sys.argv[1])
