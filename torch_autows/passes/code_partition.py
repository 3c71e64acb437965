"""code_partition: one body per partition, channels lowered to mbarrier ready/empty rings.

Assumes: memory_plan ran (buffers have counts and offsets; channels exist for every cross-partition
value); loop mmas carry ``pending``.
Guarantees: ``Program.groups`` holds one BarrierGroup per (loop, producing partition): its channels
share a ring of ``count`` slots, one ``ready`` barrier per slot (TMA transaction bytes = the sum of
its tiles) and one ``empty`` barrier per slot that every consuming partition arrives on once
(``arrivals``); each Channel names its group; each Partition has a ``body`` with only its own ops,
its loops (iter_args it does not carry dropped) and explicit sync ops:
    producer:  acquire {group}  (wait empty[slot] with phase^1, expect bytes) ... loads {group, buffer} ...
               advance {group}
    consumer:  wait_ready {group} (wait ready[slot] with phase); %v = get {group, buffer} per channel;
               release {group, lag} after the last op reading the slot (lag = async wgmma groups still
               reading it, so the slot of step k-lag is freed; ``sync`` where that op is an ``smem_read``, read
               by every thread, while one thread arrives: they meet before it); advance {group};
               after the loop: %r_done = mma_wait(%r) for accumulators of async wgmma, then
               release_tail {group, lag} frees the last ``lag`` slots.
Per partition and group a counter (slot = n % count, phase = (n // count) & 1) runs on across
loops and tiles, so every wait matches exactly one arrive: acquires and releases balance.

Loops are lowered as they are, one step after another, also those whose ops span two compute stages
(loop_schedule deferred an mma): the next pass, software_pipeline, overlaps those steps. The result
is a complete partitioned program (the interpreter runs it), only without that overlap.

Uses after an ``mma_wait`` read its retired result: ``renamed_after_waits`` (software_pipeline applies it
again to the waits it adds).

Tile consumers (``Partition.tiles`` = (c, t), partition_schedule): each fill of a ring belongs to one tile, so to
the one consumer that runs it: the ring's ``arrivals`` count it once. The producer fills the rings in walk order,
tile j's fills from ``j * F`` (F: the group's fills per tile, the trips of the loops that fill it, which may not
depend on the tile: K steps are equal within a launch). A sharing consumer's body starts with
``seek {group, per_tile=F}`` for every group it reads: its counter jumps to ``j * F`` for the CTA's j-th tile, past
the fills of the tiles the other consumers ran (their steps so far plus its own), so slot ``n % count`` and phase
``(n // count) & 1`` are the producer's for that fill, for ragged K too. After the tile its counter is at
``(j + 1) * F``, the producer's after tile j.
A parity wait cannot tell lap L from lap L-2: a consumer that jumps ahead may wait only once the slot holds the
fill one lap before its own. So the sharing consumers take turns (``Program.turns``, scope "mainloop", the ops
ping_pong uses): each tile's ops from the first that waits on a ring to the last run between ``turn_wait`` and
``turn_pass``; tile j's consumer starts waiting after tile j-1's consumer passed its last wait, when every fill
up to tile j's first has landed (CUTLASS's math warpgroup order barrier). The main loops alternate, and each
consumer's epilogue runs under the next one's main loop.

Stores staged in a ring's bytes (``Options.store_in_ring``, memory_plan.hosted_stages): each storing consumer meets
the ring's other readers (``chain_sync``) before its first such store and signals ``store_drained`` after its last;
the ring's producer waits for it (``wait_drained``) in the filling loop's first trip, before its first acquire of
the ring (``_drain_gates``); with one tile a CTA only the meeting (nothing fills the ring after the stores).
"""
from __future__ import annotations

from dataclasses import replace

from ..ir import BarrierGroup, Op, Program, TurnGroup, Value, check_expr, op, walk
from . import PassError
from .buffers import channel_groups, value_partition
from .memory_plan import hosted_stages, hosted_store

#: The turn barriers' name (as passes/ping_pong's; a Program has one TurnGroup).
TURN_BAR = "turn_bar"


def _groups(program: Program):
    """One BarrierGroup per ring of channels (buffers.channel_groups); channels learn their group."""
    sharing = {p.name for p in program.partitions if p.tiles is not None}
    groups, chans = [], {}
    for i, cs in enumerate(channel_groups(program)):
        name = f"g{i}"
        bufs = [program.buffer(c.buffer) for c in cs]
        counts = {b.count for b in bufs}
        if len(counts) != 1:
            raise PassError(f"code_partition: channels {[c.name for c in cs]} share a ring but have depths {counts}")
        dsts = sorted({d for c in cs for d in c.dsts})
        if sharing & set(dsts) and not set(dsts) <= sharing:
            raise PassError(f"code_partition: ring {name} is read by tile-sharing and other partitions ({dsts}); a "
                            f"fill is released by its tile's one consumer or by all: use tile_consumers=1")
        arrivals = 1 if set(dsts) <= sharing and dsts else len(dsts)  # a tile consumer releases only its tiles
        groups.append(BarrierGroup(name, counts.pop(), arrivals, sum(b.type.nbytes for b in bufs),
                                   tuple(c.name for c in cs)))
        for c in cs:
            chans[c.name] = replace(c, group=name)
    return groups, [chans[c.name] for c in program.channels]


def _reads(o: Op) -> tuple[str, ...]:
    """Values an op reads; for a loop, every value its body reads that the body does not define."""
    if o.kind != "loop":
        return o.operands
    defined = set(o.attr("iter_args", ())) | {r.name for b in walk(o.body) for r in b.results}
    return tuple(dict.fromkeys(x for b in walk(o.body) for x in b.operands if x not in defined))


def _partition_body(program: Program, part: str, chans, dmap) -> tuple[Op, ...]:
    by_value = {c.value: c for c in chans}
    views: dict[str, str] = {}  # smem value -> group whose slot it reads (gets and their trans views)

    def lower(ops: tuple[Op, ...]) -> list[Op]:
        out: list[Op] = []
        here = {r.name for o in ops for r in o.results}  # channels are waited and released where defined
        mine = [o for o in ops if o.kind != "yield" and (o.kind == "loop" or o.partition == part)]
        # producer side: acquire before the first load of a group, advance after its last
        puts: dict[str, list[int]] = {}
        for i, o in enumerate(mine):
            c = by_value.get(o.results[0].name) if o.kind == "load" else None
            if c is not None and c.src == part:
                puts.setdefault(c.group, []).append(i)
        # consumer side: gets for channel values this body reads, releases after their last reader
        gets: dict[str, list[tuple[int, Op]]] = {}
        for i, o in enumerate(mine):
            for x in _reads(o):
                c = by_value.get(x)
                if c is not None and part in c.dsts and x in here:
                    gets.setdefault(c.group, []).append((i, o))
        first_get = {g: min(i for i, _ in v) for g, v in gets.items()}
        for i, o in enumerate(mine):
            for g, idx in puts.items():
                if i == idx[0]:
                    out.append(op("acquire", group=g))
            for g, fi in first_get.items():
                if i == fi:
                    out.append(op("wait_ready", group=g))
                    for c in chans:
                        if c.group == g and part in c.dsts:
                            t = next(r.type for r in dmap[c.value].results if r.name == c.value)
                            out.append(op("get", [Value(c.value, t)], group=g, buffer=c.buffer))
                            views[c.value] = g
            if o.kind == "loop":
                out += _lower_loop(o)
            else:
                c = by_value.get(o.results[0].name) if o.kind == "load" else None
                if c is not None:
                    o = o.with_attrs(group=c.group, buffer=c.buffer)
                if o.kind in ("trans", "slice") and o.operands[0] in views:
                    views[o.results[0].name] = views[o.operands[0]]
                out.append(o)
            for g, idx in puts.items():
                if i == idx[-1]:
                    out.append(op("advance", group=g))
            for g in first_get:
                readers = [j for j, u in enumerate(mine) if any(views.get(x) == g for x in _reads(u))]
                if readers and i == max(readers):
                    lag = max([mine[j].attr("pending", 0) for j in readers if mine[j].kind != "loop"] or [0])
                    # the slot's last reader an smem_read: every thread of the partition loads from it, and one
                    # thread arrives for them all, so they meet first (``sync``)
                    sync = {"sync": True} if mine[i].kind == "smem_read" else {}
                    out.append(op("release", group=g, lag=lag, **sync))
                    out.append(op("advance", group=g))
        return out

    def _lower_loop(o: Op) -> list[Op]:
        keep = [i for i, n in enumerate(o.attr("iter_args")) if value_partition(n, dmap) == {part}]
        body = lower(o.body)
        if not body:
            return []
        y = o.body[-1]
        body.append(replace(y, operands=tuple(y.operands[i] for i in keep)))
        loop = replace(o, operands=tuple(o.operands[i] for i in keep), results=tuple(o.results[i] for i in keep),
                       body=tuple(body)).with_attrs(iter_args=tuple(o.attr("iter_args")[i] for i in keep))
        out = [loop]
        # async wgmma on a carried accumulator: retire it after the loop, then free the slots it held
        lags = {}
        for b in body:
            if b.kind == "release" and b.attr("lag"):
                lags[b.attr("group")] = b.attr("lag")
        for i in keep:
            src = y.operands[i]
            d = dmap.get(src)
            if d is not None and d.kind == "mma" and d.attr("pending", 0) > 0:
                r = o.results[i]
                out.append(op("mma_wait", [Value(r.name + "_done", r.type)], [r.name], pending=0))
        for g, lag in lags.items():
            out.append(op("release_tail", group=g, lag=lag))
        return out

    body = lower(program.body)
    if program.partition(part).tiles is not None:
        waited = dict.fromkeys(o.attr("group") for o in walk(body) if o.kind == "wait_ready")
        body = [op("seek", group=g, per_tile=_fills_per_tile(program, g, chans)) for g in waited] + body
    return renamed_after_waits(tuple(body))


def _fills_per_tile(program: Program, group: str, chans) -> str:
    """The fills of ``group`` per tile: the product of the trips of the loops around its loads (1 at top level).
    A count that depends on the tile (its indices, an outer loop's variable) is refused: a tile consumer's ring
    position is its tile's index times this count."""
    value = next(c.value for c in chans if c.group == group)

    def trips(ops, around):
        for o in ops:
            if any(r.name == value for r in o.results):
                return around
            if o.kind == "loop":
                lb, ub = o.attr("lb"), o.attr("ub")
                n = f"{ub}" if str(lb) == "0" else f"max(({ub})-({lb}),0)"
                found = trips(o.body, around + [n])
                if found is not None:
                    return found
        return None

    loops = trips(program.body, [])
    per_tile = "*".join(f"({n})" if len(loops) > 1 else n for n in loops) if loops else "1"
    scalars = {a.name for a in program.args if a.kind == "scalar"}
    if check_expr(per_tile) - scalars:
        raise PassError(f"code_partition: ring {group} fills {per_tile} slots per tile, which depends on the tile "
                        f"({sorted(check_expr(per_tile) - scalars)}); tile consumers need the same fills per tile: use "
                        f"tile_consumers=1")
    return per_tile


def renamed_after_waits(body: tuple[Op, ...]) -> tuple[Op, ...]:
    """``body`` with every op but an ``mma_wait`` reading the retired value where it read a value an
    ``mma_wait`` retires, from the wait on in program order (uses after the wait read the retired accumulator; an mma
    before it that accumulates onto the value in flight keeps it, as the split dQ's second mma does)."""
    renames: dict[str, str] = {}

    def ren(ops):
        res = []
        for o in ops:
            if o.kind != "mma_wait":
                o = replace(o, operands=tuple(renames.get(x, x) for x in o.operands))
            if o.body:
                o = replace(o, body=tuple(ren(o.body)))
            if o.kind == "mma_wait":
                renames[o.operands[0]] = o.results[0].name
            res.append(o)
        return res

    return tuple(ren(body))


def run(program: Program, options=None) -> Program:
    """Barrier groups for the channels and one lowered body per partition (see the module docstring)."""
    groups, chans = _groups(program)
    prog = replace(program, groups=tuple(groups), channels=tuple(chans))
    dmap = {}
    for o in walk(program.body):
        for r in o.results:
            dmap[r.name] = o
        for n in o.attr("iter_args", ()):
            dmap[n] = o
    parts = tuple(replace(p, body=_partition_body(prog, p.name, chans, dmap)) for p in program.partitions)
    if hosted_stages(program):
        parts, bars = _drain_gates(prog, parts)
        prog = replace(prog, smem_bytes=(prog.smem_bytes or 0) + 8 * bars)  # one-slot mbarriers, 8 B each
        if prog.smem_bytes > program.arch.smem_limit:
            raise PassError(f"code_partition: the stores' drain and meeting barriers do not fit ({prog.smem_bytes} B "
                            f"of SMEM); use fewer stages")
    sharing = tuple(p.name for p in parts if p.tiles is not None)
    if not sharing:
        return replace(prog, partitions=parts)
    turns = TurnGroup(TURN_BAR, sharing, scope="mainloop")
    parts = tuple(replace(p, body=_main_loop_turn(p.body, sharing.index(p.name), len(sharing)))
                  if p.name in sharing else p for p in parts)
    smem = (program.smem_bytes or 0) + turns.nbytes
    if smem > program.arch.smem_limit:
        raise PassError(f"code_partition: the tile consumers' {turns.count} turn barriers do not fit ({smem} B of "
                        f"SMEM); use fewer stages")
    return replace(prog, partitions=parts, turns=turns, smem_bytes=smem)


def _main_loop_turn(body: tuple[Op, ...], me: int, count: int) -> tuple[Op, ...]:
    """A tile consumer's body with the ops from its first ring wait to its last in one turn (see the docstring)."""
    waits = [i for i, o in enumerate(body) if any(x.kind == "wait_ready" for x in walk((o,)))]
    if not waits:
        raise PassError("code_partition: a tile consumer reads no ring; use tile_consumers=1")
    first, last = waits[0], waits[-1]
    return (*body[:first], op("turn_wait", turns=count, me=me), *body[first:last + 1],
            op("turn_pass", turns=count, to=(me + 1) % count), *body[last + 1:])


def _drain_gates(program: Program, parts) -> tuple[tuple, int]:
    """(partitions, mbarriers made): the order that lets a store stage in a ring's bytes (``Options.store_in_ring``;
    memory_plan.hosted_stages): a storing consumer meets the ring's other readers (``chain_sync``) before its first
    staged store, so none still reads the ring there, and signals ``store_drained`` after its last
    (``tma.store_wait(0)``, then an arrive): TMA has read the staging tiles. The ring's producer waits for that
    (``wait_drained``, in the filling loop's first trip, before its first acquire of the ring: the previous tile's
    stores; a fresh barrier passes the first tile) so no fill lands under a store, while Q and the other rings' fills
    of the next tile go ahead. With one tile a CTA (a grid that is not persistent) nothing fills the ring after the
    stores: the meeting alone (the partition's ``tma.store_wait(0)`` at its end keeps the CTA's SMEM until TMA has
    read it)."""
    hosted = hosted_stages(program)
    hosts = set(hosted.values())
    ring_groups = {c.group for c in program.channels if c.buffer in hosts}
    if len(ring_groups) != 1:
        raise PassError(f"code_partition: the staging tiles' host rings {sorted(hosts)} fill {len(ring_groups)} "
                        f"barrier rings; one ring gates on the stores (buffers.channel_groups keeps them together)")
    (g,) = ring_groups
    readers = sorted({d for c in program.channels if c.group == g for d in c.dsts})
    storers = [pt.name for pt in parts if any(hosted_store(o, hosted) for o in pt.body)]
    if not storers or not set(storers) <= set(readers):
        raise PassError(f"code_partition: stores staged in ring {g} are issued by {storers}, not by its readers "
                        f"{readers}: a staging write must follow its own partition's last read of the ring")
    bar, meet = f"{g}_drained", f"{g}_meet"
    gate = program.grid.persistent  # the next tile's fills wait for this tile's stores
    out = []
    for pt in parts:
        body = list(pt.body)
        if pt.name in storers:
            at = [i for i, o in enumerate(body) if hosted_store(o, hosted)]
            if gate:
                body.insert(at[-1] + 1, op("store_drained", bar=bar, count=len(storers)))
            if len(readers) > 1:  # the other readers may still read the ring (the tile's last P V)
                body.insert(at[0], replace(op("chain_sync", bar=meet, count=len(readers)), chain=pt.body[at[0]].chain,
                                           partition=pt.name))
        elif gate and any(o.kind == "acquire" and o.attr("group") == g for o in walk(pt.body)):
            body = _gate_fills(body, g, bar, len(storers))
        out.append(replace(pt, body=tuple(body)))
    return tuple(out), gate + (len(readers) > 1)  # the drain signal, and the meeting where several read the ring


def _gate_fills(body: list[Op], g: str, bar: str, count: int) -> list[Op]:
    """The producer's ``body`` with ``wait_drained`` before the first ``acquire`` of ring ``g`` in the loop that fills
    it (its first trip only: ``min_trip`` >= 1, checked by buffers.stage_hosts)."""
    for i, o in enumerate(body):
        if o.kind != "loop":
            continue
        inner = list(o.body)
        at = next((k for k, x in enumerate(inner) if x.kind == "acquire" and x.attr("group") == g), None)
        if at is not None:
            inner.insert(at, op("wait_drained", bar=bar, count=count))
            body[i] = replace(o, body=tuple(inner))
            return body
    raise PassError(f"code_partition: ring {g} hosts staging tiles but is not filled in a loop; the producer's gate "
                    f"waits in the filling loop's first trip")
