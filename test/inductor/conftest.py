"""Fixtures for the Inductor-integration tests: CPU only, fresh Dynamo state, no compile caches.

``pretend`` makes CPU-traced graphs count as sm_90 targets and the runtime's support checks say yes, so
the rewrites fire on this machine; the ops then still see CPU tensors and fall back to torch at run time.
"""
from __future__ import annotations

import logging

import pytest
import torch
import torch._dynamo
import torch._inductor.config as ic

from torch_autows.inductor import support
from torch_autows.runtime import attention as rt_attention
from torch_autows.runtime import fallback
from torch_autows.runtime import gemm as rt_gemm


def pytest_collection_modifyitems(config, items):
    quiet = pytest.mark.filterwarnings("ignore:dynamo_pgo force disabled")  # from force_disable_caches
    for item in items:
        if "test/inductor" in str(item.fspath).replace("\\", "/"):
            item.add_marker(quiet)


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    support.reset()
    fallback.reset()
    with ic.patch(force_disable_caches=True, compile_threads=1):
        yield
    torch._dynamo.reset()


def compile_time_yes(real):
    """``real`` (a runtime ``support_reason``) that says yes where asked without the device check (the
    compile-time question under ``support._pretend_target``); the run-time check (device checked) stays the real one."""

    def support_reason(*args, check_device: bool = True, **kwargs):
        return None if not check_device else real(*args, check_device=check_device, **kwargs)

    return support_reason


@pytest.fixture
def pretend(monkeypatch):
    """Rewrites fire on CPU-traced graphs: the runtime's support checks say yes at compile time; at run time
    the ops still see CPU tensors and fall back to torch."""
    monkeypatch.setattr(support, "_pretend_target", True)
    for rt in (rt_attention, rt_gemm):
        monkeypatch.setattr(rt, "support_reason", compile_time_yes(rt.support_reason))
    yield


@pytest.fixture
def log_warnings(caplog):
    caplog.set_level(logging.WARNING, logger="torch_autows")
    return caplog


def _capture(fn, *inputs, **kwargs):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch.compile(fn, backend=backend, **kwargs)(*inputs)
    return graphs


@pytest.fixture
def capture():
    """``capture(fn, *inputs)``: the Dynamo graphs of ``fn(*inputs)``, no Inductor."""
    return _capture


def post_grad_graphs(monkeypatch) -> list[str]:
    """A list that receives, per compiled graph, its text after autows's post-grad pass ran."""
    from torch_autows.inductor import graph_passes

    seen: list[str] = []
    real = graph_passes.AutoWSPostGradPass.ours

    def ours(self, graph):
        real(self, graph)
        seen.append(str(graph))

    monkeypatch.setattr(graph_passes.AutoWSPostGradPass, "ours", ours)
    return seen


def compile_post_grad(model, *xs, monkeypatch, dynamic=False):
    """``torch.compile(model, dynamic=dynamic)(*xs)`` with the backend's Inductor options: (the output, the
    post-grad graphs' text)."""
    from torch_autows.inductor import api

    seen = post_grad_graphs(monkeypatch)
    with ic.patch(api.inductor_options()):
        got = torch.compile(model, dynamic=dynamic)(*xs)
    return got, "\n".join(seen)

