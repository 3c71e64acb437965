"""Partitioned semantics: each Partition.body as a coroutine, exactly as codegen.gluon emits it.

One ``PartRun`` per (CTA, partition) runs the partition's body: its ``tile_loop`` (passes/tile_loop, handled in
``tiles.py`` with ``tile_next`` and ``seek``; a body
from before that pass is one tile's, walked over ``Program.grid``) runs the rest once per tile of the CTA
(persistent: ``pid, pid + nprog, ...``, as ``sched.cta_tiles`` lists them), yielding to the scheduler before
every op and whenever an mbarrier wait cannot pass yet. Mirrored from the generated code:
    acquire      g_s = n % count; wait empty[g_s] with phase ((n // count) & 1) ^ 1; expect ready bytes
    load         async TMA copy into buffer[g_s] (lands later, completing ready[g_s]'s bytes)
    wait_ready   g_s = n % count; wait ready[g_s] with phase (n // count) & 1
    get          the value is buffer[g_s]: a slot reference read at each use
                 (g_s, like load's and release{0}'s, is the one the last acquire/wait_ready set; after an
                 advance it is stale until the next acquire/wait_ready: using it is a `stale-slot` violation)
    release{L}   L=0: arrive empty[g_s]; else arrive empty[(n + count - L) % count] if (var - lb) >= L
    release_tail for j in 1..L: arrive empty[(n + count - j) % count] if _trip >= j
    advance      n += 1
    mma          async wgmma (operand slots recorded as being read), then wait until ``pending`` remain
    mma_wait     wait until ``pending`` remain; the accumulator is retired
    store        store_wait(copies - 1); registers -> staging slot n % copies; fence; async TMA store
                 (read at store_wait)
    smem_store   registers -> the result's own buffer, slot n % copies (checked against unretired wgmma reads)
    turn_wait    wait turn[me] with parity (turn_n & 1), ^ 1 for partition 0 (ping-pong; the barriers are
                 Program.turns', one per turn-taking partition)
    turn_pass    arrive turn[to]; turn_n += 1
    seek         n = j * per_tile for the CTA's j-th tile (a tile consumer: tile_loop ``share``)
Counters ``n`` are per partition and group and run on across loops and tiles, as does ``turn_n``.
A tile consumer (tile_loop ``share=(c, t)``) runs the CTA's j-th tiles with j % t == c; on a ring whose fills are
each released by one consumer (``arrivals`` 1, several readers) its ``wait_ready`` claims the fill: another
partition's wait for or read of that fill is a ``shared-fill`` violation (``CTA.claim``).
"""
from __future__ import annotations

import collections

import torch

from ..ir import Op, op, walk
from . import tiles
from .cta import CTA, SlotRef, TmaCopy
from .ops import InterpError, apply, eval_index, note_write, skipped, tma_store


class Wait:
    __slots__ = ("bar", "parity", "op", "group", "slot", "lap")

    def __init__(self, bar, parity, op, group, slot, lap):
        self.bar, self.parity, self.op, self.group, self.slot, self.lap = bar, parity, op, group, slot, lap

    def ready(self) -> bool:
        return self.bar.passes(self.parity)


class Wgmma:
    """An async wgmma group: operands are read (from SMEM) when it retires at a wgmma wait."""

    def __init__(self, owner, op, step, args, refs):
        self.owner, self.op, self.step, self.args, self.refs = owner, op, step, args, refs
        self.value = None

    def describe(self) -> str:
        return f"async wgmma `{self.op.results[0].name} = mma(...)` issued by {self.owner.name} at #{self.step}"


class StoreRead:
    """An async TMA store reading its staging slot until the partition's next store_wait."""

    def __init__(self, owner, op, step, key, tag, coords):
        self.owner, self.op, self.step, self.key, self.tag, self.coords = owner, op, step, key, tag, coords
        self.value = None

    def describe(self) -> str:
        return f"TMA store from {self.key[0]} issued by {self.owner.name} at #{self.step}"


class PartRun:
    def __init__(self, cta: CTA, part):
        self.cta, self.part, self.name = cta, part, part.name
        self.run = cta.run
        self.writes, self.writer = self.run.writes, cta.index  # the launch's output writes (ops.note_write)
        self.env: dict = {}
        self.scalars = dict(self.run.scalars)
        self.counters: dict[str, int] = collections.defaultdict(int)
        for o in walk(part.body):
            if o.attr("group") is not None:
                self.counters[o.attr("group")] += 0  # codegen: `{g}_n = 0` for every group the body names
        self.slotvar: dict[str, tuple[int, int]] = {}  # group -> (slot, fill n) set by acquire/wait_ready
        self.stale: dict[str, tuple[int, int, int]] = {}  # group -> (slot, fill n, step) of an advanced-past slot
        self.loops: list[tuple[str, int]] = []
        self.wgmma: collections.deque = collections.deque()
        self.stores: list[StoreRead] = []
        self.turn_n = 0
        loops = [o for o in part.body if o.kind == "tile_loop"]
        self.share = loops[0].attr("share") if loops else part.tiles  # (c, t): a tile consumer's share of the walk
        self.tile_seq = 0  # j: the CTA's j-th tile is running (a ``seek`` reads it)
        self.has_store = any(o.kind == "store" for o in walk(part.body))
        self.produces = any(o.kind in ("acquire", "load") for o in walk(part.body))
        self.waiting = None
        self.done = False
        self.op: Op | None = None
        self.gen = self._main()

    # ------------------------------------------------------------------ scheduler interface

    def runnable(self) -> bool:
        return not self.done and (self.waiting is None or self.waiting.ready())

    def step(self) -> None:
        try:
            self.waiting = next(self.gen)
        except StopIteration:
            self.done, self.waiting = True, None

    # ------------------------------------------------------------------ semantics context

    def eval(self, e):
        return eval_index(e, self.scalars)

    def tensor(self, name: str) -> torch.Tensor:
        return self.run.tensors[name]

    def fail(self, kind, msg, o=None, **kw):
        self.cta.fail(kind, msg, self.name, o if o is not None else self.op, **kw)

    def race(self, msg: str, o: Op):
        self.fail("global-race", msg, o)

    def log(self, o, detail=""):
        self.run.events.add(self.run.step, self.cta.index, self.name, o, detail)

    # ------------------------------------------------------------------ values

    def raw(self, name: str, o: Op):
        try:
            return self.env[name]
        except KeyError:
            pass
        p = self.run.program
        defs = [(pt.name, x.kind) for pt in p.partitions for x in walk(pt.body) for r in x.results if r.name == name]
        owners = sorted({pn for pn, k in defs if k != "get"})
        receivers = sorted({pn for pn, k in defs if k == "get"})
        chans = [c for c in p.channels if c.value == name]
        if chans and any(self.name in c.dsts for c in chans):
            why = f"channel {chans[0].name} lists {self.name}, but this body has no `get` for it before the use"
        elif owners:
            why = f"it is defined in {', '.join(owners)}" + (f" (and received by {', '.join(receivers)})"
                                                              if receivers else "") + \
                f"; no channel delivers it to {self.name}"
        else:
            why = "no partition defines it"
        self.fail("no-channel", f"{self.name} reads %{name}: {why}", o)

    def value(self, x, o: Op) -> torch.Tensor:
        if isinstance(x, SlotRef):
            return self.cta.read_slot(x, self.name, o)
        if isinstance(x, Wgmma):
            if x.value is None:
                self.fail("async-use", f"{self.name} uses the result of {x.describe()} before a wgmma wait "
                          f"retired it", o)
            return x.value
        return x

    # ------------------------------------------------------------------ interpretation

    def _main(self):
        body = self.part.body
        if not any(o.kind == "tile_loop" for o in body):  # before passes/tile_loop: the body is one tile's
            share = {"share": self.share} if self.share is not None else {}
            body = (op("tile_loop", body=body, **self.run.program.grid.attrs(), **share),)
        for o in body:
            if o.kind == "tile_loop":  # the walk itself is no step of its own (codegen: a few integer ops)
                self.op = o
                yield from tiles.tile_loop(self, o)
            else:
                yield from self.run_ops((o,))
        yield None
        self.op = None
        if self.wgmma:
            self.fail("unbalanced", f"{self.name} ends with {len(self.wgmma)} async wgmma groups never retired "
                      f"({self.wgmma[0].describe()})")
        if self.has_store:
            self.store_wait()

    def run_ops(self, ops):
        for o in ops:
            if o.kind == "yield":
                return [self.raw(x, o) for x in o.operands]
            yield None
            self.op = o
            self.log(o)
            if o.kind == "loop":
                yield from self.run_loop(o)
                continue
            h = HANDLERS.get(o.kind)
            if h is None:
                args = [self.value(self.raw(x, o), o) for x in o.operands]
                for r, v in zip(o.results, apply(self, o, args)):
                    self.env[r.name] = v
            else:
                g = h(self, o)
                if g is not None:
                    yield from g
        return None

    def run_loop(self, o: Op):
        its = o.attr("iter_args", ())
        for name, init in zip(its, o.operands):
            self.env[name] = self.raw(init, o)
        lb, ub = int(self.eval(o.attr("lb"))), int(self.eval(o.attr("ub")))
        var = o.attr("var")
        self.loops.append((var, lb))
        for i in range(lb, ub):
            self.scalars[var] = i
            nxt = yield from self.run_ops(o.body)
            for name, v in zip(its, nxt or ()):
                self.env[name] = v
        self.loops.pop()
        for name, r in zip(its, o.results):
            self.env[r.name] = self.env[name]
        self.scalars["_trip"] = ub - lb

    def wait(self, bar, parity, o, g, s, lap):
        while not bar.passes(parity):
            yield Wait(bar, parity, o, g, s, lap)

    def retire_until(self, pending: int, o: Op) -> None:
        while len(self.wgmma) > pending:
            grp = self.wgmma.popleft()
            args = [self.value(x, o) for x in grp.args]
            grp.value = apply(self, grp.op, args)[0]
            for ref in grp.refs:
                self.cta.smem.slots[(ref.buf, ref.slot)].reads.remove(grp)
            self.log(o, f"retired {grp.describe()}")

    def store_wait(self, keep: int = 0) -> None:
        """tma.store_wait(keep): every store but the newest ``keep`` has read its staging slot."""
        done, self.stores = self.stores[:max(len(self.stores) - keep, 0)], self.stores[max(len(self.stores) - keep, 0):]
        for rec in done:
            st = self.cta.smem.slots[rec.key]
            if st.tag != rec.tag:
                self.fail("overwrite", f"{rec.key[0]} was overwritten before {rec.describe()} finished reading it")
            name = rec.op.attr("arg")
            note_write(self, rec.op, name, tma_store(self.tensor(name), rec.coords, st.view.clone()))
            st.reads.remove(rec)


# ---------------------------------------------------------------------------------------- sync and memory ops


def _group(pr: PartRun, o: Op):
    g = o.attr("group")
    if g not in pr.cta.groups:
        raise InterpError(f"interp: `{o.kind}` names unknown barrier group {g!r}")
    return g, pr.cta.groups[g]


def _this_step(pr: PartRun, o: Op):
    """(group, BarrierGroup, fill number, slot, lap) of the group's counter; the slot becomes the one
    that this step's gets, loads and releases use."""
    g, G = _group(pr, o)
    n = pr.counters[g]
    s, lap = n % G.count, n // G.count
    pr.slotvar[g] = (s, n)
    pr.stale.pop(g, None)
    return g, G, n, s, lap


def _acquire(pr: PartRun, o: Op):
    g, G, n, s, lap = _this_step(pr, o)
    bar = pr.cta.empty[g][s]
    yield from pr.wait(bar, (lap & 1) ^ 1, o, g, s, lap)
    pr.log(o, f"{bar.name} passed, phase {bar.completed}; slot {s}, fill n={n}")
    if bar.completed != lap:
        pr.fail("wrong-phase", f"{pr.name} waited for {bar.name} to have completed {lap} phases (fill n={n}) but "
                f"it passed with {bar.completed}: the parity matched a different phase", o, group=g, slot=s,
                phase=f"lap {lap}, parity {(lap & 1) ^ 1}")
    err = pr.cta.ready[g][s].expect(G.nbytes, pr.name)
    if err:
        pr.fail("over-arrive", err, o, group=g, slot=s)


def _wait_ready(pr: PartRun, o: Op):
    g, _, n, s, lap = _this_step(pr, o)
    bar = pr.cta.ready[g][s]
    yield from pr.wait(bar, lap & 1, o, g, s, lap)
    pr.log(o, f"{bar.name} passed, phase {bar.completed}; slot {s}, fill n={n}")
    if bar.completed != lap + 1:
        pr.fail("wrong-phase", f"{pr.name} waited for fill n={n} of slot {s} ({bar.name} phase {lap}) but the "
                f"wait passed with {bar.completed} completed phases: the parity matched a different phase",
                o, group=g, slot=s, phase=f"lap {lap}, parity {lap & 1}")
    pr.cta.claim(g, s, n, pr.name, o)


def _slotvar(pr: PartRun, o: Op, g: str):
    if g in pr.stale:
        s, n, step = pr.stale[g]
        pr.fail("stale-slot", f"{pr.name} uses the slot of group {g} at fill n={pr.counters[g]} without an "
                f"acquire/wait_ready for that fill: the last one set slot {s} for fill n={n}, and advance() at "
                f"#{step} moved the counter past it (codegen would reuse {g}_s: an old or not yet landed slot)",
                o, group=g, slot=s)
    if g not in pr.slotvar:
        pr.fail("no-wait", f"{pr.name} uses the slot of group {g} before any acquire/wait_ready set it", o, group=g)
    return pr.slotvar[g]


def _ago(pr: PartRun, g: str, G, lag: int) -> tuple[int, int]:
    """(slot, fill number) of the step ``lag`` steps before the group's counter (codegen: (n + count - lag) %
    count)."""
    n = pr.counters[g] - lag
    return n % G.count, n


def _get(pr: PartRun, o: Op):
    g, G = _group(pr, o)
    lag = o.attr("lag", 0)
    if lag:  # a deferred reader: the slot of ``lag`` steps ago
        s, n = _ago(pr, g, G, lag)
    else:
        s, n = _slotvar(pr, o, g)
    pr.env[o.results[0].name] = SlotRef(o.attr("buffer"), s, n, g)


def _load(pr: PartRun, o: Op):
    g = o.attr("group")
    if g is None:
        raise InterpError(f"interp: load %{o.results[0].name} has no barrier group; run code_partition first")
    g, G = _group(pr, o)
    s, n = _slotvar(pr, o, g)
    key = (o.attr("buffer"), s)
    if key not in pr.cta.smem.slots:
        raise InterpError(f"interp: load into unknown buffer slot {key}")
    pr.cta.begin_fill(g, s, n, pr.name, o)
    copy = TmaCopy(key, n, apply(pr, o, [])[0], pr.cta.ready[g][s], o.results[0].type.nbytes, pr.name, o,
                   pr.run.step)
    pr.cta.check_write(key, copy.describe(), pr.name, o)
    pr.cta.smem.slots[key].inflight = copy
    pr.cta.copies.append(copy)


def _release(pr: PartRun, o: Op):
    g, G = _group(pr, o)
    lag = o.attr("lag", 0)
    if lag == 0:
        s, m = _slotvar(pr, o, g)
    else:
        if o.attr("guard", True) is not False:  # guarded: only once the loop has run ``lag`` steps
            if not pr.loops:
                raise InterpError("interp: release with a lag outside a loop (codegen needs the loop variable)")
            var, lb = pr.loops[-1]
            if pr.scalars[var] - lb < lag:
                pr.log(o, f"pred false: trip {pr.scalars[var] - lb} < lag {lag}")
                return
        s, m = _ago(pr, g, G, lag)
    pr.log(o, f"arrive {g}.empty[{s}] (fill n={m})")
    pr.cta.arrive_empty(g, s, m, pr, o)


def _release_tail(pr: PartRun, o: Op):
    g, G = _group(pr, o)
    if "_trip" not in pr.scalars:
        raise InterpError("interp: release_tail before any loop (codegen reads `_trip`)")
    for j in range(1, o.attr("lag") + 1):
        if pr.scalars["_trip"] >= j:
            s, m = _ago(pr, g, G, j)
            pr.log(o, f"arrive {g}.empty[{s}] (fill n={m})")
            pr.cta.arrive_empty(g, s, m, pr, o)


def _advance(pr: PartRun, o: Op):
    g, _ = _group(pr, o)
    if g in pr.slotvar:  # the slot belongs to the fill just passed: the next step needs its own wait
        pr.stale[g] = (*pr.slotvar.pop(g), pr.run.step)
    pr.counters[g] += 1


def _trans(pr: PartRun, o: Op):
    x = pr.raw(o.operands[0], o)
    if isinstance(x, SlotRef):  # a free view of the slot: still read at the use
        pr.env[o.results[0].name] = SlotRef(x.buf, x.slot, x.tag, x.group, not x.trans)
    else:
        pr.env[o.results[0].name] = apply(pr, o, [pr.value(x, o)])[0]


def _mma(pr: PartRun, o: Op):
    vals = [pr.raw(x, o) for x in o.operands]
    refs = []
    for i, x in enumerate(vals):
        if isinstance(x, SlotRef):
            pr.cta.read_slot(x, pr.name, o)  # checked at issue and again at retire
            refs.append(x)
        elif isinstance(x, Wgmma) and not (i == 2 and x.owner is pr):
            vals[i] = pr.value(x, o)  # only the accumulator may be a wgmma still in flight
    grp = Wgmma(pr, o, pr.run.step, vals, refs)
    for ref in refs:
        pr.cta.smem.slots[(ref.buf, ref.slot)].reads.append(grp)
    pr.wgmma.append(grp)
    pr.env[o.results[0].name] = grp
    if o.attr("wait", True) is not False:
        pr.retire_until(o.attr("pending", 0), o)


def _mma_wait(pr: PartRun, o: Op):
    pr.retire_until(o.attr("pending", 0), o)
    pr.env[o.results[0].name] = pr.value(pr.raw(o.operands[0], o), o)


def _store(pr: PartRun, o: Op):
    if skipped(pr, o):  # after a split_reduce, in a CTA that did not sum the parts
        return
    x = o.operands[0]
    buf = next((b for b in pr.run.program.buffers if b.value == x and b.name.endswith("_stage")), None)
    if buf is None:
        raise InterpError(f"interp: store of %{x} has no staging buffer; run buffers/memory_plan first")
    count = buf.count or 1
    pr.store_wait(count - 1)  # tma.store_wait(count - 1): the store that last used this slot has read it
    data = pr.value(pr.raw(x, o), o)
    key = (buf.name, pr.counters[buf.name] % count)
    pr.counters[buf.name] += 1
    who = f"{pr.name}'s register store into {buf.name}"
    pr.cta.check_write(key, who, pr.name, o)
    tag = ("stage", pr.name, pr.run.step)
    pr.cta.store_slot(key, data, tag)
    yield None  # fence_async_shared(); then the TMA store is issued
    if pr.cta.smem.slots[key].tag != tag:
        pr.fail("overwrite", f"{buf.name} was overwritten between {pr.name}'s register store and its TMA store")
    rec = StoreRead(pr, o, pr.run.step, key, tag, tuple(int(pr.eval(c)) for c in o.attr("coords")))
    pr.cta.smem.slots[key].reads.append(rec)
    pr.stores.append(rec)


def _smem_store(pr: PartRun, o: Op):
    """A register tile into the partition's own SMEM buffer of the result (slot ``n % count`` of a per-partition
    counter, as the codegen's ``<buf>_n``); overwriting bytes an unretired wgmma still reads is an ``overwrite``.
    The result is a reference to the slot, read at each use."""
    r = o.results[0].name
    buf = next((b for b in pr.run.program.buffers if b.value == r), None)
    if buf is None:
        raise InterpError(f"interp: smem_store %{r} has no buffer; run buffers/memory_plan first")
    count = buf.count or 1
    key = (buf.name, pr.counters[buf.name] % count)
    pr.counters[buf.name] += 1
    data = pr.value(pr.raw(o.operands[0], o), o)
    pr.cta.check_write(key, f"{pr.name}'s smem_store into {buf.name}[{key[1]}]", pr.name, o)
    tag = ("smem_store", pr.name, pr.run.step)
    pr.cta.store_slot(key, data, tag)
    pr.env[r] = SlotRef(buf.name, key[1], tag, None)


def _turn_wait(pr: PartRun, o: Op):
    me, k = o.attr("me"), pr.turn_n
    bar = pr.cta.turn(me, o)
    parity = (k & 1) ^ (1 if me == 0 else 0)
    yield from pr.wait(bar, parity, o, "turn", me, k)
    want = k if me == 0 else k + 1  # partition 0's k-th group follows the last one's (k-1)-th pass
    if bar.completed != want:
        pr.fail("wrong-phase", f"{pr.name} waited for its turn {k} on {bar.name} ({want} passes) but the wait "
                f"passed with {bar.completed}: the parity matched a different turn", o)
    pr.log(o, f"{bar.name} passed: turn {k}")


def _turn_pass(pr: PartRun, o: Op):
    err = pr.cta.turn(o.attr("to"), o).arrive(pr.name)
    if err:
        pr.fail("over-arrive", err, o)
    pr.turn_n += 1


HANDLERS = {"tile_loop": tiles.tile_loop, "tile_next": tiles.tile_next, "turn_wait": _turn_wait,
            "turn_pass": _turn_pass, "acquire": _acquire, "wait_ready": _wait_ready, "get": _get, "load": _load,
            "release": _release,
            "release_tail": _release_tail, "advance": _advance, "seek": tiles.seek, "trans": _trans, "mma": _mma,
            "mma_wait": _mma_wait, "store": _store, "smem_store": _smem_store}
