"""The post-grad activation rewrite (inductor/rewrite_activation.py): GPT-2's ``c_proj(gelu(c_fc(x)))`` (addmm ->
view -> Inductor's decomposed GELU in the post-grad graph) becomes one ``autows::gemm_act`` for c_fc in inference
graphs, lowered to a direct ``extern_kernels.autows_mm_gelu_tanh`` call; GELUs it cannot fuse (training graphs,
fp32, other pointwise math, symbolic sizes) stay with a logged reason; explain lists the fusion."""
from __future__ import annotations

import pytest
import torch
import torch._inductor.config as ic
import torch.nn as nn
import torch.nn.functional as F

from torch_autows.inductor import api, support

from .conftest import compile_post_grad as _run


class MLP(nn.Module):
    """GPT-2's MLP: c_fc, GELU, c_proj."""

    def __init__(self, d=32, f=128, approximate="tanh", bias=True):
        super().__init__()
        self.c_fc, self.c_proj = nn.Linear(d, f, bias=bias), nn.Linear(f, d, bias=bias)
        self.act = nn.GELU(approximate=approximate)

    def forward(self, x):
        return self.c_proj(self.act(self.c_fc(x)))




def _x(dtype=torch.bfloat16, requires_grad=False, rows=5):
    torch.manual_seed(0)
    return torch.randn(2, rows, 32, dtype=dtype, requires_grad=requires_grad)


@pytest.mark.parametrize("approximate,bias", [("tanh", True), ("tanh", False), ("none", True)])
def test_gpt2_mlp_is_fused(pretend, monkeypatch, approximate, bias):
    model = MLP(approximate=approximate, bias=bias).to(torch.bfloat16)
    x = _x()
    with torch.no_grad():
        got, graph = _run(model, x, monkeypatch=monkeypatch)
        ref = model(x)
    act = "gelu_tanh" if approximate == "tanh" else "gelu"
    assert support.site_counters["gemm_act.rewritten"] == 1, graph
    assert graph.count("autows.gemm_act") == 1 and f", {act}, " in graph
    assert "aten.tanh" not in graph and "aten.erf" not in graph
    assert graph.count("autows.gemm.default") == 1  # c_proj: a plain GEMM
    torch.testing.assert_close(got, ref, atol=3e-2, rtol=3e-2)


def test_bias_add_after_views_is_fused(pretend, monkeypatch):
    """``gelu(mm(a, b) [views] + bias)``: the separate bias add goes into the kernel too."""
    w, bias = torch.randn(32, 64, dtype=torch.bfloat16), torch.randn(64, dtype=torch.bfloat16)

    def f(x):
        return F.gelu((x.reshape(-1, 32) @ w).reshape(2, 5, 64) + bias, approximate="tanh")

    x = _x()
    with torch.no_grad():
        got, graph = _run(f, x, monkeypatch=monkeypatch)
    assert "autows.gemm_act" in graph and "aten.add" not in graph, graph
    torch.testing.assert_close(got, f(x), atol=3e-2, rtol=3e-2)


def test_gelu_written_out_in_16_bit_is_fused(pretend, monkeypatch):
    """HF GPT-2's ``gelu_new`` (tanh form written out, no upcast) and a GELU spelled with sigmoid: the probe
    recognises the math; a GELU followed by more math fuses the GELU only."""
    import math

    w, bias = torch.randn(32, 64, dtype=torch.bfloat16) / 6, torch.randn(64, dtype=torch.bfloat16)

    def gelu_new(x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))

    def f(x):
        y = torch.addmm(bias, x, w)
        return gelu_new(y), F.gelu(x @ w) * 2 + 1

    x = torch.randn(10, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        got, graph = _run(f, x, monkeypatch=monkeypatch)
    assert support.site_counters["gemm_act.rewritten"] == 2, graph
    assert ", gelu_tanh, " in graph and ", gelu, " in graph and "aten.tanh" not in graph and "erf" not in graph
    for g, r in zip(got, f(x)):
        torch.testing.assert_close(g, r, atol=5e-2, rtol=5e-2)


def test_lowered_to_a_direct_extern_call(pretend):
    from torch._inductor.utils import run_and_get_code

    from torch_autows.runtime import fallback

    model = MLP().to(torch.bfloat16)
    x = _x()
    with torch.no_grad(), ic.patch(api.inductor_options()):
        got, code = run_and_get_code(torch.compile(model), x)
        ref = model(x)
    src = "\n".join(code)
    assert src.count("extern_kernels.autows_mm_gelu_tanh(") == 1, src
    assert "torch.ops.autows" not in src and "tanh" not in src.replace("autows_mm_gelu_tanh", "")
    assert fallback.counters["gemm.fallback"] == 2  # c_fc (with its GELU) and c_proj, on CPU tensors
    torch.testing.assert_close(got, ref, atol=3e-2, rtol=3e-2)


def test_sites_it_cannot_fuse_stay_with_a_reason(pretend, monkeypatch, log_warnings):
    # training: the GEMM's output is saved for the GELU's backward (the op has none)
    model = MLP().to(torch.bfloat16)
    x = _x(requires_grad=True)
    got, graph = _run(model, x, monkeypatch=monkeypatch)
    got.float().sum().backward()
    assert "gemm_act" not in graph and "saved for a backward" in log_warnings.text
    # fp32: the epilogue is the 16-bit kernel's
    torch._dynamo.reset()
    with torch.no_grad():
        _, graph = _run(MLP(), _x(torch.float32), monkeypatch=monkeypatch)
    assert "gemm_act" not in graph and "takes 16-bit operands" in log_warnings.text
    # other pointwise math after a GEMM (a tanh that is not a GELU) stays, logged
    torch._dynamo.reset()
    w = torch.randn(32, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        got, graph = _run(lambda x: (torch.tanh((x @ w).float()) * 2).to(torch.bfloat16), x.detach(),
                          monkeypatch=monkeypatch)
    assert "gemm_act" not in graph and "not F.gelu" in log_warnings.text
    assert support.site_counters["gemm_act.rewritten"] == 0


@pytest.mark.parametrize("mode", ["measure", "prior"])
def test_symbolic_rows_or_prior_stay_unfused(pretend, monkeypatch, log_warnings, mode):
    import torch_autows

    model = MLP().to(torch.bfloat16)
    with torch.no_grad(), torch_autows.config.patch(choice=mode):
        x = _x(rows=7)
        got, graph = _run(model, x, monkeypatch=monkeypatch, dynamic=mode == "measure")
        torch.testing.assert_close(got, model(x), atol=3e-2, rtol=3e-2)
    assert "autows.gemm_act" not in graph and "gemm_act" in log_warnings.text


def test_explain_lists_the_fusion(pretend):
    import torch_autows

    report = torch_autows.explain(MLP().to(torch.bfloat16), _x(), print_report=False)
    gemms = [s for s in report.sites if s.kind == "gemm"]
    assert len(gemms) == 2
    fused = [s for s in gemms if "+gelu_tanh" in s.shape]
    assert len(fused) == 1 and "autows::gemm_act" in fused[0].why and fused[0].kernel == "autows", gemms


def test_symbolic_rows_fused_when_forced(pretend, monkeypatch, recwarn):
    """config.choice = "autows": a site with symbolic rows is fused; the GEMM's views are replayed on the fused
    output with their symbolic size nodes (not raw SymInt values in the graph)."""
    import torch_autows

    model = MLP().to(torch.bfloat16)
    seen = []
    with torch.no_grad(), torch_autows.config.patch(choice="autows"):
        for rows in (3, 7):
            x = _x(rows=rows)
            got, graph = _run(model, x, monkeypatch=monkeypatch, dynamic=True)
            seen.append(graph)
            torch.testing.assert_close(got, model(x), atol=3e-2, rtol=3e-2)
    assert "autows.gemm_act" in "\n".join(seen)
    assert not [w for w in recwarn if "Raw SymInt" in str(w.message)]
