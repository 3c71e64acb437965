"""The attention-bwd bench work on CPU: its cases, FLOPs, fp32 gradient reference, gradient check and registration."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import triton.testing

from torch_autows.bench import cases, runner
from torch_autows.bench import peers_attention_bwd as pab
from torch_autows.bench.__main__ import main
from torch_autows.bench.runner import Bound, CheckFailed, Peer


def test_dry_run_lists_the_forward_grid_at_d64_d128_and_the_peers(capsys):
    rc = main(["attention-bwd", "--dry-run"])
    out = capsys.readouterr().out
    assert rc == 0 and "attention-bwd: 38 case(s), 7 peer(s)" in out  # 28 FA3 grid + 10 Llama-3.1
    fwd = [c.name for c in cases.attention_cases() if c.head_dim in (64, 128)]
    assert [c.name for c in cases.select("attention-bwd")] == fwd
    for name in ("s512-d64", "s16384-d128-causal", "gqa32x8-s8192-d128"):
        assert f"  {name} " in out
    assert "d96" not in out and "d256" not in out
    for peer in ("cudnn", "fa2", "flex", "autows", "autows-atomic", "autows-reduce", "autows-separate"):
        assert f"  {peer} " in out
    assert "<date>-<gpu>-attention-bwd.json" in out


def test_quick_and_timing_defaults(capsys):
    rc = main(["attention-bwd", "--quick", "--dry-run", "--peers", "cudnn,autows"])
    out = capsys.readouterr().out
    assert rc == 0 and "4 case(s), 2 peer(s)" in out and "x 1 round(s)" in out
    assert "warmup=25, rep=100" in out


def test_flops_are_five_gemms_halved_causal():
    by = {c.name: c for c in cases.attention_bwd_cases()}
    # s4096-d64: B=4, H=32; forward 4*B*H*S^2*D, backward 2.5x that
    assert by["s4096-d64"].flops == 2.5 * 4 * 4 * 32 * 4096 ** 2 * 64
    assert by["s4096-d64-causal"].flops == by["s4096-d64"].flops / 2
    gqa = by["gqa32x8-s8192-d128-causal"]  # FLOPs count query heads: GQA shares k/v, not the work
    assert gqa.flops == 2.5 * 4 * 2 * 32 * 8192 ** 2 * 128 / 2
    fwd = {c.name: c for c in cases.attention_cases()}
    assert all(c.flops == 2.5 * fwd[n].flops for n, c in by.items())
    assert by["s512-d64"].describe().startswith("backward bf16 B=32 Hq=32")


def _autograd_grads(q, k, v, go, causal, scale):
    """dq, dk, dv by autograd through a plain softmax attention in fp64 (k/v heads repeated for GQA)."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    g = q.shape[1] // k.shape[1]
    s = q @ k.repeat_interleave(g, 1).transpose(-1, -2) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    out = torch.softmax(s, -1) @ v.repeat_interleave(g, 1)
    return torch.autograd.grad(out, (q, k, v), go.double())


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("chunk_bytes", [1, 4 * 2 * 24 * 24 * 3, 1 << 30])  # one unit, three units, all
@pytest.mark.parametrize("heads", [(4, 2), (3, 3), (4, 1)])
def test_fp32_reference_matches_autograd(causal, chunk_bytes, heads):
    torch.manual_seed(0)
    Hq, Hkv = heads
    B, S, D = 2, 24, 8
    q, go = torch.randn(B, Hq, S, D), torch.randn(B, Hq, S, D)
    k, v = torch.randn(B, Hkv, S, D), torch.randn(B, Hkv, S, D)
    got = pab.grads_fp32(q, k, v, go, causal, 0.3, chunk_bytes=chunk_bytes)
    want = _autograd_grads(q, k, v, go, causal, 0.3)
    for name, g, w in zip("qkv", got, want):
        assert g.dtype == torch.float32 and g.shape == w.shape, name
        torch.testing.assert_close(g.double(), w, rtol=1e-4, atol=1e-5, msg=f"d{name}")


def _case(causal=True):
    return cases.AttnBwdCase(2, 4, 2, 32, 16, causal)


def _inputs_and_ref(case):
    torch.manual_seed(1)
    inp = pab.make_inputs(case)
    return inp, pab.reference(case, inp)


@pytest.fixture
def cpu(monkeypatch):
    from torch_autows.bench import peers_attention

    monkeypatch.setattr(peers_attention, "DEVICE", "cpu")
    monkeypatch.setattr(runner, "_sync", lambda: None)


def test_each_gradient_is_checked_alone(cpu):
    """dQ 1.5% off passes the concatenation's check (its rms is 0.87%) but not its own."""
    case = _case()
    inp, ref = _inputs_and_ref(case)
    exact = pab.grads_fp32(inp["q"], inp["k"], inp["v"], inp["grad_out"], case.causal, inp["scale"])
    check = pab.checked(case, inp, "peer")
    flat = check(exact)
    assert runner.rel_err(flat, ref.out) < 1e-6
    off = (exact[0] * 1.015, exact[1], exact[2])
    assert runner.rel_err(pab.flat(off, inp["norms"]), ref.out) < 1e-2  # the runner alone would pass it
    with pytest.raises(CheckFailed, match="dq rel_err 1.500e-02 > tolerance"):
        check(off)
    with pytest.raises(CheckFailed, match="dv rel_err"):
        check((exact[0], exact[1], -exact[2]))
    with pytest.raises(CheckFailed, match="shapes"):
        check((exact[0], exact[1].repeat_interleave(2, 1), exact[2]))
    nan = exact[0].clone()
    nan[0, 0, 0, 0] = float("nan")
    assert not torch.isfinite(check((nan, exact[1], exact[2]))).all()  # left to the runner's NaN check


def _math_peer(case, inp):
    """A correct bf16 backward (attention_grad's math path on CPU), through the peers' ``checked``."""
    from torch_autows.attention_grad import attention_backward, reference_attention

    q, k, v, go, scale = inp["q"], inp["k"], inp["v"], inp["grad_out"], inp["scale"]
    out, lse = reference_attention(q, k, v, case.causal, scale)
    calls = []

    def result(grads):
        calls.append(1)
        return pab.checked(case, inp, "math")(grads)

    b = Bound(lambda: attention_backward(go, None, q, k, v, out, lse, case.causal, scale), result=result)
    b.calls = calls
    return b


@pytest.mark.parametrize("causal", [False, True])
def test_run_case_on_cpu(cpu, monkeypatch, causal):
    """The suite end to end: a correct bf16 backward passes at bf16 error and is timed without its check; a dK
    with the wrong sign fails; cuDNN and FA2 have no CPU kernel and autows cannot serve CPU tensors (or is not
    in this checkout): rows with an error, never a time."""
    timed = []
    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, **kw: (timed.append(fn), fn(), 0.01)[-1])
    bound = {}

    def math_bind(case, inp):
        bound["b"] = _math_peer(case, inp)
        return bound["b"]

    def wrong_bind(case, inp):
        b = _math_peer(case, inp)
        fn = b.fn
        b.fn = lambda: (lambda g: (g[0], -g[1], g[2]))(fn())
        return b

    peers = {p.name: p for p in pab.all_peers()[0]}
    case = _case(causal)
    suite = pab.suite([case], [Peer("math", math_bind), Peer("wrong", wrong_bind), peers["cudnn"], peers["fa2"],
                               peers["autows"], peers["autows-atomic"]])
    rows = {r["impl"]: r for r in runner.run_case(suite, case)}
    assert rows["math"]["error"] is None and 1e-4 < rows["math"]["rel_err"] < 1e-2, rows["math"]
    assert rows["math"]["tflops"] == pytest.approx(case.flops / 1e-5 / 1e12)
    assert len(bound["b"].calls) == 1 and bound["b"].fn in timed  # checked once; timed without the check
    assert rows["wrong"]["error"].startswith("dk rel_err") and rows["wrong"]["tflops"] is None
    for name in ("cudnn", "fa2", "autows", "autows-atomic"):
        assert rows[name]["error"] and rows[name]["tflops"] is None, rows[name]
    assert "cudnn forward" in rows["cudnn"]["error"] and "flash forward" in rows["fa2"]["error"]
    assert [r["work"] for r in rows.values()] == ["attention-bwd"] * 6


def test_forward_is_made_once_and_its_error_kept(cpu, monkeypatch):
    from torch_autows import sdpa_fallback

    calls = []

    def fused(kind, q, k, v, causal, scale):
        calls.append(kind)
        if kind == "cudnn":
            raise RuntimeError("no cuDNN here")
        return torch.zeros_like(q), torch.zeros(q.shape[:3])

    monkeypatch.setattr(sdpa_fallback, "fused_attention", fused)
    inp = pab.make_inputs(_case())
    for _ in range(2):
        with pytest.raises(RuntimeError, match="cudnn forward .*no cuDNN here"):
            pab.forward(inp, "cudnn", True)
        assert pab.forward(inp, "flash", True)[0].shape == inp["q"].shape
    assert calls == ["cudnn", "flash"]


def test_results_file_name_keeps_the_dashed_work(tmp_path):
    from torch_autows.bench.plot import panels
    from torch_autows.bench.report import WORK_ORDER, _file_key, work_of

    assert "attention-bwd" in WORK_ORDER
    for stem, work, n in [("2026-12-01-h200-attention-bwd", "attention-bwd", 1),
                          ("2026-12-01-h200-attention-bwd-3", "attention-bwd", 3),
                          ("2026-12-01-h200-attention-2", "attention", 2),
                          ("2026-12-01-rtx-a6000-gemm", "gemm", 1)]:
        path = Path(tmp_path / f"{stem}.json")
        assert work_of(path, {}) == work
        assert _file_key(path, {})[1] == n
    got = panels("attention-bwd", ["s512-d64", "s1024-d64", "gqa32x8-s4096-d128-causal"])
    assert [(t, ticks) for t, _, ticks in got] == [("d64", ["512", "1k"]), ("d128 causal GQA32/8", ["4k"])]


def test_flat_weighs_gradients_alike():
    grads = (torch.full((2, 3), 100.0), torch.ones(4), torch.full((5,), 0.01))
    norms = [float(torch.linalg.vector_norm(g)) for g in grads]
    f = pab.flat(grads, norms)
    assert f.shape == (15,) and math.isclose(float(torch.linalg.vector_norm(f)), math.sqrt(3), rel_tol=1e-6)
