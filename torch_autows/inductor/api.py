"""Turning autows on for the default Inductor backend (``enable``, ``disable``, ``inductor_options``); ``explain``.

    torch_autows.enable()                     # plain torch.compile(m) now uses autows's rewrites and choice
    torch.compile(m, options=torch_autows.inductor_options())   # the same for one compile
    torch_autows.disable()                    # the Inductor config is as it was before enable()
    torch_autows.explain(m, x)                # which attention/GEMM sites autows serves, and why not

``enable()`` sets two existing Inductor options to our chaining passes (graph_passes.py); the GEMM choices
handler is installed by the post-grad pass in the compiling thread. On torch 2.13 Inductor's config
overrides are per thread (context variables): call ``enable()``/``disable()`` in the thread that compiles.
``TORCH_AUTOWS=1`` in the environment calls ``enable()`` at ``import torch_autows``.
"""
from __future__ import annotations

import logging

from .explain import ExplainReport, explain  # noqa: F401  (re-exported)

log = logging.getLogger("torch_autows")

_KEYS = ("pre_grad_custom_pass", "post_grad_custom_post_pass")
_saved: dict | None = None  # key -> (was_default, value) before enable()


def inductor_options(mode: str | None = None) -> dict:
    """Options for ``torch.compile(model, options=...)`` that route that compile through autows.

    ``torch.compile`` takes ``mode`` or ``options``, not both: pass the mode here instead
    (``inductor_options("max-autotune")`` = that mode's options + ours). The user's own
    ``pre_grad_custom_pass`` / ``post_grad_custom_post_pass`` (as set now) keep running: ours chain them.
    """
    from torch._inductor import list_mode_options

    from . import externs, graph_passes

    externs.register()  # output code loaded from Inductor's cache calls extern_kernels.autows_*
    return {**list_mode_options(mode or "default"), **graph_passes.patches()}


def enabled() -> bool:
    return _saved is not None


def enable() -> None:
    """Route plain ``torch.compile(m)`` (Inductor) through autows in this thread. Idempotent."""
    global _saved
    if _saved is not None:
        return
    from torch._inductor import config as ic

    from . import externs, graph_passes

    externs.register()  # output code loaded from Inductor's cache calls extern_kernels.autows_*
    opts = graph_passes.patches()
    _saved = {k: (_unset(ic, k), getattr(ic, k)) for k in _KEYS}
    for k in _KEYS:
        setattr(ic, k, opts[k])
    log.info("autows enabled for torch.compile (Inductor)")


def disable() -> None:
    """Undo ``enable()``: the two Inductor options get back their exact previous values (or defaults)."""
    global _saved
    if _saved is None:
        return
    from torch._inductor import config as ic

    from . import choices

    for k, (was_default, prev) in _saved.items():
        current = getattr(ic, k)
        if getattr(current, "user", object()) is not prev:
            log.warning("autows disable(): torch._inductor.config.%s was changed after enable(); left as is", k)
        else:
            _restore(ic, k, was_default, prev)
    choices.restore()
    _saved = None
    log.info("autows disabled; Inductor config restored")


def _unset(ic, key: str) -> bool:
    """Whether the user never set ``key`` (torch's config keeps "unset" apart from "set to the default")."""
    try:
        from torch.utils._config_module import _UNSET_SENTINEL

        raw = ic._config[key].user_override
        return (raw.get() if hasattr(raw, "get") else raw) is _UNSET_SENTINEL  # 2.13: a ContextVar
    except Exception:
        return False


def _restore(ic, key: str, unset: bool, value) -> None:
    setattr(ic, key, value)  # the public path: value restored, config hashes marked dirty
    if not unset:
        return
    try:  # and back to "unset" (``delattr`` would hide the key: it exists for mock.patch)
        from torch.utils._config_module import _UNSET_SENTINEL

        entry = ic._config[key]
        if hasattr(entry.user_override, "set"):
            entry.user_override.set(_UNSET_SENTINEL)
        else:
            entry.user_override = _UNSET_SENTINEL
    except Exception:  # the value is restored either way; only the "set by the user" flag may differ
        pass


def enable_from_env() -> None:
    """``enable()`` if ``TORCH_AUTOWS`` is set to a true value (called by ``import torch_autows``)."""
    import os

    if os.environ.get("TORCH_AUTOWS", "").strip().lower() not in ("", "0", "false", "no", "off"):
        enable()
