"""The ``autows`` torch.compile backend: Inductor with autows's attention rewrite, GEMM rewrite and GEMM choice.

    torch.compile(model, backend="autows")                       # found by entry point, no import needed
    torch.compile(model, backend="autows", mode="max-autotune")  # our GEMM competes in autotuning
    torch.compile(model, backend="autows", options={...})        # Inductor options, as for "inductor"

What one compile does (torch 2.11 and 2.13 alike):

1. rewrite attention in the Dynamo graph to ``autows::attention`` (rewrite_attention.py), before AOTAutograd, so
   the op's autograd formula is what AOTAutograd differentiates;
2. ``compile_fx`` with ``list_mode_options(mode)`` + the user's options + our post-grad pass (graph_passes.py) as
   config patches. The post-grad pass rewrites GEMMs when max-autotune is off (rewrite_gemm.py);
3. an ``inner_compile`` that forwards every argument to ``compile_fx_inner`` (2.13 adds
   ``compile_region_name`` and ``get_decomp_fn``; forwarding ``*a, **kw`` covers both) inside
   ``V.set_choices_handler(AutoWSChoices())`` (choices.py); compile_fx reuses it for the lazily compiled
   backward, so both graphs see our GEMM choice under max-autotune.

The registry entry is made at import only if the name is free: the ``torch_dynamo_backends`` entry point
registers the name itself when it is looked up, and registering twice raises "duplicate name".
"""
from __future__ import annotations

import contextlib
import logging

import torch
from torch._dynamo.backends import registry

from . import choices, externs, graph_passes
from .rewrite_attention import rewrite_attention

log = logging.getLogger("torch_autows")


def _config_patches(mode: str | None, options: dict | None) -> dict:
    from torch._inductor import config as ic
    from torch._inductor import list_mode_options

    patches = {**list_mode_options(mode or "default"), **(options or {})}
    ours = graph_passes.patches(lambda key: patches[key] if key in patches else getattr(ic, key))
    # The attention rewrite runs on the Dynamo graph right here (autows() below), so only the post-grad
    # pass is installed: running the pre-grad one too would find nothing left but count sites twice.
    patches["post_grad_custom_post_pass"] = ours["post_grad_custom_post_pass"]
    return patches


def _choices_scope():
    """``V.set_choices_handler(AutoWSChoices())``, unless a user's own handler is installed (kept)."""
    from torch._inductor.choices import InductorChoices
    from torch._inductor.virtualized import V

    current = choices._current()
    if isinstance(current, choices.AutoWSChoices):
        return contextlib.nullcontext()
    if type(current) is not InductorChoices:
        choices.ensure_installed()  # logs once that the user's handler is kept
        return contextlib.nullcontext()
    return V.set_choices_handler(choices.AutoWSChoices())


def autows(gm: torch.fx.GraphModule, example_inputs, *, mode: str | None = None, options: dict | None = None):
    """Dynamo backend: Inductor (``compile_fx``) with autows's rewrites and GEMM choice."""
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    externs.register()  # output code loaded from Inductor's cache calls extern_kernels.autows_*
    patches = _config_patches(mode, options)
    rewrite_attention(gm.graph)
    gm.recompile()

    def inner_compile(gm, example_inputs, *args, **kwargs):
        with _choices_scope():
            return compile_fx_inner(gm, example_inputs, *args, **kwargs)

    return compile_fx(gm, example_inputs, inner_compile=inner_compile, config_patches=patches)


if "autows" not in registry._BACKENDS:
    registry.register_backend(autows, name="autows")
