"""The SwiGLU backward GEMM (runtime.swiglu_bwd) on sm_90 against an fp32 reference: every config, ragged shapes, the
down weight used as is ([K, N] row-major, the training graph's) and as a transposed view, bf16/fp16. Both outputs
are poisoned with NaN before each run, so an unwritten element fails the check. Then the vendor's path the choice
times it against. (The compiled training step whose backward runs the fused op is test_swiglu_gpu.py's
``test_training_step_with_both_swiglu_fusions``.)

These and that step are the tests ``runtime.swiglu_bwd.GPU_CHECKED`` waits for: the measured choice may pick the
kernel only once they have passed on an H100/H200."""
from __future__ import annotations

import pytest
import torch

from torch_autows.runtime import swiglu_bwd as rt

SHAPES = [(64, 128, 64), (100, 1000, 520), (129, 384, 1000), (1000, 2048, 4096), (4096, 1408, 512)]


def _inputs(m, n, k, dtype=torch.bfloat16, transposed=False, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dy = torch.randn(m, k, device="cuda", dtype=dtype, generator=gen)
    w = torch.randn(k, n, device="cuda", dtype=dtype, generator=gen) / k ** 0.5
    if transposed:  # [K, N] as the view of an [N, K] tensor
        w = w.t().contiguous().t()
    g, u = (torch.randn(m, n, device="cuda", dtype=dtype, generator=gen) * 2 for _ in range(2))
    return dy, w, g, u


def _rel(out, ref):
    return ((out.float() - ref).norm() / ref.norm().clamp_min(1e-6)).item()


def _ref(dy, w, g, u):
    dh = dy.float() @ w.float()
    gf = g.float()
    s = torch.sigmoid(gf)
    return dh * u.float() * s * (1 + gf * (1 - s)), dh * gf * s


def _poisoned(m, n, dtype):
    return tuple(torch.full((m, n), float("nan"), device="cuda", dtype=dtype) for _ in range(2))


@pytest.mark.parametrize("transposed", [False, True], ids=["w", "w.t()"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("config", list(rt.CONFIGS))
def test_numerics(config, shape, transposed):
    m, n, k = shape
    dy, w, g, u = _inputs(m, n, k, transposed=transposed)
    out = _poisoned(m, n, torch.bfloat16)
    rt.gemm_swiglu_bwd(dy, w, g, u, config=config, out=out)
    torch.cuda.synchronize()
    for got, ref in zip(out, _ref(dy, w, g, u)):
        assert torch.isfinite(got).all(), "unwritten (NaN) or overflowed elements"
        assert _rel(got, ref) < 1e-2


def test_fp16():
    dy, w, g, u = _inputs(300, 640, 1000, dtype=torch.float16, seed=1)
    out = _poisoned(300, 640, torch.float16)
    rt.gemm_swiglu_bwd(dy, w, g, u, config="auto", out=out)
    torch.cuda.synchronize()
    for got, ref in zip(out, _ref(dy, w, g, u)):
        assert torch.isfinite(got).all() and _rel(got, ref) < 2e-3


def test_vendor_path_of_the_choice_is_the_same_function():
    dy, w, g, u = _inputs(200, 1000, 512, seed=2)
    out = _poisoned(200, 1000, torch.bfloat16)
    rt.vendor_swiglu_bwd(dy, w, g, u, *out)
    for got, ref in zip(out, _ref(dy, w, g, u)):
        assert _rel(got, ref) < 1e-2

