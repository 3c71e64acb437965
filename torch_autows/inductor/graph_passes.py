"""The ``CustomGraphPass`` objects autows installs in Inductor's config, and the cache key they carry.

Third parties cannot add keys to ``torch._inductor.config``; "autows on" therefore means two existing
options hold our passes (``inductor_options()``):

* ``pre_grad_custom_pass``: ``AutoWSPreGradPass`` rewrites attention in the torch-level graph (rewrite_attention.py);
* ``post_grad_custom_post_pass``: ``AutoWSPostGradPass`` installs the GEMM choices handler for the rest of
  the compile (choices.py) and, with max-autotune off, rewrites the SwiGLU (forward, backward), GELU, residual and
  RoPE fusions (rewrite_swiglu_bwd/swiglu/activation/residual/rope.py), then aten.mm/addmm/bmm (rewrite_gemm.py).

Each chains the pass the user had set in that option (run first; a 2.13 list is kept as a list) and
its ``uuid()`` hashes our ``__version__``, every source file of the package, ``config.snapshot()`` and the
runtimes' kernel gates (``support.kernel_gates()``; and the tests' ``support._pretend_target``; plus the chained
passes' uuids), so FX-graph and AOTAutograd cache entries of autows and plain Inductor compiles never mix. A chained
pass without a uuid makes ours None: Inductor then bypasses the cache, as it would for that pass alone.
"""
from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from pathlib import Path

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

from .. import config
from .._version import __version__
from . import support


def hash_tree(root: Path) -> str:
    """sha256 over the names and bytes of every file under ``root`` (bytecode caches excluded)."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo"):
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def source_hash() -> str:
    """``hash_tree`` of the installed package (sources, templates); computed once per process."""
    return hash_tree(Path(__file__).resolve().parent.parent)


def autows_uuid() -> str:
    """What an autows compile depends on beyond the graph and Inductor's config."""
    h = hashlib.sha256()
    h.update(f"torch_autows {__version__}\n{source_hash()}\n".encode())
    h.update(repr(sorted(config.snapshot().items())).encode())
    h.update(repr(support.kernel_gates()).encode())  # the runtimes' switches for kernels awaiting GPU tests
    if support._pretend_target:  # tests: rewrites that a real compile on this machine would not make
        h.update(b"pretend_target\n")
    return h.hexdigest()


def _as_list(user) -> list:
    if user is None:
        return []
    return list(user) if isinstance(user, (list, tuple)) else [user]


def _pass_uuid(p):
    fn = getattr(p, "uuid", None)
    return fn() if callable(fn) else None


class _Chained(CustomGraphPass):
    """Runs the user's previous pass(es), then ours."""

    def __init__(self, user=None):
        self.user = user

    def ours(self, graph: torch.fx.Graph) -> None:
        raise NotImplementedError

    def __call__(self, graph: torch.fx.Graph) -> None:
        for p in _as_list(self.user):
            p(graph)
        self.ours(graph)

    def uuid(self):
        chained = [_pass_uuid(p) for p in _as_list(self.user)]
        if any(u is None for u in chained):
            return None
        return hashlib.sha256(repr((type(self).__name__, autows_uuid(), chained)).encode()).hexdigest()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(user={self.user!r})"


class AutoWSPreGradPass(_Chained):
    """Attention rewrite on the torch-level graph."""

    def ours(self, graph: torch.fx.Graph) -> None:
        from .rewrite_attention import rewrite_attention

        rewrite_attention(graph)


class AutoWSPostGradPass(_Chained):
    """Installs the GEMM choices handler and our ops' lowerings; with max-autotune off, rewrites GEMMs to
    autows::gemm/bmm."""

    def ours(self, graph: torch.fx.Graph) -> None:
        from . import choices, lowering  # choices: the one import upward (see test/test_structure.py)
        from .rewrite_activation import rewrite_activation
        from .rewrite_gemm import rewrite_gemms
        from .rewrite_residual import rewrite_residual
        from .rewrite_rope import rewrite_rope
        from .rewrite_swiglu import rewrite_swiglu
        from .rewrite_swiglu_bwd import rewrite_swiglu_bwd

        lowering.register()  # also for the attention op the pre-grad rewrite inserted
        choices.ensure_installed()
        rewrite_swiglu_bwd(graph)  # a backward graph's SwiGLU gradients with their dh GEMM as one site
        rewrite_swiglu(graph)  # it takes two GEMMs and their product as one site
        rewrite_activation(graph)  # then a GEMM and its GELU as one site
        rewrite_residual(graph)  # then a GEMM and its residual add as one site
        rewrite_rope(graph)  # then a q/k projection and its rotary embedding as one site
        rewrite_gemms(graph)


def _find(value, cls) -> bool:
    return any(isinstance(p, cls) for p in _as_list(value))


def installed() -> bool:
    """Whether the Inductor config active here (this thread, these patches) has autows's passes."""
    from torch._inductor import config as ic

    return _find(ic.post_grad_custom_post_pass, AutoWSPostGradPass)


def patches(current: Callable[[str], object] | None = None) -> dict:
    """Inductor config entries that turn autows on, chaining what ``current(key)`` (default: the
    active config) holds unless it is already ours."""
    from torch._inductor import config as ic

    get = current or (lambda key: getattr(ic, key))
    out = {}
    for key, cls in (("pre_grad_custom_pass", AutoWSPreGradPass),
                     ("post_grad_custom_post_pass", AutoWSPostGradPass)):
        prev = get(key)
        out[key] = prev if _find(prev, cls) else cls(prev)
    return out
