"""Session 28: the reduce form's dQ convert fused into the main kernel (``AttentionBwdRequest.finish``: the last CTA of
each (batch, kv-head) writes dQ) against the same picks with the row-kernel convert after it, and cuDNN; whole
backward, s1024-s8192, d64/d128, causal or not, interleaved rounds; per-kernel times at s1024/s4096; numerics of the
fused form on odd shapes (GQA, ragged, Sq != Skv, fp16) against fp32 math with NaN-poisoned outputs, and a repeated
call (the counters reset). Writes $OUT/finish.json."""
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
SEQS = (1024, 2048, 4096, 8192)
VARIANTS = {"convert": {"dq_mode": "reduce", "finish": False}, "fused": {"dq_mode": "reduce", "finish": True}}
ODD = [(2, 4, 2, 1000, 1000, 128, False, "bf16"), (1, 8, 8, 1024, 2048, 64, True, "fp16"),
       (2, 4, 4, 777, 1500, 64, False, "bf16"), (1, 4, 1, 2048, 2048, 128, True, "bf16"),
       (3, 2, 2, 129, 4096, 128, False, "fp16"), (1, 6, 3, 3000, 257, 64, True, "bf16"),
       (2, 2, 1, 4096, 4096, 64, False, "bf16"), (1, 16, 16, 1024, 1024, 128, True, "bf16")]


def inputs(s, d, causal, small=False, dtype="bf16", shape=None):
    import torch

    from torch_autows.sdpa_fallback import fused_attention
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    B, Hq, Hkv, Sq, Skv = shape or ((1, 2, 2, s, s) if small else (16384 // s, 2048 // d, 2048 // d, s, s))
    scale = d ** -0.5
    q, go = (torch.randn(B, Hq, Sq, d, device="cuda", dtype=dt) for _ in range(2))
    k, v = (torch.randn(B, Hkv, Skv, d, device="cuda", dtype=dt) for _ in range(2))
    if Hq == Hkv:
        out, lse = fused_attention("cudnn", q, k, v, causal, scale)
    else:
        out, lse = fused_attention("cudnn", q, k.repeat_interleave(Hq // Hkv, 1), v.repeat_interleave(Hq // Hkv, 1),
                                   causal, scale)
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
        for kw in VARIANTS.values():
            fn(kw, args, causal)()
        torch.cuda.synchronize()
        return list(job), "ok"
    except Exception as e:
        return list(job), f"{type(e).__name__}: {str(e)[:300]}"


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def reference(args, causal):
    """fp32 math gradients (dq, dk, dv) of the same rounded inputs."""
    import torch
    q, k, v, go, out, lse, scale = args
    G = q.shape[1] // k.shape[1]
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    s = qf @ kf.repeat_interleave(G, 1).transpose(2, 3) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril().logical_not(),
                          float("-inf"))
    o = torch.softmax(s, -1).nan_to_num(0.0) @ vf.repeat_interleave(G, 1)
    o.backward(go.float())
    return qf.grad, kf.grad, vf.grad


def numerics():
    import torch

    from torch_autows.runtime import attention_bwd as rt
    rows = []
    for B, Hq, Hkv, Sq, Skv, d, causal, dt in ODD:
        torch.manual_seed(Sq + Skv + d)
        args = inputs(None, d, causal, dtype=dt, shape=(B, Hq, Hkv, Sq, Skv))
        ref = reference(args, causal)
        r = {"shape": [B, Hq, Hkv, Sq, Skv, d, causal, dt]}
        try:
            rt.POISON = float("nan")
            got = fn(VARIANTS["fused"], args, causal)()
            base = fn(VARIANTS["convert"], args, causal)()
            rt.POISON = None
            again = [fn(VARIANTS["fused"], args, causal)() for _ in range(3)]  # bound plan; counters reset each call
            r["fused_err"] = [round(rel(x, y), 5) for x, y in zip(got, ref)]
            r["convert_err"] = [round(rel(x, y), 5) for x, y in zip(base, ref)]
            r["again_err"] = max(round(rel(x, y), 5) for a in again for x, y in zip(a, ref))
            r["nan"] = any(bool(x.isnan().any()) for x in (*got, *[t for a in again for t in a]))
            r["ok"] = (not r["nan"]) and max(r["fused_err"]) <= 1.5 * max(r["convert_err"]) + 1e-3 \
                and r["again_err"] <= 1.5 * max(r["convert_err"]) + 1e-3
        except Exception as e:
            rt.POISON = None
            r["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            r["ok"] = False
        print(json.dumps(r), flush=True)
        rows.append(r)
    return rows


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


def measure(s, d, causal, variants: dict):
    """One grid point timed side by side: cuDNN's backward and ``variants`` (name -> ``backward`` keywords) on the
    same inputs, each checked against cuDNN's gradients first (a variant that raises is left out, its error kept),
    then ROUNDS interleaved ``do_bench`` rounds. (the row: case, TFLOP/s and spread per variant, errors; the timed
    functions by name)."""
    import torch
    from triton.testing import do_bench

    from torch_autows.attention_grad import _cudnn_backward
    torch.cuda.empty_cache()
    args = inputs(s, d, causal)
    q, k, v, go, out, lse, scale = args
    fns = {"cudnn": lambda: _cudnn_backward(go, q, k, v, out, lse, causal, scale)}
    for n, kw in variants.items():
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
    return r, fns


def case(s, d, causal):
    r, fns = measure(s, d, causal, VARIANTS)
    r["vs_cudnn"] = {n: round(v / r["tflops"]["cudnn"], 3) for n, v in r["tflops"].items()}
    if "fused" in r["tflops"] and "convert" in r["tflops"]:
        r["fused_vs_convert"] = round(r["tflops"]["fused"] / r["tflops"]["convert"], 3)
    if s in (1024, 4096):
        r["kernels_us"] = {n: kernel_us(fns[n]) for n in VARIANTS if n in fns}
    print(json.dumps(r), flush=True)
    return r


def main():
    t0 = time.time()
    jobs = [(s, d, c) for d in (64, 128) for c in (False, True) for s in SEQS]
    with mp.get_context("spawn").Pool(12) as pool:
        print("warm", pool.map(warm, jobs), round(time.time() - t0, 1), flush=True)
    import torch
    res = {"device": torch.cuda.get_device_name(), "numerics": numerics(), "rows": []}
    print("numerics", round(time.time() - t0, 1), flush=True)
    for d in (128, 64):
        for causal in (False, True):
            for s in SEQS:
                try:
                    res["rows"].append(case(s, d, causal))
                except Exception as e:
                    res["rows"].append({"case": f"s{s}-d{d}{'-causal' * causal}", "error": f"{type(e).__name__}: {e}"})
                    print(res["rows"][-1], flush=True)
                with open(os.path.join(OUT, "finish.json"), "w") as f:
                    json.dump(res, f, indent=1)
    print("done", round(time.time() - t0, 1), flush=True)


if __name__ == "__main__":
    main()
