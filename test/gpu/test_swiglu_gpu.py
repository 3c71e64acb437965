"""The swiglu GEMM on sm_90 against an fp32 reference: every runtime.swiglu config, ragged shapes, both weight
layouts (row-major [K, N] and nn.Linear's [N, K] through ``w.t()``), bf16/fp16, fp32 output. Outputs are
poisoned with NaN before each run, so an unwritten element fails the check."""
from __future__ import annotations

import pytest
import torch

import torch_autows
from torch_autows.runtime import fallback
from torch_autows.runtime import swiglu as rt

SHAPES = [(1, 256, 512), (7, 1000, 3000), (64, 128, 64), (100, 1024, 1000), (129, 384, 520), (300, 2048, 4096)]


def _inputs(m, n, k, dtype=torch.bfloat16, linear=True, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", dtype=dtype, generator=g)
    ws = [torch.randn(n, k, device="cuda", dtype=dtype, generator=g) / k ** 0.5 for _ in range(2)]
    # nn.Linear weights [N, K] seen as [K, N] views, or row-major [K, N] tensors
    return (a, *(w.t() if linear else w.t().contiguous() for w in ws))


def _ref(a, wg, wu):
    a = a.float()
    return torch.nn.functional.silu(a @ wg.float()) * (a @ wu.float())


def _rel(out, ref):
    return ((out.float() - ref).norm() / ref.norm().clamp_min(1e-6)).item()


@pytest.mark.parametrize("linear", [True, False], ids=["w.t()", "row-major"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("config", list(rt.CONFIGS))
def test_numerics(config, shape, linear):
    if rt.CONFIGS[config].swap_ab and not linear:
        pytest.skip("a swap-AB config serves nn.Linear's layout only (test_ops_swiglu.py checks the refusal)")
    m, n, k = shape
    a, wg, wu = _inputs(m, n, k, linear=linear)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    rt.gemm_swiglu(a, wg, wu, torch.bfloat16, config=config, out=out)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all(), "unwritten (NaN) or overflowed elements"
    assert _rel(out, _ref(a, wg, wu)) < 1e-2


@pytest.mark.parametrize("config", list(rt.CONFIGS))
def test_fp16_and_fp32_output(config):
    a, wg, wu = _inputs(45, 640, 1000, dtype=torch.float16, seed=1)
    out = torch.full((45, 640), float("nan"), device="cuda", dtype=torch.float32)
    rt.gemm_swiglu(a, wg, wu, torch.float32, config=config, out=out)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()
    assert _rel(out, _ref(a, wg, wu)) < 2e-3


@pytest.mark.parametrize("config", [c for c, o in rt.CONFIGS.items() if o.split_k > 1])
def test_split_k_is_deterministic_and_resets_counters(config, repeated_split_launches):
    a, wg, wu = _inputs(13, 1000, 3000, seed=2)
    repeated_split_launches(lambda out: rt.gemm_swiglu(a, wg, wu, torch.bfloat16, config=config, out=out),
                            (13, 1000), _ref(a, wg, wu), 1e-2)


@pytest.mark.parametrize("m", [1, 16, 128, 512])
def test_heuristic_config(m):
    a, wg, wu = _inputs(m, 2048, 1024, seed=3)
    out = rt.gemm_swiglu(a, wg, wu, torch.bfloat16, config="auto")
    torch.cuda.synchronize()
    assert _rel(out, _ref(a, wg, wu)) < 1e-2


def test_ops_served_and_counted():
    fallback.reset()
    a, wg, wu = _inputs(256, 512, 384, seed=4)
    out = torch_autows.ops.gemm_swiglu(a, wg, wu)
    assert fallback.counters["gemm_swiglu.autows"] == 1
    assert _rel(out, _ref(a, wg, wu)) < 1e-2
    # weights of different layouts: one kernel reads both with one layout, so torch serves it (logged)
    out = torch_autows.ops.gemm_swiglu(a, wg, wu.contiguous())
    assert fallback.counters["gemm_swiglu.fallback"] == 1
    assert _rel(out, _ref(a, wg, wu)) < 1e-2


@pytest.mark.parametrize("m", [1, 16, 300])
def test_vendor_path_of_the_choice_is_inductors_result(m):
    # runtime.choice times ours against this; it must compute the same function (two GEMMs, one pointwise)
    from torch_autows.runtime import swiglu as rt

    a = torch.randn(m, 512, device="cuda", dtype=torch.bfloat16)
    bg, bu = (torch.randn(512, 1000, device="cuda", dtype=torch.bfloat16) / 512 ** 0.5 for _ in range(2))
    out = torch.full((m, 1000), float("nan"), device="cuda", dtype=torch.bfloat16)
    rt.vendor_swiglu(a, bg, bu, out)
    ref = torch.nn.functional.silu(a.float() @ bg.float()) * (a.float() @ bu.float())
    torch.testing.assert_close(out.float(), ref, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("linear", [True, False], ids=["w.t()", "row-major"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_saving_the_projections(shape, linear):
    """epilogue "swiglu_save" (runtime.swiglu.SAVE_CONFIG, a training graph's forward): the product and both
    projections, each NaN-poisoned before the run. These are the cases SAVE_GPU_CHECKED waits for."""
    m, n, k = shape
    a, wg, wu = _inputs(m, n, k, linear=linear, seed=5)
    out, g, u = (torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(3))
    rt.gemm_swiglu(a, wg, wu, torch.bfloat16, config="auto", out=out, saved=(g, u))
    torch.cuda.synchronize()
    for got, ref in ((out, _ref(a, wg, wu)), (g, a.float() @ wg.float()), (u, a.float() @ wu.float())):
        assert torch.isfinite(got).all(), "unwritten (NaN) or overflowed elements"
        assert _rel(got, ref) < 1e-2


def test_training_step_with_both_swiglu_fusions(monkeypatch):
    """The Llama MLP compiled with the backend in training: the forward writes the projections from the fused
    kernel (gemm_swiglu_save), the backward's dh GEMM writes both gradients (gemm_swiglu_bwd); every gradient as
    close to fp32 as eager bf16's."""
    import torch.nn as nn
    import torch.nn.functional as F

    from torch_autows import config
    from torch_autows.inductor import support
    from torch_autows.runtime import swiglu_bwd

    monkeypatch.setattr(rt, "SAVE_GPU_CHECKED", True)
    monkeypatch.setattr(swiglu_bwd, "GPU_CHECKED", True)

    class MLP(nn.Module):
        def __init__(self, h=1024, f=2816):
            super().__init__()
            self.gate, self.up = nn.Linear(h, f, bias=False), nn.Linear(h, f, bias=False)
            self.down = nn.Linear(f, h, bias=False)

        def forward(self, x):
            return self.down(F.silu(self.gate(x)) * self.up(x))

    torch.manual_seed(0)
    ref = MLP().cuda()
    model = MLP().cuda().bfloat16()
    model.load_state_dict({k: v.bfloat16() for k, v in ref.state_dict().items()})
    x, dy = torch.randn(4, 512, 1024, device="cuda"), torch.randn(4, 512, 1024, device="cuda")

    def grads(m, dtype, compiled):
        m.zero_grad(set_to_none=True)
        xi = x.to(dtype).detach().requires_grad_()  # a leaf in every dtype (x.to(float32) is x itself)
        f = torch.compile(m, backend="autows") if compiled else m
        f(xi).backward(dy.to(dtype))
        return [xi.grad.float(), *(p.grad.float() for p in m.parameters())]

    support.reset()
    exact, eager = grads(ref, torch.float32, False), grads(model, torch.bfloat16, False)
    with config.patch(choice="autows"):  # the fused kernels whatever their speed
        got = grads(model, torch.bfloat16, True)
    assert support.site_counters["swiglu.rewritten"] == 1 and support.site_counters["swiglu_bwd.rewritten"] == 1
    for e, b, c in zip(exact, eager, got):
        assert torch.isfinite(c).all()
        assert _rel(c, e) <= 2 * _rel(b, e) + 4e-3
