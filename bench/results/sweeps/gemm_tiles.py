"""GEMM shapes of the examples (gpt2_block, llama_decoder): both tiles and cuBLAS, median of 3 interleaved rounds.

Run on the GPU machine: ``PYTHONPATH=. python bench/results/sweeps/gemm_tiles.py``; it prints one line per shape.
"""
import statistics

import torch
import triton

from torch_autows.runtime import gemm as rt

shapes = [(8192, 2304, 768), (8192, 768, 768), (8192, 3072, 768), (8192, 768, 3072),
          (4096, 2048, 2048), (4096, 512, 2048), (4096, 5632, 2048), (4096, 2048, 5632)]
for M, N, K in shapes:
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(N, K, device="cuda", dtype=torch.bfloat16).t()
    fns = {"cublas": lambda a=a, b=b: torch.mm(a, b)}
    for cfg in ("ws_p_128x128", "ws_p_128x256"):
        fns[cfg] = lambda cfg=cfg, a=a, b=b: rt.gemm(a, b, None, torch.bfloat16, config=cfg)
    ts = {k: [] for k in fns}
    for _ in range(3):
        for k, f in fns.items():
            ts[k].append(triton.testing.do_bench(f, rep=50))
    m = {k: statistics.median(v) * 1e3 for k, v in ts.items()}
    print(f"gemm {M}x{N}x{K}: cublas {m['cublas']:.1f} us; 128x128 {m['ws_p_128x128']:.1f}; 128x256 "
          f"{m['ws_p_128x256']:.1f}; picked {rt.choose_config(M, N, K)}", flush=True)
