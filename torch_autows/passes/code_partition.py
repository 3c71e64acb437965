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
               reading it, so the slot of step k-lag is freed); advance {group};
               after the loop: %r_done = mma_wait(%r) for accumulators of async wgmma, then
               release_tail {group, lag} frees the last ``lag`` slots.
Per partition and group a counter (slot = n % count, phase = (n // count) & 1) runs on across
loops and tiles, so every wait matches exactly one arrive: acquires and releases balance.

A partition loop whose ops span two compute stages (loop_schedule deferred an mma) is software
pipelined (``_pipeline``): a prologue runs the early ops of the first step, the loop (from lb+1) runs
step j's early ops and step j-1's late ops — step j's first mma and step j-1's deferred mma are issued
back to back (``wait=False``), then ``mma_wait`` retires the first (pending=1) before its readers
and the deferred one (pending=0) at the end of the step — and an epilogue runs the last step's late
ops. Values early ops hand to late ops are carried as extra iter_args (``<x>_prev``); late ops
read their ring slot with ``get {lag=1}``, and the slot of step j-1 is released in step j
(``release {lag=1, guard=False}``), the last one after the epilogue. Needs a trip count >= 1
(``loop.min_trip``).

Ping-pong (``options.pingpong``, for two or more compute partitions, i.e. data-partitioned consumers):
the compute partitions take turns issuing their wgmma. Every run of mma issues with nothing that may
block between them (an "issue group": a prologue's first mma; a steady step's Q K^T, the rescale and
the deferred P V; an epilogue's mma) is
wrapped in ``turn_wait {turns, me}`` ... ``turn_pass {turns, to}``; an mma that waits for itself is
split into the issue, the pass and a ``mma_wait``, so a partition hands the turn over before it blocks.
Partition i's k-th issue group waits until partition i-1 issued its k-th (partition 0: its (k-1)-th of
the last one), so one partition's softmax runs while the other's wgmma occupy the tensor cores. Every
compute partition runs the same issue groups per tile (data partitioning splits one tile's rows), so
the turns stay balanced.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ..ir import BarrierGroup, Op, Program, Value, op, walk
from ..ir_ops import BLOCKING
from . import PassError
from .buffers import channel_groups, value_partition


def _groups(program: Program):
    """One BarrierGroup per ring of channels (buffers.channel_groups); channels learn their group."""
    groups, chans = [], {}
    for i, cs in enumerate(channel_groups(program)):
        name = f"g{i}"
        bufs = [program.buffer(c.buffer) for c in cs]
        counts = {b.count for b in bufs}
        if len(counts) != 1:
            raise PassError(f"code_partition: channels {[c.name for c in cs]} share a ring but have depths {counts}")
        dsts = sorted({d for c in cs for d in c.dsts})
        groups.append(BarrierGroup(name, counts.pop(), len(dsts), sum(b.type.nbytes for b in bufs),
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
                if o.kind == "trans" and o.operands[0] in views:
                    views[o.results[0].name] = views[o.operands[0]]
                out.append(o)
            for g, idx in puts.items():
                if i == idx[-1]:
                    out.append(op("advance", group=g))
            for g in first_get:
                readers = [j for j, u in enumerate(mine) if any(views.get(x) == g for x in _reads(u))]
                if readers and i == max(readers):
                    lag = max([mine[j].attr("pending", 0) for j in readers if mine[j].kind != "loop"] or [0])
                    out.append(op("release", group=g, lag=lag))
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
        piped = _pipeline(loop)
        if piped is not None:
            return piped
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
    # uses after a mma_wait read the retired accumulator
    renames = {o.operands[0]: o.results[0].name for o in walk(tuple(body)) if o.kind == "mma_wait"}

    def ren(ops):
        res = []
        for o in ops:
            if o.body:
                o = replace(o, body=tuple(ren(o.body)))
            if o.kind != "mma_wait":
                o = replace(o, operands=tuple(renames.get(x, x) for x in o.operands))
            res.append(o)
        return res

    return tuple(ren(body))


def _subst(o: Op, var: str, val: str) -> Op:
    """``o`` with the loop variable replaced by ``val`` in its expression attrs."""
    def sub(x):
        if isinstance(x, str):
            return re.sub(rf"\b{var}\b", f"({val})", x)
        if isinstance(x, tuple):
            return tuple(sub(e) for e in x)
        return x
    return replace(o, attrs=tuple((k, sub(x)) for k, x in o.attrs))


@dataclass
class _Split:
    """A partition loop body split by stage: ``late`` ops run one step behind the ``early`` ones."""

    body: list[Op]
    late: list[Op]
    early: list[Op]      # in body order: early compute ops, their gets and the sync ops (late releases left out)
    carried: list[str]   # values early ops define and late ops read: carried one step as ``<x>_prev``
    lagged: list[str]    # ring slots late ops read: re-got one step later with ``get {lag=1}``
    gets: dict[str, Op]
    late_groups: list[str]


def _split(loop: Op) -> _Split | None:
    body = list(loop.body[:-1])
    stages = [o.stage for o in body if o.stage is not None]
    if not stages or max(stages) == min(stages) or loop.attr("min_trip", 0) < 1:
        return None
    late = [o for o in body if o.stage == max(stages)]
    late_defs = {r.name for o in late for r in o.results}
    for o in body:
        if o not in late and any(x in late_defs for x in o.operands):
            raise PassError(f"code_partition: early op reads a deferred value: {o.kind} {o.operands}")
    gets = {o.results[0].name: o for o in body if o.kind == "get"}
    early_defs = {r.name for o in body if o.stage is not None and o not in late for r in o.results}
    late_reads = [x for o in late for x in o.operands]
    late_groups = sorted({gets[x].attr("group") for x in late_reads if x in gets})
    early_reads = {x for o in body if o not in late for x in o.operands}
    early = [o for o in body if o not in late
             and not (o.kind == "get" and o.results[0].name not in early_reads)
             and not (o.kind == "release" and o.attr("group") in late_groups)]
    return _Split(body, late, early, list(dict.fromkeys(x for x in late_reads if x in early_defs)),
                  list(dict.fromkeys(x for x in late_reads if x in gets)), gets, late_groups)


def _renamed(o: Op, names: dict[str, str], suffix: str, keep: dict[str, str] | None = None) -> Op:
    """``o`` reading through ``names``, its results renamed with ``suffix`` (or as ``keep`` says); the
    new names are recorded in ``names``."""
    res = []
    for r in o.results:
        names[r.name] = (keep or {}).get(r.name, r.name + suffix)
        res.append(Value(names[r.name], r.type))
    return replace(o, operands=tuple(names.get(x, x) for x in o.operands), results=tuple(res))


def _lagged_get(sp: _Split, x: str, name: str) -> Op:
    g = sp.gets[x]
    return replace(g, results=(Value(name, g.results[0].type),)).with_attrs(lag=1)


def _pipeline(loop: Op) -> list[Op] | None:
    """Prologue, pipelined loop and epilogue for a lowered partition loop with deferred ops (see the
    module docstring), or None when the loop has none."""
    sp = _split(loop)
    first = next((o for o in sp.early if o.kind == "mma"), None) if sp else None
    if first is None:
        return None
    y, its, var = loop.body[-1], loop.attr("iter_args"), loop.attr("var")
    lb, ub = loop.attr("lb"), loop.attr("ub")
    late_mmas = [o for o in sp.late if o.kind == "mma"]

    # prologue: the early ops of step lb
    pro = dict(zip(its, loop.operands))
    prologue = [_renamed(_subst(o, var, str(lb)), pro, "_pro") for o in sp.early]

    # steady state: step j's early ops; right after its first mma is issued, step j-1's late ops are
    # issued and the first mma alone is retired; the late mmas retire before the ring advances
    names = {x: x + "_prev" for x in sp.carried}
    names.update({x: x + "_prev" for x in sp.lagged})
    steady: list[Op] = []
    for o in sp.early:
        o = replace(o, operands=tuple(names.get(x, x) if x not in sp.lagged else x for x in o.operands))
        if o.results and o.results[0].name == first.results[0].name:
            r = o.results[0]
            steady.append(o.with_attrs(wait=False))
            steady += [_lagged_get(sp, x, x + "_prev") for x in sp.lagged]
            for d in sp.late:
                d = replace(d, operands=tuple(names.get(x, x) for x in d.operands))
                steady.append(d.with_attrs(wait=False, pending=0) if d.kind == "mma" else d)
            steady.append(op("mma_wait", [Value(r.name + "_r", r.type)], [r.name], pending=len(late_mmas)))
            names[r.name] = r.name + "_r"
        else:
            steady.append(o)
    tail = []
    for d in late_mmas:
        r = d.results[0]
        # a register A operand is read by the tensor core until the wait: keep it alive to there
        keep_alive = [x + "_prev" for x in d.operands[:1] if x in sp.carried]
        tail.append(op("mma_wait", [Value(r.name + "_done", r.type)], [r.name, *keep_alive], pending=0))
        names[r.name] = r.name + "_done"
    release = [op("release", group=g, lag=1, guard=False) for g in sp.late_groups]  # frees step j-1's slot
    at = max((i for i, o in enumerate(steady) if o.kind == "advance"), default=len(steady))
    steady = steady[:at] + tail + release + steady[at:]

    late_defs = {r.name for o in sp.late for r in o.results}
    early_yield = [x not in late_defs for x in y.operands]
    inits = tuple(pro.get(x, x) if e else init for x, e, init in zip(y.operands, early_yield, loop.operands))
    results = tuple(r if e else Value(r.name + "_loop", r.type) for r, e in zip(loop.results, early_yield))
    types = {r.name: r.type for o in sp.body for r in o.results}
    new_loop = replace(
        loop, operands=inits + tuple(pro[x] for x in sp.carried),
        results=results + tuple(Value(x + "_last", types[x]) for x in sp.carried),
        body=tuple(steady) + (replace(y, operands=tuple(names.get(x, x) for x in y.operands) + tuple(sp.carried)),),
    ).with_attrs(lb=lb + 1 if isinstance(lb, int) else f"({lb})+1",
                 iter_args=tuple(its) + tuple(x + "_prev" for x in sp.carried))

    # epilogue: the late ops of the last step, defining the loop's original late results
    epi = {it: r.name for it, r in zip(its, results)}
    epi.update({x: x + "_last" for x in sp.carried})
    epi.update({x: x + "_epi" for x in sp.lagged})
    final = {x: r.name for x, e, r in zip(y.operands, early_yield, loop.results) if not e}
    epilogue = [_lagged_get(sp, x, x + "_epi") for x in sp.lagged]
    for d in sp.late:
        d = _renamed(_subst(d, var, f"{ub}-1"), epi, "_epi", final)
        epilogue.append(d.with_attrs(pending=0) if d.kind == "mma" else d)
    return prologue + [new_loop] + epilogue + release


def _take_turns(body: tuple[Op, ...], me: int, turns: int) -> tuple[Op, ...]:
    """``body`` with every issue group of mmas wrapped in turn_wait / turn_pass (see the module docstring)."""
    out: list[Op] = []
    ops = list(body)
    i = 0
    while i < len(ops):
        o = ops[i]
        if o.body:
            out.append(replace(o, body=_take_turns(o.body, me, turns)))
            i += 1
            continue
        if o.kind != "mma":
            out.append(o)
            i += 1
            continue
        j = i  # the issue group ends at the last mma before anything that may block (or a nested body)
        for k in range(i + 1, len(ops)):
            if ops[k].kind in BLOCKING or ops[k].body:
                break
            if ops[k].kind == "mma":
                j = k
        group, tail = ops[i:j + 1], []
        last = group[-1]
        if last.attr("wait", True) is not False and last.attr("pending", 0) == 0:
            # issue, hand the turn over, then block on it; later ops read the retired value
            r = last.results[0]
            group[-1] = last.with_attrs(wait=False)
            tail = [op("mma_wait", [Value(r.name + "_w", r.type)], [r.name], pending=0)]
            ops[j + 1:] = [_reading(x, r.name, r.name + "_w") for x in ops[j + 1:]]
        out += [op("turn_wait", turns=turns, me=me), *group, op("turn_pass", turns=turns, to=(me + 1) % turns), *tail]
        i = j + 1
    return tuple(out)


def _reading(o: Op, old: str, new: str) -> Op:
    """``o`` (and its body) reading ``new`` where it read ``old``."""
    body = tuple(_reading(x, old, new) for x in o.body) if o.body else o.body
    return replace(o, operands=tuple(new if x == old else x for x in o.operands), body=body)


def _ping_pong(program: Program) -> Program:
    """Turns between the compute partitions (those that issue mmas), when ``options.pingpong`` asks and
    there are two or more; the turn mbarriers (8 B each) are added to ``smem_bytes``."""
    compute = [p for p in program.partitions if any(o.kind == "mma" for o in walk(p.body))]
    if len(compute) < 2:
        return program
    if not program.options.pingpong:  # the decision is printed either way
        note = f"code_partition: ping-pong off: {', '.join(p.name for p in compute)} issue wgmma independently"
        return replace(program, notes=program.notes + (note,))
    n = len(compute)
    idx = {p.name: i for i, p in enumerate(compute)}
    parts = tuple(replace(p, body=_take_turns(p.body, idx[p.name], n)) if p.name in idx else p
                  for p in program.partitions)
    smem = (program.smem_bytes or 0) + 8 * n
    if smem > program.arch.smem_limit:
        raise PassError(f"code_partition: {n} ping-pong turn barriers do not fit ({smem} B of SMEM)")
    note = f"code_partition: ping-pong: {', '.join(p.name for p in compute)} take turns issuing wgmma"
    return replace(program, partitions=parts, smem_bytes=smem, notes=program.notes + (note,))


def run(program: Program, options=None) -> Program:
    groups, chans = _groups(program)
    prog = replace(program, groups=tuple(groups), channels=tuple(chans))
    dmap = {}
    for o in walk(program.body):
        for r in o.results:
            dmap[r.name] = o
        for n in o.attr("iter_args", ()):
            dmap[n] = o
    parts = tuple(replace(p, body=_partition_body(prog, p.name, chans, dmap)) for p in program.partitions)
    return _ping_pong(replace(prog, partitions=parts))
