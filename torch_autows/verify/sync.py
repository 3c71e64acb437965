"""Synchronization, from code_partition on: ring barriers balance per partition and tile consumers seek their
ring positions (``_check_code``), and ping-pong turns are consistent: each turn partition waits on its own
barrier, passes to the next and takes the same turns per tile as the others (``_check_turns``, with
``_turn_shape`` and ``_main_loop_turns``); the consumer chains' ``chain_sync`` meetings balance (``_check_meetings``,
from data_partition on: each barrier met by exactly ``count`` chains, each the same times per tile in loops of equal
bounds, so no chain waits for a phase the others never complete); a slot read by ``smem_read`` last is released with
``sync`` (``_check_release_sync``); no ``mma_wait`` reads an accumulator that a wgmma
in flight writes (``_check_waits``); stores staged in a ring's bytes are ordered with its fills (``_check_drains``)."""
from __future__ import annotations

from dataclasses import replace

from ..ir import Program, walk
from ..passes.memory_plan import hosted_stages, hosted_store
from .base import _fail


def _check_code(p: Program, stage: str):
    groups = {g.name: g for g in p.groups}
    for c in p.channels:
        if c.group not in groups:
            _fail(stage, f"channel {c.name} has no barrier group")
    for pt in p.partitions:
        if not pt.body:
            _fail(stage, f"partition {pt.name} has no body")
        count = {}
        for o in walk(pt.body):
            g = o.attr("group")
            if g is None:
                continue
            if g not in groups:
                _fail(stage, f"unknown barrier group {g}", o)
            count.setdefault(g, {"acquire": 0, "wait_ready": 0, "release": 0, "advance": 0})
            if o.kind in count[g]:
                count[g][o.kind] += 1
        for g, c in count.items():
            if c["acquire"] + c["wait_ready"] != c["advance"]:
                _fail(stage, f"{pt.name}: group {g} waits {c['acquire'] + c['wait_ready']} times per step but "
                      f"advances {c['advance']} times: phases would drift")
            if c["wait_ready"] != c["release"]:
                _fail(stage, f"{pt.name}: group {g} is waited on {c['wait_ready']} times but released "
                      f"{c['release']} times: a slot would never be freed")
        _check_release_sync(pt, stage)
    sharing = {pt.name for pt in p.partitions if pt.tiles is not None}
    for g in groups.values():
        consumers = {pt.name for pt in p.partitions for o in walk(pt.body)
                     if o.kind == "release" and o.attr("group") == g.name}
        one_each = g.arrivals == 1 and consumers and consumers <= sharing  # a fill is its tile's consumer's
        if len(consumers) != g.arrivals and not one_each:
            _fail(stage, f"group {g.name} expects {g.arrivals} releasing partitions, found {sorted(consumers)}")
    for pt in p.partitions:
        body = pt.body[0].body if len(pt.body) == 1 and pt.body[0].kind == "tile_loop" else pt.body
        seeks = [o for o in walk(body) if o.kind == "seek"]
        waited = sorted({o.attr("group") for o in walk(body) if o.kind == "wait_ready"})
        head = [o.attr("group") for o in body[:len(seeks)] if o.kind == "seek"]
        if pt.tiles is None and seeks:
            _fail(stage, f"{pt.name} walks every tile but seeks its ring position", seeks[0])
        if pt.tiles is not None and (sorted(head) != waited or len(head) != len(seeks)):
            _fail(stage, f"{pt.name} runs every {pt.tiles[1]}th tile: its tile body must start with one seek per ring "
                  f"it reads ({waited}), found seeks of {[o.attr('group') for o in seeks]} (its counter would "
                  f"stay at another consumer's fills)")


def _check_release_sync(pt, stage: str):
    """A slot whose last reader before its release is an ``smem_read`` (every thread loads from it) is released with
    ``sync``: one thread arrives for the partition, so without the meeting another thread may still be reading when
    the producer refills the slot."""
    def visit(ops):
        views: dict[str, str] = {}
        for i, o in enumerate(ops):
            if o.kind == "get":
                views[o.results[0].name] = o.attr("group")
            if o.body:
                visit(o.body)
            if o.kind == "release" and i and ops[i - 1].kind == "smem_read" and not o.attr("sync") \
                    and views.get(ops[i - 1].operands[0]) == o.attr("group"):
                _fail(stage, f"{pt.name} releases {o.attr('group')} right after an smem_read of its slot without "
                      f"sync: the other threads' loads may still be in flight when one thread arrives", o)
    visit(pt.body)


def _turn_shape(ops, part: str, stage: str, scope: str = "mma") -> tuple:
    """The turns one op list takes, loops (with their bounds) nested; scope "mma": every mma inside a turn, every
    turn_wait followed by its turn_pass before anything else waits or a loop starts; scope "mainloop" (tile
    consumers): every ring wait inside a turn taken in the tile body's own op list."""
    if scope == "mainloop":
        return _main_loop_turns(ops, part, stage)
    shape: list = []
    inside = None
    for o in ops:
        if o.kind == "turn_wait":
            if inside is not None:
                _fail(stage, f"{part} waits for a turn twice without passing it", o)
            inside = o
            shape.append("turn")
        elif o.kind == "turn_pass":
            if inside is None:
                _fail(stage, f"{part} passes a turn it did not wait for", o)
            inside = None
        elif o.kind == "mma" and inside is None:
            _fail(stage, f"{part} takes ping-pong turns but issues this mma outside a turn", o)
        elif o.kind == "tile_loop":  # the whole body, per tile: its turns are the partition's
            shape += _turn_shape(o.body, part, stage)
        elif o.kind == "loop":
            if inside is not None:
                _fail(stage, f"{part} starts a loop inside a turn", o)
            inner = _turn_shape(o.body, part, stage)
            if inner:
                shape.append((o.attr("lb"), o.attr("ub"), inner))
    if inside is not None:
        _fail(stage, f"{part} waits for a turn it never passes", inside)
    return tuple(shape)


def _main_loop_turns(ops, part: str, stage: str) -> tuple:
    """Scope "mainloop": per tile one turn at the tile body's top level, every ``wait_ready`` between its
    ``turn_wait`` and ``turn_pass`` (passes/code_partition); the turns it takes per tile."""
    body = ops[0].body if len(ops) == 1 and ops[0].kind == "tile_loop" else ops
    inside, shape = None, []
    for o in body:
        if o.kind in ("turn_wait", "turn_pass"):
            if (o.kind == "turn_wait") == (inside is not None):
                _fail(stage, f"{part}: turn_wait and turn_pass must alternate in its tile body", o)
            inside = o if o.kind == "turn_wait" else None
            shape += ["turn"] if o.kind == "turn_wait" else []
            continue
        nested = [x for x in walk((o,)) if x.kind in ("turn_wait", "turn_pass")]
        if nested:
            _fail(stage, f"{part}: a main-loop turn is taken in the tile body's own ops, not inside a loop", nested[0])
        if inside is None and any(x.kind == "wait_ready" for x in walk((o,))):
            _fail(stage, f"{part} shares the tiles but waits on a ring outside its turn: it could wait a lap early "
                  f"(the other consumer's fills are not landed yet)", o)
    if inside is not None:
        _fail(stage, f"{part} waits for a turn it never passes", inside)
    return tuple(shape)


def _check_turns(p: Program, stage: str):
    """passes/ping_pong: turn ops only with Program.turns; each of its partitions waits on its own barrier and
    passes to the next, every mma inside a turn, wait and pass paired in each op list; all take the same turns
    per tile (in loops with equal bounds), so no turn barrier is left a phase behind."""
    t = p.turns
    turn_ops = {pt.name: [o for o in walk(pt.body) if o.kind in ("turn_wait", "turn_pass")] for pt in p.partitions}
    if t is None:
        for name, ops in turn_ops.items():
            if ops:
                _fail(stage, f"{name} takes ping-pong turns, but the program has no turn barriers (Program.turns)",
                      ops[0])
        return
    names = [pt.name for pt in p.partitions]
    sharing = tuple(pt.name for pt in p.partitions if pt.tiles is not None)
    if t.scope not in ("mma", "mainloop") or (t.scope == "mainloop") != bool(sharing) or \
            (sharing and t.partitions != sharing):
        _fail(stage, f"turns {t.name} (scope {t.scope!r}) over {t.partitions}: the tile consumers {sharing} take "
              f"main-loop turns (scope 'mainloop', all of them in order), other programs mma turns (scope 'mma')")
    if len(t.partitions) < 2 or len(set(t.partitions)) != t.count or not set(t.partitions) <= set(names):
        _fail(stage, f"turns {t.name}: {t.partitions} must be two or more distinct partitions of {names}")
    shapes = {}
    for pt in p.partitions:
        if pt.name not in t.partitions:
            if turn_ops[pt.name]:
                _fail(stage, f"{pt.name} takes turns but is not in turns {t.name} {t.partitions}",
                      turn_ops[pt.name][0])
            continue
        me = t.partitions.index(pt.name)
        for o in turn_ops[pt.name]:
            want = {"turns": t.count, "me" if o.kind == "turn_wait" else "to": me if o.kind == "turn_wait"
                    else (me + 1) % t.count}
            if any(o.attr(k) != v for k, v in want.items()):
                _fail(stage, f"{pt.name} is turn partition {me} of {t.count}: its {o.kind} needs {want}", o)
        shapes[pt.name] = _turn_shape(pt.body, pt.name, stage, t.scope)
        if not shapes[pt.name]:
            _fail(stage, f"{pt.name} is in turns {t.name} but never takes a turn: the others would wait for it")
    if len(set(shapes.values())) > 1:
        _fail(stage, f"the partitions of turns {t.name} take different turns per tile ({shapes}): the turn "
              f"barriers would drift a phase apart")


def _meet_shape(ops, keep, bar: str) -> tuple:
    """The meetings on ``bar`` one op list takes (ops ``keep`` accepts), loops (with their bounds) nested."""
    shape: list = []
    for o in ops:
        if o.kind == "chain_sync" and o.attr("bar") == bar and keep(o):
            shape.append("meet")
        elif o.kind == "tile_loop":
            shape += _meet_shape(o.body, keep, bar)
        elif o.kind in ("loop", "tile_next"):
            inner = _meet_shape(o.body, keep, bar)
            if inner:
                shape.append((o.kind, o.attr("lb"), o.attr("ub"), inner))
    return tuple(shape)


def _chain_ops(ops, i: int) -> tuple:
    """``ops`` with only chain ``i``'s (and the structure's) ops, loops kept."""
    return tuple(replace(o, body=_chain_ops(o.body, i)) if o.body else o for o in ops
                 if o.body or o.chain == i)


def _check_views(ops, stage: str, met: bool = False, stored: frozenset = frozenset()) -> None:
    """Every ``smem_view`` in ``ops`` follows, in its op list (or an enclosing one), a ``chain_sync`` and the store of
    its ``step_of`` tile (the slot it reads is this step's fill, which the owner has stored before the meeting)."""
    for o in ops:
        if o.kind == "chain_sync":
            met = True
        elif o.kind == "smem_store":
            stored = stored | {o.results[0].name}
        elif o.kind == "smem_view" and not (met and o.attr("step_of") in stored):
            _fail(stage, f"smem_view of %{o.operands[0]} without a chain_sync and the store of "
                  f"%{o.attr('step_of')} before it: it could read the other chain's tile before its owner wrote it",
                  o)
        if o.body:
            _check_views(o.body, stage, met, stored)


def _check_meetings(p: Program, stage: str):
    """``chain_sync {bar, count}``: made by data_partition (none in a template); one count per barrier, at least 2;
    met by exactly ``count`` chains (before code_partition: the ops' chains 0..count-1; after: ``count``
    partitions), each taking the same meetings per tile in loops of equal bounds (else a chain would wait for a
    phase the others never complete, or pass one early)."""
    partitioned = bool(p.partitions)
    bodies = [pt.body for pt in p.partitions] if partitioned else [p.body]
    for body in bodies:
        if partitioned:
            _check_views(body, stage)
        else:  # before code_partition the chains' ops are interleaved: each chain's own in order
            for i in {o.chain for o in walk(body) if o.kind == "smem_view"}:
                _check_views(_chain_ops(body, i), stage)
    for o in walk(p.body):  # from memory_plan on: a viewed tile's owner rewrites a copy while the viewer reads another
        bufs = [b for b in p.buffers if b.value in (*o.operands, o.attr("step_of"))] if o.kind == "smem_view" else []
        if any(b.count is not None and b.count < 2 for b in bufs):
            _fail(stage, f"smem_view of %{o.operands[0]}: the tiles {[b.name for b in bufs]} need 2 copies (the owner "
                  f"stores the next step's dS while the other chain may still read this one's)", o)
    syncs = [o for body in bodies for o in walk(body) if o.kind == "chain_sync"]
    if not syncs:
        return
    if stage == "template":
        _fail(stage, "chain_sync in a template: the chains it makes meet exist from data_partition on", syncs[0])
    counts: dict[str, int] = {}
    for o in syncs:
        c = o.attr("count")
        if not isinstance(c, int) or c < 2 or counts.setdefault(o.attr("bar"), c) != c:
            _fail(stage, f"chain_sync on {o.attr('bar')}: count {c!r}, but one count (>= 2) per barrier, "
                  f"{counts.get(o.attr('bar'))} elsewhere", o)
    for bar, count in counts.items():
        if partitioned:
            shapes = {pt.name: _meet_shape(pt.body, lambda o: True, bar) for pt in p.partitions}
        else:
            shapes = {f"chain {i}": _meet_shape(p.body, lambda o, i=i: o.chain == i, bar) for i in range(count)}
            stray = [o for o in syncs if o.attr("bar") == bar and o.chain not in range(count)]
            if stray:
                _fail(stage, f"chain_sync on {bar} (count {count}) in chain {stray[0].chain}: only chains "
                      f"0..{count - 1} meet there", stray[0])
        met = {k: v for k, v in shapes.items() if v}
        if len(met) != count:
            _fail(stage, f"{bar} expects {count} meeting chains a phase, but {sorted(met)} meet on it: a phase would "
                  f"never complete (or complete early)")
        if len(set(met.values())) > 1:
            _fail(stage, f"the chains meeting on {bar} meet a different number of times or in different loops "
                  f"({met}): the barrier would drift a phase apart")


def _check_waits(p: Program, stage: str):
    """From code_partition on: no ``mma_wait`` retires an mma while a later mma accumulating onto its result is in
    flight (issued ``wait=False``, not yet retired by a wait on it or on an mma issued after it). Such a wait reads
    registers the running wgmma writes, and ptxas then serializes every wgmma of the kernel (C7514; the wait of the
    chain's last mma retires the whole chain: passes/step_overlap.accumulated_into)."""
    def seq(ops) -> None:
        issued: list = []  # mmas issued wait=False, in order
        retired = -1       # index into issued of the last one a wait retired (in-order retirement)
        for o in ops:
            if o.body:
                seq(o.body)
            if o.kind == "mma" and o.attr("wait", True) is False:
                issued.append(o)
            elif o.kind == "mma_wait":
                r = o.operands[0]
                at = next((i for i, m in enumerate(issued) if m.results[0].name == r), None)
                if at is None:
                    continue
                onto = next((m for m in issued[at + 1:] if len(m.operands) == 3 and m.operands[2] == r), None)
                if onto is not None and issued.index(onto) > retired:
                    _fail(stage, f"waits on %{r} while %{onto.results[0].name} accumulates onto it in flight: ptxas "
                          f"would serialize every wgmma (wait on the chain's last mma instead)", o)
                retired = max(retired, at)
    for pt in p.partitions:
        seq(pt.body)


def _check_drains(p: Program, stage: str):
    """From code_partition on, for stores staged in a ring's bytes (``Options.store_in_ring``,
    memory_plan.hosted_stages): each storing partition signals ``store_drained`` after its last staged store and, where
    several partitions read the ring, meets them (``chain_sync``) before its first, in the same op list (a tile's
    body); the ring's producer waits (``wait_drained`` on the same barrier) in the loop that fills the ring, before
    the loop's first acquire of it. Without the meeting a chain's staging write lands on V another still reads;
    without the wait the next tile's fills land under a store TMA has not read (the interpreter's ``overwrite``).
    With one tile a CTA (a grid that is not persistent) nothing fills the ring after the stores: the meeting only."""
    hosted = hosted_stages(p)
    if not hosted:
        return
    gate = p.grid.persistent
    hosts = set(hosted.values())
    groups = {c.group for c in p.channels if c.buffer in hosts}
    readers = {d for c in p.channels if c.group in groups for d in c.dsts}
    bars = set()

    def check_storer(ops, name):
        at = [i for i, o in enumerate(ops) if hosted_store(o, hosted)]
        if not at:
            for o in ops:
                if o.body:
                    check_storer(o.body, name)
            return
        drained = [o for o in ops[at[-1] + 1:] if o.kind == "store_drained"]
        if gate and not drained:
            _fail(stage, f"{name} stores from a staging tile in {sorted(hosts)}'s bytes without a store_drained after "
                  f"its last such store: the producer would refill the ring under the store", ops[at[-1]])
        bars.update(o.attr("bar") for o in drained[:1])
        if len(readers) > 1 and not any(o.kind == "chain_sync" for o in ops[:at[0]]):
            _fail(stage, f"{name} stages a store in {sorted(hosts)}'s bytes without meeting the ring's other readers "
                  f"(chain_sync) first: one may still read the ring there", ops[at[0]])

    storers = [pt for pt in p.partitions if any(hosted_store(o, hosted) for o in walk(pt.body))]
    for pt in storers:
        check_storer(pt.body, pt.name)

    def gated(ops) -> bool:
        for o in ops:
            if o.kind in ("loop", "tile_next"):
                inner = list(o.body)
                first = next((i for i, x in enumerate(inner) if x.kind == "acquire" and x.attr("group") in groups),
                             None)
                if first is not None:
                    return any(x.kind == "wait_drained" and x.attr("bar") in bars for x in inner[:first])
            if o.body and gated(o.body):
                return True
        return False

    for pt in p.partitions if gate else ():  # one tile a CTA: every fill lands before the readers' last step
        fills = any(o.kind == "acquire" and o.attr("group") in groups for o in walk(pt.body))
        if fills and not gated(pt.body):
            _fail(stage, f"{pt.name} fills ring(s) {sorted(groups)}, which host staging tiles, without a wait_drained "
                  f"({sorted(bars)}) before its first acquire in the filling loop: a fill could land under a store")
    counts = {o.attr("count") for pt in p.partitions for o in walk(pt.body)
              if o.kind in ("store_drained", "wait_drained")}
    if counts != ({len(storers)} if gate else set()):
        _fail(stage, f"store_drained/wait_drained count {sorted(counts)}, but {len(storers)} partitions store from "
              f"the ring's bytes (one arrival each a tile)")
