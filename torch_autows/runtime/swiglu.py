"""SwiGLU GEMM runtime: ``silu(a @ bg) * (a @ bu)`` (the Llama MLP's gate and up projections) in one kernel.

The kernel is the GEMM template with ``epilogue="swiglu"`` (templates.gemm): every K step streams a tile of
both weights and runs two wgmma into two accumulators; the epilogue applies silu to the gate's, multiplies by
the up's and stores once, so the two [M, N] projections never reach memory. The passes split it like any GEMM
(two accumulators per chain; split-K reduces both with one arrival per CTA).

``support_reason(a, bg, bu, out_dtype)`` says why a call cannot run it (None: it can; works on fake tensors);
``gemm_swiglu`` raises ``Unsupported`` with that reason, else runs the config ``choose_config`` picks (or the
one named), where runtime.choice finds it faster than the vendor's path (two cuBLAS GEMMs and the
elementwise product), or always when a config is named. At decode shapes in nn.Linear's layout the measured
choice also times swap-AB configs (``decode_candidates``) and runs the fastest it kept. In a training graph the
projections are kept for the backward: ``gemm_swiglu(..., saved=(g, u))`` writes them too (epilogue "swiglu_save",
``SAVE_CONFIG``; against the default's two GEMMs writing them and its pointwise product reading them back).
"""
from __future__ import annotations

import functools

import torch

from ..ir import Options
from ..templates.gemm import GemmRequest
from . import choice
from . import device as dev
from .fallback import Unsupported
from .gemm import (
    DTYPES,
    VENDOR,
    _measured_config,
    _out_reason,
    _tma_view,
    decode_configs,
    decode_name,
    decode_pick,
    launch_template,
    replay,
    stored_reason,
    swap_fits,
)
from .gemm import support_reason as gemm_reason
from .gemm_configs import SWAP_ROWS, swap_configs, swap_serves
from .launch import BoundCache

#: The swiglu configs (choose_config picks among them, config= names one; tests compile each offline).
CONFIGS: dict[str, Options] = {
    # Two consumer warpgroups of 64 rows, each holding two 64x128 fp32 accumulators (128 registers a thread):
    # the widest tile that leaves registers for the epilogue (128x256 would need all 256 for the accumulators).
    # A, gate and up tiles are 48 KB a stage: 4 stages and two 16 KB staging tiles fill 227 KB.
    "swiglu_p_128x128": Options(block_m=128, block_n=128, block_k=64, stages=4, data_partition=2, persistent=True),
}
#: Decode tiles (a few rows): one 64-row consumer warpgroup, as deep a ring as SMEM holds, the K loop split
#: across ``s`` CTAs (passes/split_k; one reduction of both accumulators) so that enough SMs stream the weights.
#: Both stream 32 KB of weights a K step; the 128-wide one has fewer, longer units (wide N: Llama's 14336).
DECODE_TILES = ((64, 128, (1, 2, 4)), (128, 64, (1, 2)))  # (block_n, block_k, splits)
CONFIGS.update(decode_configs("swiglu_dec", DECODE_TILES))
#: Swap-AB decode tiles (templates.gemm: both weights' [BN, BK] tiles in wgmma's A slot, 16 or 64 activation rows
#: in N, two [BN, BM] accumulators, one transposed store), unsplit: nn.Linear's layout only (``gemm.swap_serves``).
#: As the GEMM's swap configs measured on the H200 (sweeps/2026-12-01-h200-decode-swap.json), they are offered to
#: the measured choice (``decode_candidates``, once ``OFFER_SWAP``), which keeps one only where it was the fastest;
#: choose_config does not pick them, as the GEMM's SWAP_PICK is picked, until a sweep of their own has measured them.
CONFIGS.update(swap_configs("swiglu_decs", ((64, 128, (1,)), (128, 128, (1,))), SWAP_ROWS))


def choose_config(m: int, n: int, k: int, sms: int = 132) -> str:
    """Decode tiles up to 128 rows (the least ``gemm.decode_time`` with both weights streamed), else the
    persistent 128x128 tile."""
    if m <= 128:
        return decode_name("swiglu_dec", decode_pick(DECODE_TILES, m, n, k, sms, weights=2))
    return "swiglu_p_128x128"


#: The config of a training site (epilogue "swiglu_save": the projections stored too, no split-K or swap-AB): the
#: persistent 128x128 tile, 0 spills offline for sm_90a with its three stores (229 KB of SMEM, 4 stages).
SAVE_CONFIG = "swiglu_p_128x128"
#: Whether a call that names no config may run the saving kernel: the measured choice does not check numbers, so it
#: waited for test/gpu/test_swiglu_gpu.py's saving cases (and the compiled training step with both SwiGLU fusions),
#: which passed on an H100 on 2026-12-05. Measured there against two cuBLAS GEMMs writing G and U and Inductor's
#: pointwise kernel (sweeps/2026-12-05-h100-swiglu-train.json): 1.055x at 16384x14336x4096, 1.041x at 4096 rows,
#: 1.030x at 4096x28672x8192.
SAVE_GPU_CHECKED = True
SAVE_NOT_CHECKED = ("the SwiGLU kernel that also writes the projections has not passed its GPU numerics tests yet "
                    "(runtime.swiglu.SAVE_GPU_CHECKED)")


def _saved_reason(saved, a, bg, out_dtype) -> str | None:
    """Why ``saved`` cannot take the projections (None: it can): two contiguous [M, N] tensors of ``out_dtype``."""
    shape = (a.shape[0], bg.shape[1])
    return next((why for name, t in zip(("g", "u"), saved or ())
                 if (why := stored_reason(f"saved {name}", t, shape, out_dtype))), None)


#: Whether the measured choice offers the swap-AB configs. The choice times candidates but does not check their
#: numbers, so a config joins only after the GPU tests (test/gpu/test_swiglu_gpu.py) have passed it on an H200: the
#: swiglu_decs_* configs passed there on 2026-12-01 (every config, nn.Linear's layout, random inputs).
OFFER_SWAP = True


def decode_candidates(m: int, n: int, k: int, swap: bool) -> list[str]:
    """The configs the measured choice times: choose_config's, and where ``swap`` (nn.Linear's layout), M <= 64 and
    ``OFFER_SWAP``, the two swap-AB tiles of the rows that won the GEMM's sweep at that M (16 up to M = 32, else
    64)."""
    out = [choose_config(m, n, k)]
    if swap and m <= 64 and OFFER_SWAP:
        bmx = 16 if m <= 32 else 64
        out += [f"swiglu_decs_{bn}x128_m{bmx}_s1" for bn in (64, 128)]
    return out


def support_reason(a, bg, bu, out_dtype=None, *, check_device: bool = True) -> str | None:
    """Why the generated swiglu GEMM cannot serve ``silu(a @ bg) * (a @ bu)`` (None: it can). Works on fake
    tensors: devices, dtypes, shapes and strides only."""
    if a.dim() != 2 or bg.dim() != 2 or bu.dim() != 2:
        return f"operands of {a.dim()}, {bg.dim()} and {bu.dim()} dims; the swiglu GEMM takes a [M, K] and " \
               f"weights [K, N]"
    if bu.shape != bg.shape or bu.stride() != bg.stride() or bu.dtype != bg.dtype or bu.device != bg.device:
        return (f"the up weight ({tuple(bu.shape)}, strides {tuple(bu.stride())}, {bu.dtype}) differs from the gate "
                f"weight ({tuple(bg.shape)}, strides {tuple(bg.stride())}, {bg.dtype}); one kernel reads both with "
                f"one layout: give them equal shapes, strides and dtypes")
    why = gemm_reason(a, bg, None, out_dtype, check_device=check_device) or dev.alignment_reason(bu=bu)
    return f"operand {why}" if why and why.startswith("bu ") else why


#: A call's metadata -> (launch.Bound, output shape[, workspace sizes]), as runtime.gemm's ``_BOUND``.
_BOUND = BoundCache(256)


def vendor_swiglu(a, bg, bu, out, saved: tuple | None = None):
    """What ``torch.compile``'s default runs for the site: two cuBLAS GEMMs, then one fused pointwise kernel
    (silu of the gate in fp32 times the up projection, as Inductor generates it), into ``out``; the projections
    into ``saved`` = (g, u) where given (a training graph keeps them). Eager torch would run silu and the product as
    two kernels, which would flatter the fused kernel in the choice."""
    g, u = (torch.mm(a, bg, out=saved[0]), torch.mm(a, bu, out=saved[1])) if saved else (torch.mm(a, bg),
                                                                                          torch.mm(a, bu))
    n = out.numel()
    if not (out.is_contiguous() and g.is_contiguous() and u.is_contiguous()) or out.dtype != g.dtype:
        return torch.mul(torch.nn.functional.silu(g), u, out=out)
    _silu_mul_kernel()[(-(-n // 1024),)](g, u, out, n, BLOCK=1024)
    return out


@functools.cache
def _silu_mul_kernel():
    """``o = silu(g) * u`` elementwise, computed in fp32 (one read of g and u, one write of o)."""
    import triton
    import triton.language as tl

    @triton.jit
    def silu_mul(g_ptr, u_ptr, o_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        g = tl.load(g_ptr + offs, mask=mask).to(tl.float32)
        u = tl.load(u_ptr + offs, mask=mask).to(tl.float32)
        tl.store(o_ptr + offs, (g / (1.0 + tl.exp(-g)) * u).to(o_ptr.dtype.element_ty), mask=mask)

    return silu_mul


def _decide(a, bg, bu, out_dtype, m, n, k, layout, save: bool = False) -> choice.Decision:
    """The measured / cached / prior choice (runtime.choice) between our kernel and the vendor's path (``save``: both
    also write the projections)."""
    key = ("swiglu", str(a.dtype), str(out_dtype), layout, choice.bucket(m), n, k, *(("save",) if save else ()))
    outs: dict[str, tuple] = {}

    def out(side: str) -> tuple:  # (out, saved)
        if side not in outs:
            new = [torch.empty((m, n), device=a.device, dtype=out_dtype) for _ in range(3 if save else 1)]
            outs[side] = (new[0], tuple(new[1:]) or None)
        return outs[side]

    def ours(cfg="auto"):
        o, sv = out("ours")
        return gemm_swiglu(a, bg, bu, out_dtype, config=cfg, out=o, saved=sv)

    def vendor():
        return vendor_swiglu(a, bg, bu, *out("vendor"))

    cands = [SAVE_CONFIG] if save else decode_candidates(m, n, k, swap_serves(trans_a=layout[0], trans_b=layout[1]))
    runs = {c: functools.partial(ours, c) for c in cands} if len(cands) > 1 else ours
    # the prior: a GEMM of both weights' width (the fused epilogue only saves traffic)
    return choice.decide(key, runs, vendor if out_dtype == a.dtype else None, choice.gemm_prior(m, 2 * n, k),
                         a.device)


def site_decision(a, bg, bu, out_dtype=None, save: bool = False) -> choice.Decision:
    """The choice for a swiglu site seen at compile time with static sizes (tensors may be fake), made on real
    random tensors of the same sizes, strides and dtypes; the support checks must have passed. ``save``: a training
    site, whose projections are written too."""
    out_dtype = out_dtype or a.dtype
    a, bg, bu = choice.materialize(a), choice.materialize(bg), choice.materialize(bu)
    M, K = a.shape
    N = bg.shape[1]
    return _decide(a, bg, bu, out_dtype, M, N, K, (_tma_view(a, M, K)[0], _tma_view(bg, K, N)[0]), save)


def gemm_swiglu(a, bg, bu, out_dtype, config: str | None = None, out: torch.Tensor | None = None,
                saved: tuple | None = None):
    """``silu(a @ bg) * (a @ bu)`` by the generated kernel, into ``out`` if given: a [M, K], bg and bu [K, N]
    (row-major, or both transposed views of [N, K] tensors such as nn.Linear weights ``w.t()``), fp32
    accumulation, silu and product in fp32, output ``out_dtype`` (a's dtype or float32). ``saved`` = (g, u),
    contiguous [M, N] of ``out_dtype``: the projections are written there too (epilogue "swiglu_save", for a
    training graph; ``SAVE_CONFIG``). ``config`` None: the vendor's path where runtime.choice decides it is faster
    (with ``saved``, also until the GPU tests have passed that kernel: ``SAVE_GPU_CHECKED``), and then None is
    returned (the caller runs torch); a config name (or "auto": choose_config's) always runs our kernel."""
    key = ("swiglu", a.shape, a.stride(), a.dtype, a.device, bg.shape, bg.stride(), bg.dtype, bu.shape, bu.stride(),
           bu.dtype, out_dtype, config, out is not None and (out.shape, out.stride(), out.dtype),
           saved is not None and tuple((t.shape, t.stride(), t.dtype) for t in saved),
           config is None and choice.mode())
    hit = _BOUND.get(key)
    if hit is VENDOR:
        return None
    if hit is not None:
        c = replay(hit, [a, bg, bu], out, out_dtype, list(saved or ()))
        if c is not None:
            return c
    why = support_reason(a, bg, bu, out_dtype) or _out_reason(out) or _saved_reason(saved, a, bg, out_dtype)
    if why:
        raise Unsupported(why)
    if config not in (None, "auto") and config not in CONFIGS:
        raise Unsupported(f"no swiglu config {config!r}; the configs are {', '.join(CONFIGS)}")
    M, K = a.shape
    N = bg.shape[1]
    ta, _ = _tma_view(a, M, K)
    tb, _ = _tma_view(bg, K, N)
    if config is None:
        # the gate first: a kernel awaiting its GPU tests is not measured (nor its decision written) in vain
        d = None if saved is not None and not SAVE_GPU_CHECKED else \
            _decide(a, bg, bu, out_dtype, M, N, K, (ta, tb), saved is not None)
        if d is None or not d.use_ours:
            _BOUND.put(key, VENDOR)
            return None
        config = _measured_config(d, ta, tb, out, CONFIGS)
    if saved is not None:
        name = SAVE_CONFIG if config in (None, "auto") else config
        o = CONFIGS[name]
        if o.split_k > 1 or o.swap_ab:
            raise Unsupported(f"config {name} splits K or swaps A and B; saving the projections takes neither: name "
                              f"{SAVE_CONFIG} or config='auto'")
    else:
        name = choose_config(M, N, K) if config in (None, "auto") else config
    if CONFIGS[name].swap_ab and not swap_fits(ta, tb, out):
        raise Unsupported(f"config {name} is swap-AB: it serves a row-major a, gate and up weights given as w.t() "
                          f"of row-major [N, K] tensors (nn.Linear's layout) and a contiguous out; name another "
                          f"config, or config='auto'")
    c = out if out is not None else torch.empty((M, N), device=a.device, dtype=out_dtype)
    # M, N, K are run-time scalars: the request that keys the compiled kernel leaves them at 1
    req = GemmRequest(1, 1, 1, DTYPES[a.dtype], DTYPES[out_dtype], ta, tb,
                      epilogue="swiglu" if saved is None else "swiglu_save")
    tensors = {"a": a.t() if ta else a, "b": bg.t() if tb else bg, "bu": bu.t() if tb else bu, "c": c}
    if saved is not None:
        tensors["g"], tensors["u"] = saved
    launch_template(req, CONFIGS[name], tensors, M, N, K, a.device, _BOUND, key, (M, N), accumulators=2)
    return c
