"""Public API: invalid arguments raise TypeError/ValueError; valid CPU calls fall back with a logged reason."""
from __future__ import annotations

import pytest
import torch
from programs import fake_cuda

import torch_autows
from torch_autows.runtime import fallback
from torch_autows.runtime.gemm import support_reason


@pytest.fixture(autouse=True)
def _reset():
    fallback.reset()


def test_gemm_invalid_arguments():
    a = torch.randn(4, 8)
    with pytest.raises(TypeError, match="torch.Tensor"):
        torch_autows.ops.gemm([[1.0]], a)
    with pytest.raises(ValueError, match="2-D"):
        torch_autows.ops.gemm(a[0], a)
    with pytest.raises(ValueError, match="a.shape\\[1\\] must equal b.shape\\[0\\]"):
        torch_autows.ops.gemm(a, a)
    with pytest.raises(TypeError, match="dtype torch.int64"):
        torch_autows.ops.gemm(a.long(), a.t().long())
    with pytest.raises(TypeError, match="cast them to one dtype"):
        torch_autows.ops.gemm(a, a.t().double().float().half())
    with pytest.raises(ValueError, match="bias must have shape"):
        torch_autows.ops.gemm(a, a.t(), bias=torch.randn(3))
    with pytest.raises(TypeError, match="out_dtype"):
        torch_autows.ops.gemm(a, a.t(), out_dtype="bf16")
    with pytest.raises(ValueError, match="\\[B, M, K\\]"):
        torch_autows.ops.bmm(torch.randn(2, 3, 4), torch.randn(3, 4, 5))


def test_gemm_cpu_falls_back_with_reason(caplog):
    a, b, bias = torch.randn(33, 17), torch.randn(17, 9), torch.randn(9)
    with caplog.at_level("WARNING", logger="torch_autows"):
        out = torch_autows.ops.gemm(a, b, bias=bias)
        torch_autows.ops.gemm(a, b, bias=bias)
    torch.testing.assert_close(out, torch.addmm(bias, a, b))
    assert fallback.counters["gemm.fallback"] == 2 and fallback.counters["gemm.autows"] == 0
    assert caplog.text.count("tensors on cpu; the generated kernels run on CUDA sm_90 GPUs") == 1  # logged once


def test_bmm_cpu_falls_back():
    a, b = torch.randn(3, 5, 7), torch.randn(3, 7, 2)
    torch.testing.assert_close(torch_autows.ops.bmm(a, b), torch.bmm(a, b))
    assert fallback.counters["bmm.fallback"] == 1


def test_attention_invalid_and_fallback(caplog):
    q = torch.randn(2, 4, 16, 8)
    kv = torch.randn(2, 2, 16, 8)
    with pytest.raises(ValueError, match="enable_gqa=True"):
        torch_autows.ops.attention(q, kv, kv)
    with pytest.raises(TypeError, match="is_causal"):
        torch_autows.ops.attention(q, q, q, is_causal=1)
    with caplog.at_level("WARNING", logger="torch_autows"):
        out, lse = torch_autows.ops.attention(q, kv, kv, is_causal=True, enable_gqa=True)
    ref = torch.nn.functional.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert lse.shape == (2, 4, 16) and lse.dtype == torch.float32
    assert "attention: falling back to torch" in caplog.text


def test_support_reasons_on_meta_like_inputs():
    a = torch.empty(64, 64, dtype=torch.bfloat16)
    assert "cpu" in support_reason(a, a)


def test_bmm_support_reason_reports_tiling_and_strides():
    b = fake_cuda(4, 64, 128)
    assert "M must be a multiple of 128" in support_reason(fake_cuda(4, 100, 64), b, check_device=False)
    a = fake_cuda(4, 128, 64)
    assert support_reason(a, b, check_device=False) is None
    interleaved = fake_cuda(128, 4, 64).transpose(0, 1)  # [B, M, K] with batches not contiguous
    assert "batches contiguous" in support_reason(interleaved, b, check_device=False)


def test_gemm_support_reasons_on_fake_cuda_tensors():
    a = fake_cuda(64, 13)
    assert "TMA needs" in support_reason(a, fake_cuda(13, 64), check_device=False)
    assert "multiple of 16 bytes" in support_reason(fake_cuda(64, 64), fake_cuda(64, 12), check_device=False)
    assert support_reason(fake_cuda(64, 64), fake_cuda(64, 64).t(), check_device=False) is None  # B^T view


def test_attention_support_reasons_on_fake_cuda_tensors():
    from torch_autows.runtime.attention import support_reason as attn_reason

    for d in (80, 32, 512):  # not served: torch SDPA
        q = fake_cuda(1, 2, 64, d)
        assert f"head_dim {d} not served" in attn_reason(q, q, q, check_device=False)
    for d in (64, 96, 192, 256):  # 96 and 192 in tiles of 128 and 256 columns
        q = fake_cuda(1, 2, 64, d)
        assert attn_reason(q, q, q, check_device=False) is None, d
    q = fake_cuda(1, 2, 64, 128)
    assert attn_reason(q, q, q, check_device=False) is None
    assert "float32" in attn_reason(q.float(), q.float(), q.float(), check_device=False)
    assert "cpu" in attn_reason(torch.randn(1, 2, 4, 64), torch.randn(1, 2, 4, 64), torch.randn(1, 2, 4, 64))
