"""The SwiGLU backward on 128x256 tiles with its epilogue in column chunks (issue 16, ``Options.epilogue_chunk``).

GPU only, not a test. sweeps/swiglu_bwd_split.py found the fused backward's 128x128 tile 12% slower in its GEMM than
cuBLAS and its epilogue exposed, where a 128x256 tile hid a residual's epilogue; the whole-tile epilogue spilled
~2 KB there, the chunked one none (offline). At each shape, every output against an fp32 reference after NaN
poisoning, then 3 interleaved do_bench rounds, medians (us):

* ``cublas``: ``torch.mm(dy, w)`` (dh alone); ``vendor``: cuBLAS + Inductor's pointwise kernel (the default's path);
* ``fused_128x128``: today's pick (``swiglu_bwd_p_128x128``);
* ``fused_128x256``, ``fused_128x256_k64``: the chunked configs (32-deep K steps x 4 stages, 64-deep x 2: G's and U's
  tiles take 128 KB of SMEM); ``fused_128x256_whole``: the first without chunks (spills);
* ``fused_pp_128x128``, ``fused_pp_128x128_c64`` (added after the run below): two consumers taking turns over whole
  128x128 tiles (``tile_consumers=2``), the epilogue in 32- or 64-column chunks, so one consumer's epilogue runs under
  the other's K loop; ``fused_128x256_prefetch``, ``fused_pp_128x128_prefetch`` / ``_c32_prefetch``: G and U
  loaded at each tile's start (``Options.epilogue_prefetch``): after its K loads the producer runs a few steps ahead,
  too little for 128 KB at an SM's share of HBM bandwidth;
* ``gemm_128x256_k{64,32}``: our plain GEMM on the wide tile, 64-deep x 4 stages and 32-deep x 4 (the K loop's
  ceiling without the epilogue's SMEM).

Run from the repository root: ``PYTHONPATH=. python bench/results/sweeps/swiglu_bwd_wide.py OUT.json``.

On an H100 (sweeps/2026-12-06-h100-swiglu-bwd-wide.json; every output within 1.7e-3 of fp32, none NaN), us, columns
cublas / vendor / fused_128x128 / fused_128x256 / fused_128x256_k64 / fused_128x256_whole / gemm k64 / gemm k32:
16384x14336x4096 2615 / 3374 / 3558 / **3178** / 4266 / 3646 / 2763 / 2678;
4096x14336x4096 684 / 879 / 895 / **821** / 1096 / 927 / 663 / 710;
4096x28672x8192 2653 / 3138 / 3623 / **2961** / 4021 / 3149 / 2935 / 2672.
The chunked 128x256 kernel runs 1.062x / 1.071x / 1.060x the vendor's path (the 128x128 one 0.95 / 0.98 / 0.87x);
chunks take 13% off the spilling whole-tile epilogue; two 64-deep stages starve the K loop (1.3x slower). Its
epilogue is still not hidden: 3178 against 2678 us for the same tile's GEMM alone (+19%), where the vendor's
pointwise kernel costs +29% over cuBLAS.

Second run, with the ping-pong and prefetch forms (sweeps/2026-12-06-h100-swiglu-bwd-wide-2.json, H100, same
tolerances), us at the three shapes: fused_128x256 **3133 / 817 / 2974** (vendor 3427 / 865 / 2997); prefetch 3542 /
917 / 3219; fused_pp_128x128 3913 / 983 / 3897, _c64 3506 / 823 / 3338, _prefetch 3873 / 1030 / 3731, _c32_prefetch
6378 / 1714 / 6333. None beats the chunked 128x256 tile: with one copy of G and U, loading them at the tile's start
puts their 128 KB (free only once the previous tile's epilogue has read them) in front of the tile's first K steps,
and the 128x128 ping-pong tiles give up more in their K loop than hiding the epilogue saves (a 128x128 GEMM tile runs
at 0.91x the 128x256 one on the H200, gemm_configs.py; the 64-column form is the best of them, 1.01-1.12x slower).
"""
from __future__ import annotations

import json
import sys
from dataclasses import replace

import torch
from sweep_timing import first_runs, interleaved_us

from torch_autows.runtime import gemm as rg
from torch_autows.runtime import swiglu_bwd as rt

SHAPES = [(16384, 14336, 4096), (4096, 14336, 4096), (4096, 28672, 8192)]
FUSED = {"fused_128x128": "swiglu_bwd_p_128x128", "fused_128x256": "swiglu_bwd_p_128x256",
         "fused_128x256_k64": "sweep_k64", "fused_128x256_whole": "sweep_whole", "fused_pp_128x128": "sweep_pp",
         "fused_pp_128x128_c64": "sweep_pp_c64", "fused_128x256_prefetch": "sweep_prefetch",
         "fused_pp_128x128_prefetch": "sweep_pp_prefetch", "fused_pp_128x128_c32_prefetch": "sweep_pp_c32_prefetch"}


def _shape(m: int, n: int, k: int) -> dict:
    dy = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(k, n, device="cuda", dtype=torch.bfloat16) / k ** .5
    g, u = (torch.randn(m, n, device="cuda", dtype=torch.bfloat16) * 2 for _ in range(2))
    dh = dy.float() @ w.float()
    s = torch.sigmoid(g.float())
    ref = (dh * u.float() * s * (1 + g.float() * (1 - s)), dh * g.float() * s)
    del dh, s
    outs = {c: tuple(torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(2))
            for c in ("vendor", *FUSED)}
    c_mm = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    runs = {"cublas": lambda: torch.mm(dy, w, out=c_mm),
            "vendor": lambda: rt.vendor_swiglu_bwd(dy, w, g, u, *outs["vendor"]),
            **{c: (lambda c=c: rt.gemm_swiglu_bwd(dy, w, g, u, config=FUSED[c], out=outs[c])) for c in FUSED},
            **{f"gemm_128x256_{x}": (lambda x=x: rg.gemm(dy, w, None, torch.bfloat16, config=f"sweep_g_{x}",
                                                                      out=c_mm))
               for x in ("k64", "k32")}}
    row = {"shape": [m, n, k], "rel_err": {}, "nan": {}}
    failed = first_runs(runs)
    if failed:
        row["failed"] = failed
    for c, o in outs.items():
        row["rel_err"][c] = [((a.float() - r).norm() / r.norm()).item() for a, r in zip(o, ref)]
        row["nan"][c] = any(x.isnan().any().item() for x in o)
    del ref
    if m * n > 10 ** 7:
        row["us"] = interleaved_us(runs, failed)
    print(row, flush=True)
    return row


def main(path: str) -> None:
    wide = rt.CONFIGS["swiglu_bwd_p_128x256"]
    rt.CONFIGS["sweep_whole"] = replace(wide, epilogue_chunk=0)
    rt.CONFIGS["sweep_k64"] = replace(wide, block_k=64, stages=2)
    # two consumers taking turns over whole 128x128 tiles (one's epilogue under the other's K loop), in 32-column
    # chunks (64-column ones spill 144 bytes there): 0 spill bytes offline, 180 KB of SMEM
    rt.CONFIGS["sweep_pp"] = replace(wide, block_n=128, block_k=64, stages=3, data_partition=1, tile_consumers=2,
                                     epilogue_chunk=32)
    # ... in 64-column chunks, whose stores stage in the slices of G and U just read (32-column ones are narrower
    # than a 128-byte swizzle row, so they stage in buffers of their own): 144 spill bytes, 164 KB, a fourth stage
    rt.CONFIGS["sweep_pp_c64"] = replace(rt.CONFIGS["sweep_pp"], epilogue_chunk=64, stages=4)
    # G and U loaded at each tile's start instead of after its K loads (Options.epilogue_prefetch)
    rt.CONFIGS["sweep_prefetch"] = replace(wide, epilogue_prefetch=True)
    # ... under ping-pong with two copies of G and U (tile_buffers=2): with one, the producer would wait at tile t+1's
    # start for tile t's epilogue, and the other consumer's K loop with it (64-column chunks: 144 spill bytes, three
    # stages; 32-column ones: none, but two stages)
    rt.CONFIGS["sweep_pp_prefetch"] = replace(rt.CONFIGS["sweep_pp_c64"], stages=3, tile_buffers=2,
                                              epilogue_prefetch=True)
    rt.CONFIGS["sweep_pp_c32_prefetch"] = replace(rt.CONFIGS["sweep_pp"], tile_buffers=2, epilogue_prefetch=True)
    rg.CONFIGS["sweep_g_k64"] = replace(wide, block_k=64, epilogue_tma=False, epilogue_chunk=0)
    rg.CONFIGS["sweep_g_k32"] = replace(wide, epilogue_tma=False, epilogue_chunk=0)
    out = {"device": torch.cuda.get_device_name(),
           "rows": [_shape(m, n, k) for m, n, k in SHAPES + [(1000, 1000, 200)]]}  # the last: numerics, ragged
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
