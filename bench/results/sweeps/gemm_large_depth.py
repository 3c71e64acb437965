"""The large-GEMM tile's K depth at the Llama-3-8B model's GEMM shapes (issue 16: the model is 77-88% GEMM).

GPU only, not a test. ``ws_p_128x256`` asks for 64-deep K steps x 4 stages, which the memory plan cuts to 3 (the
128x256 output's staging takes 64 KB); sweeps/swiglu_bwd_wide.py found 32-deep x 4 (96 KB in flight) faster at two
of its three shapes. Offline (sm_90a, 0 spills): 32-deep x 6 fits in the same 213 KB as 64-deep x 3 (144 KB in
flight, finer steps). At each shape (nn.Linear's layouts: forward x @ W^T, the input gradient dy @ W, the weight
gradient dy^T @ x), the output against fp32 after NaN poisoning, then 3 interleaved do_bench rounds, medians (us):
cuBLAS, ``ws_p_128x128`` and the 128x256 tile at 64x4 (the pick), 32x4, 32x6.

Run from the repository root: ``PYTHONPATH=. python bench/results/sweeps/gemm_large_depth.py OUT.json``.

On an H100 (sweeps/2026-12-06-h100-gemm-large-depth.json; every output 1.66e-3 from fp32, as cuBLAS's), us, columns
cublas / ws_p_128x128 / 64x4 (the pick) / 32x4 / 32x6: qkv 1195 / 1191 / 1222 / 1238 / 1216; o 815 / 827 / 819 /
837 / 830; gate_up 5501 / 5805 / **5221** / 5566 / 6368; down 2837 / 2970 / **2741** / 2831 / 3033; dx_down 2827 /
2956 / 2795 / **2720** / 2729; dx_gate_up 5524 / 6287 / **5208** / 5225 / 5608; dw_o 767 / 783 / 785 / **764** / 780;
dw_gate_up 5344 / 6128 / **5277** / 5298 / 5348. The pick is the fastest of ours at 5 of 8 shapes and 1.03-1.06x
cuBLAS at the four long ones; 32-deep steps win dx_down (1.03x the pick) and tie the weight gradients; 32x6 is never
ahead (finer steps in the same 144 KB do not help). No depth to race: the differences between them are within the
measured choice's own spread (1-5%), so it would pick noise.
"""
from __future__ import annotations

import json
import sys
from dataclasses import replace

import torch
from sweep_timing import first_runs, interleaved_us

from torch_autows.runtime import gemm as rg

# (name, M, N, K, layout): "nt" x @ W^T (W [N, K]), "nn" dy @ W, "tn" dy^T @ x; M = 8 x 2048 tokens
SHAPES = [("qkv", 16384, 6144, 4096, "nt"), ("o", 16384, 4096, 4096, "nt"), ("gate_up", 16384, 28672, 4096, "nt"),
          ("down", 16384, 4096, 14336, "nt"), ("dx_down", 16384, 14336, 4096, "nn"),
          ("dx_gate_up", 16384, 4096, 28672, "nn"), ("dw_o", 4096, 4096, 16384, "tn"),
          ("dw_gate_up", 28672, 4096, 16384, "tn")]
CONFIGS = {"ws_p_128x128": "ws_p_128x128", "k64x4": "ws_p_128x256", "k32x4": "sweep_k32x4", "k32x6": "sweep_k32x6"}


def _operands(m: int, n: int, k: int, layout: str):
    a = torch.randn(k, m, device="cuda", dtype=torch.bfloat16).t() if layout == "tn" else \
        torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t() if layout == "nt" else \
        torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    return a, b / k ** .5


def _shape(name: str, m: int, n: int, k: int, layout: str) -> dict:
    a, b = _operands(m, n, k, layout)
    ref = a.float() @ b.float()
    outs = {c: torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16) for c in ("cublas", *CONFIGS)}
    runs = {"cublas": lambda: torch.mm(a, b, out=outs["cublas"]),
            **{c: (lambda c=c: rg.gemm(a, b, None, torch.bfloat16, config=CONFIGS[c], out=outs[c])) for c in CONFIGS}}
    row = {"case": name, "shape": [m, n, k], "layout": layout, "picked": rg.choose_config(m, n, k), "rel_err": {}}
    failed = first_runs(runs)
    if failed:
        row["failed"] = failed
    for c, o in outs.items():
        row["rel_err"][c] = ((o.float() - ref).norm() / ref.norm()).item()
    del ref
    row["us"] = interleaved_us(runs, failed)
    row["tflops"] = {c: round(2 * m * n * k / v / 1e6, 1) for c, v in row["us"].items()}
    print(row, flush=True)
    return row


def main(path: str) -> None:
    wide = rg.CONFIGS["ws_p_128x256"]
    rg.CONFIGS["sweep_k32x4"] = replace(wide, block_k=32, stages=4)
    rg.CONFIGS["sweep_k32x6"] = replace(wide, block_k=32, stages=6)
    out = {"device": torch.cuda.get_device_name(), "rows": [_shape(*s) for s in SHAPES]}
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
