"""GEMM: the post-grad rewrite (max-autotune off) and the ExternKernelChoice (max-autotune on)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch._inductor.select_algorithm import extern_kernels
from torch.fx.experimental.proxy_tensor import make_fx

from torch_autows import config, ops
from torch_autows.inductor import choices, externs, support
from torch_autows.inductor.rewrite_gemm import find_gemm_sites, rewrite_gemms
from torch_autows.runtime import gemm as rt_gemm

aten = torch.ops.aten


def _aten_graph(fn, *inputs):
    return make_fx(fn, tracing_mode="fake")(*inputs)


def _ops(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_post_grad_rewrite_fuses_bias_and_keeps_epilogue(pretend):
    a, b, bias, x = torch.randn(8, 16), torch.randn(16, 4), torch.randn(4), torch.randn(3, 8, 16)

    def f(a, b, bias, x):
        y = F.gelu(torch.mm(a, b) + bias)        # mm + bias add: bias fused, gelu stays
        z = torch.addmm(bias, a, b)               # addmm: bias fused
        w = torch.bmm(x, x.transpose(1, 2))       # bmm
        return y, z, w

    gm = _aten_graph(f, a, b, bias, x)
    sites = rewrite_gemms(gm.graph)
    gm.recompile()
    assert [s.reason for s in sites] == [None, None, None]
    ops = _ops(gm)
    assert ops.count(torch.ops.autows.gemm.default) == 2 and ops.count(torch.ops.autows.bmm.default) == 1
    assert aten.mm.default not in ops and aten.addmm.default not in ops and aten.add.Tensor not in ops
    assert aten.gelu.default in ops  # the epilogue stays with Inductor
    for got, ref in zip(gm(a, b, bias, x), f(a, b, bias, x)):
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    fused = [n for n in gm.graph.nodes if n.target is torch.ops.autows.gemm.default]
    assert all(n.args[2] is not None for n in fused) and "val" in fused[0].meta


def test_post_grad_rewrite_of_chained_gemms(pretend):
    # x @ w1 @ w2 (+ bias): the second site's operand is the first site, rewritten before it
    x, w1, w2, bias = torch.randn(8, 16), torch.randn(16, 16), torch.randn(16, 4), torch.randn(4)

    def f(x, w1, w2, bias):
        return torch.mm(torch.mm(x, w1), w2) + bias, torch.addmm(bias, torch.mm(x, w1), w2)

    gm = _aten_graph(f, x, w1, w2, bias)
    sites = rewrite_gemms(gm.graph)  # lints the graph: no use of an erased node
    gm.recompile()
    assert [s.reason for s in sites] == [None] * 4 and aten.mm.default not in _ops(gm)
    for got, ref in zip(gm(x, w1, w2, bias), f(x, w1, w2, bias)):
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_post_grad_reasons(pretend, log_warnings):
    a, b = torch.randn(8, 16), torch.randn(16, 4)

    def f(a, b):
        return torch.addmm(torch.randn(8, 4), a, b, beta=2.0), torch.addmm(torch.ones(8, 4), a, b)

    gm = _aten_graph(f, a, b)
    reasons = [s.reason for s in find_gemm_sites(gm.graph)]
    assert any("alpha/beta" in r for r in reasons) and any("not 1-D" in r for r in reasons)
    rewrite_gemms(gm.graph)
    assert torch.ops.autows.gemm.default not in _ops(gm)
    assert any("alpha/beta" in r.getMessage() for r in log_warnings.records)


def test_gemm_reason(monkeypatch):
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    assert "tensors on cpu" in support.gemm_reason(a, b)
    monkeypatch.setattr(support, "_pretend_target", True)
    seen = {}

    def runtime_check(a, b, bias=None, out_dtype=None, *, check_device=True):
        seen.update(device=a.device.type, check_device=check_device)
        return None

    monkeypatch.setattr(rt_gemm, "support_reason", runtime_check)
    assert support.gemm_reason(a, b) is None
    assert seen == {"device": "cuda", "check_device": False}  # asked as a (fake) sm_90 request
    assert "float64" in support.gemm_reason(a.double(), b.double())
    monkeypatch.setattr(rt_gemm, "support_reason", lambda *args, check_device: 1 / 0)
    assert "runtime support check raised ZeroDivisionError" in support.gemm_reason(a, b)  # never breaks a compile
    monkeypatch.setattr(ops, "runtime_module", lambda name: None)  # no triton: the runtime cannot be imported
    assert "not available" in support.gemm_reason(a, b)
    monkeypatch.setattr(config, "gemm", False)
    assert "disabled" in support.gemm_reason(a, b)


def test_extern_kernels_registered_once():
    externs.register()
    externs.register()
    for op in ("mm", "addmm", "bmm", "attention"):
        assert getattr(extern_kernels, f"autows_{op}") is externs.KERNELS[op]
        assert externs.extern_choice(op) is externs.extern_choice(op)


def test_extern_kernels_compute_into_out():
    a, b, bias = torch.randn(8, 16), torch.randn(16, 4), torch.randn(4)
    out = torch.empty(8, 4)
    externs.autows_addmm(bias.expand(8, 4), a, b, out=out)
    torch.testing.assert_close(out, torch.addmm(bias, a, b))
    full = torch.randn(8, 4)
    externs.autows_addmm(full, a, b, alpha=1, beta=1, out=out)  # a 2-D bias: plain torch.addmm
    torch.testing.assert_close(out, torch.addmm(full, a, b))
    x, y, out3 = torch.randn(2, 4, 16), torch.randn(2, 16, 4), torch.empty(2, 4, 4)
    externs.autows_bmm(x, y, out=out3)
    torch.testing.assert_close(out3, torch.bmm(x, y))


def test_max_autotune_offers_our_choice(pretend, monkeypatch):
    seen = []
    base = choices.AutoWSChoices.get_template_configs

    def spy(self, kernel_inputs, templates, op_name, kwarg_overrides=None):
        out = base(self, kernel_inputs, templates, op_name, kwarg_overrides)
        seen.extend((op_name, getattr(c, "name", "")) for c in out)
        return out

    monkeypatch.setattr(choices.AutoWSChoices, "get_template_configs", spy)
    a, b = torch.randn(64, 32), torch.randn(32, 48)
    f = torch.compile(lambda a, b: torch.relu(a @ b), backend="autows",
                      options={"max_autotune": True, "max_autotune_gemm_backends": "ATEN"})
    torch.testing.assert_close(f(a, b), torch.relu(a @ b))
    assert ("mm", "autows_mm") in seen and ("mm", "mm") in seen
    assert support.site_counters["gemm.choice"] == 1 and support.site_counters["gemm.rewritten"] == 0


def test_rewritten_gemms_lower_to_direct_extern_calls(pretend):
    # max-autotune off: the wrapper calls our extern kernels into planned buffers, not the custom op
    # through the dispatcher (lowering.py); on CPU they then fall back to torch at run time.
    from torch._inductor.utils import run_and_get_code

    from torch_autows.runtime import fallback

    def f(a, b, bias, x):
        return F.gelu(torch.addmm(bias, a, b)), torch.mm(a, b) + bias, torch.bmm(x, x.transpose(1, 2)), a @ b

    a, b, bias, x = (t.bfloat16() for t in (torch.randn(64, 32), torch.randn(32, 48), torch.randn(48),
                                             torch.randn(2, 128, 64)))
    outs, code = run_and_get_code(torch.compile(f, backend="autows"), a, b, bias, x)
    src = "\n".join(code)
    # (the GELU of the first addmm is fused since rewrite_activation: extern_kernels.autows_mm_gelu)
    assert src.count("extern_kernels.autows_addmm(") == 1 and "extern_kernels.autows_mm(" in src
    assert src.count("extern_kernels.autows_mm_gelu(") == 1
    assert "extern_kernels.autows_bmm(" in src and "torch.ops.autows" not in src
    for got, ref in zip(outs, f(a, b, bias, x)):
        torch.testing.assert_close(got, ref, atol=2e-2, rtol=2e-2)
    assert support.site_counters["gemm.rewritten"] == 3 and support.site_counters["gemm_act.rewritten"] == 1
    assert fallback.counters["gemm.fallback"] == 3
    assert fallback.counters["bmm.fallback"] == 1


def test_direct_extern_calls_with_a_dynamic_dim(pretend):
    # mark_dynamic on the token dim: the lowering's output buffer takes the symbolic size
    from torch._inductor.utils import run_and_get_code

    w, bias = torch.randn(32, 48).bfloat16(), torch.randn(48).bfloat16()
    f = torch.compile(lambda x: torch.addmm(bias, x, w).relu(), backend="autows")
    for m in (64, 80):
        x = torch.randn(m, 32).bfloat16()
        torch._dynamo.mark_dynamic(x, 0)
        out, (code, *_) = run_and_get_code(f, x)
        torch.testing.assert_close(out, torch.addmm(bias, x, w).relu(), atol=2e-2, rtol=2e-2)
        assert "extern_kernels.autows_addmm(" in code and "empty_strided_cpu((s" in code  # [M, 48], M symbolic


def test_direct_extern_calls_forward_and_backward(pretend):
    # training: the backward graph's GEMMs (dX = dY W, dW = dY^T X) take the same lowering
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 48).bfloat16()
    ref = torch.nn.Linear(32, 48).bfloat16()
    ref.load_state_dict(lin.state_dict())
    x = torch.randn(64, 32).bfloat16().requires_grad_()
    xr = x.detach().clone().requires_grad_()
    torch.compile(lin, backend="autows")(x).float().square().mean().backward()
    ref(xr).float().square().mean().backward()
    for got, want in ((x.grad, xr.grad), (lin.weight.grad, ref.weight.grad), (lin.bias.grad, ref.bias.grad)):
        torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    assert support.site_counters["gemm.rewritten"] >= 3  # the forward addmm and two backward mms


def test_prior_keeps_small_gemms_on_the_vendor_path(pretend, monkeypatch, log_warnings):
    """With config.choice = "prior", a GEMM the cost rule gives to cuBLAS stays aten (logged with the reason);
    one it gives to ours is rewritten."""
    monkeypatch.setattr(config, "choice", "prior", raising=False)
    support.reset()
    bf = dict(dtype=torch.bfloat16)
    small = (torch.randn(16, 64, **bf), torch.randn(64, 128, **bf))
    big = (torch.randn(4096, 1024, **bf), torch.randn(1024, 1024, **bf))
    for (a, b), rewritten in ((small, False), (big, True)):
        gm = _aten_graph(torch.mm, a, b)
        sites = rewrite_gemms(gm.graph)
        assert sites[0].reason is None and (sites[0].vendor is None) is rewritten
        assert (torch.ops.autows.gemm.default in _ops(gm)) is rewritten
    assert support.site_counters["gemm.rewritten"] == 1 and support.site_counters["gemm.left"] == 1
    assert any("the vendor's kernel is chosen: the cost rule" in r.message for r in log_warnings.records)
