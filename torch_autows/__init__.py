"""torch_autows: warp-specialized Gluon kernels for attention and GEMM on Hopper, generated from a tile IR.

Public API:
    torch_autows.ops.gemm / bmm / attention   kernels (fall back to torch with a logged reason)
    torch_autows.config                       settings (env vars TORCH_AUTOWS_*)
    torch_autows.enable() / disable()         route plain torch.compile through autows (Inductor flag)
    torch_autows.inductor_options()           options dict for torch.compile(m, options=...)
    torch_autows.explain(model, *inputs)      which attention/GEMM sites autows serves, and why not
"""
from __future__ import annotations

# _logging first: it rewrites TORCH_LOGS=autows for torch before anything imports torch
from . import _logging, config, ops  # noqa: E402,F401
from . import custom_ops as _custom_ops  # noqa: E402,F401  (registers torch.ops.autows.*: torch.export.load needs them)
from ._compat import UntestedVersionWarning  # noqa: E402,F401  (warns once outside the tested torch/triton)
from ._version import __version__  # noqa: F401  (re-exported)


def _register_backend() -> None:
    """``torch.compile(backend="autows")`` after ``import torch_autows`` even where the package is not
    pip-installed (no entry point): a thin wrapper, so torch._inductor loads only on first compile.
    Guarded: registering a name twice is an error in torch's registry."""
    from torch._dynamo.backends import registry

    if "autows" not in registry._BACKENDS:
        def autows(gm, example_inputs, **kwargs):
            from .inductor.backend import autows as impl

            return impl(gm, example_inputs, **kwargs)

        registry.register_backend(autows, name="autows")


_register_backend()
if config.env_flag("TORCH_AUTOWS", False):  # strict: 1/0, true/false, yes/no, on/off; else ValueError
    from .inductor.api import enable_from_env as _enable_from_env

    _enable_from_env()


def __getattr__(name):
    # The Inductor glue imports torch._inductor, which is slow: load it on first use only.
    if name in ("enable", "disable", "inductor_options", "explain"):
        from .inductor import api

        return getattr(api, name)
    raise AttributeError(f"module 'torch_autows' has no attribute {name!r}")
