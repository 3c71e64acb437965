"""torch_autows: warp-specialized Gluon kernels for attention and GEMM on Hopper, generated from a tile IR.

Public API:
    torch_autows.ops.gemm / bmm / attention   kernels (fall back to torch with a logged reason)
    torch_autows.config                       settings (env vars TORCH_AUTOWS_*)
    torch_autows.enable() / disable()         route plain torch.compile through autows (Inductor flag)
    torch_autows.inductor_options()           options dict for torch.compile(m, options=...)
    torch_autows.explain(model, *inputs)      which attention/GEMM sites autows serves, and why not
"""
from __future__ import annotations

__version__ = "0.1.0"

from . import config, ops  # noqa: E402,F401


def __getattr__(name):
    # The Inductor glue imports torch._inductor, which is slow: load it on first use only.
    if name in ("enable", "disable", "inductor_options", "explain"):
        from .inductor import api

        return getattr(api, name)
    raise AttributeError(f"module 'torch_autows' has no attribute {name!r}")
