"""Public kernel API: generated warp-specialized kernels with a logged torch fallback.

    gemm(a, b, bias=None, out_dtype=None, residual=None, activation=None)
                                                    a @ b (+ bias) (+ residual), a [M, K], b [K, N], bias [N],
                                                    residual [M, N] (added in the epilogue, fp32, one rounding);
                                                    activation "gelu_tanh"/"gelu": gelu(a @ b (+ bias))
    bmm(a, b, out_dtype=None)                       batched a @ b, a [B, M, K], b [B, K, N]
    gemm_swiglu(a, w_gate, w_up, out_dtype=None)    silu(a @ w_gate) * (a @ w_up), weights [K, N], one kernel
    attention(q, k, v, *, is_causal, scale, enable_gqa) -> (out, lse)

Invalid arguments raise ``TypeError``/``ValueError``. Valid calls the generated kernels cannot serve
(CPU tensors, GPUs other than sm_90, dtypes, strides TMA cannot describe, ...) run torch instead and log
the reason once (logger ``torch_autows``).
"""
from __future__ import annotations

import functools
import importlib
import math

import torch

from . import config, sdpa_fallback
from .runtime.fallback import Unsupported, note_fallback, note_served, note_vendor

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _names(dtypes) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


def _check_tensor(name: str, t, ndim: int, dtypes=_FLOAT_DTYPES) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} has dtype {t.dtype}; use {_names(dtypes)}")


def _check_out_dtype(out_dtype, dtypes=_FLOAT_DTYPES) -> None:
    if out_dtype is not None and (not isinstance(out_dtype, torch.dtype) or out_dtype not in dtypes):
        raise TypeError(f"out_dtype must be None or one of {_names(dtypes)}, got {out_dtype!r}")


def _check_same_device_dtype(*named) -> None:
    (n0, t0), *rest = named
    for n, t in rest:
        if t.device != t0.device:
            raise ValueError(f"{n} is on {t.device} but {n0} is on {t0.device}; move them to one device")
        if t.dtype != t0.dtype:
            raise TypeError(f"{n} has dtype {t.dtype} but {n0} has {t0.dtype}; cast them to one dtype")


#: The activations ``gemm(activation=)`` applies in the epilogue -> F.gelu's ``approximate``.
ACTIVATIONS = {"gelu_tanh": "tanh", "gelu": "none"}


def check_activation(activation, residual=None) -> str:
    """Raise ValueError unless ``activation`` is None, "none" or one of ``ACTIVATIONS`` (and no residual comes with
    one); return its name ("none" for None)."""
    if activation is None or activation == "none":
        return "none"
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise ValueError(f"gemm: activation {activation!r} not served; use None, {', '.join(map(repr, ACTIVATIONS))} "
                         f"(F.gelu with approximate='tanh' or 'none')")
    if residual is not None:
        raise ValueError("gemm: an activation and a residual in one call are not served; add the residual to the "
                         "result outside")
    return activation


#: Dtypes the custom ops ``torch.ops.autows.*`` take: the public ones plus float64 (torch runs it; gradcheck).
OP_DTYPES = (*_FLOAT_DTYPES, torch.float64)


def check_gemm(a, b, bias=None, out_dtype=None, dtypes=_FLOAT_DTYPES, residual=None) -> None:
    """Raise TypeError/ValueError unless ``a [M, K] @ b [K, N] (+ bias [N]) (+ residual [M, N])`` is a valid call
    (works on fake tensors: shapes, dtypes and devices only). Shared by ``gemm``, ``torch.ops.autows.gemm`` (and
    ``gemm_residual``) and their fakes."""
    _check_tensor("a", a, 2, dtypes)
    _check_tensor("b", b, 2, dtypes)
    _check_out_dtype(out_dtype, dtypes)
    named = [("a", a), ("b", b)]
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"gemm: a is {tuple(a.shape)} and b is {tuple(b.shape)}; a.shape[1] must equal b.shape[0]")
    if bias is not None:
        _check_tensor("bias", bias, bias.dim() if isinstance(bias, torch.Tensor) else 1, dtypes)
        if bias.dim() != 1 or bias.shape[0] != b.shape[1]:
            raise ValueError(f"gemm: bias must have shape [N] = [{b.shape[1]}], got {tuple(bias.shape)}")
        named.append(("bias", bias))
    if residual is not None:
        _check_tensor("residual", residual, 2, dtypes)
        if tuple(residual.shape) != (a.shape[0], b.shape[1]):
            raise ValueError(f"gemm: residual must have the output's shape [M, N] = [{a.shape[0]}, {b.shape[1]}], "
                             f"got {tuple(residual.shape)}")
        named.append(("residual", residual))
    _check_same_device_dtype(*named)


def check_bmm(a, b, out_dtype=None, dtypes=_FLOAT_DTYPES) -> None:
    """Raise TypeError/ValueError unless ``bmm(a [B, M, K], b [B, K, N])`` is a valid call (see check_gemm)."""
    _check_tensor("a", a, 3, dtypes)
    _check_tensor("b", b, 3, dtypes)
    _check_out_dtype(out_dtype, dtypes)
    if a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        raise ValueError(f"bmm: a is {tuple(a.shape)} and b is {tuple(b.shape)}; need [B, M, K] and [B, K, N]")
    _check_same_device_dtype(("a", a), ("b", b))


def check_attention(q, k, v, is_causal=False, scale=None, enable_gqa=False, dtypes=_FLOAT_DTYPES) -> float:
    """Raise TypeError/ValueError unless ``attention(q, k, v, ...)`` is a valid call; return the scale to use
    (``scale``, or SDPA's default 1/sqrt(D)). Shared by ``attention``, ``torch.ops.autows.attention`` and its
    fake (shapes, dtypes and devices only)."""
    for n, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(n, t, 4, dtypes)
    _check_same_device_dtype(("q", q), ("k", k), ("v", v))
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    if scale is not None and (not isinstance(scale, (int, float)) or not math.isfinite(scale)):
        raise TypeError(f"scale must be None or a finite float, got {scale!r}")
    B, Hq, Sq, D = q.shape
    if k.shape[0] != B or v.shape[0] != B or k.shape[1] != v.shape[1] or k.shape[2] != v.shape[2]:
        raise ValueError(f"attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not match "
                         "(need q [B, Hq, Sq, D], k [B, Hkv, Skv, D] and v [B, Hkv, Skv, Dv])")
    if k.shape[3] != D:
        raise ValueError(f"attention: head dims of q ({D}) and k ({k.shape[3]}) differ; they must be equal (v's may "
                         f"differ: the output takes v's)")
    Hkv = k.shape[1]
    if Hkv != Hq and not enable_gqa:
        raise ValueError(f"attention: q has {Hq} heads and k/v {Hkv}; pass enable_gqa=True for grouped-query attention")
    if Hkv == 0 and Hq != 0:
        raise ValueError(f"attention: k/v have 0 heads but q has {Hq}; give k/v at least one head")
    if Hkv != 0 and Hq % Hkv != 0:
        raise ValueError(f"attention: q heads ({Hq}) must be a multiple of k/v heads ({Hkv})")
    return float(scale) if scale is not None else default_scale(D)


def default_scale(d) -> float:
    """SDPA's default scale 1/sqrt(d); 1.0 for d == 0 (the scores are all 0 then, any finite scale gives them)."""
    return 1.0 / math.sqrt(d) if d > 0 else 1.0


def gqa_group(hq, hkv) -> int:
    """q heads per k/v head (1 when there are no heads at all)."""
    return hq // hkv if hkv else 1


def _wants_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def gemm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None,
         out_dtype: torch.dtype | None = None, residual: torch.Tensor | None = None,
         activation: str | None = None) -> torch.Tensor:
    """``a @ b (+ bias) (+ residual)`` with fp32 accumulation; the result has ``out_dtype`` (default: a's dtype).
    ``residual`` [M, N] (a's dtype) is added to the fp32 accumulator in the kernel's epilogue, before the one
    rounding: ``h = x + o_proj(o)`` in one kernel. A residual the kernel cannot read (not contiguous) runs torch.
    ``activation`` ("gelu_tanh" or "gelu": ``F.gelu(x, approximate="tanh" | "none")``) is applied in fp32 to
    ``a @ b (+ bias)`` in the epilogue (GPT-2's ``c_fc`` + GELU in one kernel); it takes no residual.

    Differentiable: where an input requires grad, the call goes through ``torch.ops.autows.gemm`` (with a
    residual: ``torch.ops.autows.gemm_residual``), same kernel or fallback, plus its backward; with an
    activation torch computes it (logged: the fused kernel has no backward)."""
    check_gemm(a, b, bias, out_dtype, residual=residual)
    act = check_activation(activation, residual)
    if act != "none":
        if _wants_grad(a, b, bias):
            note_fallback("gemm", "an input requires grad: the activation epilogue has no backward; torch computes it")
            return torch_gemm(a, b, bias, out_dtype or a.dtype, activation=act)
        return run_gemm(a, b, bias, out_dtype or a.dtype, activation=act)
    if _wants_grad(a, b, bias, residual):
        if residual is not None:
            return torch.ops.autows.gemm_residual(a, b, residual, bias, out_dtype)
        return torch.ops.autows.gemm(a, b, bias, out_dtype)
    return run_gemm(a, b, bias, out_dtype or a.dtype, residual)


_GEMM_OFF = "disabled by torch_autows.config.gemm = False (TORCH_AUTOWS_GEMM=0)"


def _serve(op: str, call):
    """``call()``, a runtime's entry point, counted for ``op``: (its result, False) where the generated kernel
    served the call; (None, True) where runtime.choice kept the vendor's path; (None, False) where the runtime
    raised ``Unsupported`` (the reason is logged once)."""
    try:
        out = call()
    except Unsupported as e:
        note_fallback(op, str(e))
        return None, False
    if out is not None:
        note_served(op)
        return out, False
    note_vendor(op)
    return None, True


def run_gemm(a, b, bias, out_dtype: torch.dtype, residual=None, activation: str = "none") -> torch.Tensor:
    """``gemm`` (2-D a) or ``bmm`` (3-D a, no bias, residual or activation) for arguments already checked, without
    autograd:
    the generated kernel where it serves the call, else torch with the reason logged once."""
    op = "bmm" if a.dim() == 3 else "gemm"
    if not config.gemm:
        note_fallback(op, _GEMM_OFF)
    elif a.dtype not in _FLOAT_DTYPES:
        note_fallback(op, f"dtype {a.dtype}: autows GEMM serves float16, bfloat16 and float32")
    else:
        rt = runtime_module("gemm")
        if rt is None:
            note_fallback(op, "no generated GEMM kernel in this build of torch_autows")
        else:  # (vendor: runtime.choice found cuBLAS faster for this shape; torch_gemm runs it)
            out, _ = _serve(op, lambda: rt.bmm(a, b, out_dtype) if op == "bmm"
                            else rt.gemm(a, b, bias, out_dtype, residual=residual, activation=activation))
            if out is not None:
                return out
    return torch_gemm(a, b, bias, out_dtype, residual, activation)


def torch_gemm(a, b, bias, out_dtype, residual=None, activation: str = "none"):
    """The fallback of ``run_gemm``: torch's mm/addmm/bmm (a residual is added after, as torch.compile's default
    does: cuBLAS adding it as C with beta=1 is slower, 46.6 against 21.8 + 9.7 us at 8192x768x768 on the H200;
    an activation is F.gelu on the result), through fp32 when the output dtype differs."""
    gelu = None if activation == "none" else functools.partial(torch.nn.functional.gelu,
                                                                approximate=ACTIVATIONS[activation])
    if out_dtype == a.dtype:
        if a.dim() == 3:
            return torch.bmm(a, b)
        out = torch.addmm(bias, a, b) if bias is not None else torch.mm(a, b)
        out = gelu(out) if gelu else out
        return out.add_(residual) if residual is not None else out
    out = torch.matmul(a.float(), b.float())
    if bias is not None:
        out = out + bias.float()
    if gelu:
        out = gelu(out)
    if residual is not None:
        out = out + residual.float()
    return out.to(out_dtype)


def bmm(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Batched ``a @ b``: a [B, M, K], b [B, K, N] -> [B, M, N], fp32 accumulation (differentiable as gemm)."""
    check_bmm(a, b, out_dtype)
    if _wants_grad(a, b):
        return torch.ops.autows.bmm(a, b, out_dtype)
    return run_gemm(a, b, None, out_dtype or a.dtype)


def check_gemm_swiglu(a, w_gate, w_up, out_dtype=None, dtypes=_FLOAT_DTYPES) -> None:
    """Raise TypeError/ValueError unless ``gemm_swiglu(a [M, K], w_gate [K, N], w_up [K, N])`` is a valid call
    (shapes, dtypes and devices only: works on fake tensors)."""
    _check_tensor("a", a, 2, dtypes)
    _check_tensor("w_gate", w_gate, 2, dtypes)
    _check_tensor("w_up", w_up, 2, dtypes)
    _check_out_dtype(out_dtype, dtypes)
    if w_gate.shape != w_up.shape:
        raise ValueError(f"gemm_swiglu: w_gate is {tuple(w_gate.shape)} and w_up is {tuple(w_up.shape)}; both must "
                         f"be [K, N]")
    if a.shape[1] != w_gate.shape[0]:
        raise ValueError(f"gemm_swiglu: a is {tuple(a.shape)} and the weights {tuple(w_gate.shape)}; a.shape[1] "
                         f"must equal the weights' shape[0] (for nn.Linear weights [N, K], pass w.t())")
    _check_same_device_dtype(("a", a), ("w_gate", w_gate), ("w_up", w_up))


def gemm_swiglu(a: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor,
                out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``silu(a @ w_gate) * (a @ w_up)`` (the Llama MLP's gate and up projections and their product) in one
    kernel: a [M, K], w_gate and w_up [K, N] (row-major, or both transposed views such as nn.Linear's
    ``weight.t()``), fp32 accumulation, silu and product in fp32, result [M, N] in ``out_dtype`` (default: a's).

    Not differentiable through the kernel: where an input requires grad, torch computes it (logged)."""
    check_gemm_swiglu(a, w_gate, w_up, out_dtype)
    out_dtype = out_dtype or a.dtype
    op = "gemm_swiglu"
    if _wants_grad(a, w_gate, w_up):
        note_fallback(op, "an input requires grad: the fused kernel has no backward; torch computes it")
    elif not config.gemm:
        note_fallback(op, _GEMM_OFF)
    else:
        rt = runtime_module("swiglu")
        if rt is None:
            note_fallback(op, "no generated GEMM kernel in this build of torch_autows")
        else:
            out, vendor = _serve(op, lambda: rt.gemm_swiglu(a, w_gate, w_up, out_dtype))
            if out is not None:
                return out
            if vendor and out_dtype == a.dtype:  # what torch.compile default runs: two GEMMs and one fused product
                return rt.vendor_swiglu(a, w_gate, w_up, a.new_empty((a.shape[0], w_gate.shape[1])))
    return torch_gemm_swiglu(a, w_gate, w_up, out_dtype)


def torch_gemm_swiglu(a, w_gate, w_up, out_dtype):
    """The fallback of ``gemm_swiglu``: torch's two GEMMs and the product (what eager torch runs), through fp32
    when the output dtype differs."""
    if out_dtype == a.dtype:
        return torch.nn.functional.silu(a @ w_gate) * (a @ w_up)
    a32 = a.float()
    return (torch.nn.functional.silu(a32 @ w_gate.float()) * (a32 @ w_up.float())).to(out_dtype)


def check_gemm_rope(a, b, cos, sin, bias=None, dtypes=_FLOAT_DTYPES) -> None:
    """Raise TypeError/ValueError unless ``rope(a [M, K] @ b [K, N] (+ bias [N]))`` with tables cos, sin [P, D] is a
    valid call: N a multiple of an even D, tables of a's dtype (shapes, dtypes and devices only: works on fake
    tensors). Shared by ``torch.ops.autows.gemm_rope`` and its fake."""
    check_gemm(a, b, bias, None, dtypes)
    _check_tensor("cos", cos, 2, dtypes)
    _check_tensor("sin", sin, 2, dtypes)
    if tuple(cos.shape) != tuple(sin.shape):
        raise ValueError(f"gemm_rope: cos is {tuple(cos.shape)} and sin is {tuple(sin.shape)}; both must be [P, D]")
    D = cos.shape[1]
    if D % 2 or b.shape[1] % D or cos.shape[0] < 1:
        raise ValueError(f"gemm_rope: tables [P, D] = {tuple(cos.shape)} need an even D dividing N = {b.shape[1]} "
                         f"and P >= 1")
    _check_same_device_dtype(("a", a), ("cos", cos), ("sin", sin))


def torch_gemm_rope(a, b, cos, sin, bias=None):
    """``rope(a @ b (+ bias))`` by torch, the fallback of ``autows::gemm_rope`` and its reference: product, bias and
    rotation in fp32 (``x * cos + rotate_half(x) * sin`` per head of D columns, row m at the tables' row m % P),
    rounded once to a's dtype, as the kernel does."""
    y = a.float() @ b.float()
    if bias is not None:
        y = y + bias.float()
    from .interp.ops import rotate_half  # the IR op's meaning: the kernel's own definition of the rotation

    M, N = y.shape
    P, D = cos.shape
    rows = torch.arange(M, device=y.device) % P
    c, s = (t.float()[rows].repeat(1, N // D) for t in (cos, sin))
    return (y * c + rotate_half(y, D) * s).to(a.dtype)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_causal: bool = False,
              scale: float | None = None, enable_gqa: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """SDPA forward, torch semantics: q [B, Hq, Sq, D], k [B, Hkv, Skv, D], v [B, Hkv, Skv, Dv] -> (out [B, Hq, Sq, Dv],
    lse fp32 [B, Hq, Sq]). Dv may differ from D (e.g. DeepSeek's MLA prefill: D = 192, Dv = 128).

    ``lse`` is the natural-log log-sum-exp of each row of the scaled scores (what a backward needs).
    Differentiable: where an input requires grad, the call goes through ``torch.ops.autows.attention``.
    """
    scale_ = check_attention(q, k, v, is_causal, scale, enable_gqa)
    if _wants_grad(q, k, v):
        return torch.ops.autows.attention(q, k, v, is_causal, scale_, enable_gqa)
    out, lse, _ = run_attention(q, k, v, is_causal, scale_)
    return out, lse


@functools.cache
def runtime_module(name: str):
    """``torch_autows.runtime.<name>`` ("gemm", "swiglu", "attention"), or None where it cannot be imported (no triton);
    looked up once per name (the compiled graphs' calls go through here)."""
    try:
        return importlib.import_module(f"{__package__}.runtime.{name}")
    except ImportError:
        return None


def run_attention(q, k, v, is_causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """``attention`` for arguments already checked, without autograd (the compiled graph's op calls this):
    (out, lse, served), served False where torch ran it (then ``out`` may have any layout)."""
    if config.attention:
        rt = runtime_module("attention")
        if rt is None:
            note_fallback("attention", "no generated attention kernel in this build of torch_autows")
        elif q.dtype not in _FLOAT_DTYPES:
            note_fallback("attention", f"dtype {q.dtype}: autows attention serves float16, bfloat16 and float32")
        else:  # (vendor: runtime.choice found SDPA's pick faster for this shape; torch_attention runs it)
            res, _ = _serve("attention", lambda: rt.attention(q, k, v, is_causal, scale, vendor=torch_attention))
            if res is not None:
                return (*res, True)
    else:
        note_fallback("attention", "disabled by torch_autows.config.attention = False (TORCH_AUTOWS_ATTENTION=0)")
    return (*torch_attention(q, k, v, is_causal, scale), False)


def torch_attention(q, k, v, is_causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference/fallback: (out, lse) by torch, with torch's causal alignment (top-left, as SDPA's is_causal):
    the fused SDPA kernel torch would pick on a GPU, the explicit math elsewhere (sdpa_fallback)."""
    return sdpa_fallback.attention(q, k, v, is_causal, scale)
