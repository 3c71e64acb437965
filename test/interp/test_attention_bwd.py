"""The attention backward's main kernel (templates/attention_bwd.py) between the torch pre/postprocess
(its host side), and the separate form (the main kernel with ``dq="none"`` + templates/attention_bwd_dq.py), run by
the sequential interpreter in fp32 against ``attention_grad``'s math backward."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from torch_autows.attention_grad import attention_backward, reference_attention
from torch_autows.interp import Violation, run_sequential
from torch_autows.ir import Options, walk
from torch_autows.templates import attention_bwd as rt
from torch_autows.templates import attention_bwd_dq as rt_dq
from torch_autows.templates.attention_bwd import AttentionBwdRequest, build
from torch_autows.templates.attention_bwd_dq import AttentionBwdDqRequest


def _problem(d, Sq, Skv, Hq, Hkv, causal, grad_lse, B=1, seed=0, bshd=False):
    gen = torch.Generator().manual_seed(seed)

    def rnd(*s):
        return torch.randn(*s, generator=gen)
    if bshd:  # the [B, S, H, D] memory layout models have before their transpose
        q, k, v = (rnd(B, s, h, d).transpose(1, 2) for s, h in ((Sq, Hq), (Skv, Hkv), (Skv, Hkv)))
    else:
        q, k, v = rnd(B, Hq, Sq, d), rnd(B, Hkv, Skv, d), rnd(B, Hkv, Skv, d)
    scale = d ** -0.5
    out, lse = reference_attention(q, k, v, causal, scale)
    go = rnd(*out.shape)
    gl = rnd(*lse.shape) if grad_lse else None
    return q, k, v, out, lse, go, gl, scale


def _run(program, q, k, v, out, lse, go, gl, scale, causal):
    delta, lse2 = rt.preprocess(out, go, lse, gl)
    vals = rt.kernel_values(q, k, v, go, delta, lse2, causal, scale, program.options.block_n, fill=float("nan"))
    run_sequential(program, vals)
    return rt.gradients(vals, scale, q, k)


def _run_separate(main, dq_kernel, q, k, v, out, lse, go, gl, scale, causal):
    """The separate form: the main kernel without dQ, then the dQ kernel; dK/dV and dQ NaN-poisoned before."""
    delta, lse2 = rt.preprocess(out, go, lse, gl)
    vals = rt.kernel_values(q, k, v, go, delta, lse2, causal, scale, main.options.block_n, fill=float("nan"),
                            dq="none")
    assert "dq_acc" not in vals
    run_sequential(main, vals)
    dq_vals = rt_dq.kernel_values(q, k, v, go, delta, lse2, causal, scale, fill=float("nan"))
    run_sequential(dq_kernel, dq_vals)
    B, Hkv, Skv, D = k.shape
    return rt_dq.gradient(dq_vals, q), vals["dk"].view(B, Hkv, Skv, D), vals["dv"].view(B, Hkv, Skv, D)


# (d, Sq, Skv, Hq, Hkv, causal, grad_lse, BM, BN): lengths off the tiles, causal with Sq <, =, > Skv, G 1/2/4
CASES = [
    (64, 63, 130, 2, 1, False, False, 32, 32),
    (64, 130, 63, 2, 1, True, True, 32, 32),
    (64, 63, 130, 4, 1, True, False, 32, 32),
    (64, 200, 200, 2, 2, True, False, 16, 32),
    (128, 130, 130, 1, 1, True, True, 32, 16),
    (128, 63, 200, 4, 2, False, True, 32, 32),
    (64, 1, 200, 1, 1, True, False, 32, 32),
    (64, 200, 1, 2, 1, True, True, 32, 32),
    (128, 1, 1, 1, 1, False, False, 32, 32),
]


@pytest.mark.parametrize("d,Sq,Skv,Hq,Hkv,causal,grad_lse,BM,BN", CASES)
def test_main_kernel_matches_the_math_backward(d, Sq, Skv, Hq, Hkv, causal, grad_lse, BM, BN):
    prob = _problem(d, Sq, Skv, Hq, Hkv, causal, grad_lse, B=2 if Hq == 1 else 1)
    q, k, v, out, lse, go, gl, scale = prob
    program = build(AttentionBwdRequest(d, "f32", causal), Options(block_m=BM, block_n=BN, data_partition=1))
    got = _run(program, *prob, causal)
    ref = attention_backward(go, gl, q, k, v, out, lse, causal, scale)
    for name, a, b in zip(("dq", "dk", "dv"), got, ref):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-4), (name, float((a - b).abs().max()))


@pytest.mark.parametrize("d,Sq,Skv,Hq,Hkv,causal,grad_lse,BM,BN", CASES)
def test_separate_form_matches_the_math_backward(d, Sq, Skv, Hq, Hkv, causal, grad_lse, BM, BN):
    """dK/dV from the main kernel without dQ, dQ from the dQ kernel (its tiles: BN x BM, queries on rows)."""
    prob = _problem(d, Sq, Skv, Hq, Hkv, causal, grad_lse, B=2 if Hq == 1 else 1, seed=1)
    q, k, v, out, lse, go, gl, scale = prob
    main = build(AttentionBwdRequest(d, "f32", causal, dq="none"), Options(block_m=BM, block_n=BN, data_partition=1))
    dq_kernel = rt_dq.build(AttentionBwdDqRequest(d, "f32", causal), Options(block_m=BN, block_n=BM, data_partition=1))
    got = _run_separate(main, dq_kernel, *prob, causal)
    ref = attention_backward(go, gl, q, k, v, out, lse, causal, scale)
    for name, a, b in zip(("dq", "dk", "dv"), got, ref):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-4), (name, float((a - b).abs().max()))


def test_main_kernel_without_dq_has_four_gemms_and_no_adds():
    """``dq="none"`` leaves out the dS SMEM tile, its transposed view, the dQ mma and the atomic adds (and the
    workspace argument); the default program keeps them."""
    opts = Options(block_m=64, block_n=64, data_partition=1)
    full, nodq = (build(AttentionBwdRequest(64, "bf16", True, dq=f), opts) for f in ("atomic", "none"))
    kinds = [[o.kind for o in walk(p.body)] for p in (full, nodq)]
    assert [k.count("mma") for k in kinds] == [5, 4]
    assert [k.count("smem_store") + k.count("atomic_add_ptr") for k in kinds] == [2, 0]
    assert [k.count("trans") for k in kinds] == [3, 2]  # Q^T, dO^T (and dS's view)
    assert "dq_acc" in {a.name for a in full.args} and "dq_acc" not in {a.name for a in nodq.args}
    assert nodq.name == full.name + "_nodq"
    assert build(AttentionBwdRequest(64, "bf16", True), opts) == full  # the default is the atomic form


def test_dq_kernel_alone_in_16_bit_with_transposed_layouts():
    """dQ in bf16 from [B, S, H, D] q/k/v (the dQ kernel's store is [B, H, S, D] contiguous), GQA, causal."""
    q, k, v, out, lse, go, gl, scale = _problem(128, 70, 90, 4, 2, True, True, B=2, bshd=True)
    q, k, v, go = (t.to(torch.bfloat16) for t in (q, k, v, go))
    out = out.to(torch.bfloat16)
    program = rt_dq.build(AttentionBwdDqRequest(128, "bf16", True), Options(block_m=32, block_n=32, data_partition=1))
    delta, lse2 = rt.preprocess(out, go, lse, gl)
    vals = rt_dq.kernel_values(q, k, v, go, delta, lse2, True, scale, fill=float("nan"))
    run_sequential(program, vals)
    dq = rt_dq.gradient(vals, q)
    ref = attention_backward(go.float(), gl, q.float(), k.float(), v.float(), out.float(), lse, True, scale)[0]
    assert dq.dtype == torch.bfloat16 and dq.is_contiguous()
    assert torch.allclose(dq.float(), ref, rtol=3e-2, atol=3e-2), float((dq.float() - ref).abs().max())


def test_transposed_layouts_and_16_bit_operands():
    """q/k/v in the [B, S, H, D] memory layout, bf16 operands (P and dS rounded as the GPU rounds them)."""
    q, k, v, out, lse, go, gl, scale = _problem(64, 70, 90, 4, 2, True, True, B=2, bshd=True)
    q, k, v, go = (t.to(torch.bfloat16) for t in (q, k, v, go))
    out = out.to(torch.bfloat16)
    program = build(AttentionBwdRequest(64, "bf16", True), Options(block_m=32, block_n=32, data_partition=1))
    got = _run(program, q, k, v, out, lse, go, gl, scale, True)
    ref = attention_backward(go.float(), gl, q.float(), k.float(), v.float(), out.float(), lse, True, scale)
    for name, a, b in zip(("dq", "dk", "dv"), got, ref):
        assert a.dtype == torch.bfloat16
        assert torch.allclose(a.float(), b, rtol=3e-2, atol=3e-2), (name, float((a.float() - b).abs().max()))


def test_a_plain_dq_store_is_a_global_race():
    """Every KV block adds to the same dQ rows: with the atomic add replaced by a plain store, the CTAs race."""
    prob = _problem(64, 40, 100, 2, 1, False, False)
    program = build(AttentionBwdRequest(64, "f32", False), Options(block_m=32, block_n=32, data_partition=1))
    loop = next(o for o in program.body if o.kind == "loop")
    body = tuple(replace(o, kind="store_ptr") if o.kind == "atomic_add_ptr" else o for o in loop.body)
    mutated = replace(program, body=tuple(replace(o, body=body) if o is loop else o for o in program.body))
    _run(program, *prob, False)
    with pytest.raises(Violation) as e:
        _run(mutated, *prob, False)
    assert e.value.kind == "global-race" and "dq_acc" in e.value.message


def test_request_checks():
    with pytest.raises(ValueError, match="head dim 96"):
        AttentionBwdRequest(96)
    with pytest.raises(ValueError, match="dtype"):
        AttentionBwdRequest(64, "fp8")
    with pytest.raises(ValueError, match="dq='separate'; use one of"):
        AttentionBwdRequest(64, dq="separate")
    with pytest.raises(ValueError, match="head dim 96"):
        AttentionBwdDqRequest(96)
    with pytest.raises(ValueError, match="dtype"):
        AttentionBwdDqRequest(64, "fp8")
