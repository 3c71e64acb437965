"""TFLOP/s of every GEMM config on short-K and square shapes against cuBLAS, in one process (H200).

Run on the GPU machine: ``PYTHONPATH=. OUT=<dir> python bench/results/sweeps/gemm_configs.py``.
"""
import json
import os

import torch
import triton

from torch_autows.runtime import gemm as rt

SHAPES = {"bmm32x2048x2048x128": (32, 2048, 2048, 128), "bmm16x4096x4096x128": (16, 4096, 4096, 128),
          "mm8192x8192x256": (1, 8192, 8192, 256), "mm4096^3": (1, 4096, 4096, 4096),
          "mm8192x4096x4096": (1, 8192, 4096, 4096)}


def tflops(flop, fn):
    return flop / triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median") / 1e9


def main():
    rows = []
    for name, (B, M, N, K) in SHAPES.items():
        lead = (B,) if B > 1 else ()
        a = torch.randn(*lead, M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(*lead, K, N, device="cuda", dtype=torch.bfloat16)

        def run(cfg, a=a, b=b):
            if a.dim() == 3:
                return rt.bmm(a, b, torch.bfloat16, config=cfg)
            return rt.gemm(a, b, None, torch.bfloat16, config=cfg)

        flop = 2 * B * M * N * K
        ref = torch.matmul(a, b).float()
        row = {"case": name, "cublas": tflops(flop, lambda a=a, b=b: torch.matmul(a, b)),
               "chosen": rt.choose_config(B * M, N, K)}
        for cfg in rt.CONFIGS:
            try:
                out = run(cfg)
                torch.cuda.synchronize()
                row[cfg] = round(tflops(flop, lambda cfg=cfg: run(cfg)), 1)
                row[cfg + "_err"] = ((out.float() - ref).norm() / ref.norm()).item()
            except Exception as e:  # a config that cannot run this shape is recorded, not fatal
                row[cfg] = repr(e)[:200]
        print(json.dumps(row), flush=True)
        rows.append(row)
    with open(os.path.join(os.environ.get("OUT", "."), "sweep.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
