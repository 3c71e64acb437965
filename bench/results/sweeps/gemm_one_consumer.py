"""The 128x128 tile as one 8-warp consumer (``data_partition=1``, ``wsk_128x128_s1`` in gemm_splitk_mid.py) against
the two 64-row consumers of ``ws_p_128x128`` (what ``_large_config`` picks for narrow N and short grids), 128x256 and
cuBLAS, at the shapes where 128x128 tiles are picked or near it, both weight layouts (``x @ w`` and ``x @ w.t()``);
median of 3 interleaved ``do_bench`` rounds, numerics first (NaN-poisoned output, rel. error < 1e-2 against fp32).
Writes $OUT/gemm_one_consumer.json. Run from the repository root with ``PYTHONPATH=.``."""
from __future__ import annotations

import json
import os
import statistics
import sys

sys.path.insert(0, os.getcwd())
OUT = os.environ.get("OUT", ".")
SHAPES = [(8192, 768, 3072), (8192, 3072, 768), (16384, 1024, 4096), (8192, 1536, 4096), (4096, 4096, 4096),
          (2048, 4096, 4096), (1024, 4096, 4096), (1024, 14336, 4096), (2048, 2048, 2048), (16384, 768, 768)]
ROUNDS = 3


def main():
    import torch
    from triton.testing import do_bench

    from torch_autows.ir import Options
    from torch_autows.runtime import gemm as rg
    rg.CONFIGS["wsk_128x128_s1"] = Options(block_m=128, block_n=128, block_k=64, stages=6, data_partition=1,
                                           persistent=True)
    names = ["ws_p_128x128", "wsk_128x128_s1", "ws_p_128x256"]
    res = {"device": torch.cuda.get_device_name(), "rows": []}

    def case(m, n, k, trans):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
        b = w.t() if trans else w.t().contiguous()
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        ref = x.float() @ b.float()
        fns = {"cublas": lambda: torch.mm(x, b, out=out)}
        err = {}
        for name in names:
            o = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            rg.gemm(x, b, None, torch.bfloat16, config=name, out=o)
            err[name] = ((o.float() - ref).norm() / ref.norm()).item()
            if err[name] < 1e-2:
                fns[name] = lambda name=name: rg.gemm(x, b, None, torch.bfloat16, config=name, out=out)
        times = {c: [] for c in fns}
        for _ in range(ROUNDS):
            for c, f in fns.items():
                times[c].append(do_bench(f, warmup=10, rep=40))
        us = {c: round(1e3 * statistics.median(v), 2) for c, v in times.items()}
        row = dict(M=m, N=n, K=k, nt=trans, pick=rg.choose_config(m, n, k), us=us, err=err,
                   vs_cublas={c: round(us["cublas"] / t, 3) for c, t in us.items()},
                   spread={c: round((max(v) - min(v)) / statistics.median(v), 3) for c, v in times.items()})
        print(json.dumps({q: row[q] for q in ("M", "N", "K", "nt", "pick", "vs_cublas")}), flush=True)
        return row

    for m, n, k in SHAPES:
        for trans in (False, True):
            res["rows"].append(case(m, n, k, trans))
            with open(os.path.join(OUT, "gemm_one_consumer.json"), "w") as f:
                json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
