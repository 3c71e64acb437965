"""memory_plan: ring depth (``Buffer.count``) and SMEM offset of every buffer; total SMEM checked.

Assumes: buffers ran (every SMEM value has a Buffer, cross-partition values have Channels);
loop_schedule set ``pending`` on loop mmas.
Guarantees: every buffer has ``count`` and ``offset``; a ring buffer has at least 1 + the slots its
readers may still hold while they wait for the next (async wgmma groups, plus deferred steps:
buffers.slots_held; fewer slots deadlock: the producer would wait for a release the consumer only
gives after its next wait); the ring held longest gets at most ``options.stages``. At each depth from
there down, the buffers filled in one loop first share that depth (one barrier ring,
buffers.channel_groups); if that does not fit, each gets the same prefetch distance (depth - held - 1),
so a ring held fewer steps is shallower and gets its own barriers (attention's K 2 + V 3 at d=128 with
two Q copies);
a TMA store's staging buffer has ``options.store_buffers`` copies (with 2, a tile's store drains while
the next tile is staged); a ``tma_reduce_add``'s staging buffer has 1 (the op waits for its previous reduce to
read it before the registers overwrite it: attention backward's dQ, one reduce a step) and shares no bytes with
any other buffer (the async reduce reads it until a later store_wait that other buffers' writers do not wait
on); an ``smem_store`` tile another chain views (``smem_view``, data_partition's dq_split) has 2 (its owner
rewrites a copy two steps later, after the next meeting); in a persistent kernel a channel filled once per tile
(attention's Q) has ``options.tile_buffers`` copies (with 2, the producer loads the next tile's Q, then its K/V,
while this tile still computes); two buffers share bytes only if their lifetimes cannot overlap, and then at
the same offset (the later one is a reinterpretation of the earlier);
``Program.smem_bytes`` (buffers + mbarriers) <= ``arch.smem_per_cta(options.ctas_per_sm)`` (227 KB on sm_90 for
one CTA an SM, 113 KB each for two), lowering
the ring depth until it fits, then the per-tile copies, then the staging copies (each time the ring
depth again from the top), else PassError.

With ``Options.store_in_ring`` (a persistent kernel whose top-level stores stage in buffers of their own, one copy
each) the staging tiles take no bytes of their own: they lie inside the rings of the tile's last reading phase
(``buffers.stage_hosts``: attention's V), largest first, each at a multiple of its size from its ring's start
(``hosted_stages`` lists them); code_partition orders them with the ring's fills (the chains meet before staging,
the producer's first fill of the ring a tile waits for the stores), and where the rings are too small at a depth
the staging tiles get bytes of their own.

Reuse rule (interval colouring, greedy by size): buffers X and Y may share bytes when their live
ranges in program order are disjoint and the order is guaranteed: both are touched by one partition
only, or (one tile per CTA) X is a ring only partition P reads, and Y is P's own buffer used after
X's loop (P has waited for every fill and retired every wgmma that read X before Y is written). In
a persistent kernel the producer is already filling the next tile's ring during this tile's
epilogue, so rings never share bytes there.
"""
from __future__ import annotations

from dataclasses import replace

from ..ir import Op, Program, walk
from . import PassError
from .buffers import channel_groups, ring_stages, slots_held, stage_hosts

ALIGN = 1024  # 128-byte-swizzled NVMMA tiles need 1024-byte alignment


def _align(x: int) -> int:
    return (x + ALIGN - 1) // ALIGN * ALIGN


def reduce_stages(program: Program) -> frozenset[str]:
    """The staging buffers of the program's ``tma_reduce_add`` ops (their ``buffer``, set by passes/buffers)."""
    bodies = (program.body, *(pt.body for pt in program.partitions))
    return frozenset(o.attr("buffer") for b in bodies for o in walk(b)
                     if o.kind == "tma_reduce_add" and o.attr("buffer"))


def _intervals(body: tuple[Op, ...]):
    """Live interval of each value in top-level program order (a value touched anywhere inside a loop is
    live for that whole loop), and the loop that defines it (None: top level)."""
    iv: dict[str, tuple[int, int]] = {}
    loop_of: dict[str, Op | None] = {}

    def touch(name: str, i: int) -> None:
        lo, hi = iv.get(name, (i, i))
        iv[name] = (min(lo, i), max(hi, i))

    def visit(ops, i: int, loop: Op | None) -> None:
        for o in ops:
            for r in o.results:
                loop_of[r.name] = loop
                touch(r.name, i)
            for x in o.operands:
                touch(x, i)
            if o.body:
                visit(o.body, i, o)

    for i, o in enumerate(body):
        visit((o,), i, None)
    return iv, loop_of


def _accessors(program: Program) -> dict[str, tuple[set[str], set[str]]]:
    """buffer -> (writers, readers) partitions."""
    out = {}
    chan = {c.buffer: c for c in program.channels}
    part = {r.name: o.partition for o in walk(program.body) for r in o.results}
    viewers: dict[str, set[str]] = {}  # another chain's smem_view reads the tile too (data_partition's dq_split)
    for o in walk(program.body):
        if o.kind == "smem_view":
            viewers.setdefault(o.operands[0], set()).add(o.partition)
    for b in program.buffers:
        if b.name in chan:
            c = chan[b.name]
            out[b.name] = ({c.src}, set(c.dsts))
        else:
            p = part.get(b.value)
            out[b.name] = ({p}, {p} | viewers.get(b.value, set()))
    return out


def _compatible(x, y, program, iv, acc, loop_of, reduced=frozenset()) -> bool:
    if x.name in reduced or y.name in reduced:  # read by an async TMA reduce until a store_wait nobody else waits on
        return False
    (xs, xe), (ys, ye) = iv[x.value], iv[y.value]
    if not (xe < ys or ye < xs):
        return False
    if ye < xs:  # order them so x comes first
        x, y = y, x
    (xw, xr), (yw, yr) = acc[x.name], acc[y.name]
    if xw == xr == yw == yr and len(xw) == 1:
        return True
    ring = loop_of.get(x.value) is not None
    return (not program.grid.persistent) and ring and len(xr) == 1 and yw == yr == xr


def plan(program: Program, depth: int, store_copies: int, tile_copies: int = 1, split: bool = False):
    """Buffers with counts and offsets for a ring depth, staging copies and per-tile channel copies, and
    the SMEM they need with their mbarriers. ``depth`` is the count of the ring held longest; the others
    share it, or (``split``) get the same prefetch distance (count - held - 1), so one held fewer steps
    is that much shallower."""
    held = slots_held(program)  # its keys are the rings: buffers filled inside a loop
    most = max(held.values(), default=0)
    iv, loop_of = _intervals(program.body)
    acc = _accessors(program)
    stored = {o.operands[0] for o in walk(program.body) if o.kind == "store"}
    reduced = reduce_stages(program)
    # dS tiles the chains share (data_partition's dq_split): the owner rewrites a copy two steps later, after the
    # next meeting, which a reader reaches only with its step's wgmmas retired; one copy would be rewritten under them
    viewed = {x for o in walk(program.body) if o.kind == "smem_view" for x in (o.operands[0], o.attr("step_of"))}

    per_tile = {c.buffer for c in program.channels if loop_of.get(c.value) is None}

    def count(b) -> int:
        if b.name in held:
            return max(depth - (most - held[b.name]), held[b.name] + 1) if split else depth
        if b.name in per_tile and program.grid.persistent:
            return tile_copies
        return store_copies if b.value in stored else 2 if b.value in viewed else 1

    bufs = [replace(b, count=count(b)) for b in program.buffers]

    def place(skip: set[str]):
        """Greedy interval colouring of ``bufs`` but ``skip``: (placed buffers, bytes used)."""
        roots: list = []  # buffers that start a region; later ones may reinterpret a root's bytes
        placed: list = []
        top = 0
        for b in sorted(bufs, key=lambda b: (-b.nbytes, b.name)):
            if b.name in skip:
                continue
            off = None
            for root in roots:
                sharers = [p for p in placed if p.offset == root.offset]
                if b.nbytes <= root.nbytes and all(_compatible(p, b, program, iv, acc, loop_of, reduced)
                                                 for p in sharers):
                    off = root.offset
                    break
            if off is None:
                off, top = top, _align(top + b.nbytes)
                roots.append(replace(b, offset=off))
            placed.append(replace(b, offset=off))
        return placed, top

    hosts = stage_hosts(program)
    hosted = {b.name for b in ring_stages(program)} if hosts and store_copies == 1 else set()
    placed, top = place(hosted)
    inside = _in_hosts([b for b in placed if b.name in hosts], [b for b in bufs if b.name in hosted])
    if inside is None:  # the hosts at this depth are too small: the staging tiles are placed as any other buffer
        placed, top = place(set())
    else:
        placed += inside
    by_name = {b.name: b for b in placed}
    bufs = [by_name[b.name] for b in program.buffers]
    # a ready and an empty mbarrier (8 B each) per slot of every ring (see buffers.channel_groups)
    counts = {b.name: b.count for b in bufs}
    barriers = sum(16 * counts[cs[0].buffer] for cs in channel_groups(program, counts))
    return bufs, top + barriers


def _in_hosts(hosts: list, stages: list) -> list | None:
    """``stages`` (one copy each) placed inside the bytes of the ``hosts`` (placed ring buffers), largest first into
    the first host with room, each at a multiple of its own size from its host's start (codegen views it as a slot
    of the host's bytes); None if one does not fit."""
    used = {h.name: 0 for h in hosts}
    out = []
    for b in sorted(stages, key=lambda b: (-b.nbytes, b.name)):
        for h in sorted(hosts, key=lambda h: (-h.nbytes, h.name)):
            at = -(-used[h.name] // b.nbytes) * b.nbytes
            if at + b.nbytes <= h.nbytes:
                out.append(replace(b, offset=h.offset + at))
                used[h.name] = at + b.nbytes
                break
        else:
            return None
    return out


def hosted_stages(program: Program) -> dict[str, str]:
    """Staging buffer -> the ring buffer whose bytes it lies in: the stores' staging tiles
    ``Options.store_in_ring`` placed in the ring read last (code_partition gates that ring's fills on the stores,
    codegen views the tile in the ring's bytes)."""
    if not program.options.store_in_ring:
        return {}
    rings = [b for b in program.buffers if b.name in set(stage_hosts(program))]
    out = {}
    for b in ring_stages(program):
        for h in rings:
            if b.offset is not None and h.offset is not None and \
                    h.offset <= b.offset and b.offset + b.nbytes <= h.offset + h.nbytes:
                out[b.name] = h.name
    return out


def hosted_store(o: Op, hosted: dict[str, str]) -> bool:
    """Whether ``o`` is a TMA store from a staging tile of ``hosted`` (``hosted_stages``), in a ring's bytes."""
    return o.kind == "store" and f"{o.operands[0]}_stage" in hosted


def run(program: Program, options=None) -> Program:
    opts = options or program.options
    limit = program.arch.smem_per_cta(opts.ctas_per_sm)
    held = slots_held(program)
    lowest = max(held.values(), default=0) + 1
    for copies in range(max(opts.store_buffers, 1), 0, -1):
        for tiles in range(max(opts.tile_buffers, 1), 0, -1):
            depths = range(max(opts.stages, lowest), lowest - 1, -1)
            for depth, split in ((d, s) for d in depths for s in (False, True)):  # shared first, then split
                bufs, total = plan(program, depth, copies, tiles, split)
                if total > limit:
                    continue
                notes = program.notes
                ring_bufs = [b for b in bufs if b.name in held]
                if split and len({b.count for b in ring_bufs}) > 1:
                    rings = ", ".join(f"{b.name} {b.count}" for b in ring_bufs)
                    notes += (f"memory_plan: rings held fewer steps made shallower ({rings}) to fit",)
                if depth < opts.stages:
                    notes += (f"memory_plan: ring depth {opts.stages} -> {depth} to fit {limit} B of SMEM",)
                if copies < opts.store_buffers:
                    notes += (f"memory_plan: store staging copies {opts.store_buffers} -> {copies} to fit",)
                if tiles < opts.tile_buffers:
                    notes += (f"memory_plan: per-tile channel copies {opts.tile_buffers} -> {tiles} to fit",)
                return replace(program, buffers=tuple(bufs), smem_bytes=total, notes=notes)
    raise PassError(f"memory_plan: {total} B of SMEM at the smallest safe ring depth {lowest} exceeds "
                    f"{limit} B; use smaller block sizes")
