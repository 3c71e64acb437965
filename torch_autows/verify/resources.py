"""Partitions and the SM's resources: from partition_schedule on, every op has a known partition, the
partitions' registers fit the SM and setmaxnreg, and tile consumers share out the tiles (``_check_partitions``,
``_check_tile_shares``); from buffers on, a value crosses partitions only through a channel
(``_check_channels``); from memory_plan on, buffers are placed within the SMEM limit without partial overlaps, and a
TMA reduce-add's staging tile shares no bytes (``_check_memory``), but a store's staging tile may lie inside the ring
``Options.store_in_ring`` hosts it in (``memory_plan.hosted_stages``; verify.sync checks the gate that orders them)."""
from __future__ import annotations

from ..ir import Program, defs, walk
from ..ir.kinds import STRUCTURAL
from ..passes.buffers import value_partition
from ..passes.memory_plan import hosted_stages, reduce_stages
from .base import _fail


def _check_partitions(p: Program, stage: str):
    names = {pt.name for pt in p.partitions}
    for o in walk(p.body):
        if o.kind in STRUCTURAL:
            continue
        if o.partition not in names:
            _fail(stage, f"op has partition {o.partition!r}, not one of {sorted(names)}", o)
    regs = sum(pt.regs * 32 * max(4, pt.warps) for pt in p.partitions)
    a = p.arch
    if regs > a.regs_per_sm:
        _fail(stage, f"partitions need {regs} registers, more than the {a.regs_per_sm} of an SM")
    for pt in p.partitions:
        if pt.regs % a.reg_granularity or not a.min_regs_per_thread <= pt.regs <= a.max_regs_per_thread:
            _fail(stage, f"partition {pt.name}: {pt.regs} registers; setmaxnreg takes multiples of "
                  f"{a.reg_granularity} in {a.min_regs_per_thread}..{a.max_regs_per_thread}")
    _check_tile_shares(p, stage)


def _check_tile_shares(p: Program, stage: str):
    """Tile consumers (``Partition.tiles``): t >= 2 partitions of a persistent grid share out every tile, indices
    0..t-1 once each; the producer (it loads) walks every tile."""
    shares = {pt.name: pt.tiles for pt in p.partitions if pt.tiles is not None}
    if not shares:
        return
    counts = {t for _, t in shares.values()}
    t = max(counts)
    if len(counts) != 1 or t < 2 or sorted(c for c, _ in shares.values()) != list(range(t)):
        _fail(stage, f"tile shares {shares}: t >= 2 partitions must take the tiles j with j % t == 0, 1, ..., t-1")
    if not p.grid.persistent:
        _fail(stage, f"tile shares {shares} on a grid that is not persistent (a CTA has one tile)")
    loaders = {o.partition for o in walk(p.body) if o.kind == "load"}
    if loaders & set(shares):
        _fail(stage, f"partitions {sorted(loaders & set(shares))} load and share the tiles: the producer fills the "
              f"rings for every tile")


def _check_channels(p: Program, stage: str):
    dmap = defs(p.body)
    chans = {(c.value, d) for c in p.channels for d in c.dsts}
    for o in walk(p.body):
        if o.kind in STRUCTURAL or o.kind == "smem_view":  # no channel: the chains' meeting orders it
            continue
        for x in o.operands:
            for src in value_partition(x, dmap):
                if src != o.partition and (x, o.partition) not in chans:
                    _fail(stage, f"%{x} crosses from {src} to {o.partition} without a channel", o)


def _check_memory(p: Program, stage: str):
    for b in p.buffers:
        if b.count is None or b.offset is None or b.count < 1:
            _fail(stage, f"buffer {b.name} has no count/offset")
    if p.smem_bytes is None or p.smem_bytes > p.arch.smem_limit:
        _fail(stage, f"SMEM {p.smem_bytes} B exceeds the limit {p.arch.smem_limit} B")
    reduced = reduce_stages(p)
    bodies = [pt.body for pt in p.partitions if pt.body] or [p.body]  # the lowered bodies once code_partition ran
    named = [o.attr("buffer") for b in bodies for o in walk(b) if o.kind == "tma_reduce_add" and o.attr("buffer")]
    for name in sorted({n for n in named if named.count(n) > 1}):
        _fail(stage, f"{named.count(name)} TMA reduce-adds stage in {name}: one op's reduce may still read it while "
              f"another (another chain's store_wait does not wait for it) overwrites it; give each its own tile")
    hosted = hosted_stages(p)  # store_in_ring: a store's staging tile inside the ring read last (at its own offset)
    for i, a in enumerate(p.buffers):
        for b in p.buffers[i + 1:]:
            overlap = a.offset < b.offset + b.nbytes and b.offset < a.offset + a.nbytes
            if overlap and a.name in hosted and b.name in hosted:
                _fail(stage, f"staging tiles {a.name} and {b.name} share bytes inside {hosted[a.name]}")
            if overlap and (hosted.get(a.name) == b.name or hosted.get(b.name) == a.name):
                continue  # the producer's first fill of the ring a tile waits for the stores (verify.sync)
            if overlap and a.offset != b.offset:
                _fail(stage, f"buffers {a.name} and {b.name} overlap at different offsets")
            if overlap and {a.name, b.name} & reduced:
                _fail(stage, f"buffers {a.name} and {b.name} share bytes, but a TMA reduce-add reads "
                      f"{a.name if a.name in reduced else b.name} asynchronously until a later store_wait that no "
                      f"other buffer's writes wait for: a reduce's staging tile shares no bytes")
