"""The attention fallback picks torch's fused SDPA kernels as SDPA would (checked on CPU with fake CUDA
tensors and a patched device capability) and normalises their (out, lse); CPU runs the explicit math."""
from __future__ import annotations

import pytest
import torch
from programs import fake_cuda
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode

from torch_autows import ops, sdpa_fallback
from torch_autows.runtime import device

ATEN = {"cudnn": "_scaled_dot_product_cudnn_attention", "flash": "_scaled_dot_product_flash_attention",
        "efficient": "_scaled_dot_product_efficient_attention"}


@pytest.fixture
def sm90(monkeypatch):
    """An sm_90 GPU with cuDNN 9.10 (torch keeps its default order: flash, efficient, math, cuDNN)."""
    monkeypatch.setattr(device, "capability", lambda idx: (9, 0))
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91000)
    monkeypatch.setattr(torch._C, "_get_sdp_priority_order", lambda: [1, 2, 0, 3, 4])
    return monkeypatch


def _qkv(d, sq=64, skv=64, hq=8, hkv=8, dtype=torch.bfloat16):
    return tuple(fake_cuda(2, h, s, d, dtype=dtype) for h, s in ((hq, sq), (hkv, skv), (hkv, skv)))


class _Record(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _aten_ops(kind, d, hq=8, hkv=8, causal=False):
    """The aten ops ``fused_attention(kind, ...)`` runs (on meta tensors: no GPU needed)."""
    q, k, v = (torch.empty(2, h, 40, d, dtype=torch.bfloat16, device="meta") for h in (hq, hkv, hkv))
    with _Record() as rec:
        out, lse = sdpa_fallback.fused_attention(kind, q, k, v, causal, d ** -0.5)
    assert out.shape == (2, hq, 40, d) and lse.shape == (2, hq, 40) and lse.dtype == torch.float32
    return rec.names


@pytest.mark.parametrize("d", [96, 256])
def test_bf16_sm90_runs_flash_with_torchs_default_order(sm90, d):
    assert sdpa_fallback.fused_kernel(*_qkv(d), False) == "flash"
    assert sdpa_fallback.fused_kernel(*_qkv(d, hkv=2), True) == "flash"  # GQA, causal square
    assert ATEN["flash"] in _aten_ops("flash", d)


@pytest.mark.parametrize("d,want", [(96, "cudnn"), (128, "cudnn"), (256, "flash")])
def test_cudnn_first_where_torch_prefers_it(sm90, d, want):
    sm90.setattr(torch.backends.cudnn, "version", lambda: 91600)  # newer than 9.15: torch puts cuDNN first
    assert sdpa_fallback.fused_kernel(*_qkv(d, hkv=2), True) == want
    assert ATEN[want] in _aten_ops(want, d, hkv=2)


def test_causal_non_square_and_fp32_take_efficient(sm90):
    assert sdpa_fallback.fused_kernel(*_qkv(96, sq=40, skv=64), True) == "efficient"  # flash: Sq == Skv only
    assert sdpa_fallback.fused_kernel(*_qkv(96, dtype=torch.float32), False) == "efficient"
    names = _aten_ops("efficient", 96, hkv=2, causal=True)
    assert ATEN["efficient"] in names and "expand" in names[:names.index(ATEN["efficient"])]  # GQA k/v expanded


def test_math_where_no_fused_kernel_applies(sm90):
    assert sdpa_fallback.fused_kernel(*_qkv(6, dtype=torch.float32), False) is None  # fp32 needs d % 4
    assert sdpa_fallback.fused_kernel(*_qkv(64, sq=0), False) is None
    with sdpa_kernel([SDPBackend.MATH]):
        assert sdpa_fallback.fused_kernel(*_qkv(96), False) is None
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
        assert sdpa_fallback.fused_kernel(*_qkv(96), False) == "efficient"
    sm90.setattr(device, "capability", lambda idx: (7, 5))  # no bf16 kernels before sm_80
    assert sdpa_fallback.fused_kernel(*_qkv(96), False) is None


@pytest.mark.parametrize("scale", [0.0, -0.1])
def test_non_positive_scales_take_the_math(sm90, scale):
    # the fused kernels return NaN there on the H200 (attention sweep): scale 0 times masked -inf scores,
    # flash's running max taken before a negative scale
    assert sdpa_fallback.fused_kernel(*_qkv(96), False) == "flash"
    assert sdpa_fallback.fused_kernel(*_qkv(96), False, scale) is None
    assert sdpa_fallback.fused_kernel(*_qkv(80, hkv=2), True, scale) is None


def test_flash_pads_head_dims_to_a_multiple_of_8():
    names = _aten_ops("flash", 100)
    assert ATEN["flash"] in names and "constant_pad_nd" in names


def test_cpu_runs_the_explicit_math(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a fused kernel was chosen on CPU")

    monkeypatch.setattr(sdpa_fallback, "fused_attention", boom)
    q, k, v = torch.randn(3, 1, 2, 16, 96, dtype=torch.bfloat16)
    assert sdpa_fallback.fused_kernel(q, k, v, True) is None
    out, lse = ops.attention(q, k, v, is_causal=True)
    want = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)
    assert lse.dtype == torch.float32 and lse.shape == (1, 2, 16)
