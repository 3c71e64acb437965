"""Numerics of the generated attention backward (runtime/attention_bwd.py) on sm_90 against attention_grad's math
backward in fp32, on fresh random inputs with (out, lse) from our forward: head dims 64/128, bf16/fp16, causal or
not, Sq != Skv both ways, lengths off the tiles (1, 63, 200, 1000) and in whole tiles (128, 384: dK/dV and dQ stored
by TMA), GQA groups 1/4/8, [B, S, H, D] views, a gradient into lse, and none into out. dK/dV are NaN-poisoned before
each launch (``attention_bwd.POISON``). The tolerance per gradient is max(2 x the vendor backward's own error on the
same inputs, 1e-2), relative Frobenius norm, plus an absolute 1e-4 per element (for gradients that are zero in exact
arithmetic). Each case runs in every form (``dq_mode``: atomic dQ adds, TMA reduce-adds (d=128 through the split dQ,
``bwd_64x128_dp2_dqsplit_fold`` and ``bwd_32x128_dp2_dqsplit``: the chains share dS through SMEM and meet once a
step), or the separate dQ kernel). Plus one end-to-end ``torch.autograd`` run through ``ops.attention`` with
``config.attention_backward = "autows"``, and bitwise-equal gradients over runs under
``torch.use_deterministic_algorithms(True)`` (the separate form)."""
from __future__ import annotations

import math
import random

import pytest
import torch

from torch_autows import attention_grad, config
from torch_autows.runtime import attention as rt_fwd
from torch_autows.runtime import attention_bwd as rt
from torch_autows.runtime import fallback


def _cases(mode: str, n=48, seed=3):
    rng = random.Random(seed)
    seqs = [1, 63, 128, 200, 384, 1000]  # 128, 384: whole tiles, the gradients stored by TMA (kv_tma, dq_tma)
    out, dq_configs = [], list(rt.DQ_CONFIGS)
    dims = [d for d in (64, 128) if any(rt.serves(c, d, mode) for c in rt.CONFIGS)]
    drawn = dict.fromkeys(dims, -1)  # cases drawn so far per head dim
    for i in range(n):
        d = dims[(i // 3) % len(dims)]
        configs = [c for c in rt.CONFIGS if rt.serves(c, d, mode)]
        drawn[d] += 1
        j = drawn[d] + drawn[d] // len(configs)  # each config in turn, shifted a place a round: causal or not
        out.append(dict(b=rng.choice([1, 2]), hkv=rng.choice([1, 2]), g=(1, 4, 8)[i % 3], sq=rng.choice(seqs),
                        skv=rng.choice(seqs), d=d, causal=bool((i // 6) % 2),
                        dtype=(torch.bfloat16, torch.float16)[(i // 12) % 2], bshd=rng.random() < 0.25,
                        dlse=rng.random() < 0.25, dout=rng.random() > 0.08, config=configs[j % len(configs)],
                        mode=mode, dq_config=dq_configs[i % len(dq_configs)] if mode == "separate" else None))
    # Sq != Skv both ways, explicitly, at both head dims and causal
    for d in dims:
        for sq, skv in ((63, 1000), (1000, 63), (200, 1)):
            out.append(dict(b=1, hkv=2, g=4, sq=sq, skv=skv, d=d, causal=True, dtype=torch.bfloat16, bshd=False,
                            dlse=True, dout=True, config=rt.choose_config(d, True, mode), mode=mode,
                            dq_config=rt.choose_dq_config(d, True) if mode == "separate" else None))
            if mode == "reduce" and (d, True) in rt.REDUCE_LONG:  # the pick for many keys, on these few
                out.append({**out[-1], "config": rt.REDUCE_LONG[d, True][0]})
    return out


def _id(c):
    return (f"b{c['b']}h{c['hkv'] * c['g']}/{c['hkv']}-q{c['sq']}-kv{c['skv']}-d{c['d']}{'-causal' * c['causal']}"
            f"{'-bshd' * c['bshd']}{'-dlse' * c['dlse']}{'-nodout' * (not c['dout'])}-{str(c['dtype'])[6:]}"
            f"-{c['mode']}-{c['config']}" + (f"-{c['dq_config']}" if c["dq_config"] else ""))


def _rel(x, ref):
    return ((x.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-6)).item()


@pytest.fixture
def poisoned(monkeypatch):
    monkeypatch.setattr(rt, "POISON", float("nan"))


@pytest.mark.parametrize("c", _cases("atomic") + _cases("reduce") + _cases("separate"), ids=_id)
def test_backward_random(c, poisoned):
    torch.manual_seed(hash(_id(c)) % 2**31)
    hq, dt = c["hkv"] * c["g"], c["dtype"]

    def mk(h, s):
        if c["bshd"]:
            return torch.randn(c["b"], s, h, c["d"], device="cuda", dtype=dt).transpose(1, 2)
        return torch.randn(c["b"], h, s, c["d"], device="cuda", dtype=dt)

    q, k, v = mk(hq, c["sq"]), mk(c["hkv"], c["skv"]), mk(c["hkv"], c["skv"])
    scale = 1 / math.sqrt(c["d"])
    out, lse = rt_fwd.attention(q, k, v, c["causal"], scale, config="auto")
    go = mk(hq, c["sq"]) if c["dout"] else None
    dlse = torch.randn(c["b"], hq, c["sq"], device="cuda") if c["dlse"] else None
    if go is None and dlse is None:
        dlse = torch.randn(c["b"], hq, c["sq"], device="cuda")
    got = rt.backward(go, dlse, q, k, v, out, lse, c["causal"], scale, config=c["config"], dq_mode=c["mode"],
                      dq_config=c["dq_config"])
    ref = attention_grad.vendor_backward(None if go is None else go.float(), dlse, q.float(), k.float(), v.float(),
                                         out.float(), lse, c["causal"], scale)  # fp32: the math path
    vendor = attention_grad.vendor_backward(go, dlse, q, k, v, out, lse, c["causal"], scale)
    torch.cuda.synchronize()
    for name, x, r, w, like in zip(("dq", "dk", "dv"), got, ref, vendor, (q, k, v)):
        assert x.shape == like.shape and x.dtype == like.dtype, name
        assert not x.isnan().any(), f"{name}: NaN (a row the kernel did not write, or a NaN it computed)"
        if r.norm() == 0:  # dV without a gradient into out: exactly 0; else (Sq = Skv = 1: dS = dP - delta) noise
            assert x.float().abs().max().item() <= (0 if go is None and name == "dv" else 1e-4), name
            continue
        # relative, plus an absolute floor far below a gradient entry of O(0.01-1): a gradient that is zero in exact
        # arithmetic (Sq = 1 causal: P = 1, so dS = dP - delta) comes out as rounding noise of dP - delta (the
        # kernel's wgmma sum against the preprocess's rowsum), which no relative bound can take
        tol = max(2 * _rel(w, r), 1e-2)
        err = (x.float() - r.float()).norm().item()
        assert err <= tol * r.float().norm().item() + 1e-4 * x.numel() ** 0.5, (name, _rel(x, r), tol)


@pytest.mark.parametrize("d", [64, 128])
def test_row_kernels_match_torch(d):
    """The preprocess and dQ-convert Triton kernels (runtime/attention_bwd_rows.py) against the torch versions on
    the GPU: delta to fp32 summation order, lse2 and dQ bitwise; O as a [B, S, H, D] view, a -inf lse row; the
    preprocess also zeroing a NaN-filled dQ workspace of padded rows."""
    from torch_autows.runtime import attention_bwd_rows as rows
    from torch_autows.templates import attention_bwd as tmpl

    torch.manual_seed(4)
    o = torch.randn(2, 333, 5, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    do = torch.randn(2, 5, 333, d, device="cuda", dtype=torch.bfloat16)
    lse, dlse = (torch.randn(2, 5, 333, device="cuda") for _ in range(2))
    lse[1, 2, 7] = float("-inf")
    for _ in range(2):  # the second call with new tensors: through the bound launch (launch.JitLaunches)
        want = tmpl.preprocess(o, do, lse, dlse)
        ws = torch.full((2 * 5 * 384, d), float("nan"), device="cuda")  # the reduce form's padded dQ workspace
        for got in (rows.preprocess(o, do, lse, dlse), rows.preprocess(o, do, lse, dlse, workspace=ws)):
            torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
            assert torch.equal(got[1], want[1])
        assert torch.count_nonzero(ws).item() == 0, "the workspace zeroed, every row"
        acc = torch.randn(2 * 5 * 384, d, device="cuda")
        q = torch.empty(2, 5, 333, d, device="cuda", dtype=torch.float16)
        assert torch.equal(rows.postprocess(acc, 0.3, q), tmpl.postprocess(acc, 0.3, q))
        o, do, lse, dlse = (t.clone() + 0.5 for t in (o, do, lse, dlse))
    assert len(rows._LAUNCHES._bound) >= 3


def test_repeated_calls_take_the_bound_launch():
    """The second call with the same shapes launches through the per-shape cache and gives the same gradients up to
    the atomic dQ adds' order."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 8, 300, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out, lse = rt_fwd.attention(q, k, v, True, 0.1, config="auto")
    go = torch.randn_like(q)
    first = rt.backward(go, None, q, k, v, out, lse, True, 0.1)
    assert len(rt._BOUND) >= 1
    second = rt.backward(go, None, q, k, v, out, lse, True, 0.1)
    torch.cuda.synchronize()
    assert torch.equal(first[1], second[1]) and torch.equal(first[2], second[2])  # dK/dV: no atomics
    assert _rel(second[0], first[0]) < 1e-3


def test_repeated_separate_calls_are_bitwise_equal():
    """The separate form through the per-shape bound launches (both kernels): the second call gives the same bits."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 8, 300, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out, lse = rt_fwd.attention(q, k, v, True, 0.1, config="auto")
    go = torch.randn_like(q)
    first = rt.backward(go, None, q, k, v, out, lse, True, 0.1, dq_mode="separate")
    second = rt.backward(go, None, q, k, v, out, lse, True, 0.1, dq_mode="separate")
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(first, second))


@pytest.mark.parametrize("dq_mode", [None, "reduce"])
def test_repeated_calls_take_the_plan(dq_mode, monkeypatch):
    """A call with an earlier call's metadata takes its plan (``_Plan``): the support check and the choices do not
    run again (here they would fail), and the gradients of new tensors equal a full-path call's on them (dQ up to the
    reduce-adds' order). With NaN poison set (the tests' fixture) the plan is not taken."""
    torch.manual_seed(5)

    def inputs():
        q, k, v = (torch.randn(2, 4, 300, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        out, lse = rt_fwd.attention(q, k, v, True, 0.125, config="auto")
        return torch.randn_like(q), q, k, v, out, lse

    rt._PLANS.clear()
    first = inputs()
    rt.backward(first[0], None, *first[1:], True, 0.125, dq_mode=dq_mode)
    assert len(rt._PLANS) == 1
    call = inputs()
    with monkeypatch.context() as m:
        m.setattr(rt, "support_reason", lambda *a, **kw: pytest.fail("a planned call checked support again"))
        m.setattr(rt, "choose_dq_mode", lambda *a, **kw: pytest.fail("a planned call chose again"))
        got = rt.backward(call[0], None, *call[1:], True, 0.125, dq_mode=dq_mode)
    rt._PLANS.clear()
    want = rt.backward(call[0], None, *call[1:], True, 0.125, dq_mode=dq_mode)
    torch.cuda.synchronize()
    assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
    assert torch.equal(got[0], want[0]) if dq_mode is None else _rel(got[0], want[0]) < 1e-3
    monkeypatch.setattr(rt, "POISON", float("nan"))
    for plan in rt._PLANS.values():
        monkeypatch.setattr(plan, "run", lambda *a: pytest.fail("a poisoned call took the plan"))
    rt.backward(call[0], None, *call[1:], True, 0.125, dq_mode=dq_mode)


@pytest.mark.parametrize("d", [64, 128])
def test_repeated_reduce_calls_take_the_bound_launch(d):
    """The reduce form (d=128: the split dQ) through the per-shape bound launch, its padded dQ workspace a TMA
    descriptor rebuilt for each call's fresh workspace: dK/dV bitwise equal, dQ equal up to the order of the
    reduce-adds."""
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 4, 300, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out, lse = rt_fwd.attention(q, k, v, True, 0.125, config="auto")
    go = torch.randn_like(q)
    first = rt.backward(go, None, q, k, v, out, lse, True, 0.125, dq_mode="reduce")
    second = rt.backward(go, None, q, k, v, out, lse, True, 0.125, dq_mode="reduce")
    torch.cuda.synchronize()
    assert torch.equal(first[1], second[1]) and torch.equal(first[2], second[2])
    assert _rel(second[0], first[0]) < 1e-3
    ref = attention_grad.vendor_backward(go.float(), None, q.float(), k.float(), v.float(), out.float(), lse, True,
                                         0.125)
    assert all(_rel(x, r) < 1e-2 for x, r in zip(second, ref))


@pytest.mark.parametrize("d,causal", [(64, False), (64, True), (128, False), (128, True)])
def test_deterministic_mode_gives_the_same_bits(d, causal):
    """Under ``torch.use_deterministic_algorithms(True)`` the call takes the separate form (no dQ atomics): five runs
    on inputs where several KV blocks feed each Q block (and GQA groups of 4 feed each dK/dV) are bitwise equal, and
    match the math backward. The flag is restored."""
    torch.manual_seed(3)
    q = torch.randn(2, 8, 1000, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 2, 1000, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    scale = d ** -0.5
    out, lse = rt_fwd.attention(q, k, v, causal, scale, config="auto")
    go = torch.randn_like(q)
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert rt.choose_dq_mode(None, d) == "separate"
        runs = [rt.backward(go, None, q, k, v, out, lse, causal, scale) for _ in range(5)]
    finally:
        torch.use_deterministic_algorithms(before)
    torch.cuda.synchronize()
    for run in runs[1:]:
        for name, a, b in zip(("dq", "dk", "dv"), runs[0], run):
            assert torch.equal(a, b), name
    ref = attention_grad.vendor_backward(go.float(), None, q.float(), k.float(), v.float(), out.float(), lse,
                                         causal, scale)
    for x, r in zip(runs[0], ref):
        assert _rel(x, r) < 1e-2


def test_autograd_through_ops_attention():
    import torch_autows

    fallback.reset()
    torch.manual_seed(1)
    q = torch.randn(2, 16, 777, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(2, 4, 777, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    go = torch.randn(2, 16, 777, 64, device="cuda", dtype=torch.bfloat16)
    with config.patch(attention_backward="autows"):
        out, lse = torch_autows.ops.attention(q, k, v, is_causal=True, enable_gqa=True)
        (out.float() * go).sum().backward()
    assert fallback.counters["attention_backward.autows"] == 1
    ref = attention_grad.vendor_backward(go.float(), None, q.detach().float(), k.detach().float(),
                                         v.detach().float(), out.detach().float(), lse.detach(), True, 64 ** -0.5)
    for x, r in zip((q.grad, k.grad, v.grad), ref):
        assert _rel(x, r) < 1e-2


def test_compiled_training_runs_the_generated_backward():
    """torch.compile(backend="autows") with ``config.attention_backward = "autows"``: the backward graph calls
    ``autows::attention_backward``, which runs the generated kernel; gradients match fp32 eager."""
    import torch.nn.functional as F

    torch._dynamo.reset()
    fallback.reset()
    torch.manual_seed(2)

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    q = torch.randn(2, 16, 300, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(2, 4, 300, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    go = torch.randn(2, 16, 300, 128, device="cuda", dtype=torch.bfloat16)
    with config.patch(attention_backward="autows", choice="autows"):
        out = torch.compile(f, backend="autows")(q, k, v)
        out.backward(go)
    assert fallback.counters["attention_backward.autows"] >= 1, dict(fallback.counters)
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    f(qf, kf, vf).backward(go.float())
    for x, r in zip((q.grad, k.grad, v.grad), (qf.grad, kf.grad, vf.grad)):
        assert _rel(x, r) < 1e-2


def test_measure_decides_once_a_key_and_either_side_is_right(monkeypatch):
    """``config.attention_backward = "measure"`` (the default): the first call of a key asks runtime.choice (a
    measurement, or the disk's decision from an earlier process), the next calls of the key do not; whichever side it
    keeps, the gradients match fp32 as the vendor's do."""
    from torch_autows.runtime import choice
    from torch_autows.runtime.launch import BoundCache

    monkeypatch.setattr(rt, "_CHOSEN", BoundCache(256))
    monkeypatch.setattr(rt, "_PLANS", BoundCache(256))
    monkeypatch.setattr(choice, "records", {})
    fallback.reset()
    torch.manual_seed(3)
    q, go = (torch.randn(2, 16, 4096, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(2, 16, 4096, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    out, lse = rt_fwd.attention(q, k, v, True, 0.125, config="auto")
    asked = lambda: fallback.counters["choice.measured"] + fallback.counters["choice.cache"]  # noqa: E731
    with config.patch(attention_backward="measure", choice="measure"):
        got = [attention_grad.attention_backward(go, None, q, k, v, out, lse, True, 0.125) for _ in range(3)]
    assert asked() == 1, dict(fallback.counters)
    ref = attention_grad.vendor_backward(go.float(), None, q.float(), k.float(), v.float(), out.float(), lse, True,
                                         0.125)
    vendor = attention_grad.vendor_backward(go, None, q, k, v, out, lse, True, 0.125)
    for run in got:
        for x, r, w in zip(run, ref, vendor):
            assert _rel(x, r) < max(2 * _rel(w, r), 1e-2)
