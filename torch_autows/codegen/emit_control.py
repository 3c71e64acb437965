"""Emitters of control flow: ``loop`` with its iter_args and ``yield``, and the CTA's walk over its output tiles
(``tile_loop``: persistent, shared by tile consumers, or one tile; cross_tile's ``tile_next``), whose tile id to
tile indices lines are ``tile_lines``."""
from __future__ import annotations

import ast
from dataclasses import replace

from ..ir import Grid, walk
from .context import expr, v
from .emit_base import emit_ops, emitter


class _Divisions(ast.NodeTransformer):
    """``var // n`` and ``var % n`` (``n`` without ``var``) -> the names of their carried counters."""

    def __init__(self, var: str, divisors: dict[str, int]):
        self.var, self.divisors, self.hits = var, divisors, 0

    def visit_BinOp(self, node):
        self.generic_visit(node)
        division = isinstance(node.op, (ast.FloorDiv, ast.Mod))
        if (division and isinstance(node.left, ast.Name) and node.left.id == self.var
                and not any(isinstance(x, ast.Name) and x.id == self.var for x in ast.walk(node.right))):
            i = self.divisors.setdefault(ast.unparse(node.right), len(self.divisors))
            self.hits += 1
            return ast.Name(f"{self.var}_{'h' if isinstance(node.op, ast.FloorDiv) else 'q'}{i}", ast.Load())
        return node


def _rewrite(x, tr: _Divisions):
    if isinstance(x, tuple):
        return tuple(_rewrite(y, tr) for y in x)
    if not isinstance(x, str):
        return x
    try:
        tree = ast.parse(x, mode="eval")
    except SyntaxError:
        return x
    hits = tr.hits
    tree = tr.visit(tree)
    return ast.unparse(tree) if tr.hits > hits else x  # untouched: as written


def carried_counters(body, var: str):
    """(``body`` with ``var // n`` / ``var % n`` in its ops' index expressions replaced by ``{var}_h{i}`` /
    ``{var}_q{i}``, {n: i}): the counters the loop carries (``Options.carry_index``), so that a step pays an add and
    a compare instead of an integer division by a runtime ``n`` (about 20 SASS instructions) at each use."""
    divisors: dict[str, int] = {}
    tr = _Divisions(var, divisors)

    def op_(o):
        return replace(o, attrs=tuple((k, _rewrite(x, tr)) for k, x in o.attrs), body=tuple(op_(b) for b in o.body))

    return tuple(op_(o) for o in body), divisors


@emitter("loop")
def _loop(ctx, o, indent):
    its = o.attr("iter_args")
    out = [f"{v(n)} = {v(x)}" for n, x in zip(its, o.operands)]
    lb, ub, var = expr(o.attr("lb")), expr(o.attr("ub")), o.attr("var")
    body_ops, divisors = o.body, {}
    if ctx.program.options.carry_index:
        body_ops, divisors = carried_counters(o.body, var)
    for n, i in divisors.items():  # step lb's quotient and remainder, then carried
        out += [f"{var}_n{i} = {expr(n)}", f"{var}_q{i} = ({lb}) % {var}_n{i}", f"{var}_h{i} = ({lb}) // {var}_n{i}"]
    out.append(f"for {var} in range({lb}, {ub}):")
    ctx.loop_stack.append(o)
    body = emit_ops(ctx, body_ops, 1)
    ctx.loop_stack.pop()
    for i in divisors.values():
        body += [f"    {var}_q{i} += 1", f"    if {var}_q{i} == {var}_n{i}:", f"        {var}_q{i} = 0",
                 f"        {var}_h{i} += 1"]
    out += [ln[0:] for ln in body] or ["    pass"]
    out += [f"{v(r.name)} = {v(n)}" for n, r in zip(its, o.results)]
    out.append(f"_trip = {ub} - ({lb})")
    return out


@emitter("yield")
def _yield(ctx, o, indent):
    loop = ctx.loop_stack[-1]
    its = loop.attr("iter_args")
    if not its:
        return []
    return [f"{', '.join(v(n) for n in its)} = {', '.join(v(x) for x in o.operands)}"]


def tile_lines(grid) -> tuple[list[str], list[str]]:
    """(before the walk, per tile) lines of a grid: the tile counts, then linear tile id ``tile`` -> tile
    indices, grouped along the second-to-last index for L2 reuse (persistent serpentine: odd waves reversed)."""
    names = [n for n, _ in grid.tiles]
    lines = [f"num_{n} = {expr(e)}" for n, e in grid.tiles]
    lines.append("num_tiles = " + " * ".join(f"num_{n}" for n in names))
    body = ["t = tile"]
    if grid.persistent and grid.serpentine:  # odd waves reversed: wave w holds tiles [w*P, w*P + size)
        body += ["wave0 = (t // gl.num_programs(0)) * gl.num_programs(0)",
                 "wave_size = min(gl.num_programs(0), num_tiles - wave0)",
                 "t = t + ((t // gl.num_programs(0)) % 2) * (2 * wave0 + wave_size - 1 - 2 * t)"]
    for n in names[:-2]:
        inner = " * ".join(f"num_{m}" for m in names[names.index(n) + 1:])
        body += [f"{n} = t // ({inner})", f"t = t % ({inner})"]
    if len(names) >= 2:
        m, n = names[-2], names[-1]
        body += [f"group_size = {grid.group} * num_{n}",
                 f"first = (t // group_size) * {grid.group}",
                 f"size = min(num_{m} - first, {grid.group})",
                 f"{m} = first + (t % group_size) % size",
                 f"{n} = (t % group_size) // size"]
    else:
        body.append(f"{names[0]} = t")
    return lines, body


@emitter("tile_loop")
def _tile_loop(ctx, o, indent):
    """The CTA's walk over its output tiles (passes/tile_loop): persistent ``for tile in range(pid, num_tiles,
    nprog)``, else ``tile = pid``; the tile indices; the body once per tile; then the stores (and TMA reduces)
    drained. A ``cross_tile`` walk (passes/cross_tile) runs its body once, on the CTA's first tile (if it has one); the
    body's ``tile_next`` walks the rest."""
    grid = Grid.of(o)
    pre, per_tile = tile_lines(grid)
    out = list(pre)
    if o.attr("cross_tile"):
        # the first tile, peeled: its head runs before the walk. A loop of at most one trip, not an ``if``: with the
        # ``if``, llc hoists more scalars the partitions share (ctaid, cdiv(Sq, 128), ...) above the warp dispatch,
        # they live through every partition and ptxas spills them (12-124 bytes, sm_90a; a heuristic, measured)
        out.append("for tile in range(gl.program_id(0), gl.minimum(gl.program_id(0) + 1, num_tiles)):")
        out += ["    " + ln for ln in per_tile] + emit_ops(ctx, o.body, 1)
    elif grid.persistent and o.attr("share"):  # a tile consumer: the CTA's j-th tiles with j % t == c
        c, t = o.attr("share")
        first = "gl.program_id(0)" + (f" + {c} * gl.num_programs(0)" if c else "")
        out.append(f"for tile in range({first}, num_tiles, {t} * gl.num_programs(0)):")
        inner = 1
    elif grid.persistent:
        out.append("for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):")
        inner = 1
    else:
        out.append("tile = gl.program_id(0)")
        inner = 0
    if not o.attr("cross_tile"):
        out += ["    " * inner + ln for ln in per_tile]
        out += emit_ops(ctx, o.body, inner)
    if any(x.kind in ("store", "tma_reduce_add") for x in walk(o.body)):
        out.append("tma.store_wait(0)")
    return out


@emitter("tile_next")
def _tile_next(ctx, o, indent):
    """passes/cross_tile: the CTA's tiles after its first, the previous tile's indices kept as ``<index>_prev``
    and its values carried in the iter_args (the enclosing ``cross_tile`` tile_loop bound the first tile)."""
    grid = Grid.of(ctx.part.body[0])  # the enclosing tile_loop (a partition body is one)
    its = o.attr("iter_args")
    out = [f"{v(n)} = {v(x)}" for n, x in zip(its, o.operands)]
    out.append("for tile in range(gl.program_id(0) + gl.num_programs(0), num_tiles, gl.num_programs(0)):")
    out += [f"    {n}_prev = {n}" for n, _ in grid.tiles]
    out += ["    " + ln for ln in tile_lines(grid)[1]]
    ctx.loop_stack.append(o)
    out += emit_ops(ctx, o.body, 1)
    ctx.loop_stack.pop()
    out += [f"{v(r.name)} = {v(n)}" for n, r in zip(its, o.results)]
    return out
