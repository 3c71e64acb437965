"""Reliability of the public ops and the custom ops: NaN/Inf propagation (D1), gradients on the kernel path
(D2), empty shapes (D9), shape checks in the fake impls (D11), registration at package import (D13)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from torch_autows import ops
from torch_autows.attention_grad import _math_backward, reference_attention
from torch_autows.runtime import fallback

ATT = torch.ops.autows.attention


@pytest.fixture(autouse=True)
def _reset():
    fallback.reset()


def _softmax_ref(q, k, v, is_causal=False):
    """The explicit softmax in the inputs' dtype (what SDPA's math backend computes)."""
    s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    if is_causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).tril().logical_not(), float("-inf"))
    return torch.softmax(s, -1) @ v


def _poisoned():
    """(name, q, k, v) with NaN/Inf in q or k: SDPA and the explicit softmax give NaN rows there."""
    g = torch.Generator().manual_seed(0)
    base = [torch.randn(1, 2, 16, 32, generator=g) for _ in range(3)]
    cases = []
    for name, t, idx, val in (("nan in q", 0, (0, 0, 0, 0), float("nan")), ("nan in k", 1, (0, 0, 5, 0), float("nan")),
                              ("-inf k row", 1, (0, 0, 3, slice(None)), float("-inf")),
                              ("+inf score", 0, (0, 0, 0, slice(None)), 1e38)):
        q, k, v = (x.clone() for x in base)
        (q, k, v)[t][idx] = val
        cases.append(pytest.param(q, k, v, id=name))
    return cases


@pytest.mark.parametrize("q,k,v", _poisoned())
def test_nan_and_inf_in_q_or_k_give_nan_like_softmax(q, k, v):
    want = torch.isnan(_softmax_ref(q, k, v))
    assert want.any()
    for name, (out, _) in (("ops.attention", ops.attention(q, k, v)), ("autows::attention", ATT(q, k, v)),
                           ("reference_attention", reference_attention(q, k, v, False, 32 ** -0.5))):
        assert torch.equal(torch.isnan(out), want), name


def test_nan_in_q_gives_nan_output_row_repro():
    q, k, v = torch.randn(3, 1, 1, 16, 32)
    q[0, 0, 0, 0] = float("nan")
    assert torch.isnan(ops.attention(q, k, v)[0][0, 0, 0]).all()


def test_math_backward_keeps_nan():
    q, k, v = torch.randn(3, 1, 2, 8, 16, dtype=torch.float64)
    q[0, 0, 1, 0] = float("nan")
    out, lse = reference_attention(q, k, v, False, 0.25)
    dq, dk, dv = _math_backward(torch.ones_like(out), None, q, k, v, out, lse, False, 0.25)
    assert torch.isnan(dq[0, 0, 1]).all() and torch.isnan(dv[0, 0]).any()
    assert not torch.isnan(dq[0, 1]).any()  # the other head is untouched


def test_fully_masked_rows_are_zero():
    q = torch.randn(1, 2, 5, 16)
    kv = torch.randn(1, 2, 0, 16)
    out, lse = ops.attention(q, kv, kv)
    assert out.shape == (1, 2, 5, 16) and torch.equal(out, torch.zeros_like(out))
    assert torch.isneginf(lse).all()


# --- D2: gradients when the generated kernel serves the call (emulated on CPU) ---


@pytest.fixture
def served(monkeypatch):
    """The runtimes 'serve' every call: they return fresh tensors torch computed, without autograd (what a
    kernel launch returns)."""
    from torch_autows.runtime import attention as rta
    from torch_autows.runtime import device
    from torch_autows.runtime import gemm as rtg

    monkeypatch.setattr(device, "sm90_reason", lambda *a, **k: None)

    def gemm(a, b, bias, out_dtype, **kw):
        with torch.no_grad():
            out = a.float() @ b.float() + (bias.float() if bias is not None else 0)
        return out.to(out_dtype)

    def bmm(a, b, out_dtype, **kw):
        with torch.no_grad():
            return torch.bmm(a.float(), b.float()).to(out_dtype)

    def attention(q, k, v, is_causal, scale, **kw):
        with torch.no_grad():
            out, lse = ops.torch_attention(q, k, v, is_causal, scale)
        return rta.empty_out(q).copy_(out), lse

    monkeypatch.setattr(rtg, "gemm", gemm)
    monkeypatch.setattr(rtg, "bmm", bmm)
    monkeypatch.setattr(rta, "attention", attention)


def _grads(fn, *inputs):
    xs = [x.detach().clone().requires_grad_() for x in inputs]
    out = fn(*xs)
    outs = out if isinstance(out, tuple) else (out,)
    assert all(o.requires_grad for o in outs)
    torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
    return [x.grad for x in xs]


def test_gemm_and_bmm_served_are_differentiable(served):
    a, b, bias = torch.randn(8, 16), torch.randn(16, 4), torch.randn(4)
    got = _grads(lambda a, b, c: ops.gemm(a, b, c), a, b, bias)
    want = _grads(lambda a, b, c: torch.addmm(c, a, b), a, b, bias)
    assert fallback.counters["gemm.autows"] >= 1
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    A, B = torch.randn(2, 8, 16), torch.randn(2, 16, 4)
    for g, w in zip(_grads(ops.bmm, A, B), _grads(torch.bmm, A, B)):
        torch.testing.assert_close(g, w)
    assert fallback.counters["bmm.autows"] >= 1


@pytest.mark.parametrize("is_causal,hkv", [(False, 4), (True, 2)])
def test_attention_served_is_differentiable(served, is_causal, hkv):
    q, k, v = torch.randn(2, 4, 8, 16), torch.randn(2, hkv, 8, 16), torch.randn(2, hkv, 8, 16)
    got = _grads(lambda q, k, v: ops.attention(q, k, v, is_causal=is_causal, enable_gqa=True), q, k, v)

    def ref(q, k, v):
        s = q @ k.repeat_interleave(4 // hkv, 1).transpose(-2, -1) * 0.25
        if is_causal:
            s = s.masked_fill(torch.ones(8, 8, dtype=torch.bool).tril().logical_not(), float("-inf"))
        return torch.softmax(s, -1) @ v.repeat_interleave(4 // hkv, 1), torch.logsumexp(s, -1)

    assert fallback.counters["attention.autows"] >= 1
    for g, w in zip(got, _grads(ref, q, k, v)):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_no_grad_calls_stay_off_the_custom_op(served):
    a = torch.randn(8, 16, requires_grad=True)
    with torch.no_grad():
        out = ops.gemm(a, torch.randn(16, 4))
    assert not out.requires_grad


# --- D9: empty attention shapes ---


def _empty_cases():
    q, kv = torch.randn(2, 4, 16, 8), torch.randn(2, 4, 12, 8)
    return [pytest.param(q[:, :, :0], kv, kv, False, id="Sq=0"),
            pytest.param(q[..., :0], kv[..., :0], kv[..., :0], False, id="D=0"),
            pytest.param(q[:, :0], kv[:, :0], kv[:, :0], True, id="Hq=Hkv=0"),
            pytest.param(q[:0], kv[:0], kv[:0], False, id="B=0"),
            pytest.param(q, kv[:, :, :0], kv[:, :, :0], False, id="Skv=0")]


@pytest.mark.parametrize("q,k,v,gqa", _empty_cases())
def test_empty_attention_shapes_match_sdpa(q, k, v, gqa):
    want = F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
    for out, lse in (ops.attention(q, k, v, enable_gqa=gqa), ATT(q, k, v, False, None, gqa)):
        assert out.shape == want.shape and lse.shape == q.shape[:3] and lse.dtype == torch.float32
        torch.testing.assert_close(out, want)
    with FakeTensorMode() as mode:
        fq, fk, fv = (mode.from_tensor(t) for t in (q, k, v))
        for out, lse in (ops.attention(fq, fk, fv, enable_gqa=gqa), ATT(fq, fk, fv, False, None, gqa)):
            assert out.shape == want.shape and lse.shape == q.shape[:3]
    torch.library.opcheck(ATT.default, (q, k, v, False, None, gqa))


def test_no_kv_heads_with_q_heads_is_a_value_error():
    q, kv = torch.randn(2, 4, 16, 8), torch.randn(2, 0, 12, 8)
    for call in (lambda: ops.attention(q, kv, kv, enable_gqa=True), lambda: ATT(q, kv, kv, False, None, True)):
        with pytest.raises(ValueError, match="0 heads"):
            call()
    with FakeTensorMode() as mode, pytest.raises(ValueError, match="0 heads"):
        ATT(mode.from_tensor(q), mode.from_tensor(kv), mode.from_tensor(kv), False, None, True)


# --- D11: the fakes check shapes as the real ops do ---


def _mismatches():
    a, q = torch.empty(7, 5), torch.randn(2, 4, 16, 8)
    k3, k12, v10 = torch.randn(2, 3, 16, 8), torch.randn(2, 4, 12, 8), torch.randn(2, 4, 10, 8)
    return [pytest.param(torch.ops.autows.gemm, (a, torch.empty(6, 3)), "a.shape\\[1\\] must equal", id="gemm K"),
            pytest.param(torch.ops.autows.bmm, (torch.empty(2, 7, 5), torch.empty(2, 6, 3)), "\\[B, K, N\\]",
                         id="bmm K"),
            pytest.param(ATT, (q, k3, k3, False, None, True), "multiple of k/v heads", id="gqa 4/3"),
            pytest.param(ATT, (q, k12, v10, False, None, False), "do not match", id="k/v lengths"),
            pytest.param(ATT, (torch.randn(4, 8, 16), k12, k12, False, None, False), "q must be 4-D", id="3-D q")]


@pytest.mark.parametrize("op,args,match", _mismatches())
def test_custom_ops_and_fakes_raise_the_same_value_error(op, args, match):
    with pytest.raises(ValueError, match=match):
        op(*args)
    with FakeTensorMode() as mode, pytest.raises(ValueError, match=match):
        op(*(mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in args))


# --- D13: import torch_autows registers the ops; a saved export loads in a fresh process ---


def test_export_load_in_a_fresh_process_after_import_torch_autows(tmp_path):
    class M(torch.nn.Module):
        def forward(self, x, w):
            h = torch.ops.autows.gemm(x.flatten(0, 2), w).view(x.shape)
            return torch.ops.autows.attention(h, x, x, True, None, False)[0]

    x, w = torch.randn(1, 2, 8, 16), torch.randn(16, 16)
    path = tmp_path / "ep.pt2"
    torch.export.save(torch.export.export(M(), (x, w)), str(path))
    torch.save((x, w, M()(x, w)), str(tmp_path / "io.pt"))
    code = textwrap.dedent(f"""
        import sys, torch, torch_autows
        assert "torch._inductor.lowering" not in sys.modules
        x, w, want = torch.load({str(tmp_path / "io.pt")!r})
        got = torch.export.load({str(path)!r}).module()(x, w)
        torch.testing.assert_close(got, want)
        print("ok")
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-2000:]
