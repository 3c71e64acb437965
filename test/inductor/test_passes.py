"""The cache key our passes carry: autows and plain Inductor compiles must never share cache entries."""
from __future__ import annotations

import pytest
from torch._inductor.custom_graph_pass import CustomGraphPass

import torch_autows
from torch_autows import config
from torch_autows.inductor import graph_passes, support


class Named(CustomGraphPass):
    def __init__(self, uuid):
        self._uuid = uuid

    def __call__(self, graph):
        pass

    def uuid(self):
        return self._uuid


@pytest.mark.parametrize("setting,value", [("gemm", False), ("attention", False), ("debug", True),
                                           ("support._pretend_target", True)])
def test_uuid_changes_with_settings(monkeypatch, setting, value):
    owner, setting = (support, setting.split(".")[1]) if "." in setting else (config, setting)
    base_pass = graph_passes.AutoWSPostGradPass(None)
    base = base_pass.uuid()
    assert base and base == graph_passes.AutoWSPostGradPass(None).uuid()  # deterministic
    old = getattr(owner, setting)
    monkeypatch.setattr(owner, setting, value if value != old else not old)
    assert base_pass.uuid() != base
    monkeypatch.setattr(owner, setting, old)
    assert base_pass.uuid() == base


def test_uuid_covers_version_and_sources(monkeypatch, tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    before = graph_passes.hash_tree(tmp_path)
    (tmp_path / "pkg" / "a.py").write_text("x = 2\n")
    assert graph_passes.hash_tree(tmp_path) != before
    assert len(graph_passes.source_hash()) == 64
    base = graph_passes.autows_uuid()
    monkeypatch.setattr(graph_passes, "__version__", "0.0.0-other")
    assert graph_passes.autows_uuid() != base
    monkeypatch.setattr(graph_passes, "__version__", torch_autows.__version__)
    assert graph_passes.autows_uuid() == base
    monkeypatch.setattr(graph_passes, "source_hash", lambda: "edited-source")
    assert graph_passes.autows_uuid() != base


@pytest.mark.parametrize("module,flag", support.KERNEL_GATES)
def test_uuid_hashes_the_kernel_gates(monkeypatch, module, flag):
    """A kernel gate turned the other way (a kernel awaiting its GPU tests allowed, or a checked one held back)
    never reads a graph compiled as it was."""
    import importlib

    base = graph_passes.autows_uuid()
    rt = importlib.import_module(f"torch_autows.runtime.{module}")
    monkeypatch.setattr(rt, flag, not getattr(rt, flag))
    assert graph_passes.autows_uuid() != base


def test_uuid_chains_user_passes():
    a, b = graph_passes.AutoWSPostGradPass(Named("u1")), graph_passes.AutoWSPostGradPass(Named("u2"))
    assert a.uuid() and a.uuid() != b.uuid() != graph_passes.AutoWSPostGradPass(None).uuid()
    assert graph_passes.AutoWSPostGradPass([Named("u1"), Named("u2")]).uuid()  # 2.13 lists
    assert graph_passes.AutoWSPostGradPass(lambda g: None).uuid() is None     # no uuid: Inductor bypasses the cache
    assert graph_passes.AutoWSPostGradPass([Named("u1"), Named(None)]).uuid() is None
    assert graph_passes.AutoWSPreGradPass(None).uuid() != graph_passes.AutoWSPostGradPass(None).uuid()


def test_chained_user_pass_runs_first():
    order = []

    class Rec(CustomGraphPass):
        def __call__(self, graph):
            order.append("user")

        def uuid(self):
            return "rec"

    p = graph_passes.AutoWSPostGradPass([Rec(), Rec()])
    p.ours = lambda graph: order.append("autows")
    p(None)
    assert order == ["user", "user", "autows"]


def test_patches_do_not_double_wrap():
    user = Named("u")
    first = graph_passes.patches(lambda key: user)
    again = graph_passes.patches(lambda key: first[key])
    assert again == first and first["post_grad_custom_post_pass"].user is user


def test_autows_and_inductor_never_share_cache_entries(pretend, monkeypatch, tmp_path):
    """With the FX-graph and AOTAutograd caches on, an autows compile and a plain Inductor compile of the same
    graph each miss the other's entry: the post-grad pass (our uuid) runs for autows, never for Inductor."""
    import torch
    import torch._dynamo
    import torch._inductor.config as ic

    from torch_autows.inductor import support
    from torch_autows.runtime import fallback

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))

    def f(a, b):
        return torch.relu(a @ b)

    from torch._dynamo.utils import counters

    counters.clear()
    a, b = torch.randn(16, 32), torch.randn(32, 8)
    with ic.patch(force_disable_caches=False, fx_graph_cache=True, fx_graph_remote_cache=False):
        for backend in ("autows", "inductor", "autows", "inductor"):
            torch._dynamo.reset()
            support.reset()
            fallback.reset()
            torch.testing.assert_close(torch.compile(f, backend=backend)(a, b), f(a, b))
            ran_autows_op = fallback.counters["gemm.autows"] + fallback.counters["gemm.fallback"]
            assert ran_autows_op == (1 if backend == "autows" else 0), backend
    hits = counters["inductor"]["fxgraph_cache_hit"] + counters["aot_autograd"]["autograd_cache_hit"]
    assert hits >= 2  # the repeated compiles were served from the caches: each from its own entry
