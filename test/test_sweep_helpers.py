"""The GPU sweep's pure parts on CPU (test/sweep_cases.py): its draws cover what the sweep promises within a small
compile budget, the runtime's support checks agree with what it expects served, the references are torch's
semantics, the comparison catches what it must, and the runners pass on CPU (every call falls back to torch)
and fail, naming case and seed, when an op is broken."""
from __future__ import annotations

import pytest
import sweep_cases as sc
import torch
import torch.nn.functional as F

from torch_autows import ops
from torch_autows.runtime import attention as rt_attention
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
# Attention: head dims 96 and 256 (5% of the draws, served since) add 8 to the 12 of 64 and 128
@pytest.mark.parametrize("family,budget,least", [("gemm", 60, 0.5), ("bmm", 14, 0.5), ("attention", 20, 0.75)])
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
            "attention": lambda c: c.b * c.hq * c.sq * c.skv * c.d}[family]
    cases = [c for c in sc.RUNNERS[family][0](n, 0) if size(c) <= limit and not (finite and c.nonfinite)]
    return cases[:24]


@pytest.mark.parametrize("family", FAMILIES)
def test_runners_pass_on_cpu(family):
    cases = _small(family, finite=family == "attention")  # attention NaN cases run only where the kernel serves
    assert family == "attention" or any(c.nonfinite for c in cases)
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

