"""Hypothesis over shapes and decision points: whatever the passes accept must interpret correctly.
GEMM and attention alike.

Decision points: tile sizes, ring depth (stages), async wgmma depth (mma_pending), data_partition
factor, persistent or not, and the GEMM layout variants; shapes are drawn with tails. Small tiles keep
each example cheap; the example budget is small (CI runs the whole directory in well under 90 s).
"""
from __future__ import annotations

import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from torch_autows.interp import POLICIES, make_instance, run_partitioned, run_sequential
from torch_autows.ir import Options
from torch_autows.passes import PassError, pipeline
from torch_autows.templates.attention import AttentionRequest
from torch_autows.templates.attention import build as build_attention
from torch_autows.templates.gemm import GemmRequest, build


@st.composite
def cases(draw):
    dp = draw(st.sampled_from((1, 2)))
    bm = 128 if dp == 2 else draw(st.sampled_from((64, 128)))
    opts = Options(block_m=bm, block_n=draw(st.sampled_from((32, 64, 128))), block_k=draw(st.sampled_from((16, 32))),
                   stages=draw(st.integers(1, 5)), data_partition=dp, persistent=draw(st.booleans()),
                   mma_pending=draw(st.sampled_from((0, 1))), group_m=draw(st.sampled_from((1, 2, 8))),
                   store_buffers=draw(st.sampled_from((1, 2))))
    variant = draw(st.sampled_from(({}, {"trans_a": True}, {"trans_b": True, "bias": True},
                                    {"out_dtype": "f32", "dtype": "fp16"})))
    m = draw(st.integers(1, 3 * bm))
    n = 8 * draw(st.integers(1, 3 * opts.block_n // 8))
    k = 8 * draw(st.integers(1, 8 * opts.block_k // 8))
    return opts, variant, (m, n, k), draw(st.integers(0, 2**16)), draw(st.integers(2, 3))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_any_accepted_decision_interprets_exactly(case):
    opts, variant, shape, seed, nprog = case
    before = build(GemmRequest(1, 1, 1, **variant), opts)
    try:
        after = pipeline.run(before)
    except PassError:
        event("refused by the passes")
        return  # the passes refused this decision with a reason; nothing to run
    event("interpreted")
    inst = make_instance(after, seed, shape=shape)
    assert torch.equal(run_sequential(before, inst.inputs())["c"], inst.reference["c"])
    for policy in POLICIES:
        out = run_partitioned(after, inst.inputs(), policy=policy, seed=seed, nprog=nprog)
        assert torch.equal(out["c"], inst.reference["c"]), (policy, inst.desc, opts)


@st.composite
def attention_cases(draw):
    dp = draw(st.sampled_from((1, 2)))
    opts = Options(block_m=128 if dp == 2 else draw(st.sampled_from((64, 128))),
                   block_n=draw(st.sampled_from((32, 64, 128))), stages=draw(st.integers(1, 4)), data_partition=dp,
                   persistent=draw(st.booleans()), defer_mma=draw(st.booleans()), skip_mask=draw(st.booleans()))
    hkv, g = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    shape = (draw(st.integers(1, 2)), hkv * g, hkv, draw(st.integers(1, 300)), draw(st.integers(1, 300)))
    req = AttentionRequest(draw(st.sampled_from((64, 128))), draw(st.sampled_from(("bf16", "fp16"))),
                           draw(st.booleans()))
    return opts, req, shape, draw(st.integers(0, 2**16))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(attention_cases())
def test_attention_decisions_interpret_like_torch(case):
    opts, req, shape, seed = case
    before = build_attention(req, opts)
    try:
        after = pipeline.run(before)
    except PassError:
        event("refused by the passes")
        return
    event("interpreted")
    inst = make_instance(after, seed, shape=shape)
    seq = run_sequential(before, inst.inputs())
    assert inst.matches(seq), (inst.desc, inst.error(seq))
    for policy in POLICIES:
        out = run_partitioned(after, inst.inputs(), policy=policy, seed=seed)
        assert torch.equal(out["o"], seq["o"]) and torch.equal(out["lse"], seq["lse"]), (policy, inst.desc, opts)
