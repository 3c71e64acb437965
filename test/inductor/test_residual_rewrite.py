"""The post-grad residual rewrite (inductor/rewrite_residual.py): ``h = x + self.wo(o)`` (mm -> view -> add in the
post-grad graph) becomes one ``autows::gemm_residual`` in inference and training graphs; adds it cannot fuse
(broadcast, strided or fp32 residuals) stay with a logged reason; explain lists the fusion per site."""
from __future__ import annotations

import pytest
import torch
import torch._inductor.config as ic
import torch.nn as nn
import torch.nn.functional as F

from torch_autows.inductor import api, support

from .conftest import compile_post_grad as _run


class Block(nn.Module):
    """A Llama block's two residual adds: attention's output projection and the MLP's down projection."""

    def __init__(self, d=32, f=48, bias=False):
        super().__init__()
        self.wo, self.w1, self.w2 = nn.Linear(d, d, bias=bias), nn.Linear(d, f, bias=False), nn.Linear(f, d, bias=bias)

    def forward(self, x, o):
        h = x + self.wo(o)
        return self.w2(F.relu(self.w1(h))) + h  # the residual on the left and on the right




def _inputs(dtype=torch.bfloat16, requires_grad=False):
    torch.manual_seed(0)
    return (torch.randn(2, 5, 32, dtype=dtype, requires_grad=requires_grad),
            torch.randn(2, 5, 32, dtype=dtype, requires_grad=requires_grad))


def test_llama_block_is_fused(pretend, monkeypatch):
    for bias in (False, True):
        torch._dynamo.reset()
        support.reset()
        model = Block(bias=bias).to(torch.bfloat16)
        x, o = _inputs()
        with torch.no_grad():
            got, graph = _run(model, x, o, monkeypatch=monkeypatch)
            ref = model(x, o)
        assert support.site_counters["gemm_residual.rewritten"] == 2, graph
        assert graph.count("autows.gemm_residual") == 2 and "aten.add" not in graph and "aten.mm" not in graph
        torch.testing.assert_close(got, ref, atol=3e-2, rtol=3e-2)


def test_training_graph_is_fused_and_differentiable(pretend, monkeypatch):
    model = Block().to(torch.bfloat16)
    x, o = _inputs(requires_grad=True)
    got, graph = _run(model, x, o, monkeypatch=monkeypatch)
    got.float().sum().backward()
    assert "autows.gemm_residual" in graph and support.site_counters["gemm_residual.rewritten"] >= 2
    xr, orr = (t.detach().clone().requires_grad_() for t in (x, o))
    model(xr, orr).float().sum().backward()
    torch.testing.assert_close(x.grad, xr.grad, atol=5e-2, rtol=5e-2)
    torch.testing.assert_close(o.grad, orr.grad, atol=5e-2, rtol=5e-2)


def test_symbolic_rows_are_fused(pretend, monkeypatch):
    model = Block().to(torch.bfloat16)
    seen = []
    with torch.no_grad():
        for n in (3, 7):
            x, o = torch.randn(1, n, 32, dtype=torch.bfloat16), torch.randn(1, n, 32, dtype=torch.bfloat16)
            got, graph = _run(model, x, o, monkeypatch=monkeypatch, dynamic=True)
            seen.append(graph)
            torch.testing.assert_close(got, model(x, o), atol=3e-2, rtol=3e-2)
    assert "autows.gemm_residual" in "\n".join(seen)


@pytest.mark.parametrize("mode", ["measure", "prior"])
def test_symbolic_rows_stay_unfused_unless_forced(pretend, monkeypatch, log_warnings, mode):
    """A residual fusion is kept only where measured faster than cuBLAS's GEMM plus a read of R: with symbolic sizes (no
    measurement at compile time) or in prior mode the default's graph stays, with the reason logged."""
    import torch_autows

    torch._dynamo.reset()
    support.reset()
    model = Block().to(torch.bfloat16)
    with torch.no_grad(), torch_autows.config.patch(choice=mode):
        x, o = torch.randn(1, 7, 32, dtype=torch.bfloat16), torch.randn(1, 7, 32, dtype=torch.bfloat16)
        got, graph = _run(model, x, o, monkeypatch=monkeypatch, dynamic=mode == "measure")
        torch.testing.assert_close(got, model(x, o), atol=3e-2, rtol=3e-2)
    assert "autows.gemm_residual" not in graph and support.site_counters["gemm_residual.rewritten"] == 0
    assert "gemm_residual" in log_warnings.text


def test_adds_it_cannot_fuse_stay_with_a_reason(pretend, monkeypatch, log_warnings):
    class Near(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Linear(32, 32, bias=False)

        def forward(self, x, o):
            return (self.w(o) + x[:1],  # broadcast over rows
                    self.w(o) + x.t(),  # a transposed view
                    self.w(o) + self.w(x).t())  # a transposed GEMM output: strided too

    x = torch.randn(32, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        got, graph = _run(Near().to(torch.bfloat16), x, x.clone(), monkeypatch=monkeypatch)
    assert "gemm_residual" not in graph and support.site_counters["gemm_residual.rewritten"] == 0
    assert "broadcasts to the sum" in log_warnings.text
    assert "strides" in log_warnings.text
    torch._dynamo.reset()
    with torch.no_grad():  # fp32: the residual epilogue is the 16-bit kernel's
        _, graph = _run(Block(), *_inputs(torch.float32), monkeypatch=monkeypatch)
    assert "gemm_residual" not in graph and "16-bit operands" in log_warnings.text


def test_explain_lists_the_fusion(pretend):
    import torch_autows

    report = torch_autows.explain(Block().to(torch.bfloat16), *_inputs(), print_report=False)
    gemms = {s.node: s for s in report.sites if s.kind == "gemm"}
    assert len(gemms) == 3
    fused = [s for s in gemms.values() if "+residual" in s.shape]
    assert len(fused) == 2 and all("autows::gemm_residual" in s.why and s.kernel == "autows" for s in fused)
    assert [s.shape for s in gemms.values() if "+residual" not in s.shape] == ["[10x32]@[32x48]"]  # w1: relu after


def test_2d_add_folded_into_addmm_is_fused(pretend, monkeypatch):
    """Without a view between them Inductor folds ``mm + x`` into ``addmm(x, a, b)``: x [M, N] is the residual."""
    w = nn.Linear(32, 16, bias=False).to(torch.bfloat16)
    x, o = torch.randn(8, 16, dtype=torch.bfloat16), torch.randn(8, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        got, graph = _run(lambda x, o: x + w(o), x, o, monkeypatch=monkeypatch)
        ref = x + w(o)
    assert "autows.gemm_residual" in graph and "addmm" not in graph, graph
    torch.testing.assert_close(got, ref, atol=3e-2, rtol=3e-2)


def test_fused_sites_lower_to_direct_extern_calls(pretend):
    """The compiled wrapper calls ``extern_kernels.autows_mm_residual`` into a planned buffer (lowering.py), not
    ``torch.ops.autows.gemm_residual`` through the dispatcher; on CPU it then falls back to torch at run time."""
    from torch._inductor.utils import run_and_get_code

    from torch_autows.runtime import fallback

    for bias in (False, True):
        torch._dynamo.reset()
        support.reset()
        fallback.reset()
        model = Block(bias=bias).to(torch.bfloat16)
        x, o = _inputs()
        with torch.no_grad(), ic.patch(api.inductor_options()):
            got, code = run_and_get_code(torch.compile(model), x, o)
            ref = model(x, o)
        src = "\n".join(code)
        assert src.count("extern_kernels.autows_mm_residual(") == 2, src
        assert "torch.ops.autows" not in src
        assert support.site_counters["gemm_residual.rewritten"] == 2
        assert fallback.counters["gemm.fallback"] == 3  # wo, w2 (with their residuals) and w1, on CPU tensors
        torch.testing.assert_close(got, ref, atol=3e-2, rtol=3e-2)


def _mm(a, b, bias, out):
    return torch.addmm(bias, a, b, out=out) if bias is not None else torch.mm(a, b, out=out)


def _fake_runtime(monkeypatch, gemm):
    """A GEMM runtime whose ``gemm`` is ``gemm`` and whose vendor path is torch's, in place of the real one."""
    from types import SimpleNamespace

    from torch_autows import ops

    rt = SimpleNamespace(gemm=gemm, vendor_gemm=_mm)
    monkeypatch.setattr(ops, "runtime_module", lambda name: rt if name == "gemm" else None)


@pytest.mark.parametrize("path", ["vendor", "unsupported", "served"])
def test_extern_residual_paths(monkeypatch, path):
    """``autows_mm_residual`` as the op: the vendor's GEMM then ``add_(residual)``, torch for ``Unsupported``, or the
    kernel's output with R added in its epilogue (here a stand-in runtime that writes ``out`` itself)."""
    from torch_autows.inductor import externs
    from torch_autows.runtime import fallback
    from torch_autows.runtime.fallback import Unsupported

    fallback.reset()
    seen = []

    def gemm(a, b, bias, out_dtype, out=None, residual=None):
        seen.append(residual)
        if path == "unsupported":
            raise Unsupported("a reason")
        if path == "vendor":
            return None
        return _mm(a, b, bias, out).add_(residual)

    _fake_runtime(monkeypatch, gemm)
    torch.manual_seed(0)
    a, b, bias, r = torch.randn(8, 16), torch.randn(16, 4), torch.randn(4), torch.randn(8, 4)
    out = torch.full((8, 4), float("nan"))
    externs.autows_mm_residual(a, b, r, bias, out=out)
    torch.testing.assert_close(out, torch.addmm(bias, a, b) + r)
    assert len(seen) == 1 and seen[0] is r  # the runtime was asked with the residual
    counter = {"vendor": "gemm.vendor", "unsupported": "gemm.fallback", "served": "gemm.autows"}[path]
    assert fallback.counters[counter] == 1
    out2 = torch.empty(8, 4)
    externs.autows_mm_residual(a, b, r, out=out2)  # no bias
    torch.testing.assert_close(out2, a @ b + r)


def test_out_dtype_keeps_the_op(pretend):
    """An ``out_dtype`` other than the operands' (the rewrite never passes one) keeps the op's fallback kernel."""
    from torch._inductor.utils import run_and_get_code

    a, b, r = torch.randn(8, 16).bfloat16(), torch.randn(16, 32).bfloat16(), torch.randn(8, 32).bfloat16()
    f = torch.compile(lambda a, b, r: torch.ops.autows.gemm_residual(a, b, r, None, torch.float32) * 2)
    got, code = run_and_get_code(f, a, b, r)
    assert "torch.ops.autows.gemm_residual" in "\n".join(code) and "autows_mm_residual" not in "\n".join(code)
    torch.testing.assert_close(got, (a.float() @ b.float() + r.float()) * 2, atol=2e-2, rtol=2e-2)
