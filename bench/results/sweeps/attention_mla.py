"""Attention with q/k of head dim 192 and v of 128 (DeepSeek-style MLA prefill): candidate configs of the generated
forward against SDPA's cuDNN and memory-efficient kernels (FA2 takes one head dim), on the bench grid's MLA cases
(16 heads, 16384 tokens, s1024/s4096/s16384, causal or not), bf16. One process, median of 3 interleaved rounds of
triton.testing.do_bench (TFLOP/s, 2 B H S^2 (192 + 128), halved for causal); relative error of out against fp32.

    PYTHONPATH=. [MLA_SET=2] python bench/results/sweeps/attention_mla.py <out.json> [case glob ...]
"""
import fnmatch
import json
import os
import statistics
import sys
from dataclasses import replace

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from torch_autows.bench.cases import attention_cases
from torch_autows.bench.peers_attention import attention_fp32
from torch_autows.runtime import attention as rt
from torch_autows.runtime.attention_configs import _ONE_Q as ONE_Q

BASE = rt.CONFIGS["ws_p_128x64_rm_g16_sdb_dm_s3_lc"]
#: name -> Options, added to the runtime's configs for this run. Set "1" (the JSON without a suffix): the picks of
#: d=192 and d=128, adapted; set "2" (``-2``): variants of the d=192 pick (two Q copies, a fourth stage, 24
#: producer registers, without lead_chains, without the serpentine walk); set "3": Q in registers (q_regs).
SETS = {
    "1": {
        "ws_p_128x64_rm_g16_sdb_dm_s3_lc": BASE,
        "mla_128x64_lc_s4": replace(BASE, stages=4),
        "mla_128x128_sdb": replace(ONE_Q, raw_max=True, group_m=16, split_d=True, split_d_binary=True),
        "mla_128x128_sdb_lc": replace(ONE_Q, raw_max=True, group_m=16, split_d=True, split_d_binary=True,
                                      lead_chains=True),
        "mla_128x128_sdb_lc_pr24": replace(ONE_Q, raw_max=True, group_m=16, split_d=True, split_d_binary=True,
                                           lead_chains=True, producer_regs=24),
    },
    "2": {
        "ws_p_128x64_rm_g16_sdb_dm_s3_lc": BASE,
        "mla_q2": replace(BASE, tile_buffers=2),
        "mla_q2_s4": replace(BASE, tile_buffers=2, stages=4),
        "mla_q2_pr24": replace(BASE, tile_buffers=2, producer_regs=24),
        "mla_nolc": replace(BASE, lead_chains=False),
        "mla_serp0": replace(BASE, serpentine=False),
    },
    # set "3" (session 23; -mla-3.json, session 24): the picks with Q read into registers once a tile (q_regs, +2.4-3.9%
    # at d=192: sweeps/2026-12-02-h200-attention-q-regs.json), one and two Q copies
    "3": {
        "ws_p_128x64_rm_g16_sdb_dm_s3_lc_q2": rt.CONFIGS["ws_p_128x64_rm_g16_sdb_dm_s3_lc_q2"],
        "ws_p_128x64_rm_g16_sdb_dm_s3_lc": BASE,
        "ws_p_128x64_rm_g16_sdb_dm_s3_lc_q2_qr": rt.CONFIGS["ws_p_128x64_rm_g16_sdb_dm_s3_lc_q2_qr"],
        "ws_p_128x64_rm_g16_sdb_dm_s3_lc_qr": rt.CONFIGS["ws_p_128x64_rm_g16_sdb_dm_s3_lc_qr"],
    },
}
VARIANTS = SETS[os.environ.get("MLA_SET", "1")]
for name, o in VARIANTS.items():
    rt.CONFIGS.setdefault(name, o)
rt.V_HEAD_DIMS[(192, 128)] = tuple(dict.fromkeys((*rt.V_HEAD_DIMS[(192, 128)], *VARIANTS)))


def measure(case):
    g = torch.Generator(device="cuda").manual_seed(case.seqlen)
    B, H, S = case.batch, case.heads, case.seqlen
    q, k = (torch.randn(B, H, S, 192, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    v = torch.randn(B, H, S, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    scale = 192 ** -0.5
    ref = attention_fp32(q, k, v, case.causal, scale)[0]
    fns = {}
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
        def sdpa(backend=backend):
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=case.causal, scale=scale)
        fns[name] = sdpa
    for name in VARIANTS:
        fns[name] = lambda name=name: rt.attention(q, k, v, case.causal, scale, config=name)[0]
    row = {"case": case.name}
    for name, f in list(fns.items()):
        try:
            out = f()
            torch.cuda.synchronize()
            row[f"{name}_err"] = ((out.float() - ref).norm() / ref.norm()).item()
        except Exception as e:  # a backend that does not take the shape
            row[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:160]}"
            del fns[name]
    times = {n: [] for n in fns}
    for _ in range(3):
        for n, f in fns.items():
            times[n].append(triton.testing.do_bench(f, warmup=10, rep=100))
    for n, t in times.items():
        row[n] = round(case.flops / (statistics.median(t) * 1e-3) / 1e12, 1)
    print(json.dumps(row), flush=True)
    return row


res = [measure(c) for c in attention_cases()
       if c.dv != c.head_dim and (len(sys.argv) < 3 or any(fnmatch.fnmatch(c.name, g) for g in sys.argv[2:]))]
json.dump(res, open(sys.argv[1], "w"), indent=1)
