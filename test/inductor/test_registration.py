"""``torch.compile(backend="autows")`` finds the backend by its entry point, without ``import torch_autows``."""
from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import textwrap

import pytest

EP = "torch_autows.inductor.backend:autows"


def _entry_point_installed() -> bool:
    eps = importlib.metadata.entry_points(group="torch_dynamo_backends")
    return any(e.name == "autows" and e.value == EP for e in eps)


needs_ep = pytest.mark.skipif(not _entry_point_installed(),
                              reason="the autows entry point is not installed: run `pip install -e . --no-deps`")


def _run(code: str) -> str:
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


@needs_ep
def test_found_by_name_without_import():
    out = _run("""
        import sys
        import torch
        from torch._dynamo.backends.registry import lookup_backend
        assert not [m for m in sys.modules if m.startswith("torch_autows")]
        fn = lookup_backend("autows")
        print(fn.__module__, fn.__name__)
        import torch_autows.inductor.backend  # importing afterwards must not register twice
        print(lookup_backend("autows") is fn)
        compiled = torch.compile(lambda x: x * 2, backend="autows")  # construction looks the name up too
    """)
    assert out.split() == ["torch_autows.inductor.backend", "autows", "True"]


@needs_ep
def test_import_first_then_lookup():
    out = _run("""
        import torch
        import torch_autows.inductor.backend as b
        from torch._dynamo.backends.registry import list_backends, lookup_backend
        fn = lookup_backend("autows")  # the package's import-time wrapper or the entry point itself
        print("autows" in list_backends(), fn is b.autows or fn.__module__ == "torch_autows")
    """)
    assert out.split() == ["True", "True"]
