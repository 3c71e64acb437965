"""Custom ops that put the generated kernels into graphs: ``torch.ops.autows.{attention,attention_backward,gemm,
gemm_residual,gemm_act,bmm,gemm_swiglu,gemm_swiglu_save,gemm_swiglu_bwd,gemm_rope}``.

Registered by ``import torch_autows`` (so ``torch.export.load`` of a program using them works in a fresh
process); only ``torch.library`` is used here, nothing of Inductor or Dynamo. The Inductor lowerings stay
in ``torch_autows.inductor`` and load with it.

Gluon kernels cannot go through ``triton_op``/``wrap_triton`` (Inductor re-emits their source as
``@triton.jit``), so each kernel sits behind an opaque ``torch.library.custom_op``: Inductor calls it as
an extern kernel and compiles everything around it. Each op

* checks its arguments with the public ops' checks (``torch_autows.ops.check_*``), in the real op and in
  its fake impl alike, so tracing raises the same ValueError/TypeError as running;
* runs ``torch_autows.ops`` (generated kernel, or torch with a logged reason when the real device,
  dtype or shape cannot be served); float64 runs torch;
* returns contiguous outputs, exactly what its fake impl promises (Inductor asserts sizes and strides),
  except attention's ``out``, which has ``_out_layout``'s layout in both;
* has a fake impl written with ``new_empty`` on the input sizes, so symbolic sizes flow through;
* never syncs with the host, so it is safe inside CUDA graphs (``mode="reduce-overhead"``);
* has a backward (``register_autograd``): the public ops route calls that need gradients through here;
  except ``gemm_swiglu(_save)``, ``gemm_act``, ``gemm_rope`` and ``gemm_swiglu_bwd``, which their post-grad
  rewrites insert into graphs after AOTAutograd (no autograd left to record): where the graph keeps none of the
  values they fuse, or writing the values it keeps (``gemm_swiglu_save``), or into a backward graph.
"""
from __future__ import annotations

import torch
from torch import Tensor

from . import config
from . import ops as _kernels
from .attention_grad import attention_backward, generated_backward, vendor_backward
from .runtime.fallback import Unsupported, note_fallback, note_served, note_vendor

_SERVED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# --- attention ---


def _out_layout(q: Tensor, d: int) -> Tensor:
    """An empty ``out`` for q: the runtime's ``empty_out`` (q's layout for transposed [B, S, H, D] q), or
    contiguous where the runtime cannot be imported."""
    rt = _kernels.runtime_module("attention")
    if rt is None:
        return q.new_empty((*q.shape[:3], d))
    return rt.empty_out(q, d)


def attention_impl(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False, scale: float | None = None,
                   enable_gqa: bool = False) -> tuple[Tensor, Tensor]:
    """The body of ``autows::attention``. Compiled graphs call it directly (``extern_kernels.autows_attention``,
    inductor/lowering.py), skipping the dispatcher and custom-op layers."""
    scale = _kernels.check_attention(q, k, v, is_causal, scale, enable_gqa, dtypes=_kernels.OP_DTYPES)
    out, lse, served = _kernels.run_attention(q, k, v, is_causal, scale)
    if served:  # in empty_out's layout already
        return out, lse
    want = _out_layout(q, v.shape[-1])
    if out.stride() != want.stride():  # a fallback's layout: the fake promised _out_layout's
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
    _kernels.check_attention(q, k, v, is_causal, scale, enable_gqa, dtypes=_kernels.OP_DTYPES)
    B, Hq, Sq, _ = q.shape
    return _out_layout(q, v.shape[-1]), q.new_empty((B, Hq, Sq), dtype=torch.float32)


def _attention_setup_context(ctx, inputs, output):
    q, k, v, is_causal, scale, _ = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.is_causal = is_causal
    ctx.scale = scale if scale is not None else _kernels.default_scale(q.shape[-1])
    ctx.set_materialize_grads(False)  # an unused lse gets None, which keeps the flash backward eligible


def _attention_backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = attention_backward(grad_out, grad_lse, q, k, v, out, lse, ctx.is_causal, ctx.scale)
    return dq, dk, dv, None, None, None


attention.register_autograd(_attention_backward, setup_context=_attention_setup_context)


@torch.library.custom_op("autows::attention_backward", mutates_args=())
def attention_backward_op(grad_out: Tensor | None, grad_lse: Tensor | None, q: Tensor, k: Tensor, v: Tensor,
                          out: Tensor, lse: Tensor, is_causal: bool, scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """``(dq, dk, dv)`` of ``autows::attention`` by the generated backward (``runtime/attention_bwd.py``), or by
    torch's (``attention_grad.vendor_backward``) with the reason logged once where the real tensors are refused.
    ``autows::attention``'s autograd puts it in torch.compile's backward graphs where
    ``config.attention_backward == "autows"`` and the traced call passes the support checks. Contiguous outputs."""
    grads = generated_backward(grad_out, grad_lse, q, k, v, out, lse, is_causal, scale)
    if grads is None:
        grads = vendor_backward(grad_out, grad_lse, q, k, v, out, lse, is_causal, scale)
    return tuple(g.contiguous() for g in grads)


@attention_backward_op.register_fake
def _attention_backward_fake(grad_out, grad_lse, q, k, v, out, lse, is_causal, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


# --- GEMM ---


def run_gemm(a: Tensor, b: Tensor, bias: Tensor | None = None, out_dtype: torch.dtype | None = None) -> Tensor:
    """``a @ b (+ bias)`` (2-D) or ``bmm(a, b)`` (3-D) for checked arguments: generated kernel or torch."""
    return _kernels.run_gemm(a, b, bias, out_dtype or a.dtype)


def gemm_into(out: Tensor, a: Tensor, b: Tensor, bias: Tensor | None = None, residual: Tensor | None = None,
              activation: str = "none") -> None:
    """``out[...] = act(a @ b (+ bias)) (+ residual)``; the generated kernel writes a contiguous ``out`` directly
    (no copy). Same paths as the ops: the kernel; torch with the reason logged where it cannot serve the call; the
    vendor's GEMM (then torch's gelu in place, or ``out.add_(residual)``, as ``ops.torch_gemm``) where
    runtime.choice finds cuBLAS faster."""
    op = "bmm" if a.dim() == 3 else "gemm"
    rt = _kernels.runtime_module("gemm")
    if rt is None or not config.gemm or not out.is_contiguous() or a.dtype not in _SERVED_DTYPES:
        out.copy_(_kernels.run_gemm(a, b, bias, out.dtype, residual, activation))
        return
    try:
        if op == "bmm":
            served = rt.bmm(a, b, out.dtype, out=out)
        else:
            act = {"activation": activation} if activation != "none" else {}  # (calls without one: as before)
            served = rt.gemm(a, b, bias, out.dtype, out=out, residual=residual, **act)
    except Unsupported as e:
        note_fallback(op, str(e))
        out.copy_(_kernels.torch_gemm(a, b, bias, out.dtype, residual, activation))
    else:
        if served is not None:
            note_served(op)
        else:  # runtime.choice: cuBLAS is faster for this shape
            note_vendor(op)
            rt.vendor_gemm(a, b, bias, out, *((activation,) if activation != "none" else ()))
            if residual is not None:
                out.add_(residual)


@torch.library.custom_op("autows::gemm", mutates_args=())
def gemm(a: Tensor, b: Tensor, bias: Tensor | None = None, out_dtype: torch.dtype | None = None) -> Tensor:
    """``a [M, K] @ b [K, N] (+ bias [N])`` with fp32 accumulation, in ``out_dtype`` (default a's)."""
    _kernels.check_gemm(a, b, bias, out_dtype, dtypes=_kernels.OP_DTYPES)
    return run_gemm(a, b, bias, out_dtype).contiguous()


@gemm.register_fake
def _gemm_fake(a, b, bias=None, out_dtype=None):
    _kernels.check_gemm(a, b, bias, out_dtype, dtypes=_kernels.OP_DTYPES)
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype or a.dtype)


@torch.library.custom_op("autows::bmm", mutates_args=())
def bmm(a: Tensor, b: Tensor, out_dtype: torch.dtype | None = None) -> Tensor:
    """``a [B, M, K] @ b [B, K, N]`` with fp32 accumulation, in ``out_dtype`` (default a's)."""
    _kernels.check_bmm(a, b, out_dtype, dtypes=_kernels.OP_DTYPES)
    return run_gemm(a, b, None, out_dtype).contiguous()


@bmm.register_fake
def _bmm_fake(a, b, out_dtype=None):
    _kernels.check_bmm(a, b, out_dtype, dtypes=_kernels.OP_DTYPES)
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


@torch.library.custom_op("autows::gemm_residual", mutates_args=())
def gemm_residual(a: Tensor, b: Tensor, residual: Tensor, bias: Tensor | None = None,
                  out_dtype: torch.dtype | None = None) -> Tensor:
    """``a [M, K] @ b [K, N] (+ bias [N]) + residual [M, N]`` with fp32 accumulation, the residual added in the
    epilogue before the one rounding to ``out_dtype`` (default a's): ``h = x + o_proj(o)`` in one kernel."""
    _kernels.check_gemm(a, b, bias, out_dtype, dtypes=_kernels.OP_DTYPES, residual=residual)
    return _kernels.run_gemm(a, b, bias, out_dtype or a.dtype, residual).contiguous()


@gemm_residual.register_fake
def _gemm_residual_fake(a, b, residual, bias=None, out_dtype=None):
    _kernels.check_gemm(a, b, bias, out_dtype, dtypes=_kernels.OP_DTYPES, residual=residual)
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype or a.dtype)


def _gemm_residual_setup_context(ctx, inputs, output):
    a, b, _, bias, _ = inputs
    ctx.save_for_backward(a, b)
    ctx.has_bias = bias is not None


def _gemm_residual_backward(ctx, grad):
    """As gemm's; the residual's gradient is the output's, in its dtype."""
    a, b = ctx.saved_tensors
    da = torch.matmul(grad, b.t().to(grad.dtype)).to(a.dtype)
    db = torch.matmul(a.t().to(grad.dtype), grad).to(b.dtype)
    dbias = grad.sum(0).to(a.dtype) if ctx.has_bias else None
    return da, db, grad.to(a.dtype), dbias, None


@torch.library.custom_op("autows::gemm_act", mutates_args=())
def gemm_act(a: Tensor, b: Tensor, activation: str, bias: Tensor | None = None,
             out_dtype: torch.dtype | None = None) -> Tensor:
    """``gelu(a [M, K] @ b [K, N] (+ bias [N]))`` (``activation`` "gelu_tanh" or "gelu": F.gelu's approximate
    "tanh" or "none") with fp32 accumulation and activation, in ``out_dtype`` (default a's). No backward: the
    post-grad rewrite (inductor/rewrite_activation.py) inserts it only into inference graphs."""
    _kernels.check_gemm(a, b, bias, out_dtype, dtypes=_kernels.OP_DTYPES)
    act = _kernels.check_activation(activation)
    with torch.no_grad():
        return _kernels.run_gemm(a, b, bias, out_dtype or a.dtype, activation=act).contiguous()


@gemm_act.register_fake
def _gemm_act_fake(a, b, activation, bias=None, out_dtype=None):
    _kernels.check_gemm(a, b, bias, out_dtype, dtypes=_kernels.OP_DTYPES)
    _kernels.check_activation(activation)
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype or a.dtype)


@torch.library.custom_op("autows::gemm_swiglu", mutates_args=())
def gemm_swiglu(a: Tensor, w_gate: Tensor, w_up: Tensor) -> Tensor:
    """``silu(a [M, K] @ w_gate [K, N]) * (a @ w_up [K, N])`` in one kernel (fp32 accumulation and epilogue), in
    a's dtype. No backward: the post-grad rewrite (inductor/rewrite_swiglu.py) inserts it only where g and u
    are not saved for one."""
    _kernels.check_gemm_swiglu(a, w_gate, w_up, dtypes=_kernels.OP_DTYPES)
    with torch.no_grad():  # the body never records autograd (ops.gemm_swiglu would run torch for grad inputs)
        return _kernels.gemm_swiglu(a, w_gate, w_up).contiguous()


def gemm_swiglu_into(out: Tensor, a: Tensor, w_gate: Tensor, w_up: Tensor) -> None:
    """``out[...] = silu(a @ w_gate) * (a @ w_up)`` for checked 2-D arguments (the compiled graph's direct call,
    ``extern_kernels.autows_mm_swiglu``): the generated kernel into a contiguous ``out``; the vendor's path (two
    cuBLAS GEMMs and one fused product) where runtime.choice finds it faster; torch with the reason logged where
    the kernel cannot serve the call. Same paths as ``ops.gemm_swiglu``, without its checks and autograd layers."""
    op = "gemm_swiglu"
    rt = _kernels.runtime_module("swiglu")
    if rt is None or not config.gemm or not out.is_contiguous() or out.dtype != a.dtype:
        out.copy_(_kernels.gemm_swiglu(a, w_gate, w_up, out.dtype))
        return
    try:
        served = rt.gemm_swiglu(a, w_gate, w_up, out.dtype, out=out)
    except Unsupported as e:
        note_fallback(op, str(e))
        out.copy_(_kernels.torch_gemm_swiglu(a, w_gate, w_up, out.dtype))
        return
    if served is not None:
        note_served(op)
    else:  # runtime.choice: the vendor's path is faster for this shape
        note_vendor(op)
        rt.vendor_swiglu(a, w_gate, w_up, out)


@gemm_swiglu.register_fake
def _gemm_swiglu_fake(a, w_gate, w_up):
    _kernels.check_gemm_swiglu(a, w_gate, w_up, dtypes=_kernels.OP_DTYPES)
    return a.new_empty((a.shape[0], w_gate.shape[1]))


@torch.library.custom_op("autows::gemm_swiglu_save", mutates_args=())
def gemm_swiglu_save(a: Tensor, w_gate: Tensor, w_up: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``gemm_swiglu`` for a training graph: ``(silu(g) * u, g, u)`` with ``g = a @ w_gate`` and ``u = a @ w_up``,
    the projections the backward reads, written by the same kernel (each rounded once from its fp32 sum; the
    product from the sums), contiguous, in a's dtype. No backward: the post-grad rewrite (inductor/rewrite_swiglu.py)
    inserts it into forward graphs that save g and u."""
    _kernels.check_gemm_swiglu(a, w_gate, w_up, dtypes=_kernels.OP_DTYPES)
    shape = (a.shape[0], w_gate.shape[1])
    out, g, u = (a.new_empty(shape) for _ in range(3))
    rt = _kernels.runtime_module("swiglu")
    served, vendor = _serve_runtime("gemm_swiglu_save", rt,
                                    lambda: rt.gemm_swiglu(a, w_gate, w_up, a.dtype, out=out, saved=(g, u)))
    if vendor:  # runtime.choice: the vendor's path is faster for this shape (or the kernel awaits its GPU tests)
        rt.vendor_swiglu(a, w_gate, w_up, out, (g, u))
    elif served is None:  # torch, with the reason logged
        acc = _acc_dtype(a)
        g32, u32 = a.to(acc) @ w_gate.to(acc), a.to(acc) @ w_up.to(acc)
        out.copy_(torch.nn.functional.silu(g32) * u32)
        g.copy_(g32)
        u.copy_(u32)
    return out, g, u


def _serve_runtime(op: str, rt, call):
    """``ops._serve(op, call)`` (counted: served, the vendor's path, or a fallback with its reason logged), where
    ``rt`` (a runtime module) exists and the generated GEMM is on; a fallback, with that reason, where not."""
    def run():
        if rt is None or not config.gemm:
            raise Unsupported("the generated GEMM is off (config.gemm) or triton is missing")
        return call()

    return _kernels._serve(op, run)


def _acc_dtype(t: Tensor) -> torch.dtype:
    """The dtype torch's path computes a fused op's numbers in: float64 for float64, else float32."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


@gemm_swiglu_save.register_fake
def _gemm_swiglu_save_fake(a, w_gate, w_up):
    _kernels.check_gemm_swiglu(a, w_gate, w_up, dtypes=_kernels.OP_DTYPES)
    shape = (a.shape[0], w_gate.shape[1])
    return a.new_empty(shape), a.new_empty(shape), a.new_empty(shape)


@torch.library.custom_op("autows::gemm_rope", mutates_args=())
def gemm_rope(a: Tensor, b: Tensor, cos: Tensor, sin: Tensor, bias: Tensor | None = None) -> Tensor:
    """``rope(a [M, K] @ b [K, N] (+ bias [N]))`` in one kernel: per head of D columns ``x * cos + rotate_half(x) *
    sin`` with row m at the tables' row m % P (cos, sin [P, D] of a's dtype), fp32 accumulation and epilogue, one
    rounding (runtime/gemm_rope.py). No backward: the post-grad rewrite (inductor/rewrite_rope.py) inserts it where
    the graph keeps none of the values it fuses."""
    _kernels.check_gemm_rope(a, b, cos, sin, bias, dtypes=(torch.float16, torch.bfloat16))
    out = a.new_empty((a.shape[0], b.shape[1]))
    gemm_rope_into(out, a, b, cos, sin, bias)
    return out


def gemm_rope_into(out: Tensor, a: Tensor, b: Tensor, cos: Tensor, sin: Tensor, bias: Tensor | None = None) -> None:
    """``out[...] = rope(a @ b (+ bias))`` for checked 2-D arguments (the compiled graph's direct call,
    ``extern_kernels.autows_mm_rope``): the generated kernel into a contiguous ``out``; torch with the reason logged
    where it cannot serve the call. The site was measured faster than the default's path when it was rewritten."""
    op = "gemm_rope"
    rt = _kernels.runtime_module("gemm_rope")
    if rt is None or not config.gemm or not out.is_contiguous():
        why = "disabled by torch_autows.config.gemm = False" if not config.gemm else \
            "no generated GEMM kernel in this build" if rt is None else "the output is not contiguous"
        note_fallback(op, why)
        out.copy_(_kernels.torch_gemm_rope(a, b, cos, sin, bias))
        return
    try:
        rt.gemm_rope(a, b, cos.contiguous(), sin.contiguous(), bias, config=None, out=out)
    except Unsupported as e:
        note_fallback(op, str(e))
        out.copy_(_kernels.torch_gemm_rope(a, b, cos, sin, bias))
    else:
        note_served(op)


@gemm_rope.register_fake
def _gemm_rope_fake(a, b, cos, sin, bias=None):
    _kernels.check_gemm_rope(a, b, cos, sin, bias, dtypes=(torch.float16, torch.bfloat16))
    return a.new_empty((a.shape[0], b.shape[1]))


def _check_swiglu_bwd(dy: Tensor, w: Tensor, g: Tensor, u: Tensor) -> None:
    """Raise TypeError/ValueError unless ``gemm_swiglu_bwd(dy [M, K], w [K, N], g [M, N], u [M, N])`` is a valid
    call (shapes, dtypes and devices only: works on fake tensors)."""
    for name, t in (("dy", dy), ("w", w), ("g", g), ("u", u)):
        _kernels._check_tensor(name, t, 2, _kernels.OP_DTYPES)
    if dy.shape[1] != w.shape[0] or g.shape != u.shape or tuple(g.shape) != (dy.shape[0], w.shape[1]):
        raise ValueError(f"gemm_swiglu_bwd: dy {tuple(dy.shape)}, w {tuple(w.shape)}, g {tuple(g.shape)} and u "
                         f"{tuple(u.shape)}; dy @ w must be [M, N] = g's and u's shape")
    _kernels._check_same_device_dtype(("dy", dy), ("w", w), ("g", g), ("u", u))


@torch.library.custom_op("autows::gemm_swiglu_bwd", mutates_args=())
def gemm_swiglu_bwd(dy: Tensor, w: Tensor, g: Tensor, u: Tensor) -> tuple[Tensor, Tensor]:
    """The SwiGLU product's gradients from ``dh = dy [M, K] @ w [K, N]`` and the forward's saved gate and up
    projections ``g``, ``u`` [M, N]: ``(dh * u * silu'(g), dh * silu(g))`` in one kernel (fp32 accumulation and
    epilogue, one rounding each; runtime/swiglu_bwd.py), contiguous, in dy's dtype. No backward: the post-grad
    rewrite (inductor/rewrite_swiglu_bwd.py) inserts it into backward graphs."""
    _check_swiglu_bwd(dy, w, g, u)
    dg, du = dy.new_empty(g.shape), dy.new_empty(g.shape)
    g, u = g.contiguous(), u.contiguous()
    rt = _kernels.runtime_module("swiglu_bwd")
    served, vendor = _serve_runtime("gemm_swiglu_bwd", rt, lambda: rt.gemm_swiglu_bwd(dy, w, g, u, out=(dg, du)))
    if vendor:  # runtime.choice: the vendor's path is faster for this shape (or the kernel awaits its GPU tests)
        rt.vendor_swiglu_bwd(dy, w, g, u, dg, du)
    elif served is None:  # torch, with the reason logged
        ref_dg, ref_du = _torch_swiglu_bwd(dy, w, g, u)
        dg.copy_(ref_dg)
        du.copy_(ref_du)
    return dg, du


def _torch_swiglu_bwd(dy: Tensor, w: Tensor, g: Tensor, u: Tensor) -> tuple[Tensor, Tensor]:
    """The gradients by torch, in fp32 from the fp32 product, rounded once to dy's dtype (the kernel's numbers)."""
    acc = _acc_dtype(dy)
    dh = dy.to(acc) @ w.to(acc)
    gf = g.to(acc)
    s = torch.sigmoid(gf)
    return (dh * u.to(acc) * (s * (1 + gf * (1 - s)))).to(dy.dtype), (dh * gf * s).to(dy.dtype)


@gemm_swiglu_bwd.register_fake
def _gemm_swiglu_bwd_fake(dy, w, g, u):
    _check_swiglu_bwd(dy, w, g, u)
    return dy.new_empty(g.shape), dy.new_empty(g.shape)


gemm.register_autograd(_gemm_backward, setup_context=_gemm_setup_context)
gemm_residual.register_autograd(_gemm_residual_backward, setup_context=_gemm_residual_setup_context)
bmm.register_autograd(_gemm_backward, setup_context=_gemm_setup_context)
