"""The post-grad SwiGLU rewrite (inductor/rewrite_swiglu.py): gate, up and silu-product become one
``autows::gemm_swiglu`` in inference graphs of the Llama MLP (Inductor's silu decomposition, nn.SiLU as Hugging
Face's ACT2FN uses it, x * sigmoid(x)); near misses and training graphs stay unfused with a reason."""
from __future__ import annotations

import logging

import pytest
import torch
import torch._inductor.config as ic
import torch.nn as nn
import torch.nn.functional as F

from torch_autows.inductor import api, support
from torch_autows.runtime import swiglu as rt_swiglu

from .conftest import compile_time_yes
from .conftest import post_grad_graphs as _post_grad_graphs

aten = torch.ops.aten


class MLP(nn.Module):
    def __init__(self, h=32, f=48, act="silu"):
        super().__init__()
        self.gate, self.up = nn.Linear(h, f, bias=False), nn.Linear(h, f, bias=False)
        self.down = nn.Linear(f, h, bias=False)
        self.act = {"silu": F.silu, "module": nn.SiLU(), "sigmoid": lambda x: x * torch.sigmoid(x), "gelu": F.gelu}[act]

    def forward(self, x):
        return self.down(self.act(self.gate(x)) * self.up(x))


@pytest.fixture
def swiglu_pretend(pretend, monkeypatch):
    monkeypatch.setattr(rt_swiglu, "support_reason", compile_time_yes(rt_swiglu.support_reason))




def _run(model, x, monkeypatch):
    seen = _post_grad_graphs(monkeypatch)
    with ic.patch(api.inductor_options()):
        got = torch.compile(model)(x)
    return got, "\n".join(seen)


@pytest.mark.parametrize("act", ["silu", "module", "sigmoid"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_inference_mlp_is_fused(swiglu_pretend, monkeypatch, act, dtype):
    torch.manual_seed(0)
    model = MLP(act=act).to(dtype)
    x = torch.randn(2, 5, 32, dtype=dtype)
    with torch.no_grad():
        got, graph = _run(model, x, monkeypatch)
        ref = model(x)
    assert support.site_counters["swiglu.rewritten"] == 1
    assert "autows.gemm_swiglu" in graph and graph.count("aten.mm") == 0  # down: autows.gemm
    torch.testing.assert_close(got, ref, atol=2e-2, rtol=2e-2)


def test_near_misses_stay_unfused(swiglu_pretend, monkeypatch, log_warnings):
    x = torch.randn(4, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        _, graph = _run(MLP(act="gelu").to(torch.bfloat16), x, monkeypatch)  # not silu: no pattern at all
    assert "gemm_swiglu" not in graph and support.site_counters["swiglu.rewritten"] == 0

    class TwoInputs(MLP):
        def forward(self, x):
            return self.down(F.silu(self.gate(x)) * self.up(x * 2))

    torch._dynamo.reset()
    with torch.no_grad():
        _, graph = _run(TwoInputs().to(torch.bfloat16), x, monkeypatch)
    assert "gemm_swiglu" not in graph
    assert "different activations" in log_warnings.text


def test_training_graph_keeps_inductors_path_until_the_saving_kernel_is_checked(swiglu_pretend, monkeypatch,
                                                                                  log_warnings):
    """A training graph saves g and u: the site is the op that writes them too (gemm_swiglu_save), which the
    measured choice may take only once its GPU tests have passed (runtime.swiglu.SAVE_GPU_CHECKED)."""
    monkeypatch.setattr(rt_swiglu, "SAVE_GPU_CHECKED", False)
    model = MLP().to(torch.bfloat16)
    x = torch.randn(4, 32, dtype=torch.bfloat16, requires_grad=True)
    got, graph = _run(model, x, monkeypatch)
    got.sum().backward()
    assert "gemm_swiglu" not in graph and support.site_counters["swiglu.rewritten"] == 0
    assert "has not passed its GPU numerics tests" in log_warnings.text
    assert x.grad is not None and torch.isfinite(x.grad.float()).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_training_graph_saves_the_projections_from_the_fused_kernel(swiglu_pretend, monkeypatch, dtype):
    monkeypatch.setattr(rt_swiglu, "SAVE_GPU_CHECKED", True)
    torch.manual_seed(0)
    model = MLP().to(dtype)
    x, dy = torch.randn(2, 5, 32, dtype=dtype), torch.randn(2, 5, 32, dtype=dtype)
    seen = _post_grad_graphs(monkeypatch)
    xg = x.clone().requires_grad_()
    with ic.patch(api.inductor_options()):
        torch.compile(model)(xg).backward(dy)
    forward = seen[0]
    assert support.site_counters["swiglu.rewritten"] == 1
    assert "autows.gemm_swiglu_save" in forward and forward.count("aten.mm") == 0  # down: autows.gemm
    got = [xg.grad, *(p.grad for p in model.parameters())]
    model.zero_grad(set_to_none=True)
    xe = x.clone().requires_grad_()
    model(xe).backward(dy)
    for g, e in zip(got, [xe.grad, *(p.grad for p in model.parameters())]):
        torch.testing.assert_close(g, e, atol=3e-2, rtol=3e-2)


def test_a_saved_intermediate_other_than_the_projections_stays_unfused(swiglu_pretend, monkeypatch, log_warnings):
    class Leaky(MLP):  # returns silu(gate(x)) too: the fused op does not write it
        def forward(self, x):
            s = F.silu(self.gate(x))
            return self.down(s * self.up(x)), s

    with torch.no_grad():
        _, graph = _run(Leaky().to(torch.bfloat16), torch.randn(4, 32, dtype=torch.bfloat16), monkeypatch)
    assert "gemm_swiglu" not in graph and "is used outside the SwiGLU pattern" in log_warnings.text


@pytest.mark.parametrize("act", ["silu", "module", "sigmoid"])
def test_explain_lists_the_fusion(swiglu_pretend, act):
    import torch_autows

    report = torch_autows.explain(MLP(act=act).to(torch.bfloat16), torch.randn(2, 5, 32, dtype=torch.bfloat16),
                                  print_report=False)
    fused = [s for s in report.sites if s.kind == "swiglu"]
    assert len(fused) == 1 and fused[0].kernel == "autows" and "autows::gemm_swiglu" in fused[0].why
    assert report.count("gemm") == 1  # down alone: gate and up are inside the fusion
    assert "1 SwiGLU fusion(s)" in str(report).splitlines()[0]
    gelu = torch_autows.explain(MLP(act="gelu").to(torch.bfloat16), torch.randn(4, 32, dtype=torch.bfloat16),
                                print_report=False)
    assert gelu.count("swiglu") == 0 and gelu.count("gemm") == 3


def test_symbolic_rows_are_fused(swiglu_pretend, monkeypatch):
    # dynamic=True: the site is decided at run time per shape bucket; the pattern still matches
    model = MLP().to(torch.bfloat16)
    seen = _post_grad_graphs(monkeypatch)
    with torch.no_grad(), ic.patch(api.inductor_options()):
        cm = torch.compile(model, dynamic=True)
        for n in (3, 7, 12):
            x = torch.randn(n, 32, dtype=torch.bfloat16)
            torch.testing.assert_close(cm(x), model(x), atol=2e-2, rtol=2e-2)
    assert support.site_counters["swiglu.rewritten"] == 1 and "autows.gemm_swiglu" in "\n".join(seen)


def test_symbolic_3d_rows_reshape_with_graph_sizes(swiglu_pretend, monkeypatch):
    """[B, S, hidden] with dynamic B and S: the fused [B*S, ffn] output is reshaped back with the pattern's own
    size nodes, never raw SymInts in a node's arguments (Graph.create_node warns about those)."""
    import warnings

    model = MLP().to(torch.bfloat16)
    seen = _post_grad_graphs(monkeypatch)
    with torch.no_grad(), ic.patch(api.inductor_options()), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cm = torch.compile(model, dynamic=True)
        for n in (3, 7):
            x = torch.randn(2, n, 32, dtype=torch.bfloat16)
            torch.testing.assert_close(cm(x), model(x), atol=2e-2, rtol=2e-2)
    assert "autows.gemm_swiglu" in "\n".join(seen)
    assert not [w for w in caught if "Raw SymInt" in str(w.message)]



def test_lowered_to_a_direct_extern_call(swiglu_pretend, caplog):
    """The fused site is a direct ``extern_kernels.autows_mm_swiglu(a, w_gate, w_up, out=buf)`` call in the output
    code, not the custom op through the dispatcher (on the H200 that path cost about 20 us more host time a call than
    Inductor's three launches in the decode MLP). On CPU tensors it computes torch's result with the reason logged."""
    from torch._inductor.utils import run_and_get_code

    from torch_autows.runtime import fallback

    torch.manual_seed(0)
    model = MLP().to(torch.bfloat16)
    x = torch.randn(2, 5, 32, dtype=torch.bfloat16)
    with torch.no_grad(), ic.patch(api.inductor_options()), caplog.at_level(logging.WARNING, logger="torch_autows"):
        got, code = run_and_get_code(torch.compile(model), x)
        ref = model(x)
    src = "\n".join(code)
    assert src.count("extern_kernels.autows_mm_swiglu(") == 1, src
    assert "torch.ops.autows.gemm_swiglu" not in src
    assert fallback.counters["gemm_swiglu.fallback"] >= 1
    assert any("gemm_swiglu" in r.getMessage() and "cpu" in r.getMessage() for r in caplog.records), caplog.text
    torch.testing.assert_close(got, ref, atol=2e-2, rtol=2e-2)
