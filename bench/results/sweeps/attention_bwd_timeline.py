"""Session 27, GPU call 2: a per-CTA timeline (%clock64 in consumer0, .dev/timeline_patch.py) of the reduce-form main
kernel of the attention backward: d=128 (bwd_64x128_dp2_dqsplit_fold) and d=64 (bwd_128x128_dp2_dqsplit_fold) at
s1024 / s4096, causal or not. Per CTA: K/V wait, first step, steady step, epilogue; per SM: the gap between one CTA's
end and the next one's start. Writes $OUT/probe2.json."""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys

import torch
from triton.testing import do_bench

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timeline_patch import nostore, patch  # noqa: E402

import torch_autows.codegen.compile as cc  # noqa: E402
from torch_autows.runtime import attention_bwd as rt  # noqa: E402
from torch_autows.sdpa_fallback import fused_attention  # noqa: E402

OUT = os.environ.get("OUT", ".")
TAG = 100
_gen = cc.generate


def generate(program):
    src = _gen(program)
    if program.options.group_m == TAG + 1:
        return patch(nostore(src))
    return patch(src) if program.options.group_m == TAG else src


cc.generate = generate


def probe_config(base, d, tag=TAG):
    name = f"probe{tag}_{base}"
    rt.CONFIGS[name] = dataclasses.replace(rt.CONFIGS[base], group_m=tag)
    rt.CONFIG_HEAD_DIMS[name] = {"atomic": (), "reduce": (d,), "separate": ()}
    return name


def kernel_us(fn):
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    t = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            t[e.name[:50]] = t.get(e.name[:50], 0) + e.device_time_total / 5
    return t


def case(base, d, s, causal, tag=TAG):
    name = probe_config(base, d, tag)
    B, H = 16384 // s, 2048 // d
    scale = d ** -0.5
    q, k, v, go = (torch.randn(B, H, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, lse = fused_attention("cudnn", q, k, v, causal, scale)
    plain = lambda: rt.backward(go, None, q, k, v, out, lse, causal, scale, config=base, dq_mode="reduce")  # noqa
    probed = lambda: rt.backward(go, None, q, k, v, out, lse, causal, scale, config=name, dq_mode="reduce")  # noqa
    ms_plain = statistics.median(do_bench(plain, warmup=10, rep=60) for _ in range(3))
    ms_probe = statistics.median(do_bench(probed, warmup=10, rep=60) for _ in range(3))
    kt = kernel_us(probed)
    main_us = max(v for n, v in kt.items() if "attn_bwd" in n)
    for _ in range(3):
        probed()
    dk = probed()[1]
    torch.cuda.synchronize()
    bn = rt.CONFIGS[base].block_n
    nb = -(-s // bn)
    rows = dk.reshape(-1, d)[(torch.arange(B * H, device="cuda")[:, None] * s
                              + torch.arange(nb, device="cuda")[None, :] * bn).reshape(-1)]
    rec = rows[:, :32].contiguous().view(torch.int64)[:, :6].cpu().tolist()  # t0..t4, smid per CTA (bh-major)
    steps_per = [s // rt.CONFIGS[base].block_m] * len(rec)
    if causal:  # KV block n sees query blocks from n*bn // bm
        bm = rt.CONFIGS[base].block_m
        steps_per = [-(-s // bm) - (i % nb) * bn // bm for i in range(len(rec))]
    print("raw", rec[:3], "distinct sms", len({r[5] for r in rec}), flush=True)
    per_sm = {}
    for r, st in zip(rec, steps_per):
        per_sm.setdefault(r[5], []).append((r, st))
    spans = [max(x[0][4] for x in v) - min(x[0][0] for x in v) for v in per_sm.values()]
    ghz = statistics.median(spans) / (main_us * 1e3)
    kv, first, step, epi, gaps = [], [], [], [], []
    for v in per_sm.values():
        v.sort(key=lambda x: x[0][0])
        for (r, st), nxt in zip(v, v[1:] + [None]):
            kv.append(r[1] - r[0])
            first.append(r[2] - r[1])
            if st > 1:
                step.append((r[3] - r[2]) / (st - 1))
            epi.append(r[4] - r[3])
            if nxt is not None:
                gaps.append(nxt[0][0] - r[4])

    def us(x):
        if not x:
            return None
        return {"median": round(statistics.median(x) / ghz / 1e3, 3), "mean": round(statistics.mean(x) / ghz / 1e3, 3),
                "p90": round(sorted(x)[int(0.9 * len(x))] / ghz / 1e3, 3)}
    r = {"case": f"{base} s{s}-d{d}{'-causal' * causal}", "tag": tag, "ms_plain": ms_plain, "ms_probe": ms_probe,
         "kernels_us": {k_: round(v_, 1) for k_, v_ in kt.items()}, "ghz": round(ghz, 3), "ctas": len(rec),
         "sms": len(per_sm), "ctas_per_sm": round(len(rec) / len(per_sm), 2),
         "kv_wait_us": us(kv), "first_step_us": us(first), "step_us": us(step), "epilogue_us": us(epi),
         "gap_us": us(gaps)}
    print(json.dumps(r), flush=True)
    return r


def warm(job):
    base, d, s, causal = job
    try:
        name = probe_config(base, d)
        name2 = probe_config(base, d, TAG + 1)
        scale = d ** -0.5
        q, k, v, go = (torch.randn(1, 2, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        out, lse = fused_attention("cudnn", q, k, v, causal, scale)
        for c in (base, name, name2):
            rt.backward(go, None, q, k, v, out, lse, causal, scale, config=c, dq_mode="reduce")
        torch.cuda.synchronize()
        return job, "ok"
    except Exception as e:
        return job, f"{type(e).__name__}: {e}"


def main():
    import multiprocessing as mp
    jobs = [("bwd_64x128_dp2_dqsplit_fold", 128, 1024, c) for c in (False, True)]
    with mp.get_context("spawn").Pool(4) as pool:
        print("warm", pool.map(warm, jobs), flush=True)
    rows = []
    for base, d in (("bwd_64x128_dp2_dqsplit_fold", 128),):
        for (s, causal), tag in ((x, t) for x in ((1024, False), (1024, True)) for t in (TAG, TAG + 1)):
            try:
                rows.append(case(base, d, s, causal, tag))
            except Exception as e:
                import traceback
                traceback.print_exc()
                rows.append({"case": f"{base} s{s}", "error": f"{type(e).__name__}: {e}"})
            with open(os.path.join(OUT, "probe2.json"), "w") as f:
                json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
