"""The attention rewrite on CPU-traced Dynamo graphs (``support._pretend_target``): SDPA and the explicit forms."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from programs import fake_cuda

from torch_autows import ops
from torch_autows.inductor import support
from torch_autows.inductor.rewrite_attention import find_attention_sites, rewrite_attention
from torch_autows.runtime import attention as rt_attention

OP = torch.ops.autows.attention.default


def sdpa_causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def sdpa_scale(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, None, 0.0, False, scale=0.3)


def sdpa_gqa(q, k, v):
    return F.scaled_dot_product_attention(q, k[:, :2], v[:, :2], is_causal=True, enable_gqa=True)


def hf_llama_eager(q, k, v):  # transformers' eager_attention_forward without a mask
    w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(q.size(-1))
    w = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
    w = F.dropout(w, p=0.1, training=False)
    return torch.matmul(w, v)


def mul_scale(q, k, v):
    return (q @ k.transpose(-2, -1) * 0.25).softmax(-1) @ v


def scaled_q(q, k, v):
    return torch.softmax((q / 4.0) @ k.transpose(-1, -2), dim=-1) @ v


def permuted_k(q, k, v):
    return torch.matmul(torch.softmax(0.5 * torch.matmul(q, k.permute(0, 1, 3, 2)), dim=3), v)


def gpt2_full(q, k, v):
    w = torch.matmul(q, k.transpose(-1, -2))
    w = w / torch.full([], v.size(-1) ** 0.5, dtype=w.dtype, device=w.device)
    return torch.matmul(torch.softmax(w, -1), v)


def no_scale(q, k, v):
    return torch.matmul(torch.softmax(torch.matmul(q, k.transpose(-2, -1)), -1), v)


def k_given_transposed(q, k, v):
    kt = k.transpose(-2, -1).contiguous()  # the graph only holds K^T
    return torch.softmax(q @ kt * 0.3, -1) @ v


def _run(gm, **named):
    """Call a Dynamo graph module: its placeholders are ``L_<arg>_`` in an order of Dynamo's choosing."""
    args = [named[n.target[2:-1]] for n in gm.graph.nodes if n.op == "placeholder"]
    out = gm(*args)
    return out[0] if isinstance(out, (tuple, list)) else out


def sdpa_bool_causal_mask(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(16, 16, dtype=torch.bool).tril())


def hf_additive_causal_mask(q, k, v):  # transformers under torch.compile: a materialised min/0 mask
    pos = torch.arange(16)
    mask = torch.where(pos[None, :] <= pos[:, None], 0.0, torch.finfo(q.dtype).min)[None, None].expand(2, 1, 16, 16)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)


def gpt_masked_fill(q, k, v):
    w = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    w = w.masked_fill(torch.ones(16, 16, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(w, dim=-1) @ v


def explicit_additive_mask(q, k, v):
    mask = torch.full((16, 16), float("-inf")).triu(1)
    return torch.softmax(torch.matmul(q, k.transpose(2, 3)) * 0.3 + mask, dim=-1) @ v


def masked_fill_inf_then_scale(q, k, v):  # a temperature after a -inf mask: -inf * 0.3 is still -inf
    w = (q @ k.transpose(-2, -1)).masked_fill(torch.ones(16, 16, dtype=torch.bool).triu(1), float("-inf")) * 0.3
    return torch.softmax(w, dim=-1) @ v


def min_fill_then_scale(q, k, v):  # finfo.min * 0.5 is still far below float16's lowest
    w = (q @ k.transpose(-2, -1)).masked_fill(torch.ones(16, 16, dtype=torch.bool).triu(1), torch.finfo(q.dtype).min)
    return torch.softmax(w * 0.5, dim=-1) @ v


def additive_min_then_scale(q, k, v):
    mask = torch.full((16, 16), torch.finfo(q.dtype).min).triu(1)
    return torch.softmax((torch.matmul(q, k.transpose(2, 3)) + mask) / 4.0, dim=-1) @ v


FORMS = [sdpa_causal, sdpa_scale, sdpa_gqa, hf_llama_eager, mul_scale, scaled_q, permuted_k, gpt2_full, no_scale,
         k_given_transposed, sdpa_bool_causal_mask, hf_additive_causal_mask, gpt_masked_fill, explicit_additive_mask,
         masked_fill_inf_then_scale, min_fill_then_scale, additive_min_then_scale]
CAUSAL = {sdpa_causal, sdpa_gqa, sdpa_bool_causal_mask, hf_additive_causal_mask, gpt_masked_fill,
          explicit_additive_mask, masked_fill_inf_then_scale, min_fill_then_scale, additive_min_then_scale}


def _qkv(dtype=torch.float32, s=16):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, 4, s, 8, generator=g, dtype=dtype) for _ in range(3)]


@pytest.mark.parametrize("form", FORMS, ids=lambda f: f.__name__)
def test_rewrite_recognises_and_matches_eager(form, pretend, capture):
    q, k, v = _qkv()
    (gm,) = capture(form, q, k, v)
    sites = rewrite_attention(gm.graph)
    gm.recompile()
    assert [s.reason for s in sites] == [None]
    assert sites[0].is_causal == (form in CAUSAL)
    ts = [n.target for n in gm.graph.nodes]
    assert ts.count(OP) == 1
    assert F.scaled_dot_product_attention not in ts and not any("softmax" in str(t) for t in ts)
    out = _run(gm, q=q, k=k, v=v)
    torch.testing.assert_close(out, form(q, k, v), atol=1e-5, rtol=1e-5)
    assert support.site_counters["attention.rewritten"] == 1


def test_site_flags(pretend, capture):
    (gm,) = capture(sdpa_gqa, *_qkv())
    (site,) = find_attention_sites(gm.graph)
    assert (site.kind, site.is_causal, site.enable_gqa, site.scale) == ("sdpa", True, True, None)
    (gm,) = capture(hf_llama_eager, *_qkv())
    (site,) = find_attention_sites(gm.graph)
    assert site.kind == "explicit" and site.scale == pytest.approx(1 / math.sqrt(8))
    (gm,) = capture(scaled_q, *_qkv())
    assert find_attention_sites(gm.graph)[0].scale == pytest.approx(0.25)


def _masked_sdpa(q, k, v):  # a sliding window, not causal
    return F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(16, 16, dtype=torch.bool).tril().triu(-4))


def _masked_explicit(q, k, v):  # a mask made from an input: nothing is proven
    return torch.softmax(q @ k.transpose(-2, -1) * 0.3 + (q[0, 0, :, :1] > 0) * -1e9, -1) @ v


def _weights_returned(q, k, v):
    w = torch.softmax(q @ k.transpose(-2, -1), -1)
    return w @ v, w


def _active_dropout(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)


def _active_dropout_explicit(q, k, v):
    return F.dropout(torch.softmax(q @ k.transpose(-2, -1), -1), p=0.5, training=True) @ v


@pytest.mark.parametrize("form,why", [(_masked_sdpa, "attn_mask"), (_masked_explicit, "mask"),
                                      (_weights_returned, "other users"), (_active_dropout, "dropout"),
                                      (_active_dropout_explicit, "dropout")])
def test_not_rewritten_with_reason(form, why, pretend, capture, log_warnings):
    (gm,) = capture(form, *_qkv())
    sites = rewrite_attention(gm.graph)
    assert len(sites) == 1 and why in sites[0].reason
    assert OP not in [n.target for n in gm.graph.nodes]
    assert any(why in r.getMessage() and "left to Inductor" in r.getMessage() for r in log_warnings.records)


def test_causal_mask_with_dynamic_sizes_is_not_proven(pretend, capture):
    def f(q, k, v):
        S = q.shape[2]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(S, S, dtype=torch.bool).tril())

    q, k, v = _qkv()
    for t in (q, k, v):
        torch._dynamo.mark_dynamic(t, 2)
    (gm,) = capture(f, q, k, v)
    assert "not provably causal" in find_attention_sites(gm.graph)[0].reason


def test_unsupported_dtype_and_device(capture, monkeypatch, request):
    (gm,) = capture(sdpa_causal, *_qkv())
    assert "tensors on cpu" in find_attention_sites(gm.graph)[0].reason  # no pretend: CPU is not sm_90
    from torch_autows import config

    request.getfixturevalue("pretend")
    (gm,) = capture(sdpa_causal, *_qkv(torch.float64))
    assert "float64" in find_attention_sites(gm.graph)[0].reason
    monkeypatch.setattr(config, "attention", False)
    (gm,) = capture(sdpa_causal, *_qkv())
    assert "disabled" in find_attention_sites(gm.graph)[0].reason


def test_missing_runtime_is_a_reason(monkeypatch, capture):
    monkeypatch.setattr(support, "_pretend_target", True)
    monkeypatch.setattr(rt_attention, "support_reason", lambda q, k, v, c, s, check_device: "head_dim 8 too small")
    (gm,) = capture(sdpa_causal, *_qkv())
    assert find_attention_sites(gm.graph)[0].reason == "head_dim 8 too small"
    monkeypatch.setattr(ops, "runtime_module", lambda name: None)  # no triton: the runtime cannot be imported
    (gm,) = capture(sdpa_causal, *_qkv())
    assert "no generated attention kernel" in find_attention_sites(gm.graph)[0].reason


@pytest.mark.parametrize("train", [False, True])
def test_attention_lowers_to_a_direct_extern_call(train, pretend):
    # the compiled wrapper calls the op's body (extern_kernels.autows_attention), not torch.ops.autows through
    # the dispatcher and custom-op layers (lowering.py); on CPU it then falls back to torch at run time
    from torch._inductor.utils import run_and_get_code

    def f(x, w):
        q, k, v = (x @ w).view(2, 64, 3, 4, 32).permute(2, 0, 3, 1, 4)  # a fused QKV projection
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(2, 64, 128)

    x = torch.randn(2, 64, 128, requires_grad=train)
    w = torch.randn(128, 384, requires_grad=train) / 12
    out, code = run_and_get_code(torch.compile(f, backend="autows"), x, w)
    src = "\n".join(code)
    assert "extern_kernels.autows_attention(" in src and "torch.ops.autows.attention.default(" not in src
    ref = f(x, w)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    if train:
        gx, gw = torch.autograd.grad(out.square().sum(), (x, w))
        rx, rw = torch.autograd.grad(ref.square().sum(), (x, w))
        torch.testing.assert_close(gx, rx, atol=1e-3, rtol=1e-3)
        torch.testing.assert_close(gw, rw, atol=1e-3, rtol=1e-3)
    assert support.site_counters["attention.rewritten"] == 1




def _fill_then_tiny_scale(q, k, v):  # reliability-2 D5: masked weight exp(-65504 * 1e-4) = exp(-6.55), not 0
    s = (q @ k.transpose(-2, -1)).masked_fill(torch.ones(16, 16, dtype=torch.bool).triu(1), -65504.0) * 1e-4
    return torch.softmax(s, -1) @ v


def _where_then_tiny_scale(q, k, v):
    keep = torch.ones(16, 16, dtype=torch.bool).tril()
    return torch.softmax(torch.where(keep, q @ k.transpose(-2, -1), -65504.0) / 1e4, -1) @ v


def _half_mask_then_tiny_scale(q, k, v):  # an additive float16 min mask, then a tiny scale
    mask = torch.full((16, 16), torch.finfo(torch.float16).min, dtype=torch.float16).triu(1)
    return torch.softmax((q @ k.transpose(-2, -1) + mask) * 1e-4, -1) @ v


def _negated_around_mask(q, k, v):  # overall scale +1, but the -inf fill becomes +inf
    s = ((q @ k.transpose(-2, -1)) * -1.0).masked_fill(torch.ones(16, 16, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s * -1.0, -1) @ v


@pytest.mark.parametrize("form", [_fill_then_tiny_scale, _where_then_tiny_scale, _half_mask_then_tiny_scale,
                                  _negated_around_mask], ids=lambda f: f.__name__)
def test_scale_after_a_finite_mask_is_not_causal(form, pretend, capture):
    # the causal proof checks the masked logit the softmax sees: fill (or mask) x the scalings after the mask
    (gm,) = capture(form, *_qkv())
    (site,) = rewrite_attention(gm.graph)
    assert "not provably causal" in site.reason and not site.is_causal
    assert OP not in [n.target for n in gm.graph.nodes]


def test_scale_after_a_finite_mask_matches_eager_compiled(pretend):
    q, k, v = _qkv()
    out = torch.compile(_fill_then_tiny_scale, backend="autows")(q, k, v)
    torch.testing.assert_close(out, _fill_then_tiny_scale(q, k, v), atol=1e-5, rtol=1e-5)
    assert support.site_counters["attention.rewritten"] == 0


def test_sdpa_zero_scale_reason(pretend, capture):
    (gm,) = capture(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=0.0), *_qkv())
    (site,) = find_attention_sites(gm.graph)
    assert "scale=0.0" in site.reason and "uniform" in site.reason and "not a constant" not in site.reason


@pytest.mark.parametrize("grad", [False, True])
def test_generated_backward_keeps_a_vendor_site_in_the_graph(grad, pretend, capture):
    """With ``config.attention_backward = "autows"`` a site whose forward goes to the vendor still becomes the op
    when it needs gradients (its autograd runs the generated backward; the forward runs the vendor's kernel inside);
    without gradients it stays Inductor's."""
    from torch_autows import config

    q, k, v = (t.requires_grad_(grad) for t in _qkv(torch.bfloat16))
    with config.patch(choice="vendor", attention_backward="autows"):
        (gm,) = capture(sdpa_causal, q, k, v)
        (site,) = find_attention_sites(gm.graph)
    assert (site.vendor is None) == grad
    if grad:
        assert "generated backward is asked for" in site.choice.why and "forced by config.choice" in site.choice.why
    with config.patch(choice="vendor"):
        (gm,) = capture(sdpa_causal, q, k, v)
        assert "the vendor's kernel is chosen" in find_attention_sites(gm.graph)[0].vendor


def test_a_v_head_dim_of_its_own(pretend, capture):
    """DeepSeek's MLA prefill: q and k of head dim 192, v of 128 (the output takes v's): rewritten and equal to eager,
    as any v head dim SDPA takes (the op serves the pairs the runtime serves and falls back to SDPA for the others,
    whose reason the runtime's check gives)."""
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 2, 16, 192, generator=g) for _ in range(2))
    for dv in (128, 64):
        v = torch.randn(2, 2, 16, dv, generator=g)
        torch._dynamo.reset()  # a second shape would recompile with symbolic sizes
        (gm,) = capture(sdpa_causal, q, k, v)
        sites = rewrite_attention(gm.graph)
        gm.recompile()
        assert [s.reason for s in sites] == [None]
        assert [n.target for n in gm.graph.nodes].count(OP) == 1
        torch.testing.assert_close(_run(gm, q=q, k=k, v=v), sdpa_causal(q, k, v), atol=1e-5, rtol=1e-5)


def test_the_runtime_serves_the_v_head_dims_it_has_configs_for():
    from torch_autows.runtime import attention as rta

    q = fake_cuda(2, 2, 16, 192)
    assert rta.support_reason(q, q, fake_cuda(2, 2, 16, 128), True, check_device=False) is None
    why = rta.support_reason(q, q, fake_cuda(2, 2, 16, 64), True, check_device=False)
    assert "serves a v head dim of its own only as 192/128" in why
    assert rta.choose_config(192, True, 4096, 128) in rta.V_HEAD_DIMS[(192, 128)]
    assert all(rta.serves(c, 192, 128) for c in rta.V_HEAD_DIMS[(192, 128)])
