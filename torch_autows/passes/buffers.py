"""buffers: give every value that lives in SMEM a Buffer, and every cross-partition value a Channel.

Assumes: partition_schedule ran (every non-container op has a partition).
Guarantees: each TMA ``load`` result has a Buffer (its landing tile); each ``store`` and ``tma_reduce_add`` operand
has a staging Buffer ``<value>_stage`` (TMA stores and reduces read SMEM; a ``tma_reduce_add`` names it in its
``buffer`` attribute, as later passes rename the operand; a ``transposed`` one's is the transposed shape), but a
top-level ``store`` that stages in a slot it may take (``stage_in_slots``: the tile type of a per-tile TMA load
only its partition reads, all before the store, or of a column slice of one read only through slices of disjoint
columns (an epilogue in column chunks); attention's O in its chain's Q slot; not with ``store_buffers`` > 1,
whose stores drain from their own copies under the next tile, the slot released once read; nor with
``store_in_ring``, whose staging tiles memory_plan puts in the bytes of the ring read last, ``stage_hosts``); each
``smem_store`` result has a Buffer its partition alone writes (another chain may view it: data_partition's dq_split);
every value used in a partition other than its producer's goes through a Channel (value, src, dsts, buffer), but
the tile an ``smem_view`` reads (no ring: the chains' ``chain_sync`` orders the owner's store before the view).
Counts and offsets are left to memory_plan.
Only SMEM tiles may cross partitions here: a register value used by another role is an error
naming both roles (its SMEM hand-off is not lowered yet).
"""
from __future__ import annotations

from dataclasses import replace

from ..ir import DTYPE_BYTES, Buffer, Channel, Op, Program, defs, map_ops, walk
from . import PassError


def value_partition(name: str, dmap: dict[str, Op]) -> set[str]:
    """Partitions that produce ``name``; loop-carried values resolve to their init and yield operands."""
    d = dmap[name]
    if d.kind != "loop":
        return {d.partition}
    its = list(d.attr("iter_args"))
    i = its.index(name) if name in its else [r.name for r in d.results].index(name)
    out: set[str] = set()
    for src in (d.operands[i], d.body[-1].operands[i]):
        if src != name:
            out |= value_partition(src, dmap)
    return out


def _loops_of(program: Program) -> dict[str, Op | None]:
    """The loop that defines each value (None: top level)."""
    loop_of: dict[str, Op | None] = {}

    def visit(ops, loop):
        for o in ops:
            for r in o.results:
                loop_of.setdefault(r.name, loop)
            if o.kind == "loop":
                visit(o.body, o)

    visit(program.body, None)
    return loop_of


def slots_held(program: Program) -> dict[str, int]:
    """Ring buffer (of a channel filled inside a loop) -> the slots its readers may still hold while they
    wait for the next one: async wgmma groups left in flight on it (``pending``) plus the stages its
    latest reader runs behind the loop's first compute stage (loop_schedule's ``defer_mma``: P V of step
    j-1 reads its V slot during step j). Readers of a ``trans`` or ``slice`` view of the slot count as readers."""
    loop_of = _loops_of(program)
    out = {}
    for c in program.channels:
        loop = loop_of.get(c.value)
        if loop is None:
            continue
        first = min([o.stage for o in loop.body if o.stage is not None and o.kind != "load"] or [0])
        views, held = {c.value}, 0
        for o in loop.body:  # body order: a view is defined before its readers
            if not views.intersection(o.operands):
                continue
            if o.kind in ("trans", "slice"):
                views.add(o.results[0].name)
            held = max(held, o.attr("pending", 0) + (first if o.stage is None else o.stage) - first)
        out[c.buffer] = held
    return out


def channel_groups(program: Program, counts: dict[str, int] | None = None) -> list[list[Channel]]:
    """Channels that share one mbarrier ring: those filled in the same loop (or at top level) by the same
    partition into buffers of the same depth (``counts``, default the buffers' ``count``), in channel
    order, but in a persistent kernel the rings that host the stores' staging tiles (``stage_hosts``) apart from the
    others (their producer's first fill a tile waits for the previous tile's stores; the others' fills must not;
    with one tile a CTA nothing is filled after the stores, and the hosts keep their ring). memory_plan
    sets the depths (it makes a ring read a stage later, attention's V under defer_mma, deeper than the others
    only when one shared depth does not fit); code_partition lowers the rings."""
    loop_of = _loops_of(program)
    depth = counts or {b.name: b.count for b in program.buffers}
    hosts = set(stage_hosts(program)) if program.grid.persistent else set()
    keyed: dict[tuple, list[Channel]] = {}
    for c in program.channels:
        keyed.setdefault((id(loop_of[c.value]), c.src, depth[c.buffer], c.buffer in hosts), []).append(c)
    return list(keyed.values())


def ring_stages(program: Program) -> list[Buffer]:
    """The staging buffers of the top-level TMA stores that stage in a buffer of their own (not in a slot:
    ``stage_in_slots``)."""
    names = {f"{o.operands[0]}_stage" for o in program.body if o.kind == "store" and not o.attr("stage")}
    return [b for b in program.buffers if b.name in names]


def stage_hosts(program: Program) -> tuple[str, ...]:
    """With ``Options.store_in_ring``, a kernel whose top-level stores stage in buffers of their own: the ring buffers
    of the tile's last reading phase, whose bytes take the staging tiles (passes/memory_plan). The rings filled in the
    one loop are ordered by their first reader in its body. In a persistent kernel a split point is where every ring
    before it has had its last reader before the first reader of every ring after it (attention: K's Q K^T before
    V's P V), so the next tile's fills of the rings before it go ahead of the stores; with one tile a CTA (the
    attention backward: its dK/dV after the walk over the queries, Q's and dO's ring) nothing is filled after the
    stores and any tail of that order will do. The hosts are the rings of the latest such split (a tail) whose slots
    (at ``Options.stages`` copies, at least the slots their readers hold, as memory_plan plans them) hold every
    staging tile: the fewest rings, read last. () where the option is off, the tiles are shared out among consumers,
    or no split has room."""
    stages = ring_stages(program)
    opts = program.options
    persistent = program.grid.persistent
    # tile consumers (tile_consumers > 1) run a tile each: one storer a tile, which the per-tile drain count is not
    if not (opts.store_in_ring and stages and opts.tile_consumers == 1):
        return ()
    held = slots_held(program)
    bufs = {b.name: b for b in program.buffers}
    ring_of = {bufs[n].value: n for n in held}
    loops = [o for o in program.body if o.kind == "loop"
             and any(r.name in ring_of for x in walk(o.body) for r in x.results)]
    # persistent: the gate on the next tile's fills is waited in the loop's first trip
    if len(loops) != 1 or (persistent and int(loops[0].attr("min_trip", 0)) < 1):
        return ()
    span: dict[str, tuple[int, int]] = {}  # ring buffer -> (first, last) reader's index in the loop body
    for i, o in enumerate(loops[0].body):
        for x in o.operands:
            if x not in ring_of:
                continue
            if o.kind in ("trans", "slice"):  # a view: its readers read the ring
                ring_of[o.results[0].name] = ring_of[x]
                continue
            lo, hi = span.get(ring_of[x], (i, i))
            span[ring_of[x]] = (min(lo, i), max(hi, i))
    rings = sorted(span, key=lambda n: (span[n][0], n))
    need = sum(b.type.nbytes for b in stages)
    for i in range(len(rings) - 1, 0 if persistent else -1, -1):
        if not persistent or max(span[n][1] for n in rings[:i]) < min(span[n][0] for n in rings[i:]):
            room = sum(bufs[n].type.nbytes * max(program.options.stages, held[n] + 1) for n in rings[i:])
            if room >= need:
                return tuple(rings[i:])
    return ()


def stage_in_slots(body: tuple[Op, ...]) -> tuple[Op, ...]:
    """``body`` with each top-level TMA ``store`` staged, where it may be, in the slot of a per-tile SMEM value: a
    top-level ``load`` result of the store's chain and tile type (dtype and shape) that only the storing partition
    reads (itself or through ``trans``/``slice`` views), every reader before the store in program order (a loop
    counts whole); or a top-level ``slice`` view of such a load that is read only through slices of disjoint columns
    (``_column_chunked``), the store then writing the view's columns alone. The store gets ``stage`` = that value and
    reads it as a second operand, so code_partition releases the slot after the store, and the store waits for TMA to
    have read the slot before the slot's release (codegen, both interpreters; a later staged store's wait may cover
    it: ir.deferred_stage_waits): the producer cannot refill it under the store. It then needs no staging buffer of
    its own. A value stages one store at most."""
    types = {r.name: r.type for o in walk(body) for r in o.results}
    taken: set[str] = set()
    out = list(body)
    chunked = _column_chunked(body)
    for i, st in enumerate(body):
        if st.kind != "store" or st.attr("stage") or len(st.operands) != 1:
            continue
        t = types.get(st.operands[0])
        for ld in body[:i]:
            y = ld.results[0] if (ld.kind == "load" or (ld.kind == "slice" and ld.operands[0] in chunked
                                                          and _whole_swizzle_rows(ld.results[0].type))) \
                and ld.chain == st.chain else None
            if (y is None or y.name in taken or t is None or y.type.space != "smem"
                    or (y.type.dtype, y.type.shape) != (t.dtype, t.shape)):
                continue
            names, ok = {y.name}, True
            for k, top in enumerate(body):
                for u in walk((top,)):
                    if names.isdisjoint(u.operands):
                        continue
                    if u.kind in ("trans", "slice"):
                        names.add(u.results[0].name)
                    ok = ok and u.kind not in ("yield", "loop") and u.partition == st.partition and k < i
            if ok:
                out[i] = replace(st, operands=(st.operands[0], y.name)).with_attrs(stage=y.name)
                taken.add(y.name)
                break
    return tuple(out)


def _whole_swizzle_rows(t) -> bool:
    """Whether a column slice of an SMEM tile spans whole 128-byte rows of its swizzle (TMA tiles of 16-bit elements
    64 columns or more wide are 128-byte swizzled): only such a slice can be a TMA store's source (a narrower one
    would need the narrower swizzle of its own descriptor; Triton refuses it)."""
    return t.shape[-1] * DTYPE_BYTES[t.dtype] % 128 == 0


def _column_chunked(body: tuple[Op, ...]) -> set[str]:
    """Top-level TMA ``load`` results read only through top-level ``slice`` views, those of each chain of disjoint
    columns (an epilogue in column chunks: templates/gemm.py): a store may stage in one view's columns (its chunk)
    while the others still hold their loaded data. Views of one load in different chains read different fills of it
    (tile consumers: each fill is one consumer's tile), so only a chain's own views must not overlap."""
    loads = {o.results[0].name for o in body if o.kind == "load"}
    top = {id(o) for o in body}
    spans: dict[str, dict] = {}
    for o in walk(body):
        for x in o.operands:
            if x in loads:
                ok = o.kind == "slice" and id(o) in top
                span = (o.attr("start"), o.attr("start") + o.attr("size")) if ok else None
                spans.setdefault(x, {}).setdefault(o.chain, []).append(span)
    out = set()
    for x, per_chain in spans.items():
        if all(None not in cols and all(a[1] <= b[0] for a, b in zip(sorted(cols), sorted(cols)[1:]))
               for cols in per_chain.values()):
            out.add(x)
    return out


def run(program: Program, options=None) -> Program:
    # with more copies a store drains under the next tile from its own; with store_in_ring it stages in the bytes of
    # the ring read last (memory_plan), so the per-tile slot is released after its last reader
    if program.options.store_buffers == 1 and not program.options.store_in_ring:
        program = replace(program, body=stage_in_slots(program.body))
    dmap = defs(program.body)
    users: dict[str, set[str]] = {}
    for o in walk(program.body):
        if o.kind in ("loop", "yield", "smem_view"):  # a view of another chain's tile: the chains' meeting orders it
            continue
        for x in o.operands:
            users.setdefault(x, set()).add(o.partition)
    buffers, channels = [], []
    for o in walk(program.body):
        if o.kind == "load":
            v = o.results[0]
            buffers.append(Buffer(f"{v.name}_smem", v.type, v.name))
        if o.kind == "smem_store":  # a partition's own SMEM tile (attention backward's dS): no channel
            v = o.results[0]
            buffers.append(Buffer(f"{v.name}_smem", v.type, v.name))
        if o.kind in ("store", "tma_reduce_add") and not o.attr("stage"):  # TMA reads its source from SMEM: staging
            x = o.operands[0]
            t = next(r.type for r in dmap[x].results if r.name == x)
            if o.attr("transposed"):  # a reduce of the tile's transpose stages in the target's orientation
                t = replace(t, shape=t.shape[::-1])
            buffers.append(Buffer(f"{x}_stage", replace(t, space="smem"), x))
    for name in sorted(users):
        srcs = value_partition(name, dmap)
        dsts = users[name] - srcs
        if not dsts:
            continue
        if len(srcs) != 1:
            raise PassError(f"buffers: %{name} is produced by several partitions {sorted(srcs)}")
        (src,) = srcs
        t = next(r.type for r in dmap[name].results if r.name == name) if dmap[name].kind != "loop" else None
        if t is None or t.space != "smem":
            raise PassError(f"buffers: register value %{name} crosses from {src} to {sorted(dsts)}; only SMEM "
                            f"tiles (TMA loads) can cross partitions: schedule its producer and users together")
        channels.append(Channel(f"ch_{name}", name, src, tuple(sorted(dsts)), f"{name}_smem"))
    # a reduce names its staging tile (``buffer``): later passes rename its operand (an mma_wait's result)
    body = map_ops(program.body, lambda o: o.with_attrs(buffer=f"{o.operands[0]}_stage")
                   if o.kind == "tma_reduce_add" else o)
    return replace(program, body=body, buffers=tuple(buffers), channels=tuple(channels))
