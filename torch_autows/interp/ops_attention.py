"""Semantics of the op kinds the attention template added, mirroring their Gluon emitters one for one.

    full       gl.full(shape, value)                       value may be the string "-inf"
    mask       where(col < kv_len [and col <= row], x, -inf), cols = col + arange, rows = row + arange
    mulc       x * c                                       c an index expression (e.g. a scalar arg)
    fin0       where(x == -inf, 0, x)
    div0       where(b == 0, 0, a / where(b == 0, 1, b))
    lse        where(l == 0, -inf, (m + log2(where(l == 0, 1, l))) * ln 2)
    store_ptr  rows row + r (r < rows_valid), columns col + c (c < cols_valid, if given), of a row-major pointer
               with leading dim ``ld``
    store_vec  ptr[offset + i] for i < valid
"""
from __future__ import annotations

import torch

from ..ir import format_op
from .ops import TORCH_DTYPE, InterpError, semantics

NEG_INF = float("-inf")


@semantics("full")
def _full(ctx, o, args):
    r = o.results[0].type
    return torch.full(r.shape, float(o.attr("value")), dtype=TORCH_DTYPE[r.dtype])


@semantics("mask")
def _mask(ctx, o, args):
    x = args[0]
    bm, bn = x.shape
    cols = int(ctx.eval(o.attr("col"))) + torch.arange(bn)
    keep = (cols < int(ctx.eval(o.attr("kv_len"))))[None, :].expand(bm, bn)
    if o.attr("causal"):
        rows = int(ctx.eval(o.attr("row"))) + torch.arange(bm)
        keep = keep & (cols[None, :] <= rows[:, None])
    return torch.where(keep, x, torch.full_like(x, NEG_INF))


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


def _scatter(o, t: torch.Tensor, offs: torch.Tensor, vals: torch.Tensor) -> None:
    flat = t.view(-1)
    if offs.numel() and (offs.min() < 0 or offs.max() >= flat.numel()):
        raise InterpError(f"interp: `{format_op(o)[0].strip()}` writes outside {o.attr('arg')} ({flat.numel()} "
                          f"elements): offsets {int(offs.min())}..{int(offs.max())}")
    flat[offs] = vals.to(t.dtype)


@semantics("store_ptr")
def _store_ptr(ctx, o, args):
    x = args[0]
    bm, bn = x.shape
    r = torch.arange(bm)
    c = torch.arange(bn)
    keep = (r < int(ctx.eval(o.attr("rows_valid"))))[:, None] & (c < int(ctx.eval(o.attr("cols_valid", bn))))[None, :]
    col = int(ctx.eval(o.attr("col", 0)))
    offs = (int(ctx.eval(o.attr("row"))) + r)[:, None] * int(ctx.eval(o.attr("ld"))) + col + c[None, :]
    _scatter(o, ctx.tensor(o.attr("arg")), offs[keep].reshape(-1), x[keep].reshape(-1))


@semantics("store_vec")
def _store_vec(ctx, o, args):
    x = args[0]
    i = torch.arange(x.shape[0])
    keep = i < int(ctx.eval(o.attr("valid")))
    _scatter(o, ctx.tensor(o.attr("arg")), int(ctx.eval(o.attr("offset"))) + i[keep], x[keep])
