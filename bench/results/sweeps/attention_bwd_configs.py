"""GPU sweep (not a test): every (form, main config, dQ config) of the generated attention backward that serves a
head dim (runtime/attention_bwd_configs.py ``CONFIGS``, ``DQ_CONFIGS``, ``serves``), timed whole as a user gets it (row
kernels, workspace, kernels), against cuDNN's backward on a cuDNN forward's out and lse; plus, for the default pick,
the GPU time per kernel (torch.profiler), to show where the time goes.

``VARIANTS`` (below) adds configs that are not in ``CONFIGS``: deeper Q/dO rings, and the 64-query steps at d=128
that spill (180-684 bytes offline), to see what the spills and the ring depth cost.

Cases: s1024/s4096 x d64/d128 x causal or not, B*S = 16384 tokens, hidden 2048, bf16. Each time: the median of 3
interleaved rounds of triton.testing.do_bench. Writes JSON to argv[1] (else $OUT/attention_bwd_configs.json).

    [SEQS=1024,4096] [DIMS=64,128] python bench/results/sweeps/attention_bwd_configs.py [out.json [regex]]

``regex`` (argv[2]) keeps the combos ``form:config:dq_config`` it matches (default: all); ``SEQS`` and ``DIMS``
(comma-separated) pick the sequence lengths and head dims (default: 1024,4096 and 64,128).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import statistics
import sys
from collections import defaultdict

import torch
from triton.testing import do_bench

from torch_autows.attention_grad import _cudnn_backward
from torch_autows.runtime import attention_bwd as rt
from torch_autows.sdpa_fallback import fused_attention

#: name -> (base config, Options overrides, {form: head dims}).
VARIANTS = {
    "bwd_64x128_dp2_s3": ("bwd_64x128_dp2", {"stages": 3}, {"reduce": (64,), "separate": (64,)}),
    "bwd_64x128_dp2_s4": ("bwd_64x128_dp2", {"stages": 4}, {"reduce": (64,), "separate": (64,)}),
    "bwd_32x128_dp2_s3": ("bwd_32x128_dp2", {"stages": 3}, {"separate": (64, 128)}),
    "bwd_32x128_dp2_s4": ("bwd_32x128_dp2", {"stages": 4}, {"separate": (64, 128)}),
    "bwd_32x128_dp2_dqsplit_s3": ("bwd_32x128_dp2_dqsplit", {"stages": 3}, {"reduce": (128,)}),
    "bwd_64x128_dp2_spills": ("bwd_64x128_dp2", {}, {"reduce": (128,), "separate": (128,)}),
    "bwd_64x128_dp2_p": ("bwd_64x128_dp2", {"persistent": True}, {"reduce": (64,), "separate": (64, 128)}),
    # causal walks grouped 8 heads at a time, block by block (templates/attention_bwd.py; not measured yet)
    "bwd_64x128_dp2_g8": ("bwd_64x128_dp2", {"group_m": 8}, {"reduce": (64,), "separate": (64, 128)}),
    "bwd_64x128_dp2_p_g8": ("bwd_64x128_dp2", {"persistent": True, "group_m": 8}, {"reduce": (64,), "separate": (64,)}),
    # the folded d=128 step, persistent (0 spills offline; the persistent split-dQ fold spills 80)
    "bwd_64x128_dp2_fold_p": ("bwd_64x128_dp2_fold", {"persistent": True}, {"separate": (128,)}),
    # the fold at d=64, where registers are not tight: 64 fewer subtractions a thread and step beside the mmas
    "bwd_64x128_dp2_fold64": ("bwd_64x128_dp2", {"fold_rows": True}, {"reduce": (64,)}),
    # the grouped causal walk and the fold together (each ahead alone at causal d=64 in -configs-4)
    "bwd_64x128_dp2_g8_fold64": ("bwd_64x128_dp2", {"group_m": 8, "fold_rows": True}, {"reduce": (64,)}),
    # dV and dK of step j-1 issued after step j's S^T and dP^T (defer_mma: software_pipeline), Q/dO read a step late
    # from a third ring slot; d=64 only (0 spills offline; d=128 spills 926 bytes)
    "bwd_64x128_dp2_dm_s3": ("bwd_64x128_dp2", {"defer_mma": True, "stages": 3}, {"separate": (64,)}),
    "bwd_64x128_dp2_p_dm_s3": ("bwd_64x128_dp2", {"persistent": True, "defer_mma": True, "stages": 3},
                               {"separate": (64,)}),
    # 128-query steps at d=64 (FA3's d=64 backward tile): they spill 1.8-2 KB offline with the row vectors live, none
    # with them folded into the accumulators (separate form; the reduce form still spills 164-496 bytes)
    "bwd_128x128_dp2_fold": ("bwd_64x128_dp2", {"block_m": 128, "fold_rows": True}, {"separate": (64,)}),
    "bwd_128x128_dp2_p_fold": ("bwd_64x128_dp2", {"block_m": 128, "fold_rows": True, "persistent": True},
                               {"separate": (64,)}),
    # the picks with the step's q-head and Q block carried as counters instead of two integer divisions by
    # cdiv(Sq, 64) a step (Options.carry_index; offline: 16 -> 9 division sequences in the kernel, no spill more).
    # -configs-9 timed these; the two reduce picks have carried them since, so their _cc names are now the picks
    # and the variants without it are the _nc ones.
    "bwd_64x128_dp2_p_fold_nc": ("bwd_64x128_dp2_p_fold", {"carry_index": False}, {"reduce": (64,)}),
    "bwd_64x128_dp2_dqsplit_fold_nc": ("bwd_64x128_dp2_dqsplit_fold", {"carry_index": False}, {"reduce": (128,)}),
    "bwd_64x128_dp2_cc": ("bwd_64x128_dp2", {"carry_index": True}, {"reduce": (64,), "separate": (64, 128)}),
    "bwd_64x128_dp2_p_cc": ("bwd_64x128_dp2_p", {"carry_index": True}, {"separate": (64,)}),
    # two CTAs an SM at d=128 (-c2-d128): bwd_64x64_dp1_c2 spills 120-200 bytes there, its folded twin (a runtime
    # config since, bwd_64x64_dp1_c2_fold) and 32-query steps do not (offline sm_90a, separate form: 100 / 66 KB of
    # SMEM, consumer 232 registers)
    "bwd_32x64_dp1_c2": ("bwd_64x64_dp1_c2", {"block_m": 32}, {"separate": (64, 128)}),
    # the reduce picks with the wait for dQ's previous reduce moved before dS^T's store (Options.early_reduce_wait):
    # one partition-wide bar.sync a step fewer per consumer (ncu, s4096 d=64: barrier stalls 31% of the consumers'
    # issue gaps)
    "bwd_64x128_dp2_p_fold_erw": ("bwd_64x128_dp2_p_fold", {"early_reduce_wait": True}, {"reduce": (64,)}),
    "bwd_64x128_dp2_erw": ("bwd_64x128_dp2", {"early_reduce_wait": True}, {"reduce": (64,)}),
    "bwd_64x128_dp2_dqsplit_fold_erw": ("bwd_64x128_dp2_dqsplit_fold", {"early_reduce_wait": True},
                                        {"reduce": (128,)}),
    # the d=64 split dQ by query rows (bwd_128x128_dp2_dqsplit_fold): persistent, and with the carried counters
    # (-rows.json: 2-5% behind; the config was timed with them as this script's ``_nc`` variant without)
    "bwd_128x128_dp2_p_dqsplit_fold": ("bwd_128x128_dp2_dqsplit_fold", {"persistent": True}, {"reduce": (64,)}),
    "bwd_128x128_dp2_dqsplit_fold_cc": ("bwd_128x128_dp2_dqsplit_fold", {"carry_index": True}, {"reduce": (64,)}),
    # ... persistent with the K/V tiles in two copies (tile_buffers=2: the producer loads the next tile's K/V under
    # this tile's last steps; SMEM 231968 of 232448), for the short sequences where a 128-key CTA has 4-8 steps. Not
    # measured yet; offline as launched 344 spill bytes (causal 460; persistent alone 240 / 384), interprets clean.
    "bwd_128x128_dp2_p2_dqsplit_fold": ("bwd_128x128_dp2_dqsplit_fold", {"persistent": True, "tile_buffers": 2},
                                        {"reduce": (64,)}),
    # the two-CTA d=64 pick with lse2/delta folded into the accumulators (64 subtractions a thread and step fewer)
    "bwd_64x64_dp1_c2_fold64": ("bwd_64x64_dp1_c2", {"fold_rows": True}, {"reduce": (64,)}),
    "bwd_64x64_dp1_c2_erw": ("bwd_64x64_dp1_c2", {"early_reduce_wait": True}, {"reduce": (64,)}),
    # (session 23's bwd_64x64_dp1_c2_kvr, K and V in registers, is a runtime config since -bwd-kvr.json)
}
#: dQ-kernel variants: name -> (base, overrides[, head dims]).
DQ_VARIANTS = {"dq_128x128_dp2_p": ("dq_128x128_dp2", {"persistent": True}),
               # dQ of step j-1 after step j's S and dP (d=64 only: at d=128 it spills 1136 bytes offline)
               "dq_128x128_dp2_p_dm": ("dq_128x128_dp2", {"persistent": True, "defer_mma": True}, (64,)),
               "dq_128x128_dp2_p_dm_s3": ("dq_128x128_dp2", {"persistent": True, "defer_mma": True, "stages": 3},
                                          (64,)),
               # 64 keys a step: deferred without spills at d=128 too (offline sm_90a)
               "dq_128x64_dp2_p_dm": ("dq_128x64_dp2", {"persistent": True, "defer_mma": True}),
               "dq_128x64_dp2_p_dm_s3": ("dq_128x64_dp2", {"persistent": True, "defer_mma": True, "stages": 3})}


ONLY = sys.argv[2] if len(sys.argv) > 2 else ""


def add_variants() -> None:
    for name, (base, over, dims) in VARIANTS.items():
        rt.CONFIGS[name] = dataclasses.replace(rt.CONFIGS[base], **over)
        rt.CONFIG_HEAD_DIMS[name] = {"atomic": (), "reduce": (), "separate": (), **dims}
    for name, (base, over, *dims) in DQ_VARIANTS.items():
        rt.DQ_CONFIGS[name] = dataclasses.replace(rt.DQ_CONFIGS[base], **over)
        rt.DQ_CONFIG_HEAD_DIMS[name] = dims[0] if dims else rt.DQ_CONFIG_HEAD_DIMS[base]


def combos(d: int):
    for mode in ("reduce", "separate"):
        for c in rt.CONFIGS:
            if not rt.serves(c, d, mode):
                continue
            # every dQ config that serves d beside each main kernel (the regex narrows: a variant's runs before
            # session 21 had only the dQ pick beside it)
            dqs = [x for x in rt.DQ_CONFIGS if rt.dq_serves(x, d)]
            for dc in ([None] if mode != "separate" else dqs):
                if re.search(ONLY, f"{mode}:{c}:{dc}"):
                    yield mode, c, dc


def kernel_times(fn) -> dict[str, float]:
    """GPU microseconds per kernel name over 10 calls, per call."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
    out: dict[str, float] = defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            out[e.name[:60]] += e.device_time_total / 10
    return dict(out)


def checked_times(fns: dict) -> tuple[dict, dict]:
    """(err, ms) of backward variants (name -> a call returning (dq, dk, dv); "cudnn" the reference): each gradient's
    relative error against cuDNN's, the worst per variant (a variant that does not compile or launch: its error text,
    and it is dropped from ``fns`` untimed), and the median ms of 3 interleaved rounds of every variant left."""
    ref = fns["cudnn"]()
    err = {}
    for n, f in list(fns.items()):
        try:
            got = f()
        except Exception as e:  # a variant that does not compile or launch: recorded, not timed
            err[n] = f"{type(e).__name__}: {str(e)[:300]}"
            del fns[n]
            continue
        err[n] = max(((x.float() - y.float()).norm() / y.float().norm()).item() for x, y in zip(got, ref))
    times = defaultdict(list)
    for _ in range(3):
        for n, f in fns.items():
            times[n].append(do_bench(f, warmup=10, rep=60))
    return err, {n: statistics.median(t) for n, t in times.items()}


def case(s: int, d: int, causal: bool) -> dict:
    B, H = 16384 // s, 2048 // d
    scale = d ** -0.5
    q, k, v, go = (torch.randn(B, H, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, lse = fused_attention("cudnn", q, k, v, causal, scale)
    fns = {"cudnn": lambda: _cudnn_backward(go, q, k, v, out, lse, causal, scale)}
    for mode, c, dc in combos(d):
        fns[f"{mode}:{c}:{dc}"] = (lambda m=mode, c=c, dc=dc:
                                   rt.backward(go, None, q, k, v, out, lse, causal, scale, config=c, dq_mode=m,
                                               dq_config=dc))
    err, ms = checked_times(fns)
    flops = 2.5 * 4 * B * H * s * s * d / (2 if causal else 1)
    default = rt.choose_dq_mode(None, d, s, causal)
    prof = kernel_times(lambda: rt.backward(go, None, q, k, v, out, lse, causal, scale))
    return {"case": f"s{s}-d{d}{'-causal' * causal}", "ms": ms, "tflops": {n: flops / t / 1e9 for n, t in ms.items()},
            "err_vs_cudnn": err, "default": [default, rt.choose_config(d, causal, default)],
            "default_kernels_us": prof, "cudnn_kernels_us": kernel_times(fns["cudnn"])}


def main() -> None:
    add_variants()
    rows = []
    for s in (int(x) for x in os.environ.get("SEQS", "1024,4096").split(",")):
        for d in (int(x) for x in os.environ.get("DIMS", "64,128").split(",")):
            for causal in (False, True):
                r = case(s, d, causal)
                rows.append(r)
                best = sorted(r["tflops"].items(), key=lambda t: -t[1])
                print(r["case"], " ".join(f"{n}={t:.0f}" for n, t in best), flush=True)
                print("   ours:", {n: round(u) for n, u in r["default_kernels_us"].items()},
                      "cudnn:", {n: round(u) for n, u in r["cudnn_kernels_us"].items()}, flush=True)
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.environ.get("OUT", "."), "attention_bwd_configs.json")
    with open(path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cases": rows}, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
