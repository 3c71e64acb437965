"""Fixtures for the Inductor-integration tests: CPU only, fresh Dynamo state, no compile caches.

``pretend`` makes CPU-traced graphs count as sm_90 targets and stubs the runtime's support checks, so
the rewrites fire on this machine; the ops then still see CPU tensors and fall back to torch at run time.
"""
from __future__ import annotations

import logging

import pytest
import torch
import torch._dynamo
import torch._inductor.config as ic

from torch_autows import config
from torch_autows.inductor import target
from torch_autows.runtime import fallback


def pytest_collection_modifyitems(config, items):
    quiet = pytest.mark.filterwarnings("ignore:dynamo_pgo force disabled")  # from force_disable_caches
    for item in items:
        if "test/inductor" in str(item.fspath).replace("\\", "/"):
            item.add_marker(quiet)


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    target.reset()
    fallback.reset()
    with ic.patch(force_disable_caches=True, compile_threads=1):
        yield
    torch._dynamo.reset()


@pytest.fixture
def pretend(monkeypatch):
    """Rewrites fire on CPU-traced graphs; the runtime's support checks say yes."""
    monkeypatch.setattr(config, "pretend_sm90", True)
    monkeypatch.setattr(target, "attention_support_fn", lambda: True)
    monkeypatch.setattr(target, "gemm_support_fn", lambda: (lambda a, b, bias=None, out_dtype=None, **kw: None))
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
