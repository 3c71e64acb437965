"""The walk over tiles: from tile_loop on, every partition body is one ``tile_loop`` walking ``Program.grid``
(``_check_tile_loops``); from cross_tile on, a ``cross_tile`` walk's carried values are defined on both paths
(the first tile's head and the next tile's step) and nothing else crosses between tiles (``_check_cross_tile``)."""
from __future__ import annotations

from ..ir import Grid, Program, walk
from .base import _fail


def _check_tile_loops(p: Program, stage: str):
    """passes/tile_loop: every partition body is exactly one ``tile_loop`` whose grid is ``Program.grid``, and no
    tile_loop is nested (codegen and the interpreter walk the tiles once, from it)."""
    for pt in p.partitions:
        if len(pt.body) != 1 or pt.body[0].kind != "tile_loop":
            _fail(stage, f"{pt.name}: the body must be exactly one tile_loop (passes/tile_loop wraps it), found "
                  f"{[o.kind for o in pt.body]}")
        tl = pt.body[0]
        try:
            grid = Grid.of(tl)
        except (TypeError, ValueError) as e:
            _fail(stage, f"{pt.name}: tile_loop attributes do not describe a grid ({e})", tl)
        if grid != p.grid:
            _fail(stage, f"{pt.name}: tile_loop walks {grid}, but the program's is {p.grid}", tl)
        if tl.attr("share") != pt.tiles:
            _fail(stage, f"{pt.name}: tile_loop share {tl.attr('share')} differs from the partition's tiles "
                  f"{pt.tiles}", tl)
        nested = next((o for o in walk(tl.body) if o.kind == "tile_loop"), None)
        if nested is not None:
            _fail(stage, f"{pt.name}: a tile_loop inside the tile_loop", nested)


def _names(ops) -> set[str]:
    """Every value ``ops`` define (results and nested iter_args)."""
    return {n for o in walk(ops) for n in [r.name for r in o.results] + list(o.attr("iter_args", ()))}


def _reads(ops) -> set[str]:
    return {x for o in walk(ops) for x in o.operands}


def _check_cross_tile(p: Program, stage: str):
    """passes/cross_tile: a ``tile_next`` only as the one top-level ``tile_next`` of a ``cross_tile`` tile_loop; its
    inits are defined by the first tile's head before it, its yields by its own body, iter_args, inits, results
    and yields agree in number; its body reads only its own values and iter_args (a value of the first tile would
    be stale from the second on), the ops after it read only its results and their own values, and the previous
    tile's indices (``<index>_prev``) are read only inside it."""
    prev = {f"{n}_prev" for n, _ in p.grid.tiles}
    for pt in p.partitions:
        tl = pt.body[0]
        nexts = [i for i, o in enumerate(tl.body) if o.kind == "tile_next"]
        nested = [o for o in walk(tl.body) if o.kind == "tile_next"]
        if not tl.attr("cross_tile"):
            if nested:
                _fail(stage, f"{pt.name}: a tile_next in a tile_loop without cross_tile", nested[0])
            continue
        if len(nexts) != 1 or len(nested) != 1:
            _fail(stage, f"{pt.name}: a cross_tile tile_loop holds exactly one tile_next at its top level", tl)
        i = nexts[0]
        nx = tl.body[i]
        head, tail = tl.body[:i], tl.body[i + 1:]
        its = nx.attr("iter_args", ())
        if not nx.body or nx.body[-1].kind != "yield" or not (
                len(its) == len(nx.operands) == len(nx.results) == len(nx.body[-1].operands)):
            _fail(stage, f"{pt.name}: tile_next iter_args, inits, results and yield operands differ in number", nx)
        missing = [x for x in nx.operands if x not in _names(head)]
        if missing:
            _fail(stage, f"{pt.name}: tile_next carries %{missing[0]}, which the first tile's head does not define", nx)
        inner = _names(nx.body[:-1]) | set(its)
        bad = [x for x in nx.body[-1].operands if x not in _names(nx.body[:-1])]
        if bad:
            _fail(stage, f"{pt.name}: tile_next yields %{bad[0]}, which the next tile's step does not define", nx)
        stale = sorted(_reads(nx.body) - inner)
        if stale:
            _fail(stage, f"{pt.name}: tile_next reads %{stale[0]} of the first tile: carry it as an iter_arg", nx)
        after = _reads(tail) - _names(tail) - {r.name for r in nx.results}
        if after:
            _fail(stage, f"{pt.name}: an op after tile_next reads %{sorted(after)[0]} from before it (the first "
                  f"tile's value): read tile_next's result", nx)
        for o in walk((*head, *tail)):
            for _, val in o.attrs:
                for e in (val if isinstance(val, tuple) else (val,)):
                    if isinstance(e, str) and any(n in e for n in prev):
                        _fail(stage, f"{pt.name}: the previous tile's indices are read outside tile_next", o)
