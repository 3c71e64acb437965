"""Semantics of the op kinds the attention template added, mirroring their Gluon emitters one for one.

    full       gl.full(shape, value)                       value may be the string "-inf"
    mask       where(key < kv_len [and query < q_len] [and key <= query], x, -inf), keys the columns (col + arange)
               and queries the rows (row + arange), or with ``keys_on_rows`` the other way round
    mulc       x * c                                       c an index expression (e.g. a scalar arg)
    fin0       where(x == -inf, 0, x)
    div0       where(b == 0, 0, a / where(b == 0, 1, b))
    lse        where(l == 0, -inf, (m + log2(where(l == 0, 1, l))) * ln 2)
    store_ptr  rows row + r (r < rows_valid), columns col + c (c < cols_valid, if given), of a row-major pointer
               with leading dim ``ld``; ``transposed``: element (r, c) to offset (col + c) * ld + row + r instead (the
               swap-AB GEMM's [BN, BM] tile of C^T into C); with ``pred`` (after split_reduce) only the summing CTA
               stores
    store_vec  ptr[offset + i] for i < valid
    atomic_add_ptr  store_ptr's elements, added (f32) instead of stored, in one indivisible step
    tma_reduce_add  the f32 tile added into the f32 tensor at ``coords``, clipped at its bounds (a TMA reduce-add), in
               one indivisible step (the partitioned interpreter stages it in SMEM and adds at the store_wait);
               ``transposed``: the tile's transpose (a [D/f, BM] dQ^T tile into [BM, D/f] of dQ)
    smem_store the register tile itself (the partitioned interpreter puts it in its SMEM slot)
    chain_sync nothing (one thread of control; the partitioned interpreter makes the chains meet on an mbarrier)
    smem_view  the other chain's tile itself (partitioned: its slot of this step, read through SMEM)
    slice      columns start .. start + size of the tile
Every store and add is recorded per writer (``ops.note_write``): a plain store racing another CTA's write of the
same element is a ``global-race``.
"""
from __future__ import annotations

import torch

from ..ir import format_op
from .ops import TORCH_DTYPE, InterpError, coords_of, note_write, semantics, skipped, tma_store

NEG_INF = float("-inf")


@semantics("full")
def _full(ctx, o, args):
    r = o.results[0].type
    return torch.full(r.shape, float(o.attr("value")), dtype=TORCH_DTYPE[r.dtype])


@semantics("mask")
def _mask(ctx, o, args):
    x = args[0]
    bm, bn = x.shape
    rows = int(ctx.eval(o.attr("row"))) + torch.arange(bm)
    cols = int(ctx.eval(o.attr("col"))) + torch.arange(bn)
    keys, queries = (rows[:, None], cols[None, :]) if o.attr("keys_on_rows") else (cols[None, :], rows[:, None])
    keep = keys < int(ctx.eval(o.attr("kv_len")))
    if o.attr("q_len") is not None:
        keep = keep & (queries < int(ctx.eval(o.attr("q_len"))))
    if o.attr("causal"):
        keep = keep & (keys <= queries)
    return torch.where(keep.expand(bm, bn), x, torch.full_like(x, NEG_INF))


@semantics("mulc")
def _mulc(ctx, o, args):
    return args[0] * ctx.eval(o.attr("c"))


@semantics("fin0")
def _fin0(ctx, o, args):
    x = args[0]
    return torch.where(x == NEG_INF, torch.zeros_like(x), x)


@semantics("div0")
def _div0(ctx, o, args):
    a, b = args
    zero = b == 0
    return torch.where(zero, torch.zeros_like(a * b), a / torch.where(zero, torch.ones_like(b), b))


@semantics("lse")
def _lse(ctx, o, args):
    m, l_ = args
    zero = l_ == 0
    val = (m + torch.log2(torch.where(zero, torch.ones_like(l_), l_))) * 0.6931471805599453
    return torch.where(zero, torch.full_like(val, NEG_INF), val)


def _scatter(ctx, o, offs: torch.Tensor, vals: torch.Tensor, add: bool = False) -> None:
    """Write (``add``: add, in one indivisible step) ``vals`` at flat ``offs`` of the op's ``arg``."""
    t = ctx.tensor(o.attr("arg"))
    flat = t.view(-1)
    if offs.numel() and (offs.min() < 0 or offs.max() >= flat.numel()):
        raise InterpError(f"interp: `{format_op(o)[0].strip()}` writes outside {o.attr('arg')} ({flat.numel()} "
                          f"elements): offsets {int(offs.min())}..{int(offs.max())}")
    note_write(ctx, o, o.attr("arg"), offs, atomic=add)
    if add:
        flat.index_add_(0, offs, vals.to(t.dtype))
    else:
        flat[offs] = vals.to(t.dtype)


def _tile_offsets(ctx, o, bm: int, bn: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(flat offsets, keep mask) of a [bm, bn] pointer tile: rows ``row + r`` (r < rows_valid), columns ``col + c``
    (c < cols_valid, if given), leading dim ``ld`` (store_ptr, atomic_add_ptr); ``transposed`` (store_ptr): the
    tile's row index walks the target's columns and its column index the target's rows."""
    r, c = torch.arange(bm), torch.arange(bn)
    keep = (r < int(ctx.eval(o.attr("rows_valid"))))[:, None] & (c < int(ctx.eval(o.attr("cols_valid", bn))))[None, :]
    rows, cols = int(ctx.eval(o.attr("row"))) + r, int(ctx.eval(o.attr("col", 0))) + c
    ld = int(ctx.eval(o.attr("ld")))
    if o.attr("transposed"):
        return cols[None, :] * ld + rows[:, None], keep
    return rows[:, None] * ld + cols[None, :], keep


@semantics("store_ptr")
def _store_ptr(ctx, o, args):
    if skipped(ctx, o):  # after a split_reduce: a CTA that did not sum the parts stores nothing
        return
    x = args[0]
    offs, keep = _tile_offsets(ctx, o, *x.shape)
    _scatter(ctx, o, offs[keep].reshape(-1), x[keep].reshape(-1))


@semantics("atomic_add_ptr")
def _atomic_add_ptr(ctx, o, args):
    x = args[0]
    if x.dtype != torch.float32 or ctx.tensor(o.attr("arg")).dtype != torch.float32:
        raise InterpError(f"interp: `{format_op(o)[0].strip()}` adds {x.dtype} into "
                          f"{ctx.tensor(o.attr('arg')).dtype}: atomic_add_ptr takes an f32 tile and an f32 target")
    offs, keep = _tile_offsets(ctx, o, *x.shape)
    _scatter(ctx, o, offs[keep].reshape(-1), x[keep].reshape(-1), add=True)


def reduce_add(ctx, o, coords: tuple[int, ...], tile: torch.Tensor) -> None:
    """``tma_reduce_add``'s write: ``tile`` (f32) added into its f32 ``arg`` at ``coords``, clipped at the tensor's
    bounds, recorded as an accumulating write (overlapping adds of other CTAs are no race)."""
    t = ctx.tensor(o.attr("arg"))
    if tile.dtype != torch.float32 or t.dtype != torch.float32:
        raise InterpError(f"interp: `{format_op(o)[0].strip()}` adds {tile.dtype} into {t.dtype}: tma_reduce_add "
                          f"takes an f32 tile and an f32 target")
    note_write(ctx, o, o.attr("arg"), tma_store(t, coords, tile, add=True), atomic=True)


@semantics("tma_reduce_add")
def _tma_reduce_add(ctx, o, args):
    reduce_add(ctx, o, coords_of(ctx, o), args[0].transpose(0, 1) if o.attr("transposed") else args[0])


@semantics("store_vec")
def _store_vec(ctx, o, args):
    x = args[0]
    i = torch.arange(x.shape[0])
    keep = i < int(ctx.eval(o.attr("valid")))
    _scatter(ctx, o, int(ctx.eval(o.attr("offset"))) + i[keep], x[keep])


@semantics("smem_store")
def _smem_store(ctx, o, args):
    """The register tile as the SMEM value (the partitioned interpreter writes it into its buffer slot instead)."""
    return args[0]


@semantics("chain_sync")
def _chain_sync(ctx, o, args):
    """Nothing to order in one thread of control (the partitioned interpreter's handler is the meeting)."""
    return None


@semantics("smem_view")
def _smem_view(ctx, o, args):
    """The other chain's tile (the partitioned interpreter reads its slot of this step instead)."""
    return args[0]


@semantics("slice")
def _slice(ctx, o, args):
    return args[0][:, o.attr("start"):o.attr("start") + o.attr("size")]
