"""The attention backward's main kernel (templates/attention_bwd.py) between the torch pre/postprocess
(its host side), run by the sequential interpreter in fp32 against ``attention_grad``'s math backward."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from torch_autows.attention_grad import attention_backward, reference_attention
from torch_autows.interp import Violation, run_sequential
from torch_autows.ir import Options
from torch_autows.templates import attention_bwd as rt
from torch_autows.templates.attention_bwd import AttentionBwdRequest, build


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
