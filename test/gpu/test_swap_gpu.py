"""Swap-AB decode GEMMs on sm_90 (``decs_*`` configs, named with ``config=``): nn.Linear's ``x @ w.t() (+ bias)`` for a
few rows against an fp32 reference, every config, ragged M, N and K, bf16/fp16, fp32 output; NaN-poisoned outputs
(an unwritten element fails); split-K launches repeat bit for bit; what the configs refuse."""
from __future__ import annotations

import pytest
import torch

from torch_autows.runtime import fallback
from torch_autows.runtime import gemm as rt

SWAP = [c for c, o in rt.CONFIGS.items() if o.swap_ab]


def _rel(out, ref):
    return ((out.float() - ref).norm() / ref.norm().clamp_min(1e-6)).item()


@pytest.mark.parametrize("m", [1, 5, 16, 33, 64, 100])
@pytest.mark.parametrize("config", SWAP)
def test_linear_layout(config, m):
    g = torch.Generator(device="cuda").manual_seed(m)
    n, k = (1000, 3000) if m % 2 else (4096, 4096)  # ragged N (a partial weight tile) and K (a partial K step)
    dtype = torch.float16 if m in (5, 64) else torch.bfloat16
    x = torch.randn(m, k, device="cuda", dtype=dtype, generator=g)
    w = torch.randn(n, k, device="cuda", dtype=dtype, generator=g) / k ** 0.5  # nn.Linear's weight [N, K]
    bias = torch.randn(n, device="cuda", dtype=dtype, generator=g) if m != 16 else None
    out_dtype = torch.float32 if m == 33 else dtype
    ref = x.float() @ w.float().t() + (bias.float() if bias is not None else 0)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=out_dtype)
    rt.gemm(x, w.t(), bias, out_dtype, config=config, out=out)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all(), "unwritten (NaN) elements"
    assert _rel(out, ref) < 1e-2
    again = rt.gemm(x, w.t(), bias, out_dtype, config=config)  # the bound (address-only) launch, a fresh output
    torch.cuda.synchronize()
    assert torch.equal(again, out)


@pytest.mark.parametrize("config", [c for c in SWAP if rt.CONFIGS[c].split_k > 1])
def test_split_launches_repeat_bitwise(config, repeated_split_launches):
    x = torch.randn(13, 3000, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1000, 3000, device="cuda", dtype=torch.bfloat16) / 3000 ** 0.5
    repeated_split_launches(lambda out: rt.gemm(x, w.t(), None, torch.bfloat16, config=config, out=out), (13, 1000),
                            x.float() @ w.float().t(), 1e-2)


def test_refusals():
    x = torch.randn(8, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(fallback.Unsupported, match="is swap-AB"):
        rt.gemm(x, w.t().contiguous(), None, torch.bfloat16, config="decs_64x128_m16_s1")
    a = torch.randn(2, 64, 256, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2, 256, 512, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(fallback.Unsupported, match="is swap-AB, which serves 2-D GEMMs"):
        rt.bmm(a, b, torch.bfloat16, config="decs_64x128_m16_s1")
    with pytest.raises(fallback.Unsupported, match="does not serve a residual"):
        rt.gemm(x, w.t(), None, torch.bfloat16, config="decs_64x128_m64_s2", residual=torch.randn_like(x @ w.t()))
