"""Templates: a kernel request -> a tile-level Program (before any pass).

``TEMPLATES`` names each template's request type and build function; ``runtime.launch.compile_kernel`` (the
runtimes and the CLI) looks a template up here by name.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import attention, attention_bwd, attention_bwd_dq, gemm


@dataclass(frozen=True)
class Template:
    """One template: ``build(request, options) -> Program`` for a ``request`` of type ``request``."""

    name: str
    request: type
    build: Callable


TEMPLATES: dict[str, Template] = {
    "gemm": Template("gemm", gemm.GemmRequest, gemm.build),
    "attention": Template("attention", attention.AttentionRequest, attention.build),
    "attention_bwd": Template("attention_bwd", attention_bwd.AttentionBwdRequest, attention_bwd.build),
    "attention_bwd_dq": Template("attention_bwd_dq", attention_bwd_dq.AttentionBwdDqRequest, attention_bwd_dq.build),
}


def template(name: str) -> Template:
    """The template called ``name``; a KeyError listing the known ones."""
    t = TEMPLATES.get(name)
    if t is None:
        raise KeyError(f"unknown template {name!r}; the templates are {', '.join(TEMPLATES)}")
    return t
