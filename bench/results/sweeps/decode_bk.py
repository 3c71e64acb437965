"""Deeper K steps for the swap-AB decode tiles (issue 14): does reading more of each weight row per step lift the
weight bandwidth at a few rows?

GPU only, not a test. At 1-16 rows cuBLAS and our swap-AB pick both stream a large weight at ~3.4 TB/s (H200
decode-5: m1-4096x28672 69.4 us for 235 MB), where a plain copy reaches ~4.3. A [block_n, 128] K step reads 256
bytes of each of its block_n weight rows (nn.Linear's [N, K] row-major weight: rows K*2 bytes apart), as two
64-column TMA boxes; 132 SMs doing so touch 132 x block_n DRAM rows at once in 256-byte pieces. With 256 or 512
columns a step each row is read 512 B / 1 KB at a time (4 / 8 boxes issued back to back), fewer rows open per byte,
at the price of a shallower ring (SMEM: 12 stages of 64x128 → 5 of 64x256 → 2 of 64x512, memory_plan lowers them).
What should move if DRAM locality is what caps it: the M <= 16 rows of the big weights (K 4096-28672), toward the copy
ceiling; nothing if the cap is elsewhere (the L2 flush's write-back, HBM itself).

The configs are registered here, in this process only (runtime.gemm.CONFIGS), as the product's decs_* tiles with
block_k 256 / 512; numerics first (decode_swap.numerics: ragged shapes, two launches bitwise equal, within 1e-2 of
fp32, no NaN left), then decode_swap.time_shape (cuBLAS, the current pick, the new configs and the product's two
unsplit 16-row swap tiles, 3 interleaved do_bench rounds, medians). Run from the repository root:
``PYTHONPATH=. python bench/results/sweeps/decode_bk.py OUT.json [ROWS]`` (ROWS: comma-separated M values, default
1,8,16; the record sweeps/2026-12-05-h100-decode-bk.json holds a run of each default and one of 32,64).

On an H100 (that record), at 1-16 rows against the product's best 128-deep swap tile: the 64x256 tile 0.992-1.062x on
five of the six shapes (one point behind; most at 14336x4096: 2.17-2.19 against 2.06 TB/s), the 128x256 one
1.018-1.026x at 8192x10240; at 32 rows the best of them 0.985-1.013x, at 64 0.93-0.97x (rows the m16 tiles are
not for); 64x512 and split 2 never the best.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import replace

import decode_swap
import torch

from torch_autows.runtime import gemm as rg

KN = [(4096, 28672), (8192, 57344), (14336, 4096), (28672, 8192), (4096, 6144), (8192, 10240)]  # (K, N)
BASE = "decs_64x128_m16_s1"
NEW = {f"decs_{bn}x{bk}_m16_s{s}": replace(rg.CONFIGS[BASE], block_n=bn, block_k=bk, split_k=s)
       for bn, bk, s in [(64, 256, 1), (128, 256, 1), (64, 512, 1), (64, 256, 2)]}
OLD = ["decs_64x128_m16_s1", "decs_128x128_m16_s1"]


def main(path: str, rows: list[int]) -> None:
    torch.manual_seed(0)
    rg.CONFIGS.update(NEW)
    decode_swap.SWAP = list(NEW)
    res: dict = {"device": torch.cuda.get_device_name(), "rounds": decode_swap.ROUNDS, "numerics": [], "errors": [],
                 "timing": [], "new": {n: [o.block_n, o.block_k, o.split_k] for n, o in NEW.items()}}
    t0 = time.time()
    bad = decode_swap.numerics(res)
    print(f"numerics: {len(NEW) - len(bad)}/{len(NEW)} ok ({time.time() - t0:.0f} s); bad: {sorted(bad)}", flush=True)
    names = OLD + [c for c in NEW if c not in bad]
    for (k, n), m in [(kn, m) for kn in KN for m in rows]:
        row = decode_swap.time_shape(m, k, n, names, res)
        ms = row["ms"]
        tb = row["tbps"] = {c: 2 * k * n / t / 1e9 for c, t in ms.items()}
        res["timing"].append(row)
        old = min((c for c in OLD if c in ms), key=ms.__getitem__)
        new = min((c for c in NEW if c in ms), key=ms.__getitem__, default=None)
        line = f"M={m:3d} K={k:5d} N={n:5d}  cublas {tb['cublas']:.2f}  {old} {tb[old]:.2f} TB/s"
        if new:
            line += (f"  {new} {tb[new]:.2f} TB/s ({ms[old] / ms[new]:.3f}x the old tile, "
                     f"{ms['cublas'] / ms[new]:.3f}x cublas)")
        print(line, flush=True)
        with open(path, "w") as f:  # after every shape: a run cut short keeps what it measured
            json.dump(res, f, indent=1)
    print(f"total {time.time() - t0:.0f} s; wrote {path}")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: PYTHONPATH=. python bench/results/sweeps/decode_bk.py OUT.json [ROWS]")
    main(sys.argv[1], [int(m) for m in (sys.argv[2] if len(sys.argv) == 3 else "1,8,16").split(",")])
