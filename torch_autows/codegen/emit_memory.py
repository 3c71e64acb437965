"""Emitters that address memory without TMA: register stores and loads through pointers (``store_ptr``,
``atomic_add_ptr``, ``store_vec``, ``load_vec``, ``load_ptr``), a ring's counter and slots (``advance``, ``seek``,
``get``, ``trans`` of a slot view; ``_ago``: the slot ``lag`` steps back, also sm90's) and split-K's
``split_reduce`` through its workspace and counters."""
from __future__ import annotations

from ..ir import walk
from .context import GL_DTYPE, expr, v
from .emit_base import emitter


@emitter("store_ptr")
def _store_ptr(ctx, o, indent):
    n, index = _tile_index(ctx, o)
    row, col, ld, arg = expr(o.attr("row")), expr(o.attr("col", 0)), expr(o.attr("ld")), o.attr("arg")
    if o.attr("row_ptr"):
        # one 64-bit pointer per tile row (per column when transposed) holding the other axis's base, the elements
        # i32 offsets from it. Per-element 64-bit addresses (a wide multiply-add each) spilled the d=128 reduce
        # candidate's dK/dV epilogue (passes/BACKWARD.md step 8 (b) probe: 96 bytes -> 0 with this); applied to
        # every pointer store instead, it raised spills elsewhere (the atomic backward 0.9-1.5 KB -> 4.5-4.9 KB, some
        # attention forward configs 0 -> 16-280 bytes), so a template asks for it per op (``row_ptr=True``).
        if o.attr("transposed"):
            base = [f"{n}_cp = {arg}_ptr + (({col} + {n}_c).to(gl.int64) * ({ld}) + ({row}))",
                    f"{n}_p = {n}_cp[None, :] + {n}_r[:, None]"]
        else:
            base = [f"{n}_rp = {arg}_ptr + (({row} + {n}_r).to(gl.int64) * ({ld}) + ({col}))",
                    f"{n}_p = {n}_rp[:, None] + {n}_c[None, :]"]
    else:
        rows, cols = f"({row} + {n}_r)", f"({col} + {n}_c)"
        if o.attr("transposed"):  # element (r, c) to (col + c) * ld + row + r: the tile's rows walk C's columns
            base = [f"{n}_p = {arg}_ptr + ({cols}.to(gl.int64) * ({ld}))[None, :] + {rows}[:, None]"]
        else:
            base = [f"{n}_p = {arg}_ptr + ({rows}.to(gl.int64) * ({ld}))[:, None] + {cols}[None, :]"]
    lines = [*index, *base, f"gl.store({n}_p, {n}, mask={_store_mask(n, o)})"]
    if o.attr("pred"):  # after a split_reduce: only the CTA that summed the parts stores the tile
        return [f"if {v(o.attr('pred'))}_last:"] + ["    " + ln for ln in lines]
    return lines


@emitter("atomic_add_ptr")
def _atomic_add_ptr(ctx, o, indent):
    # store_ptr's elements; a relaxed fp32 red.global.add per element (the adds of other CTAs commute with it). The
    # tile's first row is a 64-bit scalar base and the elements i32 offsets from it: with ``ld`` a constant, a thread's
    # offsets differ by constants and share one address register (per-element 64-bit addresses, as store_ptr
    # computes them, hold two registers per element and spill in the backward's loop)
    n, index = _tile_index(ctx, o)
    ld = expr(o.attr("ld"))
    return [*index,
            f"{n}_base = {o.attr('arg')}_ptr + ({expr(o.attr('row'))}).to(gl.int64) * ({ld})",
            f"{n}_p = {n}_base + ({n}_r * ({ld}))[:, None] + ({expr(o.attr('col', 0))} + {n}_c)[None, :]",
            f"gl.atomic_add({n}_p, {n}, mask={_store_mask(n, o)}, sem=\"relaxed\", scope=\"gpu\")"]


def _tile_index(ctx, o) -> tuple[str, list[str]]:
    """The stored register tile's name and the lines of its row and column indices (``<name>_r``, ``<name>_c``) in
    its layout's slices: what store_ptr and atomic_add_ptr address elements from."""
    x = o.operands[0]
    L = ctx.layouts[x]
    bm, bn = next(r.type for op_ in walk(ctx.part.body) for r in op_.results if r.name == x).shape
    n = v(x)
    return n, [f"{n}_r = gl.arange(0, {bm}, layout={ctx._slice(1, L)})",
               f"{n}_c = gl.arange(0, {bn}, layout={ctx._slice(0, L)})"]


def _store_mask(n: str, o) -> str:
    """store_ptr's mask: rows below ``rows_valid``, and (a tile wider than the tensor) columns below ``cols_valid``."""
    rows = f"({n}_r < {expr(o.attr('rows_valid'))})[:, None]"
    if o.attr("cols_valid") is None:
        return rows
    return f"{rows} & ({n}_c < {expr(o.attr('cols_valid'))})[None, :]"


@emitter("store_vec")
def _store_vec(ctx, o, indent):
    x = o.operands[0]
    n = v(x)
    t = next(r.type for op_ in walk(ctx.part.body) for r in op_.results if r.name == x)
    return [f"{n}_i = gl.arange(0, {t.shape[0]}, layout={ctx.layouts[x]})",
            f"gl.store({o.attr('arg')}_ptr + {expr(o.attr('offset'))} + {n}_i, {n}, "
            f"mask={n}_i < {expr(o.attr('valid'))})"]


@emitter("advance")
def _advance(ctx, o, indent):
    return [f"{o.attr('group')}_n += 1"]


@emitter("seek")
def _seek(ctx, o, indent):
    # a tile consumer's ring position: the first fill of the CTA's j-th tile (j from the walk's ``tile``)
    return [f"{o.attr('group')}_n = (tile - gl.program_id(0)) // gl.num_programs(0) * ({expr(o.attr('per_tile'))})"]


def _ago(g, lag: int) -> str:
    """The ring slot of ``lag`` steps before the group's counter."""
    return f"({g.name}_n + {g.count - lag}) % {g.count}"


@emitter("get")
def _get(ctx, o, indent):
    lag = o.attr("lag", 0)
    if lag:  # the slot of ``lag`` steps ago (a deferred reader); it is not released yet
        return [f"{v(o.results[0].name)} = {o.attr('buffer')}.index({_ago(ctx.groups[o.attr('group')], lag)})"]
    return [f"{v(o.results[0].name)} = {o.attr('buffer')}.index({o.attr('group')}_s)"]


@emitter("trans")
def _trans(ctx, o, indent):
    return [f"{v(o.results[0].name)} = {v(o.operands[0])}.permute((1, 0))"]


@emitter("smem_read")
def _smem_read(ctx, o, indent):
    r = o.results[0].name
    return [f"{v(r)} = {v(o.operands[0])}.load({ctx.layouts[r]})"]


@emitter("load_vec")
def _load_vec(ctx, o, indent):
    r = o.results[0]
    n = r.type.shape[0]
    offs = f"{v(r.name)}_offs"
    return [f"{offs} = {expr(o.attr('offset'))} + gl.arange(0, {n}, layout={ctx.layouts[r.name]})",
            f"{v(r.name)} = gl.load({o.attr('arg')}_ptr + {offs}, mask={offs} < {expr(o.attr('size'))}, "
            f"other=0.0).to({GL_DTYPE[r.type.dtype]})"]


@emitter("load_ptr")
def _load_ptr(ctx, o, indent):
    # in the layout its user needs (the accumulator's: no shuffle before the add), masked rows and columns read 0
    r = o.results[0]
    L = ctx.layouts[r.name]
    bm, bn = r.type.shape
    n = v(r.name)
    rows, cols = f"({expr(o.attr('row'))} + {n}_r)", f"({expr(o.attr('col'))} + {n}_c)"
    if o.attr("row_mod") is not None:  # a table read periodically (load_ptr in ir/kinds.py)
        rows = f"({rows} % ({expr(o.attr('row_mod'))}))"
    if o.attr("col_mod") is not None:
        cols = f"({cols} % ({expr(o.attr('col_mod'))}))"
    return [f"{n}_r = gl.arange(0, {bm}, layout={ctx._slice(1, L)})",
            f"{n}_c = gl.arange(0, {bn}, layout={ctx._slice(0, L)})",
            f"{n}_p = {o.attr('arg')}_ptr + ({rows}.to(gl.int64) * ({expr(o.attr('ld'))}))[:, None] + {cols}[None, :]",
            f"{n}_m = ({n}_r < {expr(o.attr('rows_valid'))})[:, None] & "
            f"({n}_c < {expr(o.attr('cols_valid'))})[None, :]",
            f"{n} = gl.load({n}_p, mask={n}_m, other=0.0).to({GL_DTYPE[r.type.dtype]})"]


@emitter("split_reduce")
def _split_reduce(ctx, o, indent):
    # see passes/split_k: partials -> workspace slots; barrier; one arrival on the tile's counter; the last
    # arriver resets the counter and sums each accumulator's slots in order 0..S-1 (deterministic)
    xs, rs = o.operands, o.results
    L = ctx.layouts[xs[0]]
    bm, bn = rs[0].type.shape
    if any(r.type.shape != (bm, bn) or ctx.layouts[x] != L for x, r in zip(xs, rs)):
        raise ValueError(f"codegen: split_reduce of {', '.join(xs)}: the accumulators differ in shape or layout")
    n, S, A = v(rs[0].name), o.attr("splits"), len(xs)
    locks = f"{o.attr('locks')}_ptr"

    def at(i: int) -> str:  # accumulator i's first slot: its S parts follow one another
        return f"{n}_ws + {i * S * bm * bn}" if i else f"{n}_ws"

    def load(i: int) -> str:
        return (f"gl.load({at(i)} + j * {bm * bn} + {n}_off, mask={n}_keep, other=0.0, "
                f"cache_modifier=\".cg\")  # from L2: other SMs wrote it")
    return [f"{n}_tile = {expr(o.attr('index'))}  # the output tile's counter and workspace slots",
            f"{n}_r = gl.arange(0, {bm}, layout={ctx._slice(1, L)})",
            f"{n}_c = gl.arange(0, {bn}, layout={ctx._slice(0, L)})",
            f"{n}_off = ({n}_r * {bn})[:, None] + {n}_c[None, :]",
            f"{n}_keep = ({n}_r < {expr(o.attr('rows_valid'))})[:, None] & ({n}_c < {bn})[None, :]",
            f"{n}_ws = {o.attr('ws')}_ptr + {n}_tile.to(gl.int64) * {A * S * bm * bn}",
            *(f"gl.store({at(i)} + ({expr(o.attr('part'))}) * {bm * bn} + {n}_off, {v(x)}, mask={n}_keep)"
              for i, x in enumerate(xs)),
            "gl.thread_barrier()  # every thread's partial is written before the arrival",
            f"{n}_seen = gl.atomic_add({locks} + {n}_tile, 1, sem=\"acq_rel\", scope=\"gpu\")",
            "gl.thread_barrier()  # the other parts' writes are visible to every thread after the acquire",
            f"{n}_last = {n}_seen == {S - 1}",
            *(f"{v(r.name)} = gl.zeros({[bm, bn]}, gl.float32, {L})" for r in rs),
            f"if {n}_last:",
            f"    for j in range({S}):  # in slot order: the sum does not depend on who came last",
            *(f"        {v(r.name)} = {v(r.name)} + {load(i)}" for i, r in enumerate(rs)),
            f"    gl.atomic_xchg({locks} + {n}_tile, 0, sem=\"relaxed\", scope=\"gpu\")  # zero for the next launch"]
