"""Numerics of the generated GEMM on sm_90 against an fp32 reference: >= 200 random cases.

Shapes with tails, both operand layouts, bias, bmm, bf16/fp16, fp32 output, every runtime config.
Outputs are poisoned with NaN before each run, so an unwritten element fails the check.
"""
from __future__ import annotations

import random

import pytest
import torch

import torch_autows
from torch_autows.runtime import fallback
from torch_autows.runtime import gemm as rt


def _cases(n=240, seed=0):
    rng = random.Random(seed)
    dims = [1, 7, 8, 16, 64, 100, 127, 128, 129, 200, 255, 256, 257, 384, 500, 512, 640, 1000, 1024, 1536, 2048]
    out = []
    for i in range(n):
        m, k = rng.choice(dims), rng.choice(dims)
        n_ = rng.choice([d for d in dims if d % 8 == 0])
        out.append(dict(m=m, n=n_, k=k, dtype=rng.choice([torch.bfloat16, torch.float16]),
                        ta=rng.random() < 0.3, tb=rng.random() < 0.3, bias=rng.random() < 0.3,
                        out32=rng.random() < 0.1, config=list(rt.CONFIGS)[i % len(rt.CONFIGS)]))
    return out


def _operand(rows, cols, dtype, trans):
    if trans:  # a transposed view of a row-major [cols, rows] tensor, with a TMA-legal row stride
        pad = (-rows) % 8
        return torch.randn(cols, rows + pad, device="cuda", dtype=dtype)[:, :rows].t()
    pad = (-cols) % 8
    return torch.randn(rows, cols + pad, device="cuda", dtype=dtype)[:, :cols]


def _rel(out, ref):
    return ((out.float() - ref).norm() / ref.norm().clamp_min(1e-6)).item()


@pytest.mark.parametrize("case", _cases(), ids=lambda c: f"{c['m']}x{c['n']}x{c['k']}-{c['config']}")
def test_gemm_random(case):
    torch.manual_seed(hash(str(case)) % 2**31)
    a = _operand(case["m"], case["k"], case["dtype"], case["ta"])
    b = _operand(case["k"], case["n"], case["dtype"], case["tb"])
    bias = torch.randn(case["n"], device="cuda", dtype=case["dtype"]) if case["bias"] else None
    out_dtype = torch.float32 if case["out32"] else case["dtype"]
    ref = a.float() @ b.float() + (bias.float() if bias is not None else 0)
    out = torch.full((case["m"], case["n"]), float("nan"), device="cuda", dtype=out_dtype)
    rt.gemm(a, b, bias, out_dtype, config=case["config"], out=out)
    torch.cuda.synchronize()
    assert out.dtype == out_dtype and out.shape == (case["m"], case["n"])
    assert torch.isfinite(out).all(), "unwritten (NaN) or overflowed elements"
    assert _rel(out, ref) < 1e-2


@pytest.mark.parametrize("config,shape", [  # configs that tile the shape (split-K serves 2-D GEMMs only)
    (c, s) for c, o in rt.CONFIGS.items() for s in [(4, 256, 512, 128), (32, 128, 128, 64), (3, 384, 256, 320)]
    if o.split_k == 1 and s[1] % o.block_m == 0 and s[3] % o.block_k == 0])
def test_bmm(config, shape):
    B, M, N, K = shape
    a = torch.randn(B, M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(B, K, N, device="cuda", dtype=torch.bfloat16)
    out = torch.full((B, M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    rt.bmm(a, b, torch.bfloat16, config=config, out=out)
    assert torch.isfinite(out).all()
    assert _rel(out, torch.bmm(a.float(), b.float())) < 1e-2


def test_ops_served_and_counted():
    fallback.reset()
    a = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(256, 384, device="cuda", dtype=torch.bfloat16)
    out = torch_autows.ops.gemm(a, b)
    assert fallback.counters["gemm.autows"] == 1
    assert _rel(out, a.float() @ b.float()) < 1e-2


def test_unsupported_falls_back_with_reason(caplog):
    fallback.reset()
    a = torch.randn(64, 13, device="cuda", dtype=torch.bfloat16)  # row stride 26 B: not TMA-legal
    b = torch.randn(13, 64, device="cuda", dtype=torch.bfloat16)
    with caplog.at_level("WARNING", logger="torch_autows"):
        out = torch_autows.ops.gemm(a, b)
    assert fallback.counters["gemm.fallback"] == 1
    assert "TMA" in caplog.text
    torch.testing.assert_close(out, a @ b)
