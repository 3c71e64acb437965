"""Epilogue operand tiles by TMA through the producer (``Options.epilogue_tma``) against the same kernels loading
them by pointers in the consumer, and against what runs without the fusion, one process, median of 3 interleaved
rounds of triton.testing.do_bench, on the Llama-3-8B shapes at 8x2048 tokens:

- RoPE on the q and k projections (hidden 4096, d 128): cuBLAS then the model's RoPE compiled by torch.compile
  default, our plain GEMM pick then the same RoPE, both GEMMs alone, the 128x128 and ping-pong kernels alone, and
  runtime.gemm_rope on 128x128 tiles with the tables by pointer loads (``ptr:``) and by TMA (``tma:``; the ``-2``
  JSON's ``tma:ws_p_128x128_e2``, the store staged in two copies of its own, ran 1076 us, so since then a config
  with two staging copies takes its tables by pointers);
- the residual add on o_proj (K 4096) and down_proj (K 14336): ``linear(x, w) + r`` compiled by torch.compile
  default, cuBLAS's addmm (beta 1: the residual in cuBLAS's epilogue), our plain pick and the 128x128 and ping-pong
  kernels alone, runtime.gemm's residual epilogue on 128x128, 128x256 and ping-pong tiles (R by TMA: the runtime's
  ``residual_options``; in the session-18 JSONs, made before that, ``res:ws_p_128x128`` and ``_e2`` were pointer
  loads and ``<config>_et`` the TMA variants).

Writes JSON to $OUT/epilogue_tma.json.

    PYTHONPATH=. OUT=<dir> python bench/results/sweeps/epilogue_tma.py
"""
import json
import os
import statistics

import torch
import triton

from torch_autows.bench.llama import LlamaConfig, apply_rope, rope_tables
from torch_autows.runtime import gemm as rtg
from torch_autows.runtime.gemm_rope import gemm_rope

# runtime.gemm_rope picks the tables' transport itself ("auto": TMA where the tiles fit); "pointer" forces the loads
ROPE = {"ptr:ws_p_128x128": ("ws_p_128x128", "pointer"), "tma:ws_p_128x128": ("ws_p_128x128", "auto")}
RESIDUAL = ["ws_p_128x128", "ws_p_128x128_e2", "ws_p_128x256", "ws_pp2_128x128"]
B, S, HID, D = 8, 2048, 4096, 128
M = B * S


def measure(fns, check):
    errs = {n: round(check(fns[n]()), 5) for n in fns if n.startswith(("fused:", "res:", "compiled", "addmm"))}
    times = {n: [] for n in fns}
    for _ in range(3):
        for n, f in fns.items():
            times[n].append(triton.testing.do_bench(f, rep=100))
    return errs, {n: round(statistics.median(t) * 1e3, 2) for n, t in times.items()}


rows = []
cos, sin = rope_tables(LlamaConfig(), S, device="cuda")
c16, s16 = cos.to(torch.bfloat16), sin.to(torch.bfloat16)
rope = torch.compile(lambda y, h: apply_rope(y.view(B, S, h, D).transpose(1, 2), cos, sin))
for name, heads in (("q", 32), ("k", 8)):
    x = torch.randn(M, HID, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(heads * D, HID, device="cuda", dtype=torch.bfloat16) / HID ** 0.5
    fns = {"cublas+rope": lambda x=x, w=w, h=heads: rope(torch.nn.functional.linear(x, w), h),
           "autows+rope": lambda x=x, w=w, h=heads: rope(rtg.gemm(x, w.t(), None, x.dtype, config="auto"), h),
           "cublas": lambda x=x, w=w: torch.nn.functional.linear(x, w),
           "autows": lambda x=x, w=w: rtg.gemm(x, w.t(), None, x.dtype, config="auto"),
           **{c: (lambda x=x, w=w, c=c: rtg.gemm(x, w.t(), None, x.dtype, config=c))
              for c in ("ws_p_128x128", "ws_pp2_128x128")},
           **{f"fused:{n}": (lambda x=x, w=w, c=c, t=t: gemm_rope(x, w.t(), c16, s16, config=c, tables=t))
              for n, (c, t) in ROPE.items()}}
    ref = fns["cublas+rope"]().transpose(1, 2).reshape(M, heads * D).float()

    def check(out, ref=ref):
        return ((out.float() - ref).norm() / ref.norm()).item()
    errs, times = measure(fns, check)
    row = {"case": f"rope_{name}", "M": M, "N": heads * D, "K": HID, "rel_err": errs, **times}
    print(json.dumps(row), flush=True)
    rows.append(row)

add = torch.compile(lambda x, w, r: torch.nn.functional.linear(x, w) + r)
for name, k in (("o_proj", 4096), ("down_proj", 14336)):
    x = torch.randn(M, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(HID, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
    r = torch.randn(M, HID, device="cuda", dtype=torch.bfloat16)
    fns = {"compiled": lambda x=x, w=w, r=r: add(x, w, r),
           "addmm": lambda x=x, w=w, r=r: torch.addmm(r, x, w.t()),
           "autows": lambda x=x, w=w: rtg.gemm(x, w.t(), None, x.dtype, config="auto"),
           **{c: (lambda x=x, w=w, c=c: rtg.gemm(x, w.t(), None, x.dtype, config=c))
              for c in ("ws_p_128x128", "ws_pp2_128x128")},
           **{f"res:{c}": (lambda x=x, w=w, r=r, c=c: rtg.gemm(x, w.t(), None, x.dtype, config=c, residual=r))
              for c in RESIDUAL}}
    ref = (x.float() @ w.float().t() + r.float())

    def check(out, ref=ref):
        return ((out.float() - ref).norm() / ref.norm()).item()
    errs, times = measure(fns, check)
    row = {"case": f"residual_{name}", "M": M, "N": HID, "K": k, "rel_err": errs, **times}
    print(json.dumps(row), flush=True)
    rows.append(row)
with open(os.path.join(os.environ.get("OUT", "."), "epilogue_tma.json"), "w") as f:
    json.dump({"device": torch.cuda.get_device_name(), "unit": "us", "rows": rows}, f, indent=1)
