"""tile_loop: each partition's body becomes one ``tile_loop`` op, the walk over the output tiles as IR.

Assumes: the partition bodies are final (ping_pong ran: code_partition lowered them, software_pipeline
pipelined their loops, turns are in place) and each computes one output tile, reading the grid's tile
indices (``Program.grid.tiles``' names) as scalars; ring counters and turn counters run on across tiles.
Guarantees: every ``Partition.body`` is exactly one ``tile_loop`` op whose attributes are ``Program.grid``'s
(``Grid.attrs``: ``tiles``, ``persistent``, ``tile_group``, ``serpentine``; ``Grid.of`` reads them back) and whose
body is the partition's former body, unchanged. Its meaning, the one codegen's emitter and the interpreter's
handler share: the CTA walks linear tile ids ``pid, pid + nprog, ...`` when persistent (odd waves reversed
when serpentine), else the one tile ``pid``; each id is decomposed into the tile indices (grouped ``group``
rows of the second-to-last index at a time) and the body runs once per tile; after the last tile the
partition waits for its outstanding TMA stores. Nothing is decided: the Gluon is the same as when codegen
walked the grid itself. A partition that shares the tiles (``Partition.tiles`` = (c, t), partition_schedule's
tile consumers) gets ``share=(c, t)`` on its walk: of its CTA's tiles it runs the j-th only when j % t == c (codegen:
``range(pid + c * nprog, num_tiles, t * nprog)``), and its ``seek`` ops read j.

Why last: the walk wraps the final bodies. A later pass that overlaps work across tiles (attention's next
tile's loads under this tile's epilogue) rewrites this op's body or splits it, instead of codegen's text.
"""
from __future__ import annotations

from dataclasses import replace

from ..ir import Program, op
from . import PassError


def run(program: Program, options=None) -> Program:
    """Wrap each partition's body in a ``tile_loop`` carrying ``Program.grid``."""
    parts = []
    for pt in program.partitions:
        if not pt.body:
            raise PassError(f"tile_loop: partition {pt.name} has no body; run code_partition first")
        if any(o.kind == "tile_loop" for o in pt.body):
            raise PassError(f"tile_loop: partition {pt.name} already walks its tiles (a tile_loop); run the pass once")
        share = {"share": pt.tiles} if pt.tiles is not None else {}
        parts.append(replace(pt, body=(op("tile_loop", body=pt.body, **program.grid.attrs(), **share),)))
    return replace(program, partitions=tuple(parts))
