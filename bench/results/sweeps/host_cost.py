"""Host (CPU) cost per call of the attention backward and forward against cuDNN's (bench/results/sweeps/README.md,
"host-cost"): the CPU time to issue a call with the GPU busy (launches queued behind torch.cuda._sleep), the profiler's
GPU sum and do_bench, per case; cProfile of our backward at s512 d64 causal.

    PYTHONPATH=. OUT=<dir> python bench/results/sweeps/host_cost.py
"""
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time

import torch
from triton.testing import do_bench

from torch_autows.attention_grad import _cudnn_backward
from torch_autows.runtime import attention as rtf
from torch_autows.runtime import attention_bwd as rt
from torch_autows.sdpa_fallback import fused_attention

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the sibling sweep script's profile helper
from attention_bwd_configs import kernel_times  # noqa: E402

CALLS = 100


def cpu_us(fn) -> float:
    """CPU microseconds to issue one call, with the GPU busy so the launches queue."""
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(int(3e9))
    t0 = time.perf_counter()
    for _ in range(CALLS):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / CALLS * 1e6


def gpu_us(fn) -> float:
    """The profiler's sum of a call's kernel times, microseconds."""
    return sum(kernel_times(fn).values())


def profile(fn) -> str:
    pr = cProfile.Profile()
    torch.cuda._sleep(int(3e9))
    pr.enable()
    for _ in range(CALLS):
        fn()
    pr.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    pstats.Stats(pr, stream=out).sort_stats("cumulative").print_stats(45)
    return out.getvalue()[:9000]


def calls(s: int, d: int, causal: bool) -> dict:
    """The four timed calls of a case: B*S = 16384 tokens, 2048 wide, bf16."""
    B, H = 16384 // s, 2048 // d
    scale = d ** -0.5
    q, k, v, go = (torch.randn(B, H, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, lse = fused_attention("cudnn", q, k, v, causal, scale)
    return {"cudnn_bwd": lambda: _cudnn_backward(go, q, k, v, out, lse, causal, scale),
            "ours_bwd": lambda: rt.backward(go, None, q, k, v, out, lse, causal, scale),
            "cudnn_fwd": lambda: fused_attention("cudnn", q, k, v, causal, scale),
            "ours_fwd": lambda: rtf.attention(q, k, v, causal, scale)}


def main() -> None:
    res = {}
    for s, d, causal in ((512, 64, True), (512, 64, False), (512, 128, True), (1024, 64, True), (4096, 128, False)):
        name = f"s{s}-d{d}{'-causal' * causal}"
        fns = calls(s, d, causal)
        res[name] = {n: {"cpu_us": round(cpu_us(f), 1), "gpu_us": round(gpu_us(f), 1),
                         "do_bench_us": round(1000 * statistics.median(do_bench(f, rep=60) for _ in range(3)), 1)}
                     for n, f in fns.items()}
        print(name, res[name], flush=True)
        if (s, d, causal) == (512, 64, True):
            print(profile(fns["ours_bwd"]))
    with open(os.path.join(os.environ.get("OUT", "."), "host_cost.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
