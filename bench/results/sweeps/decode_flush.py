"""What the bench's L2 flush costs a decode GEMM, and where a training step's GPU time goes (issue 14, 16/17).

GPU only, not a test. (A) ``triton.testing.do_bench`` flushes L2 before every call by zeroing a 256 MB buffer, which
leaves L2 full of dirty lines: the timed kernel's first reads evict them, and HBM writes them back while the kernel
streams its weight. Time cuBLAS, the swap-AB decode configs and a copy of the weight after that write flush, after a
read flush (a sum over the same buffer: L2 left holding clean lines, as between a decode step's GEMMs) and with no
flush (back-to-back calls: host-bound at these sizes, not comparable), CUDA events around each call, median of 40.
(B) The train work's step (4 layers, 8x2048, fwd + bwd + AdamW) under Inductor default and autows, per kernel
(torch.profiler, two steps), with the autows log of every site's decision.

Run from the repository root: ``PYTHONPATH=. python bench/results/sweeps/decode_flush.py OUTDIR [a|b|ab]``; writes
``decode_flush.json``, ``train_kernels.json`` and ``autows_train_log.txt`` there.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import statistics
import sys
import time

import torch

OUT = sys.argv[1]
PARTS = sys.argv[2] if len(sys.argv) > 2 else "ab"
os.makedirs(OUT, exist_ok=True)


def ev_time(fn, flush, reps=40):
    ts = []
    for _ in range(5):
        flush()
        fn()
    torch.cuda.synchronize()
    for _ in range(reps):
        flush()
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        ts.append((s, e))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in ts) * 1e3


def part_a():
    from torch_autows.runtime import gemm as rg

    buf = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
    sink = torch.empty((), dtype=torch.int64, device="cuda")
    flushes = {
        "write": lambda: buf.zero_(),
        "read": lambda: torch.sum(buf, dim=0, out=sink),
        "none": lambda: None,
    }
    rows = []
    for k, n in [(4096, 4096), (4096, 6144), (14336, 4096), (4096, 28672), (8192, 57344)]:
        src = torch.randn(k * n, dtype=torch.bfloat16, device="cuda")
        dst = torch.empty_like(src)
        for m in (1, 16):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            sides = {"cublas": functools.partial(torch.mm, x, w.t(), out=out)}
            if m == 1:
                sides["copy"] = functools.partial(dst.copy_, src)
            for cfg in ("decs_64x128_m16_s1", "decs_128x128_m16_s1", "decs_64x128_m16_s2"):
                try:
                    rg.gemm(x, w.t(), None, torch.bfloat16, config=cfg, out=out)
                    sides[cfg] = functools.partial(rg.gemm, x, w.t(), None, torch.bfloat16, config=cfg, out=out)
                except Exception as e:
                    print("skip", cfg, repr(e)[:200], flush=True)
            for fl_name, fl in flushes.items():
                for side, fn in sides.items():
                    us = ev_time(fn, fl)
                    nbytes = 2 * k * n * (2 if side == "copy" else 1)
                    r = dict(K=k, N=n, M=m, side=side, flush=fl_name, us=us, tbps=nbytes / us / 1e6)
                    rows.append(r)
                    print(f"K={k:5d} N={n:5d} M={m:2d} {side:22s} flush={fl_name:5s} {us:7.1f} us "
                          f"{r['tbps']:.2f} TB/s", flush=True)
    with open(f"{OUT}/decode_flush.json", "w") as f:
        json.dump(rows, f, indent=1)


def part_b():
    from torch.profiler import ProfilerActivity, profile

    from torch_autows.bench.llama import LlamaConfig, build_model
    from torch_autows.bench.model import autows_backend

    log = logging.getLogger("torch_autows")
    log.setLevel(logging.INFO)
    h = logging.FileHandler(f"{OUT}/autows_train_log.txt")
    log.addHandler(h)
    cfg = LlamaConfig(n_layers=4)
    model = build_model(cfg, device="cuda", dtype=torch.bfloat16, seed=0).train()
    x = torch.randn(8, 2048, cfg.hidden, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    opt = torch.optim.AdamW(model.parameters(), lr=0.0)
    res = {}
    for name, kw in (("inductor", {}), ("autows", {"backend": autows_backend()})):
        torch._dynamo.reset()
        cm = torch.compile(model, dynamic=False, **kw)

        def step(cm=cm):
            opt.zero_grad(set_to_none=True)
            cm(x).backward(dy)
            opt.step()

        t0 = time.time()
        step()
        torch.cuda.synchronize()
        print(name, "compiled in", round(time.time() - t0, 1), "s", flush=True)
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(5):
            step()
        e.record()
        torch.cuda.synchronize()
        ms = s.elapsed_time(e) / 5
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(2):
                step()
            torch.cuda.synchronize()
        ks = []
        for ev in prof.key_averages():
            us = getattr(ev, "self_device_time_total", 0.0)
            if us > 0:
                ks.append((ev.key, us / 2 / 1e3, ev.count // 2))
        ks.sort(key=lambda t: -t[1])
        res[name] = {"step_ms": ms, "kernels": ks}
        print(name, f"step {ms:.2f} ms; kernels total {sum(k[1] for k in ks):.2f} ms", flush=True)
        for k in ks[:45]:
            print(f"  {k[1]:8.3f} ms x{k[2]:3d}  {k[0][:150]}", flush=True)
    with open(f"{OUT}/train_kernels.json", "w") as f:
        json.dump(res, f, indent=1)


if "a" in PARTS:
    part_a()
if "b" in PARTS:
    part_b()
