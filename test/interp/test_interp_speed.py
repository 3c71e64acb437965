"""The interpreter's own speed, reported (printed, never asserted): 512x512x512 GEMM, 128-wide tiles."""
from __future__ import annotations

import time

import torch

from torch_autows.interp import POLICIES, make_instance, run_partitioned, run_sequential
from torch_autows.passes import pipeline
from torch_autows.runtime.gemm import CONFIGS
from torch_autows.templates.gemm import GemmRequest, build


def test_report_speed_512_cubed(capsys):
    before = build(GemmRequest(512, 512, 512), CONFIGS["ws_p_128x128"])
    after = pipeline.run(before)
    inst = make_instance(after, 0, shape=(512, 512, 512))
    run_partitioned(after, inst.inputs())  # warm up torch
    lines = []
    t = time.perf_counter()
    assert torch.equal(run_sequential(before, inst.inputs())["c"], inst.reference["c"])
    lines.append(f"sequential: {1e3 * (time.perf_counter() - t):.1f} ms")
    for policy in POLICIES:
        stats: dict = {}
        t = time.perf_counter()
        out = run_partitioned(after, inst.inputs(), policy=policy, nprog=2, stats=stats)
        dt = time.perf_counter() - t
        assert torch.equal(out["c"], inst.reference["c"])
        lines.append(f"partitioned {policy}: {1e3 * dt:.1f} ms, {stats['steps']} steps "
                     f"({1e6 * dt / stats['steps']:.1f} us/step), {stats['ctas']} CTAs")
    with capsys.disabled():
        print("\n[interp speed] 512x512x512 bf16 GEMM, ws_p_128x128 (16 tiles, 8 K steps): " + "; ".join(lines))
