"""Attention runtime: support check, compiled-kernel cache and launch of the generated flash forward.

``support_reason(q, k, v, is_causal, scale)`` says why a call cannot run the generated kernel (None:
it can; works on fake tensors). ``attention`` raises ``Unsupported`` with that reason, else runs
templates.attention -> passes.pipeline -> codegen.gluon and returns (out, lse); ``out`` is in q's
layout when q is a transposed [B, S, H, D] tensor (``empty_out``), or the ``out=`` given. Head dims 64, 96, 128,
192 and 256 are served; 96 and 192 run in wider tiles, so their q/k/v in [B, S, H, D] rows with several heads
are read from [B, H, S, D] copies (``_in_place``'s ``own_cols``). v may have a head dim of its own where
``V_HEAD_DIMS`` lists the pair (192 / 128, MLA prefill): the output takes v's, and k and v, which the kernel addresses
with one (rb, rh, ch), are read as [B, H, S, D] rows (copies where they are not) unless there is one kv head.

Configs and their choice live in ``attention_configs`` (re-exported here).
"""
from __future__ import annotations

import functools
import math

import torch

from ..ir import Options
from ..templates.attention import HEAD_DIMS as TEMPLATE_HEAD_DIMS
from ..templates.attention import AttentionRequest, tile_cols
from . import choice
from . import device as dev
from .attention_configs import (  # noqa: F401  (re-exported: runtime.attention is where callers look for them)
    CONFIGS,
    HEAD_DIMS,
    UNMASKED_HEAD_DIMS,
    V_HEAD_DIMS,
    choose_config,
    options_for,
    serves,
    v_head_dims_text,
)
from .fallback import Unsupported
from .gemm import DTYPES
from .launch import BoundCache, Tma, compile_kernel

LOG2E = 1.4426950408889634

def support_reason(q, k, v, is_causal=False, scale=None, *, check_device: bool = True) -> str | None:
    why = dev.sm90_reason(q.device, check_device)
    if why:
        return why
    if q.dtype not in (torch.bfloat16, torch.float16):
        return f"dtype {q.dtype}; generated attention takes bfloat16 or float16"
    D, Dv = q.shape[-1], v.shape[-1]
    if D not in TEMPLATE_HEAD_DIMS:
        served = ", ".join(map(str, TEMPLATE_HEAD_DIMS))
        return f"head_dim {D} not served by autows attention ({served} are); falling back to torch SDPA"
    if Dv != D and (D, Dv) not in V_HEAD_DIMS:
        return (f"head dims {D} (q, k) and {Dv} (v): autows attention serves a v head dim of its own only as "
                f"{v_head_dims_text()}; falling back to torch SDPA")
    if q.shape[-2] < 1 or k.shape[-2] < 1:
        return "an empty sequence"
    if q.numel() == 0 or k.numel() == 0:
        return "an empty batch or no heads"
    return dev.alignment_reason(q=q, k=k, v=v)


def o_tma_ok(Sq: int, d: int, opts: Options, out: torch.Tensor | None = None) -> bool:
    """Whether O may be stored by TMA (templates.attention, ``o_tma``): every query tile whole (Sq % block_m == 0) and
    no padding columns (d a power of two, or split in pieces: ``split_d``), so no tile row or column lies in another
    head; ``out`` 16-byte aligned
    (TMA's rule; a row pitch of whole 16 bytes is _out_view's). cross_tile refuses TMA stores (passes/cross_tile)."""
    return (Sq % opts.block_m == 0 and tile_cols(d, opts) == d and not opts.cross_tile
            and (out is None or out.data_ptr() % 16 == 0))


def _plan(req: AttentionRequest, opts: Options):
    """(Program, Launcher) of a request (launch.compile_kernel caches them)."""
    kernel = compile_kernel("attention", req, opts)
    return kernel.program, kernel.launcher


def _in_place(t: torch.Tensor, bshd_first: bool = False, own_cols: bool = False):
    """(tensor, rb, rh, ch, ld) of a [B, H, S, D] tensor addressed as rows of sequence positions (see the
    template) with a row pitch of ``ld`` elements, without a copy; None when it cannot be.

    Two row orders: [B, H, S, D] (rb=H*S, rh=S, ch=0; rows of D) and [B, S, H, D], the layout models
    transpose (rb=S, rh=0, ch=D; rows of H*D). Rows may be longer than that (``ld``), as for q, k and v
    sliced from one fused QKV projection [B, S, 3, H, D]. TMA needs ``ld`` a multiple of 16 bytes.
    With a length-1 dim both orders may fit; ``bshd_first`` says which to try first. ``own_cols``: only a view
    whose rows end at the head's last column (not [B, S, H, D] rows with H > 1), for a kernel whose tiles are
    wider than D (templates.attention.tile_d): TMA then reads the columns past D as zeros, not the next head."""
    B, H, S, D = t.shape
    sb, sh, ss, sd = t.stride()
    if t.numel() == 0:  # nothing to address (and no pitch to derive)
        return None
    if D > 1 and sd != 1:
        return None
    forms = [(H * S, S, 0, D, ((S, ss), (H, sh), (B, sb))), (S, 0, D, H * D, ((S, ss), (B, sb)))]
    for rb, rh, ch, cols, order in forms[::-1] if bshd_first else forms:
        if ch and H > 1 and (sh != D or own_cols):
            continue
        ld, ok, rows = None, True, 1  # the pitch: the stride of the innermost row dim with more than one entry
        for n, st in order:
            if n > 1:
                ld = st // rows if ld is None and st % rows == 0 else ld
                ok = ok and ld is not None and st == rows * ld
            rows *= n
        ld = cols if ld is None else ld
        if ok and ld >= cols and (ld * t.element_size()) % 16 == 0:
            return t, rb, rh, ch, ld
    return None


def _rows_view(t: torch.Tensor, own_cols: bool = False):
    """``_in_place(t, own_cols=own_cols)``, or a [B, H, S, D]-contiguous copy's."""
    return _in_place(t, own_cols=own_cols) or _in_place(t.contiguous(), own_cols=own_cols)


def _kv_views(k: torch.Tensor, v: torch.Tensor, own_cols: bool = False):
    """Row views of k and v with the same (rb, rh, ch), which the kernel shares between them: v in place if
    it can be read in k's row order, else a copy of v in that order (``own_cols``: see ``_in_place``)."""
    kv = _rows_view(k, own_cols)
    bshd = bool(kv[3])
    vv = _in_place(v, bshd, own_cols)
    # the kernel addresses v with k's (rb, rh, ch); with one head ch is never used (v's head dim may differ from k's)
    if vv is None or vv[1:3] != kv[1:3] or (vv[3] != kv[3] and v.shape[1] > 1):
        vv = _in_place(v.transpose(1, 2).contiguous().transpose(1, 2) if bshd else v.contiguous(), bshd, own_cols)
    return kv, vv


def empty_out(q: torch.Tensor, d: int | None = None) -> torch.Tensor:
    """The output for q: [B, Hq, Sq, D] in q's layout when q is read as [B, S, H, D] rows (models transpose it
    back to [B, S, H*D], which is then a view), else contiguous."""
    B, H, S, D = q.shape
    d = d or D
    view = _in_place(q)
    if view is not None and view[3]:  # ch != 0: q is read as [B, S, H, D]
        return q.new_empty((B, S, H, d)).transpose(1, 2)
    return q.new_empty((B, H, S, d))


def _out_view(out: torch.Tensor):
    """``_in_place(out)`` when its rows are packed (the kernel stores O with a pitch it derives), else None."""
    view = _in_place(out)
    B, H, S, D = out.shape
    return view if view is not None and view[4] == (H * D if view[3] else D) else None


def _tma(view) -> Tma:
    """The 2-D TMA argument of a ``_rows_view``: B*rb rows of D (or, [B, S, H, D], H*D) columns, ld apart."""
    t, rb, _, ch, ld = view
    B, H, S, D = t.shape
    return Tma(t, (B * rb, H * D if ch else D), (ld, 1))


#: A call's metadata -> (launch.Bound, out's allocation (shape, transposed), lse shape), for calls that read
#: q, k, v and write out in place: a repeated call passes only addresses (see runtime.gemm._BOUND).
_BOUND = BoundCache(256)


def _new(q, shape, transposed: bool, dtype=None) -> torch.Tensor:
    t = torch.empty(shape, device=q.device, dtype=dtype or q.dtype)
    return t.transpose(1, 2) if transposed else t


#: A ``_BOUND`` entry for a key whose decision is the vendor's path (runtime.choice): the call returns None.
VENDOR = ("vendor",)


def site_decision(q, k, v, is_causal: bool, scale: float | None, vendor) -> choice.Decision:
    """The choice for an attention site seen at compile time with static sizes (fake tensors allowed): made on
    real random tensors like them on the same GPU (see runtime.gemm.site_decision)."""
    q, k, v = (choice.materialize(t) for t in (q, k, v))
    return _decide(q, k, v, is_causal, scale if scale is not None else q.shape[-1] ** -0.5, vendor)


def _decide(q, k, v, is_causal: bool, scale: float, vendor) -> choice.Decision:
    """The measured / cached / prior choice (runtime.choice) between our kernel and ``vendor`` (SDPA's fused pick,
    given by the caller) for this call."""
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    layout = tuple(bool(x and x[3]) for x in (_in_place(q), _in_place(k), _in_place(v)))  # [B, S, H, D] rows?
    Dv = v.shape[-1]
    key = ("attention", str(q.dtype), D if Dv == D else (D, Dv), is_causal, scale > 0, Hq, Hkv, layout,
           choice.bucket(B), choice.bucket(Sq), choice.bucket(Skv))
    ours = functools.partial(attention, q, k, v, is_causal, scale, "auto")
    theirs = functools.partial(vendor, q, k, v, is_causal, scale) if vendor is not None else None
    return choice.decide(key, ours, theirs, choice.attention_prior(D, is_causal, Skv), q.device)


def attention(q, k, v, is_causal: bool, scale: float, config: str | None = None,
              out: torch.Tensor | None = None, lse: torch.Tensor | None = None, vendor=None):
    """(out, lse) by the generated kernel. With ``vendor`` (a function of (q, k, v, is_causal, scale)) and no
    ``config``, the call returns None where runtime.choice finds the vendor faster (the caller runs it); a
    config name (or "auto": the heuristic's) always runs our kernel."""
    choose = vendor is not None and config is None
    key = (q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, v.shape, v.stride(), v.dtype,
           is_causal, scale, config, out is not None and (out.shape, out.stride(), out.dtype),
           lse is not None and (lse.shape, lse.stride(), lse.dtype), choose and choice.mode())
    hit = _BOUND.get(key)
    if hit is VENDOR:
        return None
    if hit is not None:
        bound, out_alloc, lse_shape = hit
        o = out if out is not None else _new(q, *out_alloc)
        m = lse if lse is not None else _new(q, lse_shape, False, torch.float32)
        if bound(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), m.data_ptr()):
            return o, m
    why = support_reason(q, k, v, is_causal, scale)
    if why:
        raise Unsupported(why)
    if choose and not _decide(q, k, v, is_causal, scale, vendor).use_ours:
        _BOUND.put(key, VENDOR)
        return None
    config = None if config == "auto" else config
    B, Hq, Sq, D = q.shape
    Hkv, Skv, Dv = k.shape[1], k.shape[2], v.shape[-1]
    config = config or choose_config(D, is_causal, Skv, Dv)
    if not serves(config, D, Dv, is_causal):
        dims = f"{D}/{Dv}" if Dv != D else str(D)
        raise ValueError(f"attention config {config!r} does not serve head dims {dims}{' causal' * bool(is_causal)} "
                         "(HEAD_DIMS, UNMASKED_HEAD_DIMS, V_HEAD_DIMS)")
    opts = options_for(config, scale)
    # tiles wider than D (a padded head dim): q, k and v read so that the columns past D are zeros; with a v head dim
    # of its own, k and v (which share their row addressing) in [B, H, S, D] rows unless there is one head
    own_cols = tile_cols(D, opts) != D
    qv, (kv, vv) = _rows_view(q, own_cols), _kv_views(k, v, own_cols or (Dv != D and Hkv > 1))
    given = out
    ov = _out_view(out) if out is not None else None
    if ov is None:  # none given, or in neither layout (then written through a copy, below)
        out = empty_out(q, Dv)
        ov = _out_view(out)
    lse = lse if lse is not None else torch.empty((B, Hq, Sq), device=q.device, dtype=torch.float32)
    req = AttentionRequest(D, DTYPES[q.dtype], bool(is_causal), o_tma=o_tma_ok(Sq, Dv, opts, out),
                           d_v=Dv if Dv != D else 0)
    try:  # no directory to write the kernel source to (or another OSError): torch serves the call, with why
        program, launcher = _plan(req, opts)
    except OSError as e:
        raise Unsupported(f"could not build the kernel: {e}") from e
    BH = B * Hq
    values = {"q": _tma(qv), "k": _tma(kv), "v": _tma(vv), "o": _tma(ov) if req.o_tma else out, "lse": lse,
              "Sq": Sq, "Skv": Skv, "Hq": Hq, "Hkv": Hkv, "G": Hq // Hkv, "qk_scale": float(scale) * LOG2E, "BH": BH}
    for prefix, view in (("q", qv), ("kv", kv), ("o", ov)):  # (rb, rh, ch) of each row view
        values.update(zip((f"{prefix}_rb", f"{prefix}_rh", f"{prefix}_ch"), view[1:4]))
    args = launcher.ordered(values)  # by templates.attention's argument names
    tiles = BH * math.ceil(Sq / program.options.block_m)
    idx = dev.index(out.device)
    grid = dev.grid(tiles, program.grid.persistent, idx, program.options.ctas_per_sm)
    try:  # the first launch of a specialisation compiles it (Triton's cache may be unwritable)
        launcher(grid, args, idx)
    except OSError as e:
        raise Unsupported(f"could not compile the kernel: {e}") from e
    if qv[0] is q and kv[0] is k and vv[0] is v and (given is None or given is out):  # no copies were made
        bshd = bool(qv[3])  # empty_out's layout
        out_alloc = ((B, Sq, Hq, Dv) if bshd else (B, Hq, Sq, Dv), bshd)  # v's head dim
        _BOUND.remember(key, launcher, grid, args, idx, out_alloc, (B, Hq, Sq))
    if given is not None and given is not out:
        given.copy_(out)
        out = given
    return out, lse
