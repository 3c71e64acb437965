"""The GPU sweep's pure parts on CPU (test/sweep_cases.py): its draws cover what the sweep promises within a small
compile budget, the runtime's support checks agree with what it expects served, the references are torch's
semantics, the comparison catches what it must, and the runners pass on CPU (every call falls back to torch)
and fail, naming case and seed, when an op is broken."""
from __future__ import annotations

import pytest
import sweep_cases as sc
import torch
import torch.nn.functional as F

from torch_autows import attention_grad, ops
from torch_autows.runtime import attention as rt_attention
from torch_autows.runtime import attention_bwd as rt_bwd
from torch_autows.runtime import device as dev
from torch_autows.runtime import gemm as rt_gemm

FAMILIES = list(sc.RUNNERS)


@pytest.mark.parametrize("family", FAMILIES)
def test_cases_are_seeded_and_independent_of_the_count(family):
    make = sc.RUNNERS[family][0]
    assert [c.p for c in make(40, 3)[:10]] == [c.p for c in make(10, 3)]
    assert [c.p for c in make(10, 3)] != [c.p for c in make(10, 4)]
    c = make(13, 3)[12]
    assert "TORCH_AUTOWS_SWEEP_SEED=3 TORCH_AUTOWS_SWEEP_N=13" in c.describe() and f"{family} case 12" in c.describe()


def test_default_draws_cover_the_brief():
    g = sc.gemm_cases(500, 0)
    ms = [c.m for c in g]
    assert 1 in ms and max(ms) <= 300 and len({m for m in ms if 1 < m <= 300}) > 100
    assert any(c.n % 8 for c in g) and any(c.k % 8 and c.storage == "tight" for c in g)
    for flag in ("bias", "out32", "ta", "tb"):
        assert 20 <= sum(bool(getattr(c, flag)) for c in g) <= 250, flag
    assert {c.dtype for c in g} == {"bf16", "fp16", "fp32"} and any(0 in (c.m, c.n, c.k) for c in g)
    assert {c.storage for c in g} == {"padded", "tight", "offset"}
    a = sc.attention_cases(500, 0)
    assert any(c.hq != c.hkv for c in a) and any(c.gqa_flag and c.hq == c.hkv for c in a)
    assert sum(c.causal for c in a) > 150 and sum(c.sq != c.skv for c in a) > 400
    assert any(c.sq % 2 and c.skv % 2 and c.sq > 128 for c in a) and max(max(c.sq, c.skv) for c in a) > 1000
    assert {c.d for c in a} >= {64, 128, 32, 96} and {c.dtype for c in a} == {"bf16", "fp16", "fp32"}
    scales = [c.scale for c in a]
    assert None in scales and 0.0 in scales and any(s and s > 0 for s in scales) and any(s and s < 0 for s in scales)
    assert {c.q_layout for c in a} == {c.kv_layout for c in a} == {"bhsd", "bshd", "fused"}
    for cases in (g, sc.bmm_cases(500, 0), a):
        assert 0.08 <= sum(c.nonfinite is not None for c in cases) / len(cases) <= 0.25
    assert {c.nonfinite[1] for c in g if c.nonfinite} == {"nan", "inf", "-inf"}
    assert all(sc.attention_servable(c.p) and not (c.causal and c.nonfinite[0] == "v") for c in a if c.nonfinite)


def _kernel_variants(family, cases):
    """(compiled-kernel variants, servable count) by the runtime's own support checks and config choice, on CPU
    tensors with the draws' layouts (the device check is what would fail here)."""
    variants, served = set(), 0
    for c in cases:
        if family == "gemm":
            a, b, bias, odt = sc.gemm_inputs(c, fill=False)
            if rt_gemm.support_reason(a, b, bias, odt) is None:
                served += 1
                variants.add((c.dtype, odt, rt_gemm._tma_view(a, c.m, c.k)[0], rt_gemm._tma_view(b, c.k, c.n)[0],
                              c.bias, rt_gemm.choose_config(c.m, c.n, c.k)))
        elif family == "bmm":
            a, b, odt = sc.bmm_inputs(c, fill=False)
            if rt_gemm.support_reason(a, b, None, odt) is None:
                served += 1
                variants.add((c.dtype, odt, rt_gemm.choose_config(c.b * c.m, c.n, c.k)))
        else:
            q, k, v, scale = sc.attention_inputs(c, fill=False)
            ok = rt_attention.support_reason(q, k, v, c.causal, scale) is None
            assert ok == sc.attention_servable(c.p), c.describe()
            if ok:
                served += 1
                config = rt_attention.choose_config(c.d, c.causal, c.skv)
                variants.add((c.dtype, c.d, c.causal, config, rt_attention.options_for(config, scale).raw_max))
    return variants, served


# GEMM: the decode tiles (M <= 128: 10 configs, each per dtype, layout and bias) raised the kernels a 500-case
# sweep compiles from 14 to 56 (bmm: 3 to 13); at 1-2 s a compile on the H200 the sweep stays within minutes.
# Attention: head dims 96, 192 and 256 (11% of the draws) add 13 to the 12 of 64 and 128; TORCH_AUTOWS_SWEEP_SHARD
# runs the head dims' kernels in separate processes (sc.shard), so their compiles run side by side. The short causal
# picks (several CTAs an SM up to 512 keys, two Q copies at d=192 up to 1024) add 3.
@pytest.mark.parametrize("family,budget,least", [("gemm", 60, 0.5), ("bmm", 14, 0.5), ("attention", 29, 0.75)])
def test_servable_share_and_compile_budget(family, budget, least, monkeypatch):
    monkeypatch.setattr(dev, "sm90_reason", lambda device, check_device=True: None)  # as on the H200
    cases = sc.RUNNERS[family][0](500, 0)
    variants, served = _kernel_variants(family, cases)
    assert len(variants) <= budget, sorted(variants, key=str)  # each one compiles once: keeps the sweep fast
    assert least * len(cases) <= served <= 0.97 * len(cases), served  # mostly the kernel, some torch fallbacks


def test_attention_reference_is_sdpa():
    g = torch.Generator().manual_seed(0)
    # (not a negative scale with is_causal: torch's CPU SDPA returns NaN there, reliability-2's upstream note)
    for hq, hkv, sq, skv, causal, scale in [(4, 2, 5, 9, True, 0.3), (2, 2, 9, 5, True, 0.2), (4, 1, 7, 7, False, -0.2),
                                            (2, 2, 3, 3, False, 0.0)]:
        q = torch.randn(2, hq, sq, 16, generator=g, dtype=torch.float64)
        k, v = (torch.randn(2, hkv, skv, 16, generator=g, dtype=torch.float64) for _ in range(2))
        out, lse = sc.attention_reference(q, k, v, causal, scale)
        want = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=hq != hkv)
        assert out.dtype == lse.dtype == torch.float32
        torch.testing.assert_close(out, want.float(), atol=1e-5, rtol=1e-5)
        s = (q @ k.repeat_interleave(hq // hkv, 1).transpose(-2, -1) * scale)
        if causal:
            s = s.masked_fill(~torch.ones(sq, skv, dtype=torch.bool).tril(), float("-inf"))
        torch.testing.assert_close(lse, s.logsumexp(-1).float())


def test_attention_reference_keeps_nan_where_torch_does():
    q, k, v = (torch.randn(1, 1, 6, 8) for _ in range(3))
    q[0, 0, 2, 3] = float("nan")
    out, lse = sc.attention_reference(q, k, v, False, 0.5)
    assert out.isnan().all(-1)[0, 0].tolist() == [i == 2 for i in range(6)] and lse[0, 0, 2].isnan()
    q, k = q.nan_to_num(0.0), k.clone()
    k[0, 0, 3, 0] = float("nan")  # causal: rows 0..2 never see key 3
    out, _ = sc.attention_reference(q, k, v, True, 0.5)
    assert out.isnan().all(-1)[0, 0].tolist() == [i >= 3 for i in range(6)] and not out[0, 0, :3].isnan().any()


def test_compare_catches_what_it_must():
    ref = torch.randn(8, 16)
    ref[2, 5] = float("nan")
    ref[3, 1] = float("inf")
    ok = ref.to(torch.bfloat16)
    assert sc.compare(ok, ref, 1e-2, dtype=torch.bfloat16) is None  # bf16 rounding is within 1e-2
    unwritten = ok.clone()
    unwritten[7, 7] = float("nan")  # a poisoned element the kernel did not write
    assert "NaN pattern" in sc.compare(unwritten, ref, 1e-2) and "(7, 7)" in sc.compare(unwritten, ref, 1e-2)
    assert "NaN pattern" in sc.compare(ok.nan_to_num(0.0, posinf=float("inf")), ref, 1e-2)  # NaN turned into 0
    flipped = ok.clone()
    flipped[3, 1] = -float("inf")
    assert "+inf pattern" in sc.compare(flipped, ref, 1e-2)
    off = ok.clone()
    off[0] += 1.0
    assert "relative norm error" in sc.compare(off, ref, 1e-2)
    assert "expected" in sc.compare(ok, ref, 1e-2, dtype=torch.float16)
    assert "expected" in sc.compare(ok[:4], ref, 1e-2)
    lse = torch.tensor([1.0, 50.0, -float("inf")])
    assert sc.compare(lse + torch.tensor([0.01, 0.06, 0.0]), lse, 1e-3, atol=2e-2) is None
    assert "off by more than" in sc.compare(lse + torch.tensor([0.03, 0.0, 0.0]), lse, 1e-3, atol=2e-2)


def _small(family, n=300, limit=3e6, finite=False):
    size = {"gemm": lambda c: c.m * c.n * c.k, "bmm": lambda c: c.b * c.m * c.n * c.k,
            "attention": lambda c: c.b * c.hq * c.sq * c.skv * c.d,
            "attention_bwd": lambda c: c.b * c.hq * c.sq * c.skv * c.d}[family]
    cases = [c for c in sc.RUNNERS[family][0](n, 0) if size(c) <= limit and not (finite and c.nonfinite)]
    return cases[:24]


@pytest.mark.parametrize("family", FAMILIES)
def test_runners_pass_on_cpu(family):
    cases = _small(family, finite=family == "attention")  # attention NaN cases run only where the kernel serves
    assert family in ("attention", "attention_bwd") or any(c.nonfinite for c in cases)  # the backward: finite
    failures, line = sc.sweep(family, device="cpu", cases=cases)
    assert not failures, "\n".join(failures)
    assert line.startswith(f"sweep {family}: {len(cases)} configs, 0 failures (seed 0; 0 servable")


def test_runners_report_a_broken_op_with_its_seed(monkeypatch):
    gemm, attention = ops.gemm, ops.attention
    monkeypatch.setattr(ops, "gemm", lambda *a, **kw: gemm(*a, **kw).flip(0))
    failures, line = sc.sweep("gemm", device="cpu", cases=[c for c in _small("gemm") if c.m > 1][:3])
    assert "3 failures" in line and len(failures) == 3
    assert "TORCH_AUTOWS_SWEEP_SEED=0" in failures[0] and "ops.gemm" in failures[0]
    # the fallback's old NaN -> 0 (reliability-2 D1) on a case with a NaN input
    monkeypatch.setattr(ops, "attention", lambda *a, **kw: tuple(t.nan_to_num(0.0) for t in attention(*a, **kw)))
    nan_case = next(c for c in sc.attention_cases(300, 0) if c.nonfinite and c.b * c.hq * c.sq * c.skv * c.d < 3e6)
    failures, _ = sc.sweep("attention", device="cpu", cases=[nan_case])
    assert failures and "NaN pattern differs" in failures[0]
    monkeypatch.setattr(ops, "attention", lambda *a, **kw: 1 / 0)
    failures, line = sc.sweep("attention", device="cpu", cases=_small("attention")[:2])
    assert "2 failures" in line and "raised ZeroDivisionError" in failures[0]



# ---------------------------------------------------------------------------------------------- attention backward


def test_attention_bwd_draws_cover_issue_17():
    """The 240 default draws cover every axis issue 17 names, each more than a few times."""
    a = sc.attention_bwd_cases()
    assert len(a) == sc.BWD_N == 240 and len({tuple(c.p.items()) for c in a}) == 240

    def many(pred, least=10):
        return sum(bool(pred(c)) for c in a) >= least

    assert {c.dtype for c in a} == {"bf16", "fp16"} and {c.d for c in a} == {64, 128}
    assert {c.dq_mode for c in a} == {"atomic", "reduce", "separate"}
    assert all(many(lambda c, m=m: c.dq_mode == m, 60) for m in ("atomic", "reduce", "separate"))
    assert many(lambda c: c.causal, 80) and many(lambda c: not c.causal, 80)
    assert {c.hq // c.hkv for c in a} == {1, 2, 4, 8} and {c.hkv for c in a} == {1, 2, 3, 4}
    for causal in (True, False):  # Sq > Skv, Sq < Skv and Sq = Skv, with and without the causal mask
        assert many(lambda c, cz=causal: c.causal == cz and c.sq > c.skv)
        assert many(lambda c, cz=causal: c.causal == cz and c.sq < c.skv)
        assert many(lambda c, cz=causal: c.causal == cz and c.sq == c.skv)
    assert many(lambda c: c.sq % 2 and c.skv % 2 and min(c.sq, c.skv) > 128)  # odd lengths off the tiles
    assert many(lambda c: 1 in (c.sq, c.skv), 5) and many(lambda c: max(c.sq, c.skv) > 1000, 5)
    assert many(lambda c: {c.sq, c.skv} & {63, 65, 127, 129, 255, 257}, 20)  # block edges +-1
    for t in ("q", "kv", "do", "out"):
        assert many(lambda c, t=t: getattr(c, f"{t}_layout") == "bshd", 40), t
    assert many(lambda c: c.dlse and c.dout, 20) and many(lambda c: not c.dout, 10)
    assert all(c.dlse for c in a if not c.dout)  # some gradient always flows
    assert many(lambda c: c.scale is None, 100) and many(lambda c: c.scale, 40)
    assert all(c.scale is None or 0 < c.scale <= 0.3 for c in a) and not any(c.nonfinite for c in a)


def test_attention_bwd_inputs_are_seeded_and_out_lse_are_the_reference_forward():
    c = next(c for c in sc.attention_bwd_cases(60, 5) if c.dout and c.dlse and c.hq != c.hkv
             and c.q_layout == "bshd" and c.out_layout == "bshd" and c.sq * c.skv < 1e5)
    first, again = sc.attention_bwd_inputs(c), sc.attention_bwd_inputs(c)
    assert all(torch.equal(x, y) for x, y in zip(first[:-1], again[:-1])) and first[-1] == again[-1]
    do, dlse, q, k, v, out, lse, scale = first
    assert q.shape == out.shape == do.shape == (c.b, c.hq, c.sq, c.d) and k.shape == v.shape == (c.b, c.hkv, c.skv, c.d)
    assert q.dtype == out.dtype == do.dtype == sc.DTYPES[c.dtype] and dlse.shape == lse.shape == (c.b, c.hq, c.sq)
    assert not q.is_contiguous() and not out.is_contiguous() and out.transpose(1, 2).is_contiguous()  # [B, S, H, D]
    ref, ref_lse = sc.attention_reference(q, k, v, c.causal, scale)
    assert torch.equal(out, ref.to(out.dtype)) and torch.equal(lse, ref_lse)


def test_attention_bwd_draws_are_served_within_the_compile_budget(monkeypatch):
    """Every draw is served by the generated backward (by its own support check, as on the H200), and the sweep
    compiles at most 32 kernels: main kernel per (dtype, d, causal, form) in the case's form and the public path's
    (chosen per call), dQ kernel per (dtype, d, causal)."""
    monkeypatch.setattr(dev, "sm90_reason", lambda device, check_device=True: None)
    variants = set()
    for c in sc.attention_bwd_cases():
        do, dlse, q, k, v, out, lse, scale = sc.attention_bwd_inputs(c, fill=False)
        assert rt_bwd.support_reason(q, k, v, out, lse, do, c.causal, scale) is None, c.describe()
        for form in {c.dq_mode, rt_bwd.choose_dq_mode(None, c.d, c.skv, c.causal)}:
            variants.add(("main", c.dtype, c.d, c.causal, form, rt_bwd.choose_config(c.d, c.causal, form)))
        if c.dq_mode == "separate":
            variants.add(("dq", c.dtype, c.d, c.causal, rt_bwd.choose_dq_config(c.d, c.causal)))
    assert len(variants) <= 32, sorted(variants, key=str)


def _softmax_attention(q, k, v, causal, scale):
    """Explicit softmax attention (GQA by repeated k/v heads, top-left causal): (out, lse), differentiable."""
    g = q.shape[1] // k.shape[1]
    s = q @ k.repeat_interleave(g, 1).transpose(-2, -1) * scale
    if causal:
        s = s.masked_fill(~torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(s, -1) @ v.repeat_interleave(g, 1), s.logsumexp(-1)


@pytest.mark.parametrize("hq,hkv,sq,skv,causal,dout,dlse,bshd", [
    (4, 2, 5, 9, True, True, True, False), (8, 1, 9, 5, True, True, False, True),
    (2, 2, 7, 7, False, False, True, False), (4, 4, 1, 6, True, True, True, True),
    (6, 3, 6, 1, False, True, False, False)])
def test_attention_bwd_reference_is_autograd(hq, hkv, sq, skv, causal, dout, dlse, bshd):
    """The fp32 reference (math backward, GQA expand/sum) equals torch.autograd through an explicit fp64 softmax
    attention of sum(out * dO) + sum(lse * dlse), and the gradient check accepts autograd's own gradients."""
    g = torch.Generator().manual_seed(hq * 100 + sq * 10 + skv)

    def mk(h, s):
        t = torch.randn(2, s, h, 8, generator=g, dtype=torch.float64)
        return (t.transpose(1, 2) if bshd else t.transpose(1, 2).contiguous()).requires_grad_()

    q, k, v = mk(hq, sq), mk(hkv, skv), mk(hkv, skv)
    go = torch.randn(2, hq, sq, 8, generator=g, dtype=torch.float64) if dout else None
    gl = torch.randn(2, hq, sq, generator=g, dtype=torch.float64) if dlse else None
    out, lse = _softmax_attention(q, k, v, causal, 0.4)
    loss = (out * go).sum() if dout else 0
    want = torch.autograd.grad(loss + ((lse * gl).sum() if dlse else 0), (q, k, v), allow_unused=True)
    want = [torch.zeros_like(t) if w is None else w for w, t in zip(want, (q, k, v))]
    got = sc.attention_bwd_reference(go, gl, q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(), causal,
                                     0.4)
    for x, w in zip(got, want):
        assert x.dtype == torch.float32 and x.shape == w.shape
        torch.testing.assert_close(x, w.float(), atol=1e-5, rtol=1e-5)
    assert sc.compare_grads([w.float() for w in want], got, got, [t.float() for t in (q, k, v)], name="x") == []


def test_compare_grads_catches_what_it_must():
    torch.manual_seed(0)
    like = [torch.empty(2, 4, 16, 8, dtype=torch.bfloat16), *(torch.empty(2, 2, 32, 8, dtype=torch.bfloat16),) * 2]
    ref = [torch.randn(t.shape) for t in like]
    ok = [r.to(torch.bfloat16) for r in ref]
    assert sc.compare_grads(ok, ref, ok, like, name="bwd") == []

    def with_dq(dq, vendor=ok):
        return sc.compare_grads([dq, *ok[1:]], ref, vendor, like, name="bwd")

    noisy = (ref[0] * 1.02).to(torch.bfloat16)  # 2% off: over the 1e-2 floor ...
    assert "bwd dq: relative norm error" in with_dq(noisy)[0]
    vendor = [(ref[0] * 0.985).to(torch.bfloat16), *ok[1:]]  # ... within 2 x a vendor error of 1.5%
    assert with_dq(noisy, vendor) == []
    unwritten = ok[0].clone()
    unwritten[1, 3, 7] = float("nan")  # a poisoned row the kernel did not write
    assert "bwd dq: non-finite at 8 elements, first at (1, 3, 7, 0)" in with_dq(unwritten)[0]
    assert "expected torch.bfloat16[2, 4, 16, 8]" in with_dq(ok[0].half())[0]
    assert "expected" in with_dq(ok[0][:, :2])[0]
    zero = [ok[0], ok[1], torch.zeros_like(ok[2])]  # dV with no gradient into out: exactly 0 or wrong
    ref_zero = [ref[0], ref[1], torch.zeros_like(ref[2])]
    assert sc.compare_grads(zero, ref_zero, zero, like, name="bwd") == []
    zero[2][0, 0, 0, 0] = 1e-3
    assert "bwd dv: nonzero" in sc.compare_grads(zero, ref_zero, zero, like, name="bwd")[0]
    assert "not (dq, dk, dv)" in sc.compare_grads(None, ref, ok, like, name="bwd")[0]


def _small_bwd(n=3, **want):
    return [c for c in _small("attention_bwd", n=120) if all(getattr(c, k) == v for k, v in want.items())][:n]


def test_attention_bwd_runner_reports_a_broken_backward(monkeypatch):
    backward = attention_grad.attention_backward

    def off(*a, **kw):
        dq, dk, dv = backward(*a, **kw)
        return dq * 1.1, dk, dv

    monkeypatch.setattr(attention_grad, "attention_backward", off)
    failures, line = sc.sweep("attention_bwd", device="cpu", cases=_small_bwd())
    assert "3 failures" in line and len(failures) == 3
    assert "TORCH_AUTOWS_SWEEP_SEED=0" in failures[0] and "attention_backward dq: relative norm error" in failures[0]


@pytest.mark.parametrize("mode", ["atomic", "separate"])
def test_attention_bwd_runner_runs_the_runtime_poisoned_in_the_case_form(mode, monkeypatch):
    """Where the runtime serves a case (faked here: CPU), the runner calls it in the case's dq_mode with POISON NaN
    (restored after) and reports what the kernel left unwritten."""
    seen, hole = [], [False]

    def fake(*args, dq_mode=None, **kw):
        seen.append((dq_mode, rt_bwd.POISON))
        dq, dk, dv = attention_grad.vendor_backward(*args)
        if hole[0] and rt_bwd.POISON is not None:  # the poison fills what the kernel leaves
            dk = dk.clone()
            dk[0, 0, -1] = rt_bwd.POISON  # the last key row never written
        return dq, dk, dv

    monkeypatch.setattr(rt_bwd, "support_reason", lambda *a, **kw: None)
    monkeypatch.setattr(rt_bwd, "backward", fake)
    cases = _small_bwd(2, dq_mode=mode)
    failures, line = sc.sweep("attention_bwd", device="cpu", cases=cases)
    assert not failures and "0 failures (seed 0; 2 servable" in line
    # the public path (its form chosen per call, unpoisoned) and the runner's own call in the case's form, poisoned
    assert [(m, "nan" if p != p else p) for m, p in seen] == [(None, None), (mode, "nan")] * 2
    assert rt_bwd.POISON is None
    hole[0] = True
    failures, line = sc.sweep("attention_bwd", device="cpu", cases=cases)
    assert "2 failures" in line and f"runtime backward ({mode} dQ, NaN-poisoned) dk: non-finite" in failures[0]


def test_shard_splits_cases_evenly_and_by_head_dim():
    cases = sc.attention_cases(500, 0)
    parts = [sc.shard(cases, f"{i}/8") for i in range(8)]
    assert sorted(c.index for p in parts for c in p) == list(range(500))  # every case in exactly one shard
    assert max(map(len, parts)) <= 2 * 500 / 8  # even enough: no shard holds a whole common head dim
    assert all(len({c.d for c in p}) <= 4 for p in parts)  # a few head dims (kernels to compile) each
    assert 192 in {c.d for c in cases}
    gemm = sc.gemm_cases(10, 0)
    assert sorted(c.index for i in range(2) for c in sc.shard(gemm, f"{i}/2")) == list(range(10))
    assert sc.shard(cases, None) is cases
    with pytest.raises(ValueError, match="0 <= i < n"):
        sc.shard(cases, "3/3")
