"""A GEMM with rotary position embedding in its epilogue: ``rope(a @ b (+ bias))`` by the generated kernel.

The Llama q/k projections followed by RoPE (``x * cos + rotate_half(x) * sin`` per head of D columns, cos/sin rows
of the positions) as one kernel (templates.gemm ``GemmRequest.rope``; issue 16, item 3): the projection's output is
rotated in fp32 in registers and rounded once, instead of written, read back and rewritten by a pointwise kernel.
Row m of the output takes the tables' row ``m % P`` (P = ``cos.shape[0]``): with rows [batch, sequence] flattened
and positions 0..S-1 in every sequence, tables of S rows; with a position per row, tables of M rows. The tables
come by TMA where the producer can load them (``tables_options``), else by pointer loads in the consumer.

``inductor/rewrite_rope.py`` sends the sites it finds here where ``site_decision`` measures the fused kernel faster
than what ``torch.compile``'s default runs (``vendor_rope``: cuBLAS, then one pointwise RoPE kernel).
"""
from __future__ import annotations

import functools
from dataclasses import replace

import torch

from ..ir import Options
from ..templates.gemm import GemmRequest
from . import choice
from .fallback import Unsupported
from .gemm import (
    CONFIGS,
    DECODE_TILES,
    DTYPES,
    _tma_view,
    decode_name,
    decode_pick,
    launch_template,
    replay,
    serves_rope,
    support_reason,
)
from .launch import BoundCache

_BOUND = BoundCache(64)

#: RoPE on the large-GEMM tile (128x256, 64-deep K steps: ``ws_p_128x256``'s ring), two heads of 128 a tile, the
#: epilogue in half-head column chunks (templates.gemm_epilogue ``rope_chunks``, ``epilogue_chunk`` = D/2: 0 spills
#: offline for sm_90a, 225 KB of SMEM with the tables' tiles, which also serve both heads) and the tables by TMA. The
#: 128x128 RoPE kernel measured 0.82x the default's path on an H100 where our plain GEMM on that tile was at parity
#: with cuBLAS: its epilogue costs 5-9 us of a tile's ~25 (sweeps/rope_epilogue.py tells the parts apart).
WIDE: dict[str, Options] = {"rope_p_128x256": replace(CONFIGS["ws_p_128x256"], epilogue_tma=True, epilogue_chunk=64)}
#: Whether the measured choice may race the wide config at a site (it times, it does not check numbers): it waits
#: for test/gpu/test_rope_gpu.py's wide cases; until then it runs only where named.
WIDE_GPU_CHECKED = False


def _options(config: str) -> Options:
    return WIDE[config] if config in WIDE else CONFIGS[config]


def serves(config: str, d: int) -> bool:
    """Whether ``config`` (runtime.gemm's, or ``WIDE``'s) serves the RoPE epilogue at head dim ``d``."""
    if config in WIDE:
        return d == 2 * WIDE[config].epilogue_chunk
    return config in CONFIGS and serves_rope(config, d)


def rope_reason(a, b, cos, sin, bias=None, *, check_device: bool = True) -> str | None:
    """Why ``gemm_rope`` cannot serve the call (None: it can). Works on fake tensors."""
    if a.dim() != 2 or b.dim() != 2:
        return "a and b must be 2-D (flatten the batch and sequence into rows)"
    why = support_reason(a, b, bias, check_device=check_device)
    if why:
        return why
    if cos.dim() != 2 or tuple(cos.shape) != tuple(sin.shape):
        return f"cos {tuple(cos.shape)} and sin {tuple(sin.shape)} must both be [P, D]"
    P, D = cos.shape
    if P < 1 or D < 2 or D % 2:
        return f"tables [{P}, {D}]: RoPE needs an even head dim D and at least one row"
    if cos.dtype != a.dtype or sin.dtype != a.dtype:
        return f"cos/sin {cos.dtype}/{sin.dtype}: the epilogue reads tables of the operands' dtype {a.dtype} " \
               f"(the models cast them so: cos.to(x.dtype))"
    if not (cos.is_contiguous() and sin.is_contiguous()) or cos.device != a.device or sin.device != a.device:
        return "cos and sin must be contiguous and on the operands' device"
    if b.shape[1] % D:
        return f"N={b.shape[1]} is not a multiple of the head dim {D}: RoPE rotates whole heads"
    return None


def choose_config(m: int, n: int, k: int, d: int) -> str:
    """A config serving the RoPE epilogue at head dim ``d`` for an M x N x K call: up to 128 rows the decode model's
    pick (``decode_pick``, as plain GEMMs take theirs) among the decode tiles that hold whole heads and serve it,
    split-K included (a few rows against a large weight: a single unsplit 128-wide tile streams it from N/128 SMs),
    else the 128x128 tile (the widest that serves it; with the tables by TMA 877-903 us at the Llama-3-8B q projection
    of 8x2048 rows on the H200, 940-984 by pointers)."""
    if m <= 128:
        tiles = tuple(t for t in DECODE_TILES if serves_rope(decode_name("dec", (t[0], t[1], 1)), d))
        best = decode_pick(tiles, m, n, k)
        if best and serves_rope(decode_name("dec", best), d):
            return decode_name("dec", best)
    if serves_rope("ws_p_128x128", d):
        return "ws_p_128x128"
    raise Unsupported(f"no GEMM config serves the RoPE epilogue at head dim {d} (runtime.gemm.serves_rope)")


def gemm_rope(a, b, cos, sin, bias=None, config: str | None = "auto", out: torch.Tensor | None = None,
              tables: str = "auto") -> torch.Tensor:
    """``rope(a @ b (+ bias))``: a [M, K], b [K, N] (nn.Linear's ``x @ w.t()`` included), cos/sin [P, D] of the
    operands' dtype, N a multiple of D; row m rotates by the tables' row m % P. Output [M, N] of the operands' dtype
    (into ``out`` if given, contiguous). ``config`` "auto" (``choose_config``'s), None (the config this site's
    measurement kept, ``site_decision``, where this process made one; else "auto"'s) or a config name that
    ``serves``; ``tables`` "auto"
    (by TMA where ``tables_options`` allows it) or "pointer" (pointer loads always: for measuring the two). Raises
    ``Unsupported`` with the reason where the kernel cannot serve the call."""
    if tables not in ("auto", "pointer"):
        raise ValueError(f"tables={tables!r}: use 'auto' (TMA where the tiles fit) or 'pointer'")
    # a call seen before launches through its Bound: the checks, config and plan below are functions of this key (an
    # address of another alignment makes the Bound refuse, and the full path runs); 205 us of host time a call
    # without it at the Llama q projection (H100), against cuBLAS and the pointwise kernel's 71
    key = ("rope", a.shape, a.stride(), a.dtype, a.device, b.shape, b.stride(), b.dtype, cos.shape, cos.stride(),
           cos.dtype, sin.shape, sin.stride(), sin.dtype, bias is not None and (bias.shape, bias.stride(), bias.dtype),
           out is not None and (out.shape, out.stride(), out.dtype), config, tables)
    hit = _BOUND.get(key)
    if hit is not None:
        c = replay(hit, [a, b], out, a.dtype, [t for t in (bias, cos, sin) if t is not None])
        if c is not None:
            return c
    why = rope_reason(a, b, cos, sin, bias)
    if why:
        raise Unsupported(why)
    M, K = a.shape
    N = b.shape[1]
    P, D = cos.shape
    if config is None:  # the config the site's measurement kept (site_decision), where this process made one
        d = choice.records.get(_site_key(a, b, cos, M, N, K, candidates(M, N, K, D, cos, sin), bias is not None))
        config = d.config if d is not None and d.config is not None else "auto"
    config = choose_config(M, N, K, D) if config == "auto" else config
    if not serves(config, D):
        raise ValueError(f"config {config!r} does not serve the RoPE epilogue at head dim {D}; use 'auto' or one of "
                         f"{[c for c in (*CONFIGS, *WIDE) if serves(c, D)]}")
    if out is not None and (tuple(out.shape) != (M, N) or out.dtype != a.dtype or not out.is_contiguous()):
        raise ValueError(f"out must be a contiguous [{M}, {N}] {a.dtype} tensor, not {tuple(out.shape)} {out.dtype}")
    ta, tb = _tma_view(a, M, K)[0], _tma_view(b, K, N)[0]
    c = out if out is not None else torch.empty((M, N), device=a.device, dtype=a.dtype)
    options = tables_options(_options(config), cos, sin, M) if tables == "auto" else \
        replace(_options(config), epilogue_tma=False)
    if options.epilogue_chunk and not options.epilogue_tma:
        raise Unsupported(f"config {config} reads the tables' column halves from their TMA tiles, which this call "
                          f"cannot take (tables {tuple(cos.shape)} at rows m % P: P a multiple of {options.block_m} "
                          f"or at least M={M}, 16-byte aligned; tables='auto'); use config='auto'")
    req = GemmRequest(1, 1, 1, DTYPES[a.dtype], None, ta, tb, bias is not None, rope=D)  # sizes at run time
    operands = {"a": a.t() if ta else a, "b": b.t() if tb else b, "c": c, "cos": cos, "sin": sin, "P": P,
                **({"bias": bias} if bias is not None else {})}
    launch_template(req, options, operands, M, N, K, a.device, _BOUND, key, (M, N))
    return c


def tables_options(options: Options, cos, sin, m: int) -> Options:
    """``options`` with the tables by TMA (``epilogue_tma``: the producer loads their tiles into SMEM during the K
    steps; H200, q projection 16384x4096x4096 on 128x128 tiles: 903 us against 984 with pointer loads, which every
    CTA issues at once after its last mma) wherever the producer can load them so: a tile holds one head (``block_n``
    = D), its ``block_m`` rows from ``m0 % P`` lie inside the table (P a multiple of ``block_m``, or P >= M: no row
    wraps), K is not split (only the CTA that stores rotates), the store stages in the tables' slot (one staging
    copy: with two of their own the ring keeps 3 stages, 1076 us) and both tables are 16-byte aligned; pointer loads
    everywhere else."""
    P, D = cos.shape
    heads = options.block_n == D or (options.epilogue_chunk and D == 2 * options.epilogue_chunk)  # ``WIDE``: [BM, D]
    fits = (heads and (P % options.block_m == 0 or P >= m) and options.split_k == 1
            and options.store_buffers == 1 and not (cos.data_ptr() % 16 or sin.data_ptr() % 16))
    return replace(options, epilogue_tma=bool(fits))


def vendor_rope(a, b, cos, sin, bias, out):
    """What ``torch.compile``'s default runs for a RoPE site, into ``out`` [M, N]: cuBLAS's GEMM, then one pointwise
    kernel over its output (Inductor fuses the halves, the negation, the concatenation, the two products and the
    sum into one; eager torch would run five kernels, which would flatter the fused kernel in the choice)."""
    y = torch.addmm(bias, a, b) if bias is not None else torch.mm(a, b)
    M, N = y.shape
    P, D = cos.shape
    _rope_kernel()[(M, -(-N // 1024))](y, cos, sin, out, N, P, D=D, BLOCK=1024)
    return out


@functools.cache
def _rope_kernel():
    """Row m of ``o = y * cos + rotate_half(y) * sin`` per head of D columns, tables' row m % P, in fp32 (one read of
    y, one write of o; the tables stay in L2)."""
    import triton
    import triton.language as tl

    @triton.jit
    def rope_rows(y_ptr, c_ptr, s_ptr, o_ptr, N, P, D: tl.constexpr, BLOCK: tl.constexpr):
        m = tl.program_id(0).to(tl.int64)
        n = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        keep = n < N
        d = n % D
        half = D // 2
        partner = tl.where(d < half, n + half, n - half)
        sign = tl.where(d < half, -1.0, 1.0)
        y = tl.load(y_ptr + m * N + n, mask=keep, other=0.0).to(tl.float32)
        r = tl.load(y_ptr + m * N + partner, mask=keep, other=0.0).to(tl.float32)
        p = m % P
        c = tl.load(c_ptr + p * D + d, mask=keep, other=0.0).to(tl.float32)
        s = tl.load(s_ptr + p * D + d, mask=keep, other=0.0).to(tl.float32)
        tl.store(o_ptr + m * N + n, (y * c + sign * r * s).to(o_ptr.dtype.element_ty), mask=keep)

    return rope_rows


def site_decision(a, b, cos, sin, bias=None) -> choice.Decision:
    """The choice for a RoPE site seen at compile time with static sizes (tensors may be fake), made on real random
    tensors of the same sizes, strides and dtypes (the support checks must have passed): the fused kernel against
    ``vendor_rope``; without a measurement (prior mode, or no sm_90 GPU) the default's path."""
    a, b, cos, sin = (choice.materialize(t) for t in (a, b, cos, sin))
    bias = choice.materialize(bias) if bias is not None else None
    M, K = a.shape
    N = b.shape[1]
    cands = candidates(M, N, K, cos.shape[1], cos, sin)
    key = _site_key(a, b, cos, M, N, K, cands, bias is not None)
    outs = [torch.empty((M, N), device=a.device, dtype=a.dtype) for _ in range(2)]

    def ours(cfg="auto"):
        return gemm_rope(a, b, cos, sin, bias, config=cfg, out=outs[0])

    runs = {c: functools.partial(ours, c) for c in cands} if len(cands) > 1 else ours
    return choice.decide(key, runs, lambda: vendor_rope(a, b, cos, sin, bias, outs[1]), False, a.device)


def candidates(m: int, n: int, k: int, d: int, cos, sin) -> list[str]:
    """The configs a site's measurement races: ``choose_config``'s, and the wide ``WIDE`` tile where it is GPU-checked
    (``WIDE_GPU_CHECKED``), the call has more rows than the decode tiles take, and the tables come by TMA."""
    out = [choose_config(m, n, k, d)]
    if WIDE_GPU_CHECKED and m > 128:
        out += [c for c, o in WIDE.items() if serves(c, d) and tables_options(o, cos, sin, m).epilogue_tma]
    return out


def _site_key(a, b, cos, m: int, n: int, k: int, cands: list, bias: bool = False) -> tuple:
    key = ("rope", str(a.dtype), (_tma_view(a, m, k)[0], _tma_view(b, k, n)[0]), bias, choice.bucket(m), n, k,
           tuple(cos.shape))
    return key + (tuple(cands),) if len(cands) > 1 else key  # (a one-config key stays as the choice cache has it)

