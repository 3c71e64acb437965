"""Ping-pong over tiles (``tile_consumers=2``) against cuBLAS and today's tiles on the large GEMMs (H200), TFLOP/s.

cuBLAS, ws_p_128x256, ws_p_128x128 and the ping-pong configs ws_pp2_128x128 / ws_pp2_64x256, on square shapes and
the Llama-3 8B projections (M = tokens), B as nn.Linear's weight (a transposed view of [N, K]); the median of 3
interleaved ``do_bench`` rounds per peer, each output checked against an fp32 matmul first.

Run on the GPU machine: ``PYTHONPATH=. python bench/results/sweeps/gemm_pingpong.py out.json``; it prints one line
per shape and writes the rows as JSON to the path given.
"""
import json
import statistics
import sys

import torch
import triton

from torch_autows.runtime import gemm as rt

SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 14336, 4096), (8192, 4096, 14336), (16384, 4096, 4096),
          (16384, 6144, 4096)]
CONFIGS = ("ws_p_128x256", "ws_p_128x128", "ws_pp2_128x128", "ws_pp2_64x256")
ROUNDS = 3


def main(path: str) -> None:
    rows = []
    for M, N, K in SHAPES:
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(N, K, device="cuda", dtype=torch.bfloat16).t()
        ref = (a.float() @ b.float())
        fns = {"cublas": lambda a=a, b=b: torch.mm(a, b)}
        fns.update({cfg: (lambda cfg=cfg, a=a, b=b: rt.gemm(a, b, None, torch.bfloat16, config=cfg))
                    for cfg in CONFIGS})
        row = {"shape": f"{M}x{N}x{K}", "chosen": rt.choose_config(M, N, K)}
        for name, fn in list(fns.items()):  # a config that fails is recorded, not timed
            try:
                out = fn()
                torch.cuda.synchronize()
                row[name + "_err"] = ((out.float() - ref).norm() / ref.norm()).item()
            except Exception as e:
                row[name] = repr(e)[:200]
                del fns[name]
        times = {name: [] for name in fns}
        for _ in range(ROUNDS):  # interleaved: clock and thermal drift hit every peer alike
            for name, fn in fns.items():
                times[name].append(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))
        flop = 2 * M * N * K
        for name, ts in times.items():
            row[name] = round(flop / statistics.median(ts) / 1e9, 1)
        rows.append(row)
        print(f"gemm {M}x{N}x{K}: " + "; ".join(f"{name} {row[name]}" for name in ("cublas", *CONFIGS))
              + f" TFLOP/s; picked {row['chosen']}", flush=True)
        del a, b, ref
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: PYTHONPATH=. python bench/results/sweeps/gemm_pingpong.py <out.json>")
    main(sys.argv[1])
