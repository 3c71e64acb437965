"""Backward of ``autows::attention`` against eager autograd (CPU: the math backward; fp64 gradcheck)."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import torch_autows.custom_ops  # noqa: F401  (registers torch.ops.autows.*)
from torch_autows.attention_grad import cudnn_backward_ok, flash_backward_ok

attention = torch.ops.autows.attention


def _inputs(dtype, hq=4, hkv=4, sq=8, skv=8, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g, dtype=dtype).requires_grad_()  # noqa: E731
    return mk(2, hq, sq, d), mk(2, hkv, skv, d), mk(2, hkv, skv, d)


CASES = [  # (hq, hkv, sq, skv, causal, scale)
    (4, 4, 8, 8, False, None),
    (4, 4, 8, 8, True, None),
    (4, 2, 8, 8, True, 0.3),      # GQA
    (4, 4, 6, 10, True, None),    # causal, Sq != Skv (top-left, as SDPA)
    (2, 1, 10, 6, False, 1.0),    # MQA, Sq > Skv
]


@pytest.mark.parametrize("hq,hkv,sq,skv,causal,scale", CASES)
def test_gradcheck_fp64(hq, hkv, sq, skv, causal, scale):
    q, k, v = _inputs(torch.float64, hq, hkv, sq, skv, d=4)
    fn = lambda q, k, v: attention(q, k, v, causal, scale, hq != hkv)[0]  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v), atol=1e-6)


@pytest.mark.parametrize("hq,hkv,sq,skv,causal,scale", CASES)
def test_grads_match_sdpa_fp32(hq, hkv, sq, skv, causal, scale):
    q, k, v = _inputs(torch.float32, hq, hkv, sq, skv)
    out, lse = attention(q, k, v, causal, scale, hq != hkv)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=hq != hkv)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    g = torch.randn_like(out)
    ours = torch.autograd.grad(out, (q, k, v), g)
    theirs = torch.autograd.grad(ref, (q, k, v), g)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_lse_gradient():
    """A gradient flowing into lse (not used by the rewrite, but part of the op's contract)."""
    q, k, v = _inputs(torch.float64, sq=8, skv=8, d=4)
    scale = 0.5

    def ref(q, k, v):
        s = (q @ k.transpose(-2, -1)) * scale
        s = s.masked_fill(~torch.ones(8, 8, dtype=torch.bool).tril(), -math.inf)
        return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)

    out, lse = attention(q, k, v, True, scale, False)
    r_out, r_lse = ref(q, k, v)
    torch.testing.assert_close(lse, r_lse.float(), atol=1e-6, rtol=1e-6)
    go, gl = torch.randn_like(out), torch.randn_like(r_lse)
    ours = torch.autograd.grad((out, lse), (q, k, v), (go, gl.float()))
    theirs = torch.autograd.grad((r_out, r_lse), (q, k, v), (go, gl))
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_opcheck():
    q, k, v = _inputs(torch.float32, 4, 2)
    torch.library.opcheck(attention.default, (q, k, v, True, None, True))
    # [B, S, H, D] views as models produce them: the output takes q's layout, in the fake as in the kernel
    qt, kt, vt = (t.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_() for t in (q, k, v))
    torch.library.opcheck(attention.default, (qt, kt, vt, True, None, True))
    assert attention(qt, kt, vt, True, None, True)[0].transpose(1, 2).is_contiguous()
    a, b, bias = torch.randn(8, 16, requires_grad=True), torch.randn(16, 4, requires_grad=True), torch.randn(4)
    torch.library.opcheck(torch.ops.autows.gemm.default, (a, b, bias, None))
    torch.library.opcheck(torch.ops.autows.bmm.default, (a[None].detach(), b[None].detach(), None))


def test_flash_backward_only_where_contract_matches():
    q = torch.empty(1, 2, 8, 64, dtype=torch.float16)
    k = torch.empty(1, 2, 16, 64, dtype=torch.float16)
    assert not flash_backward_ok(q, k, False, None)  # CPU: never
    assert not cudnn_backward_ok(q, k, False, None)
    if torch.cuda.is_available():
        qc, kc = q.cuda(), k.cuda()
        assert flash_backward_ok(qc, kc, False, None)
        assert not flash_backward_ok(qc, kc, True, None)             # causal, Sq != Skv: alignment differs
        assert not flash_backward_ok(qc, qc, False, torch.ones(1))   # grad into lse
        assert not flash_backward_ok(qc.float(), kc.float(), False, None)


def test_cudnn_backward_call_matches_the_op_schema():
    # the call the cuDNN path makes, on meta tensors (no GPU): grouped k/v heads as they are, lse as [B, H, S, 1]
    from torch_autows.attention_grad import _cudnn_backward

    q = torch.empty(2, 8, 64, 128, device="meta", dtype=torch.bfloat16)
    k = torch.empty(2, 2, 64, 128, device="meta", dtype=torch.bfloat16).transpose(1, 2).contiguous().transpose(1, 2)
    out, lse = torch.empty_like(q), torch.empty(2, 8, 64, device="meta")
    dq, dk, dv = _cudnn_backward(torch.empty_like(q), q, k, k, out, lse, True, 0.1)
    assert dq.shape == q.shape and dk.shape == dv.shape == k.shape


def test_cudnn_backward_not_for_one_query_and_one_key(monkeypatch):
    """cuDNN's backward refuses Sq = Skv = 1 ("s_q = s_kv = 1 is not supported", cuDNN 9.19 on the H200): that call
    goes to flash. Fake CUDA tensors on a patched sm_90 with cuDNN 9.19."""
    from programs import fake_cuda

    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91900)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))

    def cuda(s):
        return fake_cuda(2, 4, s, 64)

    assert cudnn_backward_ok(cuda(2), cuda(2), True, None) and cudnn_backward_ok(cuda(1), cuda(3), False, None)
    assert not cudnn_backward_ok(cuda(1), cuda(1), True, None)
    assert flash_backward_ok(cuda(1), cuda(1), True, None)
