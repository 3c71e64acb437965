"""Attention backward runtime: support check, config choice and launch of the generated main kernel
(templates/attention_bwd.py; passes/BACKWARD.md).

``backward(grad_out, grad_lse, q, k, v, out, lse, is_causal, scale, config=None) -> (dq, dk, dv)`` runs the torch
preprocess (delta, lse2), the main kernel (dK, dV, and dQ added atomically into a zeroed fp32 workspace) and the
torch postprocess (dQ = scale * workspace). It raises ``Unsupported`` with ``support_reason``'s reason where it
cannot serve a call; ``attention_grad.attention_backward`` then runs the vendor's backward. A repeated call with the
same shapes, strides and dtypes launches with only its tensors' addresses (``launch.BoundCache``), as the forward.

The dQ adds reorder from run to run (fp32 atomics), so the result is not bit-reproducible: a call made with
``torch.use_deterministic_algorithms(True)`` is not served.
"""
from __future__ import annotations

import torch

from ..ir import Options
from ..templates.attention_bwd import HEAD_DIMS, AttentionBwdRequest, gradients, kernel_values, preprocess
from . import device as dev
from .fallback import Unsupported
from .gemm import DTYPES
from .launch import BoundCache, Tma, compile_kernel

#: Every config the runtime can run (choose_config picks; config= names one; tests compile each offline). One CTA
#: per (batch, kv-head, block of BN keys), not persistent; a producer warp streams Q and dO through a 2-deep ring.
#: ``dp2``: two consumer warpgroups of BN/2 keys each (each adds its partial dQ), producer at 24 registers and
#: consumers at 240 (FA3's split). ``dp1``: one consumer warpgroup.
CONFIGS: dict[str, Options] = {
    "bwd_64x128_dp2": Options(block_m=64, block_n=128, stages=2, data_partition=2, persistent=False, group_m=1,
                              producer_regs=24),
    "bwd_64x64_dp1": Options(block_m=64, block_n=64, stages=2, data_partition=1, persistent=False, group_m=1),
}

#: Head dims each config serves.
CONFIG_HEAD_DIMS: dict[str, tuple[int, ...]] = {"bwd_64x128_dp2": (64, 128), "bwd_64x64_dp1": (64, 128)}


def serves(config: str, d: int) -> bool:
    """Whether ``config`` runs head dim ``d``."""
    return d in CONFIG_HEAD_DIMS.get(config, ())


def choose_config(d: int, causal: bool) -> str:
    """The config for a call. Both head dims take two consumer warpgroups of 64 keys and 64-query steps (offline,
    sm_90a: d=64 without spills; d=128 spills a few loop-invariant scalars, test/codegen/test_attention_bwd_codegen.py
    ``SPILLS``). Not measured on a GPU yet (bench/results/sweeps/attention_bwd_probe.py)."""
    return "bwd_64x128_dp2"


def _same(*ts) -> bool:
    return all(t.dtype == ts[0].dtype for t in ts)


def support_reason(q, k, v, out, lse, grad_out, is_causal=False, scale=None, *,
                   check_device: bool = True) -> str | None:
    """Why ``backward`` cannot serve this call (None: it can). Works on fake tensors."""
    why = dev.sm90_reason(q.device, check_device)
    if why:
        return why
    if q.dtype not in (torch.bfloat16, torch.float16):
        return f"dtype {q.dtype}; the generated attention backward takes bfloat16 or float16"
    if not _same(q, k, v, out, *(() if grad_out is None else (grad_out,))):
        return "q, k, v, out and grad_out differ in dtype; the generated attention backward takes one dtype"
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return "q, k and v must be [B, H, S, D]"
    D = q.shape[-1]
    if D not in HEAD_DIMS or k.shape[-1] != D or v.shape[-1] != D:
        return (f"head_dim {D} (k {k.shape[-1]}, v {v.shape[-1]}) not served by the generated attention backward "
                f"({', '.join(map(str, HEAD_DIMS))} are, the same for q, k and v)")
    B, Hq, Sq, _ = q.shape
    if k.shape[:3] != v.shape[:3] or k.shape[0] != B or Hq % max(k.shape[1], 1):
        return "k and v must share [B, Hkv, Skv] with q's batch and Hq a multiple of Hkv"
    if Sq < 1 or k.shape[2] < 1 or q.numel() == 0 or k.numel() == 0:
        return "an empty sequence, batch or head count"
    if tuple(out.shape) != tuple(q.shape) or tuple(lse.shape) != (B, Hq, Sq):
        return "out must be q's shape and lse [B, Hq, Sq]"
    if torch.are_deterministic_algorithms_enabled():
        return "atomic dQ is not deterministic (torch.use_deterministic_algorithms is on)"
    tensors = {"q": q, "k": k, "v": v, **({} if grad_out is None else {"grad_out": grad_out})}
    return dev.alignment_reason(**tensors)


#: Tests set this to a float (NaN) that fills dK/dV before the launch, so a row the kernel fails to write shows.
POISON: float | None = None

#: A call's metadata -> (launch.Bound,) for calls whose q, k, v and dO are read in place.
_BOUND = BoundCache(256)


def _key(grad_out, grad_lse, q, k, v, out, lse, is_causal, scale, config):
    return tuple((t.shape, t.stride(), t.dtype) if t is not None else None for t in (grad_out, grad_lse, q, k, v, out,
                                                                                      lse)) + (
        q.device, bool(is_causal), float(scale), config)


def backward(grad_out, grad_lse, q, k, v, out, lse, is_causal: bool, scale: float, config: str | None = None):
    """(dq, dk, dv), [B, H, S, D] each (dk/dv with k's heads), of ``(out, lse) = attention(q, k, v, is_causal,
    scale)`` by the generated kernel; ``grad_out`` or ``grad_lse`` may be None (no gradient into it). Raises
    ``Unsupported`` where ``support_reason`` gives a reason."""
    why = support_reason(q, k, v, out, lse, grad_out, is_causal, scale)
    if why:
        raise Unsupported(why)
    config = config or choose_config(q.shape[-1], is_causal)
    if not serves(config, q.shape[-1]):
        raise ValueError(f"attention backward config {config!r} serves head dims {CONFIG_HEAD_DIMS.get(config, ())}, "
                         f"not {q.shape[-1]}; use one of {sorted(c for c in CONFIGS if serves(c, q.shape[-1]))}")
    opts = CONFIGS[config]
    delta, lse2 = preprocess(out, grad_out, lse, grad_lse)
    values = kernel_values(q, k, v, grad_out, delta, lse2, bool(is_causal), float(scale), opts.block_n, POISON)
    views = [values[n] for n in ("q", "k", "v", "do")]
    ptrs = [values[n] for n in ("lse2", "delta", "dq_acc", "dk", "dv")]
    key = _key(grad_out, grad_lse, q, k, v, out, lse, is_causal, scale, config)
    hit = _BOUND.get(key)
    if hit is not None and hit[0](*(t.data_ptr() for t in views + ptrs)):
        return gradients(values, float(scale), q, k)
    try:  # no directory to write the kernel source to (or another OSError): the vendor's backward serves the call
        kernel = compile_kernel("attention_bwd", AttentionBwdRequest(q.shape[-1], DTYPES[q.dtype], bool(is_causal)),
                                opts)
        launcher = kernel.launcher
    except OSError as e:
        raise Unsupported(f"could not build the kernel: {e}") from e
    for n, t in zip(("q", "k", "v", "do"), views):
        values[n] = Tma(t, tuple(t.shape), tuple(t.stride()))
    args = launcher.ordered(values)
    grid = values["BH"] * values["NB"]  # one CTA per (batch, kv-head) and launched KV block
    idx = dev.index(q.device)
    try:
        launcher(grid, args, idx)
    except OSError as e:
        raise Unsupported(f"could not compile the kernel: {e}") from e
    in_place = grad_out is not None and all(a.data_ptr() == b.data_ptr() for a, b in zip(views, (q, k, v, grad_out)))
    if in_place:
        _BOUND.remember(key, launcher, grid, args, idx)
    return gradients(values, float(scale), q, k)
