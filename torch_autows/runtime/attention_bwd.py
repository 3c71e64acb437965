"""Attention backward around the generated main kernel (templates/attention_bwd.py): the preprocess, the kernel's
argument values and the postprocess, in torch (passes/BACKWARD.md §1-2; templates of their own later).

    delta, lse2 = preprocess(out, grad_out, lse, grad_lse)   rowsum(fp32(dO) * fp32(O)) [- dlse]; fin0(lse) * log2 e
    values = kernel_values(q, k, v, grad_out, delta, lse2, causal, scale, block_n)
                                                           a value per argument name of the template: 2-D row views,
                                                           the zeroed fp32 dQ workspace, dK/dV (rows of the KV
                                                           blocks the kernel skips already zero), scalars
    dq = postprocess(values["dq_acc"], scale, q)             scale * dQ_acc in q's dtype, [B, Hq, Sq, D]

Not wired into ``attention_grad`` yet (a GPU check comes first); the interpreter tests run the kernel between them.
Tensors are [B, H, S, D] (k/v with Hkv heads, Hq a multiple of Hkv), in the [B, H, S, D] or the [B, S, H, D] memory
layout (anything else is copied); everything is pure: nothing here launches.
"""
from __future__ import annotations

import torch

LOG2E = 1.4426950408889634


def kv_blocks(Sq: int, Skv: int, block_n: int, causal: bool) -> int:
    """KV blocks to launch per (batch, kv-head), the kernel's ``NB`` scalar: causal,
    only those whose first key is below Sq (the others see no query)."""
    return -(-(min(Sq, Skv) if causal else Skv) // block_n)


def preprocess(out: torch.Tensor, grad_out: torch.Tensor | None, lse: torch.Tensor,
               grad_lse: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(delta, lse2), each [B*Hq*Sq] f32: delta = rowsum(fp32(dO) * fp32(O)) - dlse (a gradient into lse folds in
    here: dS = P (dP - delta + dlse)); lse2 = lse * log2 e, 0 where lse is -inf (a row with every key masked)."""
    delta = torch.zeros(lse.shape, dtype=torch.float32, device=lse.device)
    if grad_out is not None:
        delta = (grad_out.float() * out.float()).sum(-1)
    if grad_lse is not None:
        delta = delta - grad_lse.float()
    lse = lse.float()
    lse2 = torch.where(lse == float("-inf"), torch.zeros_like(lse), lse * LOG2E)
    return delta.reshape(-1).contiguous(), lse2.reshape(-1).contiguous()


def _rows(t: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """``t`` [B, H, S, D] as the 2-D row view the kernel reads (element (b, h, s, d) at row b*rb + h*rh + s,
    column h*ch + d) and (rb, rh, ch); a layout that is neither [B, H, S, D] nor [B, S, H, D] is copied."""
    B, H, S, D = t.shape
    if t.transpose(1, 2).is_contiguous() and not t.is_contiguous():
        return t.transpose(1, 2).reshape(B * S, H * D), (S, 0, D)
    t = t.contiguous()
    return t.reshape(B * H * S, D), (H * S, S, 0)


def kernel_values(q, k, v, grad_out, delta, lse2, causal: bool, scale: float, block_n: int,
                  fill: float | None = None) -> dict:
    """A value per argument name of the attention_bwd template. dK/dV are new [B, Hkv, Skv, D] tensors (their
    2-D views under "dk"/"dv"), left uninitialised (``fill``: filled, as the interpreter's poison) except the rows
    of the KV blocks the kernel is not launched for (causal, keys at or past Sq), which are zero; the dQ
    workspace is zero. ``grad_out`` None: zeros (only a gradient into lse flows)."""
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    if grad_out is None:
        grad_out = torch.zeros_like(q)
    (q2, qs), (k2, ks), (v2, vs), (do2, ds) = (_rows(t) for t in (q, k, v, grad_out))
    if vs != ks:
        k2, ks = _rows(k.contiguous())
        v2, vs = _rows(v.contiguous())
    make = torch.empty if fill is None else (lambda *s, **kw: torch.full(s, fill, **kw))
    dk, dv = (make(B, Hkv, Skv, D, dtype=k.dtype, device=k.device) for _ in range(2))
    NB = kv_blocks(Sq, Skv, block_n, causal)
    dk[:, :, NB * block_n:] = 0
    dv[:, :, NB * block_n:] = 0
    vals = {"q": q2, "k": k2, "v": v2, "do": do2, "lse2": lse2, "delta": delta,
            "dq_acc": torch.zeros(B * Hq * Sq, D, dtype=torch.float32, device=q.device),
            "dk": dk.view(B * Hkv * Skv, D), "dv": dv.view(B * Hkv * Skv, D),
            "Sq": Sq, "Skv": Skv, "Hq": Hq, "Hkv": Hkv, "G": Hq // Hkv, "qk_scale": scale * LOG2E, "scale": scale,
            "BH": B * Hkv, "NB": NB}
    for pre, s in (("q", qs), ("kv", ks), ("do", ds), ("dk", (Hkv * Skv, Skv, 0))):
        vals.update(zip((f"{pre}_rb", f"{pre}_rh", f"{pre}_ch"), s))
    return vals


def postprocess(dq_acc: torch.Tensor, scale: float, q: torch.Tensor) -> torch.Tensor:
    """dQ [B, Hq, Sq, D] in q's dtype: scale * the fp32 workspace [B*Hq*Sq, D]."""
    return (dq_acc * scale).to(q.dtype).view(q.shape)


def gradients(values: dict, scale: float, q: torch.Tensor, k: torch.Tensor):
    """(dq, dk, dv) [B, H, S, D] from the values after the kernel ran."""
    B, Hkv, Skv, D = k.shape
    return (postprocess(values["dq_acc"], scale, q), values["dk"].view(B, Hkv, Skv, D),
            values["dv"].view(B, Hkv, Skv, D))
