"""Inductor lowerings of ``autows::gemm`` / ``autows::gemm_residual`` / ``autows::gemm_act`` /
``autows::gemm_swiglu`` / ``autows::gemm_rope`` / ``autows::bmm`` / ``autows::attention``:
direct calls of our extern kernels.

Without a lowering, Inductor runs a custom op as a ``FallbackKernel``: the compiled wrapper calls
``torch.ops.autows.gemm.default(...)``, which goes through the dispatcher and the ``custom_op`` layers
(autograd wrapper, redispatch, the Python impl) before our launcher, about 30 us of host time per call
on a CPU where the launcher itself takes 20; small models, with many short GEMMs, wait on that. The
lowering emits what max-autotune already emits when our choice wins: ``extern_kernels.autows_mm(a, b,
out=buf)`` (externs.py; ``autows_mm_residual(a, b, residual[, bias], out=buf)`` for the residual op,
``autows_mm_<activation>(a, b[, bias], out=buf)`` for the activation op, ``autows_mm_rope(a, b, cos, sin[, bias],
out=buf)`` for the RoPE op, ``autows_mm_swiglu(a, w_gate, w_up,
out=buf)`` for SwiGLU: through the op, the decode MLP's fused site cost about 20 us more host time a call than
Inductor's three launches on the H200) into a
buffer Inductor plans like any other, so the wrapper calls our Python function directly and Inductor can
reuse the buffer.

Same semantics as the op: ``gemm_into`` re-checks the real tensors and falls back to torch with a
logged reason. Not used under ``cpp_wrapper`` (no Python to call) or for an ``out_dtype`` other than
the operands' (our rewrite never passes one): those keep the custom op's fallback kernel.

Attention returns two tensors (out, lse), which the extern-choice form (one ``out=`` buffer) cannot
express: its lowering keeps Inductor's fallback node for the op (same schema, outputs, layouts and
buffer handling) and only names ``extern_kernels.autows_attention`` (``custom_ops.attention_impl``, the op's
body) as the function the wrapper calls. Host time per call measured on the H200 (small problem, launch
bound): 37 us through the op, 24 through the direct call, 19 for the runtime alone (SDPA: 24).
"""
from __future__ import annotations

import torch
from torch._inductor import ir
from torch._inductor.kernel.mm_common import mm_args
from torch._inductor.lowering import fallback_handler, register_lowering
from torch._inductor.virtualized import V

from .externs import extern_choice

# torch.ops.autows.* are defined by ``import torch_autows`` (custom_ops), which runs before this module
_GEMM, _BMM = torch.ops.autows.gemm.default, torch.ops.autows.bmm.default
_GEMM_RESIDUAL = torch.ops.autows.gemm_residual.default
_GEMM_ACT = torch.ops.autows.gemm_act.default
_GEMM_SWIGLU = torch.ops.autows.gemm_swiglu.default
_GEMM_ROPE = torch.ops.autows.gemm_rope.default
_ATTENTION = torch.ops.autows.attention.default


def _direct(a, out_dtype) -> bool:
    """Whether the direct call serves it: a Python wrapper to call from, and the operands' dtype out."""
    return not V.graph.cpp_wrapper and out_dtype in (None, a.get_dtype())


def _as_op(op, *args, **kwargs):
    """The custom op's own fallback kernel (the path without this lowering)."""
    return fallback_handler(op, add_to_fallback_set=False)(*args, **kwargs)


def _lower_gemm(a, b, bias=None, out_dtype=None):
    if not _direct(a, out_dtype):
        return _as_op(_GEMM, a, b, bias, out_dtype)
    _, _, _, layout, a, b = mm_args(a, b)
    if bias is None:
        return extern_choice("mm").bind((a, b), layout).output_node()
    bias = ir.ExternKernel.require_stride1(ir.ExternKernel.realize_input(bias))
    return extern_choice("addmm").bind((bias, a, b), layout, alpha=1, beta=1).output_node()


def _lower_gemm_residual(a, b, residual, bias=None, out_dtype=None):
    if not _direct(a, out_dtype):
        return _as_op(_GEMM_RESIDUAL, a, b, residual, bias, out_dtype)
    _, _, _, layout, a, b = mm_args(a, b)
    # the kernel reads R as a contiguous [M, N] tensor (the rewrite only fuses contiguous ones): a no-op for those
    residual = ir.ExternKernel.require_contiguous(ir.ExternKernel.realize_input(residual))
    inputs = (a, b, residual)
    if bias is not None:
        inputs += (ir.ExternKernel.require_stride1(ir.ExternKernel.realize_input(bias)),)
    return extern_choice("mm_residual").bind(inputs, layout).output_node()


def _lower_gemm_act(a, b, activation, bias=None, out_dtype=None):
    if not _direct(a, out_dtype) or activation not in ("gelu_tanh", "gelu"):  # (the op raises on the latter)
        return _as_op(_GEMM_ACT, a, b, activation, bias, out_dtype)
    _, _, _, layout, a, b = mm_args(a, b)
    inputs = (a, b)
    if bias is not None:
        inputs += (ir.ExternKernel.require_stride1(ir.ExternKernel.realize_input(bias)),)
    return extern_choice(f"mm_{activation}").bind(inputs, layout).output_node()


def _lower_gemm_swiglu(a, w_gate, w_up):
    if not _direct(a, None):
        return _as_op(_GEMM_SWIGLU, a, w_gate, w_up)
    _, _, _, layout, a, w_gate = mm_args(a, w_gate)
    w_up = ir.ExternKernel.realize_input(w_up)
    return extern_choice("mm_swiglu").bind((a, w_gate, w_up), layout).output_node()


def _lower_gemm_rope(a, b, cos, sin, bias=None):
    if not _direct(a, None):
        return _as_op(_GEMM_ROPE, a, b, cos, sin, bias)
    _, _, _, layout, a, b = mm_args(a, b)
    inputs = (a, b, *(ir.ExternKernel.require_contiguous(ir.ExternKernel.realize_input(t)) for t in (cos, sin)))
    if bias is not None:
        inputs += (ir.ExternKernel.require_stride1(ir.ExternKernel.realize_input(bias)),)
    return extern_choice("mm_rope").bind(inputs, layout).output_node()


def _lower_bmm(a, b, out_dtype=None):
    if not _direct(a, out_dtype):
        return _as_op(_BMM, a, b, out_dtype)
    _, _, _, layout, a, b = mm_args(a, b)
    return extern_choice("bmm").bind((a, b), layout).output_node()


def _fallback_node(x):
    """The FallbackKernel behind a lowered output (TensorBox -> StorageBox -> MultiOutput -> kernel), or None."""
    while x is not None and not isinstance(x, ir.MultiOutput):
        x = getattr(x, "data", None)
    node = x.inputs[0] if x is not None and x.inputs else None
    return node if isinstance(node, ir.FallbackKernel) else None


def _lower_attention(*args, **kwargs):
    outs = _as_op(_ATTENTION, *args, **kwargs)
    node = _fallback_node(outs[0])
    python_wrapper = not V.graph.cpp_wrapper and not getattr(V.graph, "fx_wrapper", False)  # prints the name
    if node is not None and node.op_overload is _ATTENTION and python_wrapper:
        extern_choice("attention")  # the name must exist: the wrapper looks it up in extern_kernels
        node.python_kernel_name = "extern_kernels.autows_attention"
    return outs


_registered = False


def register() -> None:
    """Register the seven lowerings in Inductor (once per process; before Inductor lowers a graph with our ops:
    the post-grad pass and ``rewrite_gemms`` call it)."""
    global _registered
    if not _registered:
        for op, fn in ((_GEMM, _lower_gemm), (_GEMM_RESIDUAL, _lower_gemm_residual), (_GEMM_ACT, _lower_gemm_act),
                       (_GEMM_SWIGLU, _lower_gemm_swiglu), (_GEMM_ROPE, _lower_gemm_rope), (_BMM, _lower_bmm),
                       (_ATTENTION, _lower_attention)):
            register_lowering(op, type_promotion_kind=None)(fn)
        _registered = True
