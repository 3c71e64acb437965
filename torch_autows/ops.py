"""Public kernel API: generated warp-specialized kernels with a logged torch fallback.

    gemm(a, b, bias=None, out_dtype=None)           a @ b (+ bias), a [M, K], b [K, N], bias [N]
    bmm(a, b, out_dtype=None)                       batched a @ b, a [B, M, K], b [B, K, N]
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

from . import config
from .runtime.fallback import Unsupported, note_fallback, note_served, note_vendor

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _check_tensor(name: str, t, ndim: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if t.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name} has dtype {t.dtype}; use float16, bfloat16 or float32")


def _check_out_dtype(out_dtype) -> None:
    if out_dtype is not None and (not isinstance(out_dtype, torch.dtype) or out_dtype not in _FLOAT_DTYPES):
        raise TypeError(f"out_dtype must be None or one of {_FLOAT_DTYPES}, got {out_dtype!r}")


def _check_same_device_dtype(*named) -> None:
    (n0, t0), *rest = named
    for n, t in rest:
        if t.device != t0.device:
            raise ValueError(f"{n} is on {t.device} but {n0} is on {t0.device}; move them to one device")
        if t.dtype != t0.dtype:
            raise TypeError(f"{n} has dtype {t.dtype} but {n0} has {t0.dtype}; cast them to one dtype")


def gemm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None,
         out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``a @ b (+ bias)`` with fp32 accumulation; the result has ``out_dtype`` (default: a's dtype)."""
    _check_tensor("a", a, 2)
    _check_tensor("b", b, 2)
    _check_out_dtype(out_dtype)
    named = [("a", a), ("b", b)]
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"gemm: a is {tuple(a.shape)} and b is {tuple(b.shape)}; a.shape[1] must equal b.shape[0]")
    if bias is not None:
        _check_tensor("bias", bias, bias.dim() if isinstance(bias, torch.Tensor) else 1)
        if bias.dim() != 1 or bias.shape[0] != b.shape[1]:
            raise ValueError(f"gemm: bias must have shape [N] = [{b.shape[1]}], got {tuple(bias.shape)}")
        named.append(("bias", bias))
    _check_same_device_dtype(*named)
    out_dtype = out_dtype or a.dtype
    if config.gemm:
        from .runtime import gemm as rt

        try:
            out = rt.gemm(a, b, bias, out_dtype)
        except Unsupported as e:
            note_fallback("gemm", str(e))
        else:
            if out is not None:
                note_served("gemm")
                return out
            note_vendor("gemm")
    else:
        note_fallback("gemm", "disabled by torch_autows.config.gemm = False (TORCH_AUTOWS_GEMM=0)")
    return _torch_gemm(a, b, bias, out_dtype)


def _torch_gemm(a, b, bias, out_dtype):
    if out_dtype == a.dtype:
        return torch.addmm(bias, a, b) if bias is not None else torch.mm(a, b)
    out = torch.mm(a.float(), b.float())
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)


def bmm(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Batched ``a @ b``: a [B, M, K], b [B, K, N] -> [B, M, N], fp32 accumulation."""
    _check_tensor("a", a, 3)
    _check_tensor("b", b, 3)
    _check_out_dtype(out_dtype)
    if a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        raise ValueError(f"bmm: a is {tuple(a.shape)} and b is {tuple(b.shape)}; need [B, M, K] and [B, K, N]")
    _check_same_device_dtype(("a", a), ("b", b))
    out_dtype = out_dtype or a.dtype
    if config.gemm:
        from .runtime import gemm as rt

        try:
            out = rt.bmm(a, b, out_dtype)
        except Unsupported as e:
            note_fallback("bmm", str(e))
        else:
            if out is not None:
                note_served("bmm")
                return out
            note_vendor("bmm")
    else:
        note_fallback("bmm", "disabled by torch_autows.config.gemm = False (TORCH_AUTOWS_GEMM=0)")
    out = torch.bmm(a, b) if out_dtype == a.dtype else torch.bmm(a.float(), b.float()).to(out_dtype)
    return out


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_causal: bool = False,
              scale: float | None = None, enable_gqa: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """SDPA forward, torch semantics: q [B, Hq, Sq, D], k/v [B, Hkv, Skv, D] -> (out, lse fp32 [B, Hq, Sq]).

    ``lse`` is the natural-log log-sum-exp of each row of the scaled scores (what a backward needs).
    """
    for n, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(n, t, 4)
    _check_same_device_dtype(("q", q), ("k", k), ("v", v))
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    if scale is not None and (not isinstance(scale, (int, float)) or not math.isfinite(scale)):
        raise TypeError(f"scale must be None or a finite float, got {scale!r}")
    B, Hq, Sq, D = q.shape
    if k.shape[0] != B or v.shape[0] != B or k.shape[1] != v.shape[1] or k.shape[2] != v.shape[2]:
        raise ValueError(f"attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not match")
    if k.shape[3] != D or v.shape[3] != D:
        raise ValueError(f"attention: head dims differ (q {D}, k {k.shape[3]}, v {v.shape[3]}); they must be equal")
    Hkv = k.shape[1]
    if Hkv != Hq and not enable_gqa:
        raise ValueError(f"attention: q has {Hq} heads and k/v {Hkv}; pass enable_gqa=True for grouped-query attention")
    if Hq % Hkv != 0:
        raise ValueError(f"attention: q heads ({Hq}) must be a multiple of k/v heads ({Hkv})")
    scale = float(scale) if scale is not None else 1.0 / math.sqrt(D)
    out, lse, _ = run_attention(q, k, v, is_causal, scale)
    return out, lse


@functools.cache
def runtime_module(name: str):
    """``torch_autows.runtime.<name>`` ("gemm", "attention"), or None where it cannot be imported (no triton);
    looked up once per name (the compiled graphs' calls go through here)."""
    try:
        return importlib.import_module(f"{__package__}.runtime.{name}")
    except ImportError:
        return None


def run_attention(q, k, v, is_causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """``attention`` for arguments already checked (the compiled graph's op calls this): (out, lse, served),
    served False where torch ran it (then ``out`` is contiguous)."""
    if config.attention:
        rt = runtime_module("attention")
        if rt is None:
            note_fallback("attention", "no generated attention kernel in this build of torch_autows")
        else:
            try:
                res = rt.attention(q, k, v, is_causal, scale, vendor=torch_attention)
            except Unsupported as e:
                note_fallback("attention", str(e))
            else:
                if res is not None:
                    note_served("attention")
                    return (*res, True)
                note_vendor("attention")
    else:
        note_fallback("attention", "disabled by torch_autows.config.attention = False (TORCH_AUTOWS_ATTENTION=0)")
    return (*torch_attention(q, k, v, is_causal, scale), False)


def torch_attention(q, k, v, is_causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference/fallback: (out, lse) by torch, with torch's causal alignment (top-left, as SDPA's is_causal)."""
    Hq, Hkv = q.shape[1], k.shape[1]
    if Hkv != Hq:
        k = k.repeat_interleave(Hq // Hkv, dim=1)
        v = v.repeat_interleave(Hq // Hkv, dim=1)
    s = torch.matmul(q.float(), k.float().transpose(-2, -1)) * scale
    if is_causal:
        Sq, Skv = q.shape[2], k.shape[2]
        keep = torch.ones(Sq, Skv, dtype=torch.bool, device=q.device).tril(diagonal=0)
        s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1)).nan_to_num(0.0)
    out = torch.matmul(p, v.float()).to(q.dtype)
    return out, lse
