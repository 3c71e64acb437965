"""The partitioned interpreter's handlers of the tile walk (``partitioned.HANDLERS`` maps the op kinds to them): a
partition's ``tile_loop`` (passes/tile_loop; a tile consumer's ``share``), cross_tile's ``tile_next``, and a tile
consumer's ring ``seek`` (passes/code_partition). ``pr`` is the running ``partitioned.PartRun``."""
from __future__ import annotations

from ..ir import Grid, Op
from .ops import InterpError
from .sequential import tile_indices


def tile_loop(pr, o: Op):
    """passes/tile_loop: the body once per tile of the CTA (``CTA.tiles``: the scheduler made them with
    ``sched.cta_tiles`` from this op's grid), the grid's tile indices bound to each tile's. A ``cross_tile``
    walk (passes/cross_tile) runs the body once, on the first tile (none without tiles); its ``tile_next``
    walks the others."""
    grid = Grid.of(o)
    c, t = o.attr("share") or (0, 1)  # a tile consumer runs the CTA's j-th tiles with j % t == c
    for j, tile in enumerate(pr.cta.tiles[:1] if o.attr("cross_tile") else pr.cta.tiles):
        if j % t != c:
            continue
        pr.tile_seq = j
        pr.scalars.update(tile_indices(grid, pr.run.scalars, tile))
        yield from pr.run_ops(o.body)


def tile_next(pr, o: Op):
    """passes/cross_tile: the body once per tile of the CTA after its first, the previous tile's indices bound
    as ``<index>_prev`` and the next one's as the indices; iter_args carried as a loop's."""
    grid = Grid.of(pr.part.body[0])
    its = o.attr("iter_args", ())
    for name, init in zip(its, o.operands):
        pr.env[name] = pr.raw(init, o)
    for tile in pr.cta.tiles[1:]:
        pr.scalars.update({f"{n}_prev": pr.scalars[n] for n, _ in grid.tiles})
        pr.scalars.update(tile_indices(grid, pr.run.scalars, tile))
        nxt = yield from pr.run_ops(o.body)
        for name, v in zip(its, nxt or ()):
            pr.env[name] = v
    for name, r in zip(its, o.results):
        pr.env[r.name] = pr.env[name]


def seek(pr, o: Op):
    """A tile consumer's counter to the first fill of the CTA's j-th tile: n = j * per_tile."""
    g = o.attr("group")
    if g not in pr.cta.groups:
        raise InterpError(f"interp: `seek` names unknown barrier group {g!r}")
    if g in pr.slotvar:  # as after an advance: the slot of the last wait belongs to another fill
        pr.stale[g] = (*pr.slotvar.pop(g), pr.run.step)
    pr.counters[g] = pr.tile_seq * int(pr.eval(o.attr("per_tile")))
    pr.log(o, f"{g} counter -> {pr.counters[g]} (tile {pr.tile_seq} of the CTA)")
