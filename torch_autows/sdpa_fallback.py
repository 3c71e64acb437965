"""The attention fallback: torch's fused SDPA kernels where SDPA would run one, the explicit math elsewhere.

``attention`` returns ``(out, lse fp32 [B, Hq, Sq])`` (natural-log log-sum-exp of the scaled scores) with
SDPA's semantics (top-left causal mask, grouped k/v heads). On CUDA it calls the aten kernel SDPA picks
for the same call, one that also returns the log-sum-exp:

* ``aten._scaled_dot_product_cudnn_attention``   (takes grouped k/v heads; lse [B, H, S] or [B, H, S, 1])
* ``aten._scaled_dot_product_flash_attention``   (takes grouped k/v heads; causal only with Sq == Skv;
  head dims padded to a multiple of 8 as SDPA does)
* ``aten._scaled_dot_product_efficient_attention`` with ``compute_log_sumexp=True`` (k/v expanded to the q
  heads; lse padded to a multiple of 32 rows)

The choice (``fused_kernel``): on real CUDA tensors torch's own ``torch._fused_sdp_choice``; on fake/meta
tensors (tracing), where that cannot run, a mirror of torch's rules (priority order, ``torch.backends.cuda``
flags, the per-kernel checks of ``sdp_utils.cpp``) for the device's capability. Anything else (CPU, no
kernel applies, math chosen) runs ``math_attention`` in fp32 (fp64 for fp64 inputs).

NaN/Inf in q or k give NaN rows as SDPA and an explicit softmax do; only rows whose every score is -inf
(lse = -inf) are zero.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from .runtime import device as dev

#: ``torch._C._SDPBackend`` values -> our kernel names (0 is math, 4 overrideable: neither is fused here).
_BACKENDS = {1: "flash", 2: "efficient", 3: "cudnn"}
_HALF = (torch.float16, torch.bfloat16)


def attention(q, k, v, is_causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse fp32 [B, Hq, Sq]) by torch for checked arguments (see the module docstring)."""
    kind = fused_kernel(q, k, v, is_causal, scale)
    if kind is None:
        return math_attention(q, k, v, is_causal, scale)
    return fused_attention(kind, q, k, v, is_causal, scale)


def math_attention(q, k, v, is_causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The explicit softmax, accumulated in fp32 (fp64 for fp64 inputs); top-left causal as SDPA's."""
    Hq, Hkv = q.shape[1], k.shape[1]
    if Hkv != Hq and Hkv:
        k = k.repeat_interleave(Hq // Hkv, dim=1)
        v = v.repeat_interleave(Hq // Hkv, dim=1)
    s = scores(q, k, is_causal, scale)
    lse = torch.logsumexp(s, dim=-1)
    p = softmax_from_lse(s, lse)
    out = torch.matmul(p, v.to(s.dtype)).to(q.dtype)
    return out, lse.float()


def scores(q, k, is_causal: bool, scale: float) -> torch.Tensor:
    """Scaled scores in the accumulation dtype (fp32, or fp64 for fp64 inputs), -inf where causally masked
    (top-left, as SDPA's ``is_causal``); k has q's head count."""
    acc = torch.promote_types(q.dtype, torch.float32)
    s = torch.matmul(q.to(acc), k.to(acc).transpose(-2, -1)) * scale
    if is_causal:
        Sq, Skv = q.shape[2], k.shape[2]
        keep = torch.ones(Sq, Skv, dtype=torch.bool, device=q.device).tril(diagonal=0)
        s = s.masked_fill(~keep, float("-inf"))
    return s


def softmax_from_lse(s: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """``exp(s - lse)``: NaN where a row has a NaN or +inf score (as softmax), 0 in rows that are all -inf."""
    return torch.exp(s - lse.unsqueeze(-1)).masked_fill(torch.isneginf(lse).unsqueeze(-1), 0.0)


def fused_attention(kind: str, q, k, v, is_causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse fp32 [B, Hq, Sq]) from one of torch's fused kernels ("cudnn", "flash", "efficient")."""
    B, Hq, Sq, D = q.shape
    Dv = v.shape[-1]
    aten = torch.ops.aten
    if kind == "cudnn":
        res = aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, is_causal, False, scale=scale)
    elif kind == "flash":
        pad = -D % 8  # as SDPA: zero columns change neither the scores nor the kept output columns
        if pad:
            q, k, v = (F.pad(t, (0, pad)) for t in (q, k, v))
        res = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, is_causal, False, scale=scale)
    elif kind == "efficient":
        if k.shape[1] != Hq:
            g = Hq // k.shape[1]
            k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        res = aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, is_causal, scale=scale)
    else:
        raise ValueError(f"unknown fused attention kernel {kind!r}; use 'cudnn', 'flash' or 'efficient'")
    out, lse = res[0], res[1]
    if out.shape[-1] != Dv:  # flash's padding columns
        out = out[..., :Dv]
    if lse.dim() == 4:  # cuDNN: [B, H, S, 1]
        lse = lse[..., 0]
    return out, lse[:, :, :Sq].float()  # efficient pads rows to a multiple of 32


def fused_kernel(q, k, v, is_causal: bool, scale: float | None = None) -> str | None:
    """The fused kernel SDPA would run for this call ("cudnn", "flash", "efficient"), or None (math/CPU).

    A scale <= 0 takes the math: on the H200 (torch 2.11) the fused kernels return NaN for scale 0 (masked
    -inf scores times 0) and flash for negative scales (its running max is taken before scaling), where the
    softmax is well defined (the attention sweep, test/gpu/test_sweep_gpu.py, found it)."""
    if scale is not None and scale <= 0:
        return None
    if q.device.type != "cuda" or torch.version.hip is not None or q.dtype == torch.float64:
        return None
    if dev.is_real(q):
        try:
            choice = torch._fused_sdp_choice(q, k, v, None, 0.0, is_causal, scale=scale,
                                             enable_gqa=k.shape[1] != q.shape[1])
        except RuntimeError:  # no kernel at all (every backend disabled): the explicit math
            return None
        return _BACKENDS.get(int(choice))
    return mirror_choice(q, k, v, is_causal)


# --- torch's selection rules, for tensors torch cannot check (fake/meta while tracing) ---


def _priority(cap: tuple[int, int]) -> list[str]:
    """torch's backend order: the global order, with cuDNN first where torch puts it there on first use
    (sm_90/sm_10x with cuDNN newer than 9.15, unless TORCH_CUDNN_SDPA_DEPRIORITIZED)."""
    names = {**_BACKENDS, 0: "math"}
    order = [names.get(int(b), "other") for b in torch._C._get_sdp_priority_order()]
    version = torch.backends.cudnn.version() or 0
    preferred = os.environ.get("TORCH_CUDNN_SDPA_DEPRIORITIZED", "").lower() not in ("1", "true", "on", "yes")
    if preferred and version > 91500 and cap[0] in (9, 10) and cap[1] in (0, 3) and order[:1] == ["flash"]:
        order = ["cudnn", *(b for b in order if b != "cudnn")]
    return order


def _last_dim_contiguous(*ts, ignore_singleton: bool) -> bool:
    return all(t.stride(-1) == 1 or (ignore_singleton and t.shape[-1] == 1) for t in ts)


def _can_flash(q, k, v, is_causal, cap) -> bool:
    D, Sq, Skv = q.shape[-1], q.shape[2], k.shape[2]
    return (torch.backends.cuda.flash_sdp_enabled() and (8, 0) <= cap <= (12, 1) and q.dtype in _HALF
            and D <= 256 and v.shape[-1] == D and min(Sq, Skv) > 0 and (not is_causal or Sq == Skv)
            and _last_dim_contiguous(q, k, v, ignore_singleton=True))


def _can_efficient(q, k, v, is_causal, cap) -> bool:
    D = q.shape[-1]
    align = (8 if q.dtype in _HALF else 4) if cap >= (8, 0) else 1
    dtypes = (*_HALF, torch.float32) if cap >= (8, 0) else (torch.float16, torch.float32)
    offsets_ok = all((t.storage_offset() * t.element_size()) % (align * t.element_size()) == 0 or t.numel() == 0
                     for t in (q, k, v))
    return (torch.backends.cuda.mem_efficient_sdp_enabled() and (5, 0) <= cap <= (12, 1) and q.dtype in dtypes
            and D > 0 and D % align == 0 and min(q.shape[2], k.shape[2]) > 0 and offsets_ok
            and _last_dim_contiguous(q, k, v, ignore_singleton=False))


def _can_cudnn(q, k, v, is_causal, cap) -> bool:
    version = torch.backends.cudnn.version() or 0
    D, Skv = q.shape[-1], k.shape[2]
    # head dims above 128 need a cuDNN frontend torch's Python cannot see: left to flash here
    return (torch.backends.cuda.cudnn_sdp_enabled() and version >= 90000 and (8, 0) <= cap <= (12, 1)
            and q.dtype in _HALF and not (torch.are_deterministic_algorithms_enabled()
                                          and not torch.is_deterministic_algorithms_warn_only_enabled())
            and max(q.shape[0], q.shape[1]) <= 65535 and 0 < D <= 128 and D % 8 == 0
            and min(q.shape[2], Skv) > 0 and Skv != 1 and _last_dim_contiguous(q, k, v, ignore_singleton=True))


_CHECKS = {"flash": _can_flash, "efficient": _can_efficient, "cudnn": _can_cudnn}


def mirror_choice(q, k, v, is_causal: bool) -> str | None:
    """``fused_kernel`` for CUDA tensors without storage: torch's rules applied to the device's capability."""
    cap = dev.capability(dev.index(q.device))
    for name in _priority(cap):
        if name == "math" and torch.backends.cuda.math_sdp_enabled():
            return None
        check = _CHECKS.get(name)
        if check is not None and check(q, k, v, is_causal, cap):
            return name
    return None
