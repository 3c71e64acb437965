"""Session 28: the backward's reduce picks (dK/dV by TMA out of the Q/dO ring, ``_sr``) as persistent walks: a CTA
per SM runs the (batch, kv-head, KV block) tiles in turn, so the next tile's K/V load runs under this tile's dK/dV
epilogue and no CTA launch separates two tiles (on the H200 a short CTA spent 1.25 us waiting for K/V and 1.59 us
between CTAs, sweeps/2026-12-05-h200-attention-bwd-timeline.json). Needs codegen's ``_reduces_before_stores`` to let
a persistent partition mix its dQ reduces with one-copy TMA stores. Whole backward against the non-persistent pick
and cuDNN, s1024-s8192, d64/d128, causal or not, 5 interleaved rounds; numerics of the persistent configs on odd
shapes against fp32 math with NaN-poisoned outputs. Writes $OUT/persistent_sr.json."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import time

sys.path.insert(0, os.getcwd())
sys.path.insert(0, "bench/results/sweeps")
OUT = os.environ.get("OUT", ".")
SEQS = (1024, 2048, 4096, 8192)
BASE = {128: "bwd_64x128_dp2_dqsplit_fold_sr", 64: "bwd_128x128_dp2_dqsplit_fold_sr"}
ODD = [(2, 4, 2, 1000, 1024, 128, False, "bf16"), (1, 8, 8, 1024, 2048, 64, True, "fp16"),
       (2, 4, 4, 777, 1536, 64, False, "bf16"), (1, 4, 1, 2048, 2048, 128, True, "bf16"),
       (3, 2, 2, 129, 4096, 128, False, "fp16"), (2, 2, 1, 4096, 4096, 64, True, "bf16")]


def install():
    from dataclasses import replace

    from torch_autows.runtime import attention_bwd_configs as c
    for d, name in BASE.items():
        c.CONFIGS[name + "_p"] = replace(c.CONFIGS[name], persistent=True)
        c.CONFIG_HEAD_DIMS[name + "_p"] = {"atomic": (), "reduce": (d,), "separate": ()}


def variants(d):
    return {"pick": {"dq_mode": "reduce", "config": BASE[d]}, "persistent": {"dq_mode": "reduce",
                                                                            "config": BASE[d] + "_p"}}


def warm(job):
    s, d, causal = job
    try:
        import torch
        from attention_bwd_finish import fn, inputs
        install()
        args = inputs(s, d, causal, small=True)
        for kw in variants(d).values():
            fn(kw, args, causal)()
        torch.cuda.synchronize()
        return "ok"
    except Exception as e:
        return f"{job}: {type(e).__name__}: {str(e)[:300]}"


def numerics():
    import torch
    from attention_bwd_finish import fn, inputs, reference, rel

    from torch_autows.runtime import attention_bwd as rt
    rows = []
    for B, Hq, Hkv, Sq, Skv, d, causal, dt in ODD:
        torch.manual_seed(Sq + Skv + d)
        args = inputs(None, d, causal, dtype=dt, shape=(B, Hq, Hkv, Sq, Skv))
        ref = reference(args, causal)
        r = {"shape": [B, Hq, Hkv, Sq, Skv, d, causal, dt]}
        try:
            rt.POISON = float("nan")
            got = fn(variants(d)["persistent"], args, causal)()
            base = fn(variants(d)["pick"], args, causal)()
            rt.POISON = None
            r["persistent_err"] = [round(rel(x, y), 5) for x, y in zip(got, ref)]
            r["pick_err"] = [round(rel(x, y), 5) for x, y in zip(base, ref)]
            r["nan"] = any(bool(x.isnan().any()) for x in got)
            r["ok"] = not r["nan"] and max(r["persistent_err"]) <= 1.5 * max(r["pick_err"]) + 1e-3
        except Exception as e:
            rt.POISON = None
            r["error"], r["ok"] = f"{type(e).__name__}: {str(e)[:300]}", False
        print(json.dumps(r), flush=True)
        rows.append(r)
    return rows


def case(s, d, causal):
    from attention_bwd_finish import kernel_us, measure
    r, fns = measure(s, d, causal, variants(d))
    if "persistent" in r["tflops"]:
        r["persistent_vs_pick"] = round(r["tflops"]["persistent"] / r["tflops"]["pick"], 3)
    if s == 1024 and not causal:
        r["kernels_us"] = {n: kernel_us(fns[n]) for n in variants(d) if n in fns}
    print(json.dumps(r), flush=True)
    return r


def main():
    t0 = time.time()
    jobs = [(s, d, c) for d in (64, 128) for c in (False, True) for s in SEQS]
    with mp.get_context("spawn").Pool(12) as pool:
        print("warm", [x for x in pool.map(warm, jobs) if x != "ok"], round(time.time() - t0, 1), flush=True)
    import torch
    install()
    res = {"device": torch.cuda.get_device_name(), "numerics": numerics(), "rows": []}
    for d in (128, 64):
        for causal in (False, True):
            for s in SEQS:
                try:
                    res["rows"].append(case(s, d, causal))
                except Exception as e:
                    res["rows"].append({"case": f"s{s}-d{d}{'-causal' * causal}", "error": f"{type(e).__name__}: {e}"})
                with open(os.path.join(OUT, "persistent_sr.json"), "w") as f:
                    json.dump(res, f, indent=1)
    print("done", round(time.time() - t0, 1), flush=True)


if __name__ == "__main__":
    main()
