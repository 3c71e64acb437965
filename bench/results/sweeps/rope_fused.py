"""The RoPE GEMM (runtime.gemm_rope, 128-wide tiles) against what runs without it, one process, median of 3
interleaved rounds of triton.testing.do_bench: cuBLAS's GEMM then the model's RoPE (apply_rope, compiled by
torch.compile default into one pointwise kernel), and our plain GEMM pick then the same RoPE, on the Llama-3-8B q and
k projections at 8x2048 tokens (hidden 4096, d 128, 32 q / 8 kv heads). Writes JSON to $OUT/rope_fused.json.

    PYTHONPATH=. OUT=<dir> python bench/results/sweeps/rope_fused.py
"""
import json
import os
import statistics

import torch
import triton

from torch_autows.bench.llama import LlamaConfig, apply_rope, rope_tables
from torch_autows.runtime import gemm as rtg
from torch_autows.runtime.gemm_rope import gemm_rope

B, S, HID, D = 8, 2048, 4096, 128
cos, sin = rope_tables(LlamaConfig(), S, device="cuda")
c16, s16 = cos.to(torch.bfloat16), sin.to(torch.bfloat16)
rope = torch.compile(lambda y, h: apply_rope(y.view(B, S, h, D).transpose(1, 2), cos, sin))
rows = []
for name, heads in (("q", 32), ("k", 8)):
    x = torch.randn(B * S, HID, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(heads * D, HID, device="cuda", dtype=torch.bfloat16) / HID ** 0.5
    fns = {"cublas+rope": lambda x=x, w=w, h=heads: rope(torch.nn.functional.linear(x, w), h),
           "autows+rope": lambda x=x, w=w, h=heads: rope(rtg.gemm(x, w.t(), None, None, config="auto"), h),
           "cublas": lambda x=x, w=w: torch.nn.functional.linear(x, w),
           "fused": lambda x=x, w=w: gemm_rope(x, w.t(), c16, s16)}
    ref = fns["cublas+rope"]().transpose(1, 2).reshape(B * S, heads * D).float()
    err = ((fns["fused"]().float() - ref).norm() / ref.norm()).item()
    times = {n: [] for n in fns}
    for _ in range(3):
        for n, f in fns.items():
            times[n].append(triton.testing.do_bench(f, rep=100))
    row = {"proj": name, "M": B * S, "N": heads * D, "K": HID, "rel_err_vs_unfused": round(err, 5),
           **{n: round(statistics.median(t) * 1e3, 1) for n, t in times.items()}}
    print(json.dumps(row), flush=True)
    rows.append(row)
with open(os.path.join(os.environ.get("OUT", "."), "rope_fused.json"), "w") as f:
    json.dump({"device": torch.cuda.get_device_name(), "unit": "us", "rows": rows}, f, indent=1)
