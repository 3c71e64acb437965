"""How reproducible the measured choice's verdicts are, and whether pairing the two sides' runs makes them more so.

GPU only, not a test. On an H100 (2026-12-06) the same sites' verdicts moved between runs of the train step (SwiGLU
save 0.85x / 1.04x / 1.09x, attention 1.04x vendor / 1.06x ours, GEMMs 0.93-1.08x) at round spreads of 2-20%, and
the train step's ratio with them (1.015-1.027x). ``runtime.choice._measure`` times each side in blocks (>= 10 runs a
round, 3 rounds, the order alternating), so a change of clocks between blocks is charged to one side. Measured here,
at each site, ``REPEATS`` times in one process:

* ``blocks``: ``choice._measure`` as it is (ratio = vendor / ours medians, round spread, verdict);
* ``paired``: runs of the two sides alternating one by one behind a GPU sleep (flush, ours, flush, vendor, ...), the
  ratio of each adjacent pair, median and inter-quartile range of ``PAIRS`` pairs.

A paired estimator whose ratios spread less across repeats (and agrees with the blocks' median) is the candidate for
``_measure``. Sites: the Llama-3-8B training SwiGLU (16384x14336x4096, saving G and U), a plain projection
(16384x4096x4096, nn.Linear's layout) and the RoPE q projection (a real 0.82x gap: the estimator must keep it).

Run from the repository root: ``PYTHONPATH=. python bench/results/sweeps/choice_noise.py OUT.json``.
"""
from __future__ import annotations

import json
import statistics
import sys

import torch

from torch_autows.runtime import choice
from torch_autows.runtime import gemm as rg
from torch_autows.runtime import gemm_rope as gr
from torch_autows.runtime import swiglu as sw

REPEATS, PAIRS = 6, 30
M, K = 16384, 4096


def _sites() -> dict:
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    bg, bu = (torch.randn(14336, K, device="cuda", dtype=torch.bfloat16).t() for _ in range(2))
    so, sv = ([torch.empty(M, 14336, device="cuda", dtype=torch.bfloat16) for _ in range(3)] for _ in range(2))
    w = torch.randn(4096, K, device="cuda", dtype=torch.bfloat16).t()
    co, cv = (torch.empty(M, 4096, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    cos, sin = (torch.randn(2048, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    return {
        "swiglu_save": (lambda: sw.gemm_swiglu(a, bg, bu, torch.bfloat16, config="auto", out=so[0],
                                               saved=tuple(so[1:])),
                        lambda: sw.vendor_swiglu(a, bg, bu, sv[0], saved=tuple(sv[1:]))),
        "mm_4096": (lambda: rg.gemm(a, w, None, torch.bfloat16, config="auto", out=co),
                    lambda: torch.mm(a, w, out=cv)),
        "rope_q": (lambda: gr.gemm_rope(a, w, cos, sin, None, out=co),
                   lambda: gr.vendor_rope(a, w, cos, sin, None, cv)),
    }


def paired(ours, vendor, pairs: int = PAIRS) -> dict:
    from triton import runtime

    driver = runtime.driver.active
    cache = driver.get_empty_cache_for_benchmark()
    for f in (ours, vendor):
        f()
    torch.cuda.synchronize()
    ev = [[torch.cuda.Event(enable_timing=True) for _ in range(4)] for _ in range(pairs)]
    torch.cuda._sleep(int(0.2 * choice.SM_HZ))
    for i, (s0, e0, s1, e1) in enumerate(ev):
        first, second = (ours, vendor) if i % 2 == 0 else (vendor, ours)
        driver.clear_cache(cache)
        s0.record()
        first()
        e0.record()
        driver.clear_cache(cache)
        s1.record()
        second()
        e1.record()
    torch.cuda.synchronize()
    ratios = []
    for i, (s0, e0, s1, e1) in enumerate(ev):
        t0, t1 = s0.elapsed_time(e0), s1.elapsed_time(e1)
        o, v = (t0, t1) if i % 2 == 0 else (t1, t0)
        ratios.append(v / o)
    q = statistics.quantiles(ratios, n=4)
    return {"ratio": round(statistics.median(ratios), 4), "iqr": [round(q[0], 4), round(q[2], 4)]}


def main(path: str) -> None:
    rows = []
    for name, (ours, vendor) in _sites().items():
        row = {"site": name, "blocks": [], "paired": []}
        for _ in range(REPEATS):
            d = choice._measure(ours, vendor)
            row["blocks"].append({"ratio": round(d.vendor_ms / d.ours_ms, 4), "spread": round(d.spread, 4),
                                  "ours": d.use_ours})
            row["paired"].append(paired(ours, vendor))
        for k in ("blocks", "paired"):
            r = [x["ratio"] for x in row[k]]
            row[f"{k}_ratio_range"] = [min(r), max(r)]
        print(row, flush=True)
        rows.append(row)
    with open(path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
