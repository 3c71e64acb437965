"""Swap-AB decode configs (``decs_*``, issue 14) against cuBLAS and the current pick on the Llama-3 decode shapes.

GPU only, not a test. nn.Linear's layout (``x @ w.t()``, the layout the swap configs serve) at M = 1/8/16/32/64
rows: cuBLAS (``torch.mm`` into a preallocated output), the runtime's current choice (``choose_config``, a
``dec_*`` tile) and every swap config, each timed with ``do_bench`` in 3 interleaved rounds (every contender once
per round, so clock and thermal drift hit all alike), the median kept. A numerics check first: every swap config on
ragged shapes, two launches bitwise equal and within 1e-2 relative error of fp32; a config that fails it is not timed.
Writes JSON to argv[1] and prints one line per shape: cuBLAS, the current pick and the best swap config, with the
weight-traffic TB/s of each. Run from the repository root: ``PYTHONPATH=. python bench/results/sweeps/decode_swap.py
$OUT/decode_swap.json``.
"""
from __future__ import annotations

import json
import statistics
import sys
import time

import torch
from triton.testing import do_bench

from torch_autows.runtime import gemm as rg

KN = [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096), (8192, 10240), (8192, 57344), (28672, 8192)]  # (K, N)
MS = [1, 8, 16, 32, 64]
ROUNDS = 3
SWAP = [c for c, o in rg.CONFIGS.items() if o.swap_ab]


def _rel(out, ref) -> float:
    return ((out.float() - ref).norm() / ref.norm().clamp_min(1e-6)).item()


def numerics(res: dict) -> set[str]:
    """Every swap config on ragged shapes (two launches bitwise equal, rel. error < 1e-2, nothing left NaN); the
    names of those that fail."""
    bad = set()
    for name in SWAP:
        for m, k, n in [(1, 4096, 4096), (17, 4096, 1536), (64, 1000, 640), (33, 2048, 4104)]:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
            try:
                outs = []
                for _ in range(2):
                    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
                    rg.gemm(x, w.t(), None, torch.bfloat16, config=name, out=out)
                    outs.append(out)
                torch.cuda.synchronize()
                err, same = _rel(outs[0], x.float() @ w.float().t()), torch.equal(outs[0], outs[1])
                ok = err < 1e-2 and same and not outs[0].isnan().any().item()
                res["numerics"].append(dict(cfg=name, M=m, K=k, N=n, rel=err, deterministic=same, ok=ok))
            except Exception as e:  # a config that fails to build or launch: recorded, not timed
                ok = False
                res["errors"].append(dict(cfg=name, M=m, K=k, N=n, err=repr(e)[:400]))
            if not ok:
                bad.add(name)
    return bad


def time_shape(m: int, k: int, n: int, names: list[str], res: dict) -> dict:
    """Median of ROUNDS interleaved do_bench rounds (ms) of cuBLAS, the current pick and ``names`` at one shape."""
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    pick = rg.choose_config(m, n, k)
    fns = {"cublas": lambda: torch.mm(x, w.t(), out=out)}
    for name in [pick, *names]:
        try:
            rg.gemm(x, w.t(), None, torch.bfloat16, config=name, out=out)  # compile and bind outside the timing
            fns[name] = lambda name=name: rg.gemm(x, w.t(), None, torch.bfloat16, config=name, out=out)
        except Exception as e:
            res["errors"].append(dict(cfg=name, M=m, K=k, N=n, err=repr(e)[:300]))
    times: dict[str, list[float]] = {c: [] for c in fns}
    for _ in range(ROUNDS):
        for c, fn in fns.items():
            times[c].append(do_bench(fn, warmup=10, rep=30))
    ms = {c: statistics.median(v) for c, v in times.items()}
    row = dict(M=m, K=k, N=n, pick=pick, ms=ms, rounds=times)
    swaps = [c for c in ms if c in names]
    row["best_swap"] = min(swaps, key=ms.__getitem__) if swaps else None
    return row


def main(path: str) -> None:
    torch.manual_seed(0)
    res: dict = {"device": torch.cuda.get_device_name(), "rounds": ROUNDS, "numerics": [], "errors": [], "timing": []}
    t0 = time.time()
    bad = numerics(res)
    print(f"numerics: {len(SWAP) - len(bad)}/{len(SWAP)} swap configs ok ({time.time() - t0:.0f} s); bad: "
          f"{sorted(bad)}", flush=True)
    names = [c for c in SWAP if c not in bad]
    for (k, n), m in [(kn, m) for kn in KN for m in MS]:
        row = time_shape(m, k, n, names, res)
        weight = 2 * k * n  # bytes of the weight, the traffic that bounds a decode GEMM
        tb = row["tbps"] = {c: weight / t / 1e9 for c, t in row["ms"].items()}
        best, pick, ms = row["best_swap"], row["pick"], row["ms"]
        res["timing"].append(row)
        line = f"M={m:3d} K={k:5d} N={n:5d}  cublas {tb['cublas']:.2f} TB/s"
        if pick in ms:
            line += f"  pick {pick} {tb[pick]:.2f} ({ms['cublas'] / ms[pick]:.3f}x cublas)"
        if best:
            line += f"  best swap {best} {tb[best]:.2f} ({ms['cublas'] / ms[best]:.3f}x cublas)"
        print(line, flush=True)
        with open(path, "w") as f:  # after every shape: a run cut short keeps what it measured
            json.dump(res, f, indent=1)
    print(f"total {time.time() - t0:.0f} s; wrote {path}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: PYTHONPATH=. python bench/results/sweeps/decode_swap.py OUT.json")
    main(sys.argv[1])
