"""The attention fallback's fused SDPA kernels on the GPU: out and lse against the fp32 math, for a head dim the
generated kernel does not serve (80) and two it serves in wider tiles or where runtime.choice finds SDPA's pick
faster (96, 256), causal or not, grouped k/v heads, Sq != Skv; the public op falls back for 80 and 160."""
from __future__ import annotations

import pytest
import torch

from torch_autows import ops, sdpa_fallback
from torch_autows.runtime import fallback


@pytest.mark.parametrize("d", [80, 96, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hq,hkv,sq,skv", [(8, 8, 256, 256), (8, 2, 256, 256), (8, 2, 200, 320), (4, 1, 1, 77)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_fallback_matches_fp32(d, causal, hq, hkv, sq, skv, dtype):
    g = torch.Generator(device="cuda").manual_seed(d + hq + sq)
    q = torch.randn(2, hq, sq, d, device="cuda", dtype=dtype, generator=g)
    k, v = (torch.randn(2, hkv, skv, d, device="cuda", dtype=dtype, generator=g) for _ in range(2))
    scale = d ** -0.5
    kind = sdpa_fallback.fused_kernel(q, k, v, causal, scale)
    assert kind in ("cudnn", "flash", "efficient")
    out, lse = sdpa_fallback.fused_attention(kind, q, k, v, causal, scale)
    want, want_lse = sdpa_fallback.math_attention(q.float(), k.float(), v.float(), causal, scale)
    assert out.shape == q.shape and out.dtype == dtype
    assert lse.shape == (2, hq, sq) and lse.dtype == torch.float32
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, want_lse, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("d", [80, 160])
def test_public_op_falls_back_to_a_fused_kernel(d):
    fallback.reset()
    q, k, v = (torch.randn(1, 4, 512, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out, lse = ops.attention(q, k, v, is_causal=True)
    assert fallback.counters["attention.fallback"] == 1
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out, want, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, sdpa_fallback.math_attention(q.float(), k.float(), v.float(), True,
                                                                 d ** -0.5)[1], atol=2e-3, rtol=2e-3)
