"""Custom ops that put the generated kernels into compiled graphs: ``torch.ops.autows.{attention,gemm,bmm}``.

Gluon kernels cannot go through ``triton_op``/``wrap_triton`` (Inductor re-emits their source as
``@triton.jit``), so each kernel sits behind an opaque ``torch.library.custom_op``: Inductor calls it as
an extern kernel and compiles everything around it. Each op

* runs ``torch_autows.ops`` (generated kernel, or torch with a logged reason when the real device,
  dtype or shape cannot be served: the FX rewrites decide on the traced target, the op re-checks the
  tensors it is given);
* returns contiguous outputs, exactly what its fake impl promises (Inductor asserts sizes and strides);
* has a fake impl written with ``new_empty`` on the input sizes, so symbolic sizes (``mark_dynamic``)
  flow through;
* never syncs with the host, so it is safe inside CUDA graphs (``mode="reduce-overhead"``).

``autows::attention`` returns ``(out, lse)`` and has a backward (attention_grad.py). The GEMM ops are
inserted after AOTAutograd (post-grad) where no autograd is needed; they get a plain backward anyway so
that eager use is differentiable.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .. import config
from .. import ops as _kernels
from ..runtime.attention import empty_out
from ..runtime.fallback import Unsupported, note_fallback, note_served, note_vendor
from .attention_grad import attention_backward, reference_attention

_SERVED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# --- attention ---


def attention_impl(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False, scale: float | None = None,
                   enable_gqa: bool = False) -> tuple[Tensor, Tensor]:
    """The body of ``autows::attention``. Compiled graphs call it directly (``extern_kernels.autows_attention``,
    lowering.py), skipping the dispatcher and custom-op layers; the arguments were checked when the graph was
    traced (they are an SDPA call's), so it goes straight to the runtime."""
    if k.shape[1] != q.shape[1] and not enable_gqa:
        raise ValueError(f"autows::attention: q has {q.shape[1]} heads and k/v {k.shape[1]}; pass enable_gqa=True")
    scale = scale if scale is not None else q.shape[-1] ** -0.5
    if q.dtype in _SERVED_DTYPES:
        out, lse, served = _kernels.run_attention(q, k, v, is_causal, scale)
        if served:  # in empty_out's layout already
            return out, lse
    else:
        note_fallback("attention", f"dtype {q.dtype}: autows attention serves float16, bfloat16 and float32")
        out, lse = reference_attention(q, k, v, is_causal, scale)
    want = empty_out(q, v.shape[-1])
    if out.stride() != want.stride():  # a fallback's layout: the fake promised empty_out's
        out = want.copy_(out)
    return out, lse.contiguous()


@torch.library.custom_op("autows::attention", mutates_args=())
def attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False, scale: float | None = None,
              enable_gqa: bool = False) -> tuple[Tensor, Tensor]:
    """SDPA (no mask tensor, no dropout) returning ``(out [B, Hq, Sq, D], lse fp32 [B, Hq, Sq])``; ``out`` has
    q's layout when q is a [B, S, H, D] tensor transposed (runtime.attention.empty_out), so the model's
    transpose back is a view, and is contiguous otherwise."""
    return attention_impl(q, k, v, is_causal, scale, enable_gqa)


@attention.register_fake
def _attention_fake(q, k, v, is_causal=False, scale=None, enable_gqa=False):
    B, Hq, Sq, _ = q.shape
    return empty_out(q, v.shape[-1]), q.new_empty((B, Hq, Sq), dtype=torch.float32)


def _attention_setup_context(ctx, inputs, output):
    q, k, v, is_causal, scale, _ = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.is_causal = is_causal
    ctx.scale = scale if scale is not None else q.shape[-1] ** -0.5
    ctx.set_materialize_grads(False)  # an unused lse gets None, which keeps the flash backward eligible


def _attention_backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = attention_backward(grad_out, grad_lse, q, k, v, out, lse, ctx.is_causal, ctx.scale)
    return dq, dk, dv, None, None, None


attention.register_autograd(_attention_backward, setup_context=_attention_setup_context)


# --- GEMM ---


def _torch_gemm(a: Tensor, b: Tensor, bias: Tensor | None, out_dtype: torch.dtype) -> Tensor:
    if out_dtype == a.dtype:
        if a.dim() == 3:
            return torch.bmm(a, b)
        return torch.addmm(bias, a, b) if bias is not None else torch.mm(a, b)
    out = torch.matmul(a.float(), b.float())
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)


def run_gemm(a: Tensor, b: Tensor, bias: Tensor | None = None, out_dtype: torch.dtype | None = None) -> Tensor:
    """``a @ b (+ bias)`` (2-D) or ``bmm(a, b)`` (3-D) through ``torch_autows.ops``; torch if the runtime is missing."""
    out_dtype = out_dtype or a.dtype
    op = "bmm" if a.dim() == 3 else "gemm"
    if a.dtype not in _SERVED_DTYPES or out_dtype not in _SERVED_DTYPES:
        note_fallback(op, f"dtype {a.dtype} -> {out_dtype}: autows GEMM serves float16, bfloat16 and float32")
        return _torch_gemm(a, b, bias, out_dtype)
    try:
        if a.dim() == 3:
            return _kernels.bmm(a, b, out_dtype=out_dtype)
        return _kernels.gemm(a, b, bias, out_dtype=out_dtype)
    except ImportError as e:
        note_fallback(op, f"torch_autows.runtime.gemm cannot be imported ({e})")
    return _torch_gemm(a, b, bias, out_dtype)


def gemm_into(out: Tensor, a: Tensor, b: Tensor, bias: Tensor | None = None) -> None:
    """``out[...] = a @ b (+ bias)``; the generated kernel writes a contiguous ``out`` directly (no copy)."""
    op = "bmm" if a.dim() == 3 else "gemm"
    rt = _kernels.runtime_module("gemm")
    if rt is None or not config.gemm or not out.is_contiguous() or a.dtype not in _SERVED_DTYPES:
        out.copy_(run_gemm(a, b, bias, out.dtype))
        return
    try:
        if op == "bmm":
            served = rt.bmm(a, b, out.dtype, out=out)
        else:
            served = rt.gemm(a, b, bias, out.dtype, out=out)
    except Unsupported as e:
        note_fallback(op, str(e))
        out.copy_(_torch_gemm(a, b, bias, out.dtype))
    else:
        if served is not None:
            note_served(op)
        else:  # runtime.choice: cuBLAS is faster for this shape
            note_vendor(op)
            rt.vendor_gemm(a, b, bias, out)


@torch.library.custom_op("autows::gemm", mutates_args=())
def gemm(a: Tensor, b: Tensor, bias: Tensor | None = None, out_dtype: torch.dtype | None = None) -> Tensor:
    """``a [M, K] @ b [K, N] (+ bias [N])`` with fp32 accumulation, in ``out_dtype`` (default a's)."""
    return run_gemm(a, b, bias, out_dtype).contiguous()


@gemm.register_fake
def _gemm_fake(a, b, bias=None, out_dtype=None):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype or a.dtype)


@torch.library.custom_op("autows::bmm", mutates_args=())
def bmm(a: Tensor, b: Tensor, out_dtype: torch.dtype | None = None) -> Tensor:
    """``a [B, M, K] @ b [B, K, N]`` with fp32 accumulation, in ``out_dtype`` (default a's)."""
    return run_gemm(a, b, None, out_dtype).contiguous()


@bmm.register_fake
def _bmm_fake(a, b, out_dtype=None):
    return a.new_empty((a.shape[0], a.shape[1], b.shape[2]), dtype=out_dtype or a.dtype)


def _gemm_setup_context(ctx, inputs, output):
    a, b = inputs[0], inputs[1]
    ctx.save_for_backward(a, b)
    ctx.n_inputs = len(inputs)  # gemm: (a, b, bias, out_dtype); bmm: (a, b, out_dtype)
    ctx.has_bias = len(inputs) == 4 and inputs[2] is not None


def _gemm_backward(ctx, grad):
    a, b = ctx.saved_tensors
    da = torch.matmul(grad, b.transpose(-2, -1).to(grad.dtype)).to(a.dtype)
    db = torch.matmul(a.transpose(-2, -1).to(grad.dtype), grad).to(b.dtype)
    if ctx.n_inputs == 4:
        dbias = grad.sum(0).to(a.dtype) if ctx.has_bias else None
        return da, db, dbias, None
    return da, db, None


gemm.register_autograd(_gemm_backward, setup_context=_gemm_setup_context)
bmm.register_autograd(_gemm_backward, setup_context=_gemm_setup_context)
