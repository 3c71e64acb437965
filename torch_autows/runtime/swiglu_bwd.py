"""SwiGLU backward runtime: the MLP's first backward GEMM with the product's gradients in its epilogue.

In training, the Llama MLP ``down(silu(G) * U)`` (G, U the gate and up projections, saved by the forward) gets
``dh = dy @ W_down`` (dy the gradient of the MLP's output; W_down [hidden, ffn], nn.Linear's weight used as is) and
then, pointwise, ``du = dh * silu(G)`` and ``dG = dh * U * silu'(G)``. ``torch.compile``'s default runs a cuBLAS
GEMM that writes dh and one Inductor kernel that reads dh, G and U back and writes dG and du. The kernel here is the
GEMM template with ``epilogue="swiglu_bwd"`` (templates.gemm): dh stays in the accumulator's registers and the
epilogue reads G's and U's tiles, so dh never reaches memory (two [M, ffn] transfers fewer a layer).

``support_reason(dy, w, g, u)`` says why a call cannot run it (None: it can; works on fake tensors);
``gemm_swiglu_bwd`` raises ``Unsupported`` with that reason, else runs the fastest of ``CONFIGS`` where runtime.choice
finds it faster than the vendor's path (``vendor_swiglu_bwd``) and the GPU tests have passed the kernel
(``GPU_CHECKED``), or always when a config is named (``PICK`` for "auto").
"""
from __future__ import annotations

import functools

import torch

from ..ir import Options
from ..templates.gemm import GemmRequest
from . import choice
from . import device as dev
from .fallback import Unsupported
from .gemm import DTYPES, VENDOR, _tma_view, epilogue_operand_reason, launch_template, replay, stored_reason
from .gemm import support_reason as gemm_reason
from .launch import BoundCache

#: The configs (tests compile each offline). Two consumer warpgroups of 64 rows, persistent, G's and U's tiles by TMA
#: (``Options.epilogue_tma``: the producer loads them during the tile's last K steps; their slots stage the stores).
#: 128x128: the residual's tile width (G's and U's fp32 tiles fit beside the 64-register accumulator), five 32 KB
#: stages, 229 KB of SMEM, 0 spill bytes offline for sm_90a. 128x256 (the pick): the epilogue in 64-column chunks
#: (``Options.epilogue_chunk``: the whole-tile epilogue spills ~2 KB there), G's and U's tiles 128 KB of SMEM, which
#: leaves four 32-deep K stages (two 64-deep ones starve the K loop: 1.3x slower). On an H100
#: (sweeps/swiglu_bwd_wide.py) the 128x256 kernel ran 1.062x / 1.071x / 1.060x the vendor's path at 16384x14336x4096,
#: 4096x14336x4096 and 4096x28672x8192, the 128x128 one 0.95x / 0.98x / 0.87x (its tile's GEMM 12% behind cuBLAS and
#: its epilogue exposed: sweeps/swiglu_bwd_split.py). The measured choice races both.
CONFIGS: dict[str, Options] = {
    "swiglu_bwd_p_128x128": Options(block_m=128, block_n=128, block_k=64, stages=5, data_partition=2,
                                    persistent=True, epilogue_tma=True),
    "swiglu_bwd_p_128x256": Options(block_m=128, block_n=256, block_k=32, stages=4, data_partition=2,
                                    persistent=True, epilogue_tma=True, epilogue_chunk=64),
}
PICK = "swiglu_bwd_p_128x256"

#: Whether the kernel may serve calls that do not name a config. The measured choice times our kernel against the
#: vendor's path but does not check its numbers, so a new kernel joins only once the GPU tests
#: (test/gpu/test_swiglu_bwd_gpu.py: both outputs against the fp32 reference, NaN-poisoned, ragged shapes, both
#: layouts and dtypes; and test/gpu/test_swiglu_gpu.py's compiled training step with both SwiGLU fusions, its
#: gradients against fp32) have passed it on an H100/H200; until then the rewrite leaves its sites to Inductor with
#: this reason, and ``gemm_swiglu_bwd(config=None)`` takes the vendor's path. They passed on an H100 on 2026-12-05.
GPU_CHECKED = True
NOT_CHECKED = ("the fused SwiGLU backward kernel has not passed its GPU numerics tests yet "
               "(runtime.swiglu_bwd.GPU_CHECKED)")


def support_reason(dy, w, g, u, *, check_device: bool = True) -> str | None:
    """Why the generated kernel cannot serve ``dh = dy @ w`` with the SwiGLU gradients from ``g`` and ``u`` (None:
    it can). dy [M, K], w [K, N] (row-major, or a transposed view), g and u contiguous [M, N] of dy's dtype."""
    if dy.dim() != 2 or w.dim() != 2 or g.dim() != 2 or u.dim() != 2:
        return (f"operands of {dy.dim()}, {w.dim()}, {g.dim()} and {u.dim()} dims; the SwiGLU backward GEMM takes "
                f"dy [M, K], w [K, N] and the saved projections [M, N]")
    why = gemm_reason(dy, w, None, None, check_device=check_device)
    if why:
        return why
    M, N = dy.shape[0], w.shape[1]
    return (epilogue_operand_reason("saved projection g", g, M, N, dy.dtype)
            or epilogue_operand_reason("saved projection u", u, M, N, dy.dtype) or dev.alignment_reason(g=g, u=u))


#: A call's metadata -> (launch.Bound, output shape), as runtime.gemm's ``_BOUND``.
_BOUND = BoundCache(64)


def vendor_swiglu_bwd(dy, w, g, u, dg, du):
    """What ``torch.compile``'s default runs: a cuBLAS GEMM writing dh, then one pointwise kernel (as Inductor
    generates it) reading dh, G and U and writing dG and du."""
    dh = torch.mm(dy, w)
    n = dh.numel()
    _grads_kernel()[(-(-n // 1024),)](dh, g, u, dg, du, n, BLOCK=1024)
    return dg, du


@functools.cache
def _grads_kernel():
    """``du = dh silu(g)``, ``dg = dh u silu'(g)`` elementwise in fp32 (one read of dh, g, u; one write of each)."""
    import triton
    import triton.language as tl

    @triton.jit
    def swiglu_grads(dh_ptr, g_ptr, u_ptr, dg_ptr, du_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        dh = tl.load(dh_ptr + offs, mask=mask).to(tl.float32)
        g = tl.load(g_ptr + offs, mask=mask).to(tl.float32)
        u = tl.load(u_ptr + offs, mask=mask).to(tl.float32)
        s = 1.0 / (1.0 + tl.exp(-g))
        tl.store(du_ptr + offs, (dh * g * s).to(du_ptr.dtype.element_ty), mask=mask)
        tl.store(dg_ptr + offs, (dh * u * s * (1.0 + g * (1.0 - s))).to(dg_ptr.dtype.element_ty), mask=mask)

    return swiglu_grads


def _decide(dy, w, g, u, m, n, k, layout) -> choice.Decision:
    """The measured / cached / prior choice (runtime.choice) between our kernel and the vendor's path."""
    key = ("swiglu_bwd", str(dy.dtype), layout, choice.bucket(m), n, k, tuple(CONFIGS))  # new configs: measure again
    outs: dict[str, tuple] = {}

    def out(side: str) -> tuple:  # allocated only where a measurement runs (not for a cached decision)
        if side not in outs:
            outs[side] = tuple(torch.empty((m, n), device=dy.device, dtype=dy.dtype) for _ in range(2))
        return outs[side]

    def ours(cfg):
        return gemm_swiglu_bwd(dy, w, g, u, config=cfg, out=out("ours"))

    def vendor():
        return vendor_swiglu_bwd(dy, w, g, u, *out("vendor"))

    # The prior keeps the vendor's path: the 128x128 kernel ran 0.86-0.997x its speed on an H100
    # (sweeps/2026-12-05-h100-swiglu-train.json), the chunked 128x256 one 1.06-1.07x (sweeps/swiglu_bwd_wide.py) but
    # on one card and three shapes; only a measurement takes it.
    # every config races (the decision keeps the fastest: Decision.config): the 128x256 tiles' K steps are shallower
    return choice.decide(key, {c: functools.partial(ours, c) for c in CONFIGS}, vendor, False, dy.device)


def site_decision(dy, w, g, u) -> choice.Decision:
    """The choice for a site seen at compile time with static sizes (tensors may be fake), made on real random
    tensors of the same sizes, strides and dtypes; the support checks must have passed."""
    dy, w, g, u = (choice.materialize(t) for t in (dy, w, g, u))
    M, K = dy.shape
    N = w.shape[1]
    return _decide(dy, w, g, u, M, N, K, (_tma_view(dy, M, K)[0], _tma_view(w, K, N)[0]))


def gemm_swiglu_bwd(dy, w, g, u, config: str | None = None, out: tuple | None = None):
    """(dG, du) of the SwiGLU product from ``dh = dy @ w`` and the saved ``g``, ``u`` by the generated kernel, into
    ``out`` = (dg, du) if given (contiguous [M, N] of dy's dtype). ``config`` None: the vendor's path where
    runtime.choice decides it is faster, and then None is returned (the caller runs torch); a config name (or
    "auto") always runs our kernel."""
    key = ("swiglu_bwd", dy.shape, dy.stride(), dy.dtype, dy.device, w.shape, w.stride(), w.dtype, g.shape,
           g.stride(), u.stride(), config, out is not None and tuple((t.shape, t.stride()) for t in out),
           config is None and choice.mode())
    hit = _BOUND.get(key)
    if hit is VENDOR:
        return None
    M, K = dy.shape
    N = w.shape[1]
    dg, du = out if out is not None else (torch.empty((M, N), device=dy.device, dtype=dy.dtype) for _ in range(2))
    if hit is not None and replay(hit, [dy, w], dg, dy.dtype, after=[du, g, u]) is not None:
        return dg, du
    why = support_reason(dy, w, g, u) or stored_reason("out dg", dg, (M, N), dy.dtype) or \
        stored_reason("out du", du, (M, N), dy.dtype)
    if why:
        raise Unsupported(why)
    if config not in (None, "auto") and config not in CONFIGS:
        raise Unsupported(f"no swiglu_bwd config {config!r}; the configs are {', '.join(CONFIGS)}")
    ta, _ = _tma_view(dy, M, K)
    tb, _ = _tma_view(w, K, N)
    name = PICK if config in (None, "auto") else config
    if config is None:
        d = _decide(dy, w, g, u, M, N, K, (ta, tb)) if GPU_CHECKED else None
        if d is None or not d.use_ours:
            _BOUND.put(key, VENDOR)
            return None
        name = d.config if d.config in CONFIGS else PICK
    # M, N, K are run-time scalars: the request that keys the compiled kernel leaves them at 1
    req = GemmRequest(1, 1, 1, DTYPES[dy.dtype], None, ta, tb, epilogue="swiglu_bwd")
    tensors = {"a": dy.t() if ta else dy, "b": w.t() if tb else w, "c": dg, "du": du, "g": g, "u": u}
    launch_template(req, CONFIGS[name], tensors, M, N, K, dy.device, _BOUND, key, (M, N))
    return dg, du

