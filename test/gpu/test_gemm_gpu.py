"""Numerics of the generated GEMM on sm_90 against an fp32 reference: >= 200 random cases.

Shapes with tails, both operand layouts, bias, bmm, bf16/fp16, fp32 output, every runtime config.
Outputs are poisoned with NaN before each run, so an unwritten element fails the check.
"""
from __future__ import annotations

import random

import pytest
import torch

import torch_autows
from torch_autows.runtime import fallback
from torch_autows.runtime import gemm as rt


def _cases(n=240, seed=0):
    rng = random.Random(seed)
    dims = [1, 7, 8, 16, 64, 100, 127, 128, 129, 200, 255, 256, 257, 384, 500, 512, 640, 1000, 1024, 1536, 2048]
    out = []
    for i in range(n):
        m, k = rng.choice(dims), rng.choice(dims)
        n_ = rng.choice([d for d in dims if d % 8 == 0])
        config = list(rt.CONFIGS)[i % len(rt.CONFIGS)]
        case = dict(m=m, n=n_, k=k, dtype=rng.choice([torch.bfloat16, torch.float16]),
                    ta=rng.random() < 0.3, tb=rng.random() < 0.3, bias=rng.random() < 0.3,
                    out32=rng.random() < 0.1, config=config)
        if rt.CONFIGS[config].swap_ab:  # a swap-AB config serves nn.Linear's layout only: x @ w.t()
            case.update(ta=False, tb=True)
        out.append(case)
    return out


def _operand(rows, cols, dtype, trans):
    if trans:  # a transposed view of a row-major [cols, rows] tensor, with a TMA-legal row stride
        pad = (-rows) % 8
        return torch.randn(cols, rows + pad, device="cuda", dtype=dtype)[:, :rows].t()
    pad = (-cols) % 8
    return torch.randn(rows, cols + pad, device="cuda", dtype=dtype)[:, :cols]


def _rel(out, ref):
    return ((out.float() - ref).norm() / ref.norm().clamp_min(1e-6)).item()


@pytest.mark.parametrize("case", _cases(), ids=lambda c: f"{c['m']}x{c['n']}x{c['k']}-{c['config']}")
def test_gemm_random(case):
    torch.manual_seed(hash(str(case)) % 2**31)
    a = _operand(case["m"], case["k"], case["dtype"], case["ta"])
    b = _operand(case["k"], case["n"], case["dtype"], case["tb"])
    bias = torch.randn(case["n"], device="cuda", dtype=case["dtype"]) if case["bias"] else None
    out_dtype = torch.float32 if case["out32"] else case["dtype"]
    ref = a.float() @ b.float() + (bias.float() if bias is not None else 0)
    out = torch.full((case["m"], case["n"]), float("nan"), device="cuda", dtype=out_dtype)
    rt.gemm(a, b, bias, out_dtype, config=case["config"], out=out)
    torch.cuda.synchronize()
    assert out.dtype == out_dtype and out.shape == (case["m"], case["n"])
    assert torch.isfinite(out).all(), "unwritten (NaN) or overflowed elements"
    assert _rel(out, ref) < 1e-2


@pytest.mark.parametrize("config,shape", [  # configs that tile the shape (split-K serves 2-D GEMMs only)
    (c, s) for c, o in rt.CONFIGS.items() for s in [(4, 256, 512, 128), (32, 128, 128, 64), (3, 384, 256, 320)]
    if o.split_k == 1 and not o.swap_ab and s[1] % o.block_m == 0 and s[3] % o.block_k == 0])
def test_bmm(config, shape):
    B, M, N, K = shape
    a = torch.randn(B, M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(B, K, N, device="cuda", dtype=torch.bfloat16)
    out = torch.full((B, M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    rt.bmm(a, b, torch.bfloat16, config=config, out=out)
    assert torch.isfinite(out).all()
    assert _rel(out, torch.bmm(a.float(), b.float())) < 1e-2


def test_ops_served_and_counted():
    fallback.reset()
    a = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(256, 384, device="cuda", dtype=torch.bfloat16)
    out = torch_autows.ops.gemm(a, b)
    assert fallback.counters["gemm.autows"] == 1
    assert _rel(out, a.float() @ b.float()) < 1e-2


def test_unsupported_falls_back_with_reason(caplog):
    fallback.reset()
    a = torch.randn(64, 13, device="cuda", dtype=torch.bfloat16)  # row stride 26 B: not TMA-legal
    b = torch.randn(13, 64, device="cuda", dtype=torch.bfloat16)
    with caplog.at_level("WARNING", logger="torch_autows"):
        out = torch_autows.ops.gemm(a, b)
    assert fallback.counters["gemm.fallback"] == 1
    assert "TMA" in caplog.text
    torch.testing.assert_close(out, a @ b)


# --- the residual epilogue: a @ b (+ bias) + r, r added in fp32 before the one rounding; R's tile by TMA where K is
# not split (runtime.gemm_configs.residual_options: any tile width), by pointers after split-K's reduction ---

RESIDUAL_CONFIGS = [c for c in rt.CONFIGS if rt.serves_residual(c)]


def _residual_cases(n=72, seed=1):
    rng = random.Random(seed)
    ms = [1, 2, 7, 16, 64, 100, 128, 129, 255, 256, 500, 1024]  # decode rows (split-K configs) and large ones
    out = []
    for i in range(n):
        config = RESIDUAL_CONFIGS[i % len(RESIDUAL_CONFIGS)]
        out.append(dict(m=rng.choice(ms), n=rng.choice([8, 64, 136, 256, 640, 1024, 2048]),
                        k=rng.choice([16, 100, 256, 1000, 2048, 4096]),
                        dtype=rng.choice([torch.bfloat16, torch.float16]),
                        ta=rng.random() < 0.2, tb=rng.random() < 0.5, bias=rng.random() < 0.4,
                        out32=rng.random() < 0.15 and rt.serves_residual(config, out32=True), config=config))
    return out


@pytest.mark.parametrize("case", _residual_cases(), ids=lambda c: f"{c['m']}x{c['n']}x{c['k']}-{c['config']}"
                         + ("-bias" if c["bias"] else ""))
def test_gemm_residual_random(case):
    torch.manual_seed(hash(str(case)) % 2**31)
    m, n = case["m"], case["n"]
    a = _operand(m, case["k"], case["dtype"], case["ta"])
    b = _operand(case["k"], n, case["dtype"], case["tb"])
    bias = torch.randn(n, device="cuda", dtype=case["dtype"]) if case["bias"] else None
    r = 4 * torch.randn(m, n, device="cuda", dtype=case["dtype"])  # large enough that a missing add shows
    out_dtype = torch.float32 if case["out32"] else case["dtype"]
    ref = a.float() @ b.float() + (bias.float() if bias is not None else 0) + r.float()
    out = torch.full((m, n), float("nan"), device="cuda", dtype=out_dtype)
    rt.gemm(a, b, bias, out_dtype, config=case["config"], out=out, residual=r)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all(), "unwritten (NaN) or overflowed elements"
    assert _rel(out, ref) < 1e-2


@pytest.mark.parametrize("config", [c for c in RESIDUAL_CONFIGS if rt.CONFIGS[c].split_k > 1])
def test_split_k_residual_is_added_once(config, repeated_split_launches):
    a = torch.randn(13, 3000, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(3000, 1000, device="cuda", dtype=torch.bfloat16)
    r = 8 * torch.randn(13, 1000, device="cuda", dtype=torch.bfloat16)
    repeated_split_launches(lambda out: rt.gemm(a, b, None, torch.bfloat16, config=config, out=out, residual=r),
                            (13, 1000), a.float() @ b.float() + r.float(), 1e-2)


@pytest.mark.parametrize("m", [1, 8, 128, 2048])
def test_ops_gemm_residual_served_and_counted(m):
    fallback.reset()
    x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)  # nn.Linear weight [N, K]
    bias = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    out = rt.gemm(x, w.t(), bias, torch.bfloat16, config="auto", residual=x)  # h = x + o_proj(x)
    ref = x.float() @ w.float().t() + bias.float() + x.float()
    assert _rel(out, ref) < 1e-2
    via_ops = torch_autows.ops.gemm(x, w.t(), bias=bias, residual=x)  # ours or cuBLAS's addmm: the measured choice
    assert fallback.counters["gemm.autows"] + fallback.counters["gemm.vendor"] == 1
    assert _rel(via_ops, ref) < 1e-2


def test_residual_fallbacks():
    fallback.reset()
    a = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(512, 384, device="cuda", dtype=torch.bfloat16)
    r = torch.randn(384, 256, device="cuda", dtype=torch.bfloat16).t()  # strided: torch serves it
    out = torch_autows.ops.gemm(a, b, residual=r)
    assert fallback.counters["gemm.fallback"] == 1
    assert _rel(out, a.float() @ b.float() + r.float()) < 1e-2
    odd = torch.randn(256 * 384 + 1, device="cuda", dtype=torch.bfloat16)[1:].view(256, 384)  # R by TMA: 16 B
    out = torch_autows.ops.gemm(a, b, residual=odd)
    assert fallback.counters["gemm.fallback"] == 2
    assert _rel(out, a.float() @ b.float() + odd.float()) < 1e-2
    with pytest.raises(fallback.Unsupported, match="does not serve a residual"):
        rt.gemm(a, b, None, torch.float32, config="ws_p_128x256", residual=r.contiguous())


# --- the activation epilogue: gelu(a @ b (+ bias)) in fp32 before the one rounding ---

def _activation_cases(n=60, seed=2):
    rng = random.Random(seed)
    ms = [1, 2, 7, 16, 64, 100, 128, 129, 255, 256, 500, 1024, 4096]  # decode rows (split-K configs) and large ones
    acts = [(c, act) for act in ("gelu_tanh", "gelu") for c in rt.CONFIGS if rt.serves_activation(c, act)]
    out = []
    for i in range(n):
        config, act = acts[i % len(acts)]
        out.append(dict(m=rng.choice(ms), n=rng.choice([8, 64, 136, 256, 768, 1024, 3072]),
                        k=rng.choice([16, 100, 256, 768, 1000, 3072]),
                        dtype=rng.choice([torch.bfloat16, torch.float16]),
                        ta=rng.random() < 0.2, tb=rng.random() < 0.6, bias=rng.random() < 0.7,
                        out32=rng.random() < 0.15, config=config, act=act))
    return out


@pytest.mark.parametrize("case", _activation_cases(), ids=lambda c: f"{c['m']}x{c['n']}x{c['k']}-{c['config']}-"
                         f"{c['act']}" + ("-bias" if c["bias"] else ""))
def test_gemm_activation_random(case):
    torch.manual_seed(hash(str(case)) % 2**31)
    m, n = case["m"], case["n"]
    a = _operand(m, case["k"], case["dtype"], case["ta"])
    b = _operand(case["k"], n, case["dtype"], case["tb"])
    bias = 4 * torch.randn(n, device="cuda", dtype=case["dtype"]) if case["bias"] else None
    out_dtype = torch.float32 if case["out32"] else case["dtype"]
    approx = "tanh" if case["act"] == "gelu_tanh" else "none"
    ref = torch.nn.functional.gelu(a.float() @ b.float() + (bias.float() if bias is not None else 0),
                                   approximate=approx)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=out_dtype)
    rt.gemm(a, b, bias, out_dtype, config=case["config"], out=out, activation=case["act"])
    torch.cuda.synchronize()
    assert torch.isfinite(out).all(), "unwritten (NaN) or overflowed elements"
    assert _rel(out, ref) < 1e-2
    assert (out.float() >= -0.2).all()  # GELU's minimum is about -0.17: a missing activation shows


@pytest.mark.parametrize("config", [c for c in rt.CONFIGS if rt.CONFIGS[c].split_k > 1
                                    and rt.serves_activation(c, "gelu_tanh")])
def test_split_k_activation_is_applied_once(config, repeated_split_launches):
    a = torch.randn(13, 3000, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(3000, 1000, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(1000, device="cuda", dtype=torch.bfloat16)
    repeated_split_launches(lambda out: rt.gemm(a, b, bias, torch.bfloat16, config=config, out=out,
                                                activation="gelu_tanh"),
                            (13, 1000), torch.nn.functional.gelu(a.float() @ b.float() + bias.float(),
                                                                 approximate="tanh"), 1e-2)


@pytest.mark.parametrize("m", [1, 8, 128, 2048, 8192])
@pytest.mark.parametrize("act", ["gelu_tanh", "gelu"])
def test_ops_gemm_activation_served_and_counted(m, act):
    """GPT-2's c_fc (768 -> 3072, bias, GELU): the kernel with config='auto', and ops.gemm's measured choice."""
    fallback.reset()
    x = torch.randn(m, 768, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(3072, 768, device="cuda", dtype=torch.bfloat16) / 28  # nn.Linear weight [N, K]
    bias = torch.randn(3072, device="cuda", dtype=torch.bfloat16)
    ref = torch.nn.functional.gelu(x.float() @ w.float().t() + bias.float(),
                                   approximate="tanh" if act == "gelu_tanh" else "none")
    out = rt.gemm(x, w.t(), bias, torch.bfloat16, config="auto", activation=act)
    assert _rel(out, ref) < 1e-2
    via_ops = torch_autows.ops.gemm(x, w.t(), bias=bias, activation=act)  # ours, or cuBLAS then torch's gelu
    assert fallback.counters["gemm.autows"] + fallback.counters["gemm.vendor"] == 1
    assert _rel(via_ops, ref) < 1e-2


def test_activation_refusals():
    a = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(512, 384, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(fallback.Unsupported, match="does not serve activation 'gelu'"):
        rt.gemm(a, b, None, torch.bfloat16, config="ws_p_128x256", activation="gelu")
    out = rt.gemm(a, b, None, torch.bfloat16, config="ws_p_128x256", activation="gelu_tanh")
    assert _rel(out, torch.nn.functional.gelu(a.float() @ b.float(), approximate="tanh")) < 1e-2
