"""The extern kernels: the Python functions Inductor's output code calls as ``extern_kernels.autows_*``.

``autows_mm`` / ``autows_addmm`` / ``autows_bmm`` / ``autows_mm_residual`` / ``autows_mm_gelu_tanh`` /
``autows_mm_gelu`` / ``autows_mm_swiglu`` / ``autows_mm_rope`` write our GEMM into the buffer
Inductor planned (``out=``); ``autows_attention`` is the attention op's body (``custom_ops.attention_impl``).
Both the GEMM choice under max-autotune (choices.py) and the ops' lowerings (lowering.py) bind them through
``extern_choice``. Their names are global in Inductor, so each ``ExternKernelChoice`` is created once per
process; ``register()`` creates them all, so that output code loaded from Inductor's cache, compiled in
an earlier process, finds its ``extern_kernels.autows_*`` without anything being compiled first.
"""
from __future__ import annotations

import torch
from torch._inductor.select_algorithm import ExternKernelChoice, extern_kernels

from ..custom_ops import attention_impl, gemm_into, gemm_rope_into, gemm_swiglu_into


def autows_mm(a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor) -> None:
    """``out = a @ b`` (2-D)."""
    gemm_into(out, a, b)


def autows_addmm(inp: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, alpha=1, beta=1, out: torch.Tensor) -> None:
    """``out = beta * inp + alpha * (a @ b)``; our kernel for a row bias with alpha = beta = 1, else torch."""
    if alpha != 1 or beta != 1 or not (inp.dim() == 1 or inp.shape[0] == 1 or inp.stride(0) == 0):
        torch.addmm(inp, a, b, alpha=alpha, beta=beta, out=out)
        return
    gemm_into(out, a, b, inp if inp.dim() == 1 else inp[0])


def autows_mm_residual(a: torch.Tensor, b: torch.Tensor, residual: torch.Tensor, bias: torch.Tensor | None = None,
                       *, out: torch.Tensor) -> None:
    """``out = a @ b (+ bias) + residual`` (2-D; ``autows::gemm_residual``'s lowering): the residual added in the
    kernel's epilogue, or after the vendor's / torch's GEMM where those serve the call."""
    gemm_into(out, a, b, bias, residual)


def autows_mm_gelu_tanh(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, *,
                        out: torch.Tensor) -> None:
    """``out = gelu(a @ b (+ bias), approximate="tanh")`` (2-D; ``autows::gemm_act``'s lowering): the activation in
    the kernel's epilogue, or torch's gelu after the vendor's / torch's GEMM where those serve the call."""
    gemm_into(out, a, b, bias, activation="gelu_tanh")


def autows_mm_gelu(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, *,
                   out: torch.Tensor) -> None:
    """``out = gelu(a @ b (+ bias))`` (the exact erf form), as ``autows_mm_gelu_tanh``."""
    gemm_into(out, a, b, bias, activation="gelu")


def autows_mm_swiglu(a: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, *, out: torch.Tensor) -> None:
    """``out = silu(a @ w_gate) * (a @ w_up)`` (2-D; ``autows::gemm_swiglu``'s lowering)."""
    gemm_swiglu_into(out, a, w_gate, w_up)


def autows_mm_rope(a: torch.Tensor, b: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   bias: torch.Tensor | None = None, *, out: torch.Tensor) -> None:
    """``out = rope(a @ b (+ bias))`` (2-D; ``autows::gemm_rope``'s lowering)."""
    gemm_rope_into(out, a, b, cos, sin, bias)


def autows_bmm(a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor) -> None:
    """``out = a @ b`` (3-D, batched)."""
    gemm_into(out, a, b)


KERNELS = {"mm": autows_mm, "addmm": autows_addmm, "bmm": autows_bmm,
           "mm_residual": autows_mm_residual,  # not a max-autotune choice: gemm_residual's lowering (lowering.py)
           # nor these: gemm_act's lowering, one name per activation (no string argument in the output code)
           "mm_gelu_tanh": autows_mm_gelu_tanh, "mm_gelu": autows_mm_gelu,
           "mm_swiglu": autows_mm_swiglu,  # gemm_swiglu's lowering
           "mm_rope": autows_mm_rope,  # gemm_rope's lowering
           "attention": attention_impl}  # not a GEMM choice: the attention lowering's kernel name (lowering.py)
_CHOICES: dict[str, ExternKernelChoice] = {}


def extern_choice(op: str) -> ExternKernelChoice:
    """The ``ExternKernelChoice`` for "mm" / "addmm" / "bmm" / "mm_residual" / "mm_gelu_tanh" / "mm_gelu"
    ("attention": only its name,
    registered in ``extern_kernels``), created once per process."""
    if op not in _CHOICES:
        fn, name = KERNELS[op], f"autows_{op}"
        lookup = getattr(ExternKernelChoice, "lookup", None)  # 2.13; 2.11 only has the extern_kernels module
        existing = lookup(name) if lookup else None
        if existing is None and hasattr(extern_kernels, name):
            delattr(extern_kernels, name)  # module re-import on 2.11: re-register under the same name
        _CHOICES[op] = existing or ExternKernelChoice(fn, None, name=name, has_out_variant=op != "attention")
    return _CHOICES[op]


def register() -> None:
    """Make every ``extern_kernels.autows_*`` name exist (idempotent; cheap after the first call)."""
    for op in KERNELS:
        extern_choice(op)
