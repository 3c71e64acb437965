"""Backward of ``autows::attention``: gradients of ``(out, lse) = attention(q, k, v)`` from the saved out and lse.

With ``torch_autows.config.attention_backward`` "autows" or "measure" (the default; there where measured faster) the
generated backward (``runtime/attention_bwd.py``) serves the calls it supports (the reason for any other is logged
once). Otherwise three implementations,
chosen per call from static facts (device, dtype, shapes: nothing that needs a host sync, so all are CUDA-graph
safe and trace with symbolic sizes):

* ``aten._scaled_dot_product_cudnn_attention_backward`` (what Inductor's default path runs for SDPA on
  Hopper) on sm_90 with cuDNN 9 when the flash contract below holds and head_dim <= 128. It takes grouped
  k/v heads and strided [B, S, H, D] views as they are. Measured on the H200 for a Llama training step
  (4 x 1024, 16/4 heads, d128, 2 layers): the flash path's expanded k/v, contiguous copies and kernels
  took 0.62 ms of GPU time per step, cuDNN's 0.35 (the step: 4.45 -> 4.10 ms; Inductor's 4.03).
* ``aten._scaled_dot_product_flash_attention_backward`` on CUDA fp16/bf16 when its contract matches
  ours: same natural-log lse of the scaled scores, top-left causal mask (it only agrees with ours when
  Sq == Skv), head_dim % 8 == 0 and <= 256, and no gradient flowing into lse.
* otherwise the math of the reference (``torch_autows.sdpa_fallback.math_attention``) differentiated by hand, in
  fp32 (fp64 for fp64 inputs):
      P  = softmax(S)                   S = scale * Q K^T (causal: -inf above the diagonal)
      dV = P^T dO          dP = dO V^T          delta = rowsum(dO * O)
      dS = P * (dP - delta + dlse)      dQ = scale * dS K      dK = scale * dS^T Q
  Written out rather than via ``torch.autograd.grad``: it is traced into AOTAutograd's backward graph,
  where nested autograd is not available.

Grouped-query attention: k/v are expanded to the q heads (head h reads kv head h // group, as SDPA's
``enable_gqa``) and the expanded gradients are summed back over each group.
"""
from __future__ import annotations

import torch

from .sdpa_fallback import scores, softmax_from_lse

_FLASH_DTYPES = (torch.float16, torch.bfloat16)


def _group(q: torch.Tensor, k: torch.Tensor) -> int:
    """q heads per k/v head (1 with no heads at all: Hq = Hkv = 0)."""
    return q.shape[1] // k.shape[1] if k.shape[1] else 1


def _expand_kv(t: torch.Tensor, group: int) -> torch.Tensor:
    return t if group == 1 else t.repeat_interleave(group, dim=1)


def _reduce_kv(g: torch.Tensor, group: int) -> torch.Tensor:
    if group == 1:
        return g
    B, H, S, D = g.shape
    return g.view(B, H // group, group, S, D).sum(dim=2)


def flash_backward_ok(q: torch.Tensor, k: torch.Tensor, is_causal: bool, grad_lse, v=None) -> bool:
    """Whether torch's flash-attention backward computes exactly our gradients for this call (``v``, where given,
    must have q's head dim: flash has one)."""
    D = q.shape[-1]
    return (q.is_cuda and torch.version.hip is None and q.dtype in _FLASH_DTYPES and grad_lse is None
            and isinstance(D, int) and D % 8 == 0 and D <= 256 and (v is None or v.shape[-1] == D)
            and (not is_causal or q.shape[2] == k.shape[2]))


def cudnn_backward_ok(q: torch.Tensor, k: torch.Tensor, is_causal: bool, grad_lse, v=None) -> bool:
    """Whether cuDNN's SDPA backward computes our gradients for this call (grouped k/v heads included). cuDNN refuses
    one query against one key ("s_q = s_kv = 1 is not supported", cuDNN 9.19 on the H200): flash serves that."""
    if not flash_backward_ok(q, k, is_causal, grad_lse, v) or q.shape[-1] > 128:
        return False
    if q.shape[2] == 1 and k.shape[2] == 1:
        return False
    version = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return bool(version and version >= 90000) and torch.cuda.get_device_capability(q.device) == (9, 0)


def _cudnn_backward(grad_out, q, k, v, out, lse, is_causal: bool, scale: float):
    if grad_out.stride() != out.stride():  # cuDNN reads dO with O's strides
        grad_out = torch.empty_like(out).copy_(grad_out)
    seed = torch.zeros((), dtype=torch.long, device=q.device)  # unused: dropout_p == 0
    return torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
        grad_out, q, k, v, out, lse.unsqueeze(-1), seed, seed, None, None, None, q.shape[2], k.shape[2], 0.0,
        is_causal, scale=scale)


def _flash_backward(grad_out, q, k, v, out, lse, is_causal: bool, scale: float):
    dev = q.device
    seed = torch.empty(2, dtype=torch.uint64, device=dev)  # unused: dropout_p == 0
    offset = torch.empty((), dtype=torch.uint64, device=dev)
    dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_backward(
        grad_out.contiguous(), q.contiguous(), k, v, out.contiguous(), lse.contiguous(), None, None,
        q.shape[2], k.shape[2], 0.0, is_causal, seed, offset, scale=scale)
    return dq, dk, dv


def reference_attention(q, k, v, is_causal: bool, scale: float):
    """(out, lse fp32) by the explicit math (``sdpa_fallback.math_attention``), for any float dtype (fp64: tests)."""
    group = _group(q, k)
    s = scores(q, _expand_kv(k, group), is_causal, scale)
    lse = torch.logsumexp(s, dim=-1)
    p = softmax_from_lse(s, lse)
    out = torch.matmul(p, _expand_kv(v, group).to(s.dtype)).to(q.dtype)
    return out, lse.float()


def _math_backward(grad_out, grad_lse, q, k, v, out, lse, is_causal: bool, scale: float):
    s = scores(q, k, is_causal, scale)
    acc = s.dtype
    qf, kf, vf = q.to(acc), k.to(acc), v.to(acc)
    # The softmax is recomputed rather than rebuilt from the saved lse: one more row reduction buys
    # gradients exact to the accumulation dtype whatever the forward kernel's lse rounding was.
    # NaN where a score is NaN or +inf (as softmax); 0 only in rows that are all -inf, as the reference
    p = softmax_from_lse(s, torch.logsumexp(s, dim=-1))
    ds = torch.zeros_like(p)
    dv = torch.zeros_like(vf)
    if grad_out is not None:
        go = grad_out.to(acc)
        dv = torch.matmul(p.transpose(-2, -1), go)
        dp = torch.matmul(go, vf.transpose(-2, -1))
        delta = (go * out.to(acc)).sum(dim=-1, keepdim=True)
        ds = p * (dp - delta)
    if grad_lse is not None:
        ds = ds + p * grad_lse.to(acc).unsqueeze(-1)
    dq = torch.matmul(ds, kf) * scale
    dk = torch.matmul(ds.transpose(-2, -1), qf) * scale
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def generated_backward(grad_out, grad_lse, q, k, v, out, lse, is_causal: bool, scale: float):
    """The generated backward's (dq, dk, dv) (``runtime/attention_bwd.py``), or None with the reason logged once
    (``runtime/fallback.py``) where it does not serve the call, or, with ``config.attention_backward == "measure"``,
    where runtime.choice keeps the vendor's backward for calls like it (measured on the first, then cached). A traced
    call (fake tensors: torch.compile's backward graph) that the support checks accept becomes
    ``torch.ops.autows.attention_backward`` in the graph, which decides the same way when the graph runs."""
    from . import config
    from .runtime import attention_bwd, fallback
    from .runtime.device import is_real

    if not all(is_real(t) for t in (q, k, v, out, lse)):
        why = attention_bwd.support_reason(q, k, v, out, lse, grad_out, is_causal, scale)
        if why:
            fallback.note_fallback("attention_backward", why)
            return None
        return tuple(torch.ops.autows.attention_backward(grad_out, grad_lse, q, k, v, out, lse, is_causal, scale))
    vendor = vendor_backward if config.attention_backward == "measure" else None
    try:
        grads = attention_bwd.backward(grad_out, grad_lse, q, k, v, out, lse, is_causal, scale, vendor=vendor)
    except fallback.Unsupported as e:
        fallback.note_fallback("attention_backward", str(e))
        return None
    if grads is not None:
        fallback.note_served("attention_backward")
    return grads


def attention_backward(grad_out, grad_lse, q, k, v, out, lse, is_causal: bool, scale: float):
    """(dq, dk, dv) for ``attention(q, k, v, is_causal, scale)``; k/v may have fewer heads than q (GQA). With
    ``config.attention_backward`` "autows" the generated backward first, where it serves the call; "measure" (the
    default) the same where it was also measured faster than the vendor's (``generated_backward``)."""
    from . import config

    if config.attention_backward in ("autows", "measure"):
        grads = generated_backward(grad_out, grad_lse, q, k, v, out, lse, is_causal, scale)
        if grads is not None:
            return grads
    return vendor_backward(grad_out, grad_lse, q, k, v, out, lse, is_causal, scale)


def vendor_backward(grad_out, grad_lse, q, k, v, out, lse, is_causal: bool, scale: float):
    """(dq, dk, dv) by torch: cuDNN's backward where it serves the call, else flash's, else the math in fp32."""
    if grad_out is not None and cudnn_backward_ok(q, k, is_causal, grad_lse, v):
        dq, dk, dv = _cudnn_backward(grad_out, q, k, v, out, lse, is_causal, scale)
        return dq, dk, dv
    group = _group(q, k)
    ke, ve = _expand_kv(k, group), _expand_kv(v, group)
    if grad_out is not None and flash_backward_ok(q, k, is_causal, grad_lse, v):
        dq, dk, dv = _flash_backward(grad_out, q, ke.contiguous(), ve.contiguous(), out, lse, is_causal, scale)
    else:
        dq, dk, dv = _math_backward(grad_out, grad_lse, q, ke, ve, out, lse, is_causal, scale)
    return dq, _reduce_kv(dk, group), _reduce_kv(dv, group)
