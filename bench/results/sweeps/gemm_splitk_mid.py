"""Split-K on the 128-row tiles (one 8-warp consumer, ``data_partition=1``) for GEMMs of 64-512 rows, issue 14's M =
128/256 cases: the large-GEMM tiles leave SMs idle there (14336x4096 at 256 rows is 64 tiles of 128x128 on 132 SMs:
0.71x cuBLAS in the H200 decode-3 record). nn.Linear's layout (``x @ w.t()``) on the Llama-3 decode weights at M = 64,
128, 256, 512: cuBLAS (``torch.mm`` into a preallocated output), the runtime's current pick and the candidate configs
(added to ``CONFIGS`` here), median of 3 interleaved ``do_bench`` rounds. Numerics first: every candidate on ragged
shapes, NaN-poisoned output, two launches bitwise equal, rel. error < 1e-2 against fp32; a failing config is not
timed. Writes $OUT/gemm_splitk_mid.json. Run from the repository root with ``PYTHONPATH=.``."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import sys
import time

sys.path.insert(0, os.getcwd())
OUT = os.environ.get("OUT", ".")
KN = [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096), (8192, 10240), (8192, 57344), (28672, 8192)]
MS = [64, 128, 256, 512]
ROUNDS = 3


def candidates():
    from torch_autows.ir import Options
    c = {f"wsk_128x128_s{s}": Options(block_m=128, block_n=128, block_k=64, stages=6, data_partition=1,
                                      persistent=True, split_k=s) for s in (1, 2, 3, 4)}
    c.update({f"wsk_128x256_s{s}": Options(block_m=128, block_n=256, block_k=64, stages=4, data_partition=1,
                                           persistent=True, split_k=s) for s in (1, 2)})
    return c


def install():
    from torch_autows.runtime import gemm as rg
    rg.CONFIGS.update(candidates())
    return rg


def _rel(out, ref) -> float:
    return ((out.float() - ref).norm() / ref.norm().clamp_min(1e-6)).item()


def warm(job):
    m, k, n, name = job
    try:
        import torch
        rg = install()
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        rg.gemm(x, w.t(), None, torch.bfloat16, config=name or rg.choose_config(m, n, k), out=out)
        torch.cuda.synchronize()
        return "ok"
    except Exception as e:
        return f"{job}: {type(e).__name__}: {str(e)[:200]}"


def numerics(rg, res) -> set:
    import torch
    bad = set()
    for name in candidates():
        for m, k, n in [(200, 4096, 4096), (64, 1000, 640), (300, 2048, 4104), (129, 8200, 1000)]:
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
            except Exception as e:
                ok = False
                res["errors"].append(dict(cfg=name, M=m, K=k, N=n, err=repr(e)[:400]))
            if not ok:
                bad.add(name)
    return bad


def time_shape(rg, m, k, n, names, res):
    import torch
    from triton.testing import do_bench
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    pick = rg.choose_config(m, n, k)
    fns = {"cublas": lambda: torch.mm(x, w.t(), out=out)}
    for name in dict.fromkeys([pick, *names]):
        try:
            rg.gemm(x, w.t(), None, torch.bfloat16, config=name, out=out)
            fns[name] = lambda name=name: rg.gemm(x, w.t(), None, torch.bfloat16, config=name, out=out)
        except Exception as e:
            res["errors"].append(dict(cfg=name, M=m, K=k, N=n, err=repr(e)[:300]))
    times = {c: [] for c in fns}
    for _ in range(ROUNDS):
        for c, fn in fns.items():
            times[c].append(do_bench(fn, warmup=10, rep=30))
    us = {c: round(1e3 * statistics.median(v), 2) for c, v in times.items()}
    best = min((c for c in us if c in names), key=us.__getitem__, default=None)
    row = dict(M=m, K=k, N=n, pick=pick, us=us, best=best,
               vs_cublas={c: round(us["cublas"] / t, 3) for c, t in us.items()},
               spread={c: round((max(v) - min(v)) / statistics.median(v), 3) for c, v in times.items()})
    print(json.dumps({k: row[k] for k in ("M", "K", "N", "pick", "best", "vs_cublas")}), flush=True)
    return row


def main():
    t0 = time.time()
    from torch_autows.runtime.gemm_configs import choose_config
    picks = {choose_config(m, n, k): (m, k, n) for m in MS for k, n in KN}  # one job a kernel (M, N, K at run time)
    jobs = [(*picks[p], p) for p in picks] + [(256, 4096, 4096, name) for name in candidates()]
    with mp.get_context("spawn").Pool(12) as pool:
        print("warm", [r for r in pool.map(warm, jobs) if r != "ok"], round(time.time() - t0, 1), flush=True)
    import torch
    rg = install()
    res = {"device": torch.cuda.get_device_name(), "numerics": [], "errors": [], "rows": []}
    bad = numerics(rg, res)
    print("numerics bad:", sorted(bad), round(time.time() - t0, 1), flush=True)
    names = [c for c in candidates() if c not in bad]
    for m in MS:
        for k, n in KN:
            res["rows"].append(time_shape(rg, m, k, n, names, res))
            with open(os.path.join(OUT, "gemm_splitk_mid.json"), "w") as f:
                json.dump(res, f, indent=1)
    print("done", round(time.time() - t0, 1), flush=True)


if __name__ == "__main__":
    main()
