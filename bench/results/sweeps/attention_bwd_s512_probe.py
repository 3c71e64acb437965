"""Why the s512 causal backward points move 10-30% between harnesses (bench/results/sweeps/README.md, session 21;
written then, not run yet: the device refused a start). For s512 causal d=128 and d=64 (16384 tokens, 2048 wide,
bf16), in one process: cuDNN's, FA2's and our backward with the one-CTA and the two-CTA main kernels, timed as the
sweep does (3 interleaved rounds of do_bench); each of ours timed right after an FA2 backward (as the bench runs
its peers: cudnn, fa2, autows), minus FA2 alone; and, from a profiler trace of calls after a 256 MB L2 flush each,
every call's span from the flush's end to its last kernel's end against the sum of its kernels (span - busy: the
GPU waiting for the host).

    PYTHONPATH=. OUT=<dir> python bench/results/sweeps/attention_bwd_s512_probe.py
"""
import json
import os
import statistics

import torch
from triton.testing import do_bench

from torch_autows.attention_grad import _cudnn_backward, _flash_backward
from torch_autows.runtime import attention_bwd as rt
from torch_autows.sdpa_fallback import fused_attention


def spans(fn, n: int = 8) -> list[tuple[float, float]]:
    """(span, busy) microseconds of ``n`` calls, each after a 256 MB flush (the flush's kernel splits the trace)."""
    cache = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int, device="cuda")
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            cache.zero_()
            fn()
        torch.cuda.synchronize()
    events = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                    key=lambda e: e.time_range.start)
    calls: list[list] = []
    for e in events:
        if "fill" in e.name.lower() or "zero" in e.name.lower():
            calls.append([e])
        elif calls:
            calls[-1].append(e)
    out = []
    for c in calls:
        if len(c) > 1:
            busy = sum(e.time_range.end - e.time_range.start for e in c[1:])
            out.append((round(c[-1].time_range.end - c[0].time_range.end, 1), round(busy, 1)))
    return out


def case(d: int) -> dict:
    s, causal = 512, True
    B, H = 16384 // s, 2048 // d
    scale = d ** -0.5
    q, k, v, go = (torch.randn(B, H, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, lse = fused_attention("cudnn", q, k, v, causal, scale)
    fo, fl = fused_attention("flash", q, k, v, causal, scale)
    ours = ["bwd_64x128_dp2", "bwd_64x64_dp1_c2" if d == 64 else "bwd_64x64_dp1_c2_fold"]
    fns = {"cudnn": lambda: _cudnn_backward(go, q, k, v, out, lse, causal, scale),
           "fa2": lambda: _flash_backward(go, q, k, v, fo, fl, causal, scale)}
    for c in ours:
        fns[c] = lambda c=c: rt.backward(go, None, q, k, v, out, lse, causal, scale, config=c, dq_mode="separate")
    times: dict[str, list] = {n: [] for n in fns}
    for _ in range(3):
        for n, f in fns.items():
            times[n].append(1000 * do_bench(f, warmup=25, rep=100))
    us = {n: round(statistics.median(t), 1) for n, t in times.items()}
    for c in ours:
        both = statistics.median(1000 * do_bench(lambda c=c: (fns["fa2"](), fns[c]()), warmup=25, rep=100)
                                 for _ in range(3))
        us[c + "_after_fa2"] = round(both - us["fa2"], 1)
    return {"us": us, "span_busy_us": {n: spans(fns[n]) for n in ("cudnn", *ours)}}


def main() -> None:
    res = {}
    for d in (128, 64):
        res[f"s512-d{d}-causal"] = case(d)
        print(f"s512-d{d}-causal", json.dumps(res[f"s512-d{d}-causal"]), flush=True)
    with open(os.path.join(os.environ.get("OUT", "."), "attention_bwd_s512_probe.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
