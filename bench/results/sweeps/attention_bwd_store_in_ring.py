"""Session 27, GPU call 3: the reduce picks with dK/dV by TMA out of the Q/dO ring (``_sr``) against the pointer-store
picks and cuDNN, whole backward, s512-s8192, d64/d128, causal or not; per-kernel times at s1024/s4096. Writes
$OUT/probe3.json."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import sys
import time

sys.path.insert(0, os.getcwd())
OUT = os.environ.get("OUT", ".")
ROUNDS = 5
SEQS = (512, 1024, 2048, 4096, 8192)
BASE = {128: "bwd_64x128_dp2_dqsplit_fold", 64: "bwd_128x128_dp2_dqsplit_fold"}


def variants(s, d, causal):
    from torch_autows.runtime import attention_bwd as rt
    v = {"reduce": {"config": BASE[d], "dq_mode": "reduce"}, "reduce_sr": {"config": BASE[d] + "_sr",
                                                                          "dq_mode": "reduce"}}
    mode = rt.choose_dq_mode(None, d, s, causal)
    cfg = rt.choose_config(d, causal, mode, s)
    if mode != "reduce" or cfg != BASE[d]:
        v["pick"] = {}
    if d == 64:  # the two-CTA reduce pick below REDUCE_LONG's keys
        v["reduce_c2"] = {"config": "bwd_64x64_dp1_c2_kvr", "dq_mode": "reduce"}
    return v


def inputs(s, d, causal, small=False):
    import torch

    from torch_autows.sdpa_fallback import fused_attention
    B, H = (1, 2) if small else (16384 // s, 2048 // d)
    scale = d ** -0.5
    q, k, v, go = (torch.randn(B, H, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, lse = fused_attention("cudnn", q, k, v, causal, scale)
    return q, k, v, go, out, lse, scale


def fn(kw, args, causal):
    from torch_autows.runtime import attention_bwd as rt
    q, k, v, go, out, lse, scale = args
    return lambda: rt.backward(go, None, q, k, v, out, lse, causal, scale, **kw)


def warm(job):
    s, d, causal = job
    try:
        import torch
        args = inputs(s, d, causal, small=True)
        for kw in variants(s, d, causal).values():
            fn(kw, args, causal)()
        torch.cuda.synchronize()
        return list(job), "ok"
    except Exception as e:
        return list(job), f"{type(e).__name__}: {str(e)[:300]}"


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def kernel_us(f):
    import torch
    f()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            f()
        torch.cuda.synchronize()
    t = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            t[e.name[:50]] = round(t.get(e.name[:50], 0) + e.device_time_total / 5, 1)
    return t


def case(s, d, causal):
    import torch
    from triton.testing import do_bench

    from torch_autows.attention_grad import _cudnn_backward
    torch.cuda.empty_cache()
    args = inputs(s, d, causal)
    q, k, v, go, out, lse, scale = args
    fns = {"cudnn": lambda: _cudnn_backward(go, q, k, v, out, lse, causal, scale)}
    for n, kw in variants(s, d, causal).items():
        fns[n] = fn(kw, args, causal)
    ref = fns["cudnn"]()
    err = {}
    for n, f in list(fns.items()):
        try:
            err[n] = max(rel(x, y) for x, y in zip(f(), ref))
        except Exception as e:
            err[n] = f"{type(e).__name__}: {str(e)[:200]}"
            del fns[n]
    torch.cuda.synchronize()
    t = {n: [] for n in fns}
    for _ in range(ROUNDS):
        for n, f in fns.items():
            t[n].append(do_bench(f, warmup=10, rep=60))
    B, H = 16384 // s, 2048 // d
    flops = 2.5 * 4 * B * H * s * s * d / (2 if causal else 1)
    r = {"case": f"s{s}-d{d}{'-causal' * causal}",
         "tflops": {n: round(flops / statistics.median(x) / 1e9, 1) for n, x in t.items()},
         "spread": {n: round((max(x) - min(x)) / statistics.median(x), 3) for n, x in t.items()}, "err": err}
    r["vs_cudnn"] = {n: round(v / r["tflops"]["cudnn"], 3) for n, v in r["tflops"].items()}
    if s in (1024, 4096) and not causal:
        r["kernels_us"] = {n: kernel_us(fns[n]) for n in ("reduce", "reduce_sr") if n in fns}
    print(json.dumps(r), flush=True)
    return r


def main():
    t0 = time.time()
    jobs = [(s, d, c) for d in (64, 128) for c in (False, True) for s in (1024,)]
    with mp.get_context("spawn").Pool(4) as pool:
        print("warm", pool.map(warm, jobs), round(time.time() - t0, 1), flush=True)
    rows = []
    import torch
    for d in (128, 64):
        for causal in (False, True):
            for s in SEQS:
                try:
                    rows.append(case(s, d, causal))
                except Exception as e:
                    rows.append({"case": f"s{s}-d{d}{'-causal' * causal}", "error": f"{type(e).__name__}: {e}"})
                    print(rows[-1], flush=True)
                with open(os.path.join(OUT, "probe3.json"), "w") as f:
                    json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    print("done", round(time.time() - t0, 1), flush=True)


if __name__ == "__main__":
    main()
