"""Decode GEMM configs (BM=64 tiles, split-K) against cuBLAS on the Llama-3 decode shapes; numerics of every
config on ragged shapes first (two launches bitwise equal). PERS=1 (default): persistent variants p<BN>x<BK>_sk<S>
(the runtime's dec_<BN>x<BK>_s<S>); PERS=0: one tile per CTA. Writes $OUT/decode_sweep.json (run with PYTHONPATH=.)."""
import itertools
import json
import os
import time

import torch
from triton.testing import do_bench

from torch_autows import config as cfg
from torch_autows.ir import Options
from torch_autows.runtime import gemm as rg

cfg.choice = "autows"
OUT = os.environ.get("OUT", "/tmp")
KN = [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096), (8192, 10240), (8192, 57344), (28672, 8192)]
MS = [1, 16, 64, 128]
variants = {}
PERS = os.environ.get("PERS", "1") == "1"
for bn, bk, lim in [(64, 128, None), (128, 128, None), (128, 64, None), (256, 64, None)]:
    for sk in (1, 2, 3, 4):
        name = f"{'p' if PERS else 'd'}{bn}x{bk}{'_2cta' if lim else ''}_sk{sk}"
        kw = dict(block_m=64, block_n=bn, block_k=bk, stages=12, data_partition=1, persistent=PERS, split_k=sk)
        if lim:
            kw["smem_limit"] = lim
        variants[name] = Options(**kw)
for k, o in variants.items():
    rg.CONFIGS[k] = o
res = {"numerics": [], "timing": [], "errors": []}
dev = "cuda"
torch.manual_seed(0)

def check(name, M, K, N, tb):
    a = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    w = torch.randn(N, K, device=dev, dtype=torch.bfloat16) / K ** 0.5
    b = w.t() if tb else w.t().contiguous()
    ref = (a.float() @ b.float())
    outs = []
    for _rep in range(2):
        out = torch.full((M, N), float("nan"), device=dev, dtype=torch.bfloat16)
        rg.gemm(a, b, None, torch.bfloat16, config=name, out=out)
        torch.cuda.synchronize()
        outs.append(out)
    err = (outs[0].float() - ref).abs().max().item()
    same = torch.equal(outs[0], outs[1])
    ok = err < 0.05 and same and not outs[0].isnan().any().item()
    res["numerics"].append(dict(cfg=name, M=M, K=K, N=N, tb=tb, err=err, deterministic=same, ok=ok))
    return ok

# numerics: every variant on a few ragged shapes, both B layouts
t0 = time.time()
for name in variants:
    ragged = [(1, 4096, 4096), (17, 4096, 1536), (64, 1024, 640), (100, 2048, 4096)]
    for (M, K, N), tb in itertools.product(ragged, (False, True)):
        try:
            check(name, M, K, N, tb)
        except Exception as e:
            res["errors"].append(dict(cfg=name, M=M, K=K, N=N, tb=tb, err=repr(e)[:400]))
print("numerics", time.time() - t0, sum(not r["ok"] for r in res["numerics"]), "bad", len(res["errors"]), "errors",
      flush=True)
bad = {r["cfg"] for r in res["numerics"] if not r["ok"]} | {r["cfg"] for r in res["errors"]}

def t(fn):
    return do_bench(fn, warmup=5, rep=15)

copy_src = torch.empty(512 * 2**20 // 2, device=dev, dtype=torch.bfloat16)
copy_dst = torch.empty_like(copy_src)
ms = t(lambda: copy_dst.copy_(copy_src))
res["copy_tbps"] = 2 * copy_src.numel() * 2 / ms / 1e9
for (K, N), M, tb in itertools.product(KN, MS, (False, True)):
    if tb and M not in (1, 16):
        continue
    a = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    w = torch.randn(N, K, device=dev, dtype=torch.bfloat16) / K ** 0.5
    b = w.t() if tb else w.t().contiguous()
    out = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
    byts = 2 * (M * K + K * N + M * N)
    row = dict(M=M, K=K, N=N, tb=tb)
    row["cublas"] = t(lambda a=a, b=b, out=out: torch.mm(a, b, out=out))
    for name in ["ws_p_128x128"] + [v for v in variants if v not in bad]:
        try:
            rg.gemm(a, b, None, torch.bfloat16, config=name, out=out)
            row[name] = t(lambda a=a, b=b, name=name, out=out:
                          rg.gemm(a, b, None, torch.bfloat16, config=name, out=out))
        except Exception as e:
            res["errors"].append(dict(cfg=name, M=M, K=K, N=N, err=repr(e)[:300]))
    best = min((x for x in row if x[0] in "dp" and x[1].isdigit()), key=lambda x: row[x])
    row["best"] = best
    print(f"M={M} K={K} N={N} tb={tb} cublas {byts / row['cublas'] / 1e9:.2f}TB/s ours {best} "
          f"{byts / row[best] / 1e9:.2f}TB/s ratio {row['cublas'] / row[best]:.3f}", flush=True)
    res["timing"].append(row)
json.dump(res, open(os.path.join(OUT, "decode_sweep.json"), "w"), indent=1)
print("copy", res["copy_tbps"], "total", time.time() - t0)
