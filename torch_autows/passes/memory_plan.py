"""memory_plan: ring depth (``Buffer.count``) and SMEM offset of every buffer; total SMEM checked.

Assumes: buffers ran (every SMEM value has a Buffer, cross-partition values have Channels);
loop_schedule set ``pending`` on loop mmas.
Guarantees: every buffer has ``count`` and ``offset``; buffers filled inside one loop share one
depth (they share a barrier ring), at least 1 + the most async wgmma groups that may still read a
slot (fewer slots deadlock: the producer would wait for a release the consumer only gives after its
next wait) and at most ``options.stages``; two buffers share bytes only if their lifetimes cannot
overlap, and then at the same offset (the later one is a reinterpretation of the earlier);
``Program.smem_bytes`` (buffers + mbarriers) <= ``options.smem_limit`` (227 KB on sm_90), lowering
the ring depth until it fits, else PassError.

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

ALIGN = 1024  # 128-byte-swizzled NVMMA tiles need 1024-byte alignment


def _align(x: int) -> int:
    return (x + ALIGN - 1) // ALIGN * ALIGN


def _positions(body: tuple[Op, ...]):
    """Program-order interval of each value's def and uses; ops in a loop count as the whole loop."""
    pos: dict[str, list[int]] = {}
    loop_of: dict[str, Op | None] = {}
    counter = [0]

    # a value touched inside a loop is live for the whole loop: pass the loop's span down
    def spans(ops, span, loop):
        for o in ops:
            if o.kind == "loop":
                start = counter[0]
                n = sum(1 for _ in walk(o.body)) + 2
                counter[0] += n
                _visit_loop(o, (start, start + n - 1) if span is None else span)
                continue
            here = counter[0]
            counter[0] += 1
            s = span or (here, here)
            for r in o.results:
                pos.setdefault(r.name, []).extend(s)
                loop_of[r.name] = loop
            for x in o.operands:
                pos.setdefault(x, []).extend(s)

    def _visit_loop(o, span):
        for x in o.operands:
            pos.setdefault(x, []).extend(span)
        for r in o.results:
            pos.setdefault(r.name, []).extend(span)
        for inner in walk(o.body):
            for r in inner.results:
                pos.setdefault(r.name, []).extend(span)
                loop_of[r.name] = o
            for x in inner.operands:
                pos.setdefault(x, []).extend(span)

    spans(body, None, None)
    return {k: (min(v), max(v)) for k, v in pos.items()}, loop_of


def _accessors(program: Program) -> dict[str, tuple[set[str], set[str]]]:
    """buffer -> (writers, readers) partitions."""
    out = {}
    chan = {c.buffer: c for c in program.channels}
    part = {r.name: o.partition for o in walk(program.body) for r in o.results}
    for b in program.buffers:
        if b.name in chan:
            c = chan[b.name]
            out[b.name] = ({c.src}, set(c.dsts))
        else:
            p = part.get(b.value)
            out[b.name] = ({p}, {p})
    return out


def _compatible(x, y, program, iv, acc, loop_of) -> bool:
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


def plan(program: Program, depth: int):
    pending = max([o.attr("pending", 0) for o in walk(program.body) if o.kind == "mma"] or [0])
    iv, loop_of = _positions(program.body)
    acc = _accessors(program)
    bufs = []
    rings = set()
    for b in program.buffers:
        in_loop = loop_of.get(b.value) is not None and b.type.space == "smem" and \
            any(c.buffer == b.name for c in program.channels)
        count = max(depth, pending + 1) if in_loop else 1
        if in_loop:
            rings.add(id(loop_of[b.value]))
        bufs.append(replace(b, count=count))
    placed = []
    top = 0
    for b in sorted(bufs, key=lambda b: (-b.nbytes, b.name)):
        off = None
        for root in placed:
            if root.offset in {p.offset for p in placed if p is not root and p.offset == root.offset and
                               p.name < root.name}:
                continue
            sharers = [p for p in placed if p.offset == root.offset]
            if b.nbytes <= root.nbytes and all(_compatible(p, b, program, iv, acc, loop_of) for p in sharers):
                off = root.offset
                break
        if off is None:
            off = top
            top = _align(top + b.nbytes)
        placed.append(replace(b, offset=off))
    by_name = {b.name: b for b in placed}
    bufs = [by_name[b.name] for b in program.buffers]
    ring_counts = {b.count for b in bufs if b.count and b.count > 1}
    barriers = 16 * sum(ring_counts) * max(len(rings), 1) + 16 * len(bufs)
    return bufs, top + barriers


def run(program: Program, options=None) -> Program:
    opts = options or program.options
    pending = max([o.attr("pending", 0) for o in walk(program.body) if o.kind == "mma"] or [0])
    lowest = pending + 1
    for depth in range(max(opts.stages, lowest), lowest - 1, -1):
        bufs, total = plan(program, depth)
        if total <= opts.smem_limit:
            notes = program.notes
            if depth < opts.stages:
                notes += (f"memory_plan: ring depth {opts.stages} -> {depth} to fit {opts.smem_limit} B of SMEM",)
            return replace(program, buffers=tuple(bufs), smem_bytes=total, notes=notes)
    raise PassError(f"memory_plan: {total} B of SMEM at the smallest safe ring depth {lowest} exceeds "
                    f"{opts.smem_limit} B; use smaller block sizes")
