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
    tma_reduce_add  as store, with a TMA bulk reduce-add (the tile is added, not written, at store_wait)
    smem_store   registers -> the result's own buffer, slot n % copies (checked against unretired wgmma reads)
    turn_wait    wait turn[me] with parity (turn_n & 1), ^ 1 for partition 0 (ping-pong; the barriers are
                 Program.turns', one per turn-taking partition)
    turn_pass    arrive turn[to]; turn_n += 1
    chain_sync   arrive bar (count arrivals a phase), wait bar with parity (bar_n & 1); bar_n += 1
    store_drained  store_wait(0); arrive bar (count arrivals a phase)
    wait_drained   in the loop's first trip: wait bar with parity (bar_n & 1) ^ 1; bar_n += 1
    smem_view    another chain's smem_store tile: its slot of fill n, n = the partition's own stores so far - 1
    slice        a view of a slot's columns (read at the use, as ``trans``)
    seek         n = j * per_tile for the CTA's j-th tile (a tile consumer: tile_loop ``share``)
Counters ``n`` are per partition and group and run on across loops and tiles, as does ``turn_n``.
A tile consumer (tile_loop ``share=(c, t)``) runs the CTA's j-th tiles with j % t == c; on a ring whose fills are
each released by one consumer (``arrivals`` 1, several readers) its ``wait_ready`` claims the fill: another
partition's wait for or read of that fill is a ``shared-fill`` violation (``CTA.claim``).

Here: ``PartRun`` (the coroutine, its values and counters, the scheduler's interface) and ``HANDLERS``, the op
kinds' handlers: ``barriers.py`` (rings and turns), ``async_ops.py`` (wgmma, TMA stores, SMEM slot references),
``tiles.py`` (the tile walk); other kinds run their ``ops.SEMANTICS`` on values.
"""
from __future__ import annotations

import collections

import torch

from ..ir import Op, deferred_stage_waits, op, walk
from . import tiles
from .async_ops import StoreRead, Wgmma, _mma, _mma_wait, _slice, _smem_store, _smem_view, _store, _trans
from .barriers import (
    _acquire,
    _advance,
    _chain_sync,
    _get,
    _load,
    _release,
    _release_tail,
    _store_drained,
    _turn_pass,
    _turn_wait,
    _wait_drained,
    _wait_ready,
)
from .cta import CTA, SlotRef
from .ops import apply, eval_index, note_write, tma_store
from .ops_attention import reduce_add


class Wait:
    __slots__ = ("bar", "parity", "op", "group", "slot", "lap")

    def __init__(self, bar, parity, op, group, slot, lap):
        self.bar, self.parity, self.op, self.group, self.slot, self.lap = bar, parity, op, group, slot, lap

    def ready(self) -> bool:
        return self.bar.passes(self.parity)


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
        self.deferred_waits = deferred_stage_waits(part.body)  # staged stores a later one's wait covers (codegen's)
        self.turn_n = 0
        loops = [o for o in part.body if o.kind == "tile_loop"]
        self.share = loops[0].attr("share") if loops else part.tiles  # (c, t): a tile consumer's share of the walk
        self.tile_seq = 0  # j: the CTA's j-th tile is running (a ``seek`` reads it)
        self.has_store = any(o.kind in ("store", "tma_reduce_add") for o in walk(part.body))
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
        """tma.store_wait(keep): every store (or reduce-add) but the newest ``keep`` has read its staging slot; each
        is applied to global memory now (the latest it may read the slot)."""
        done, self.stores = self.stores[:max(len(self.stores) - keep, 0)], self.stores[max(len(self.stores) - keep, 0):]
        for rec in done:
            st = self.cta.smem.slots[rec.key]
            if not rec.staged(st):
                self.fail("overwrite", f"{rec.key[0]} was overwritten before {rec.describe()} finished reading it")
            name = rec.op.attr("arg")
            if rec.op.kind == "tma_reduce_add":
                reduce_add(self, rec.op, rec.coords, rec.data(st))
            else:
                note_write(self, rec.op, name, tma_store(self.tensor(name), rec.coords, rec.data(st)))
            st.reads.remove(rec)


HANDLERS = {"tile_loop": tiles.tile_loop, "tile_next": tiles.tile_next, "turn_wait": _turn_wait,
            "turn_pass": _turn_pass, "acquire": _acquire, "wait_ready": _wait_ready, "get": _get, "load": _load,
            "release": _release,
            "release_tail": _release_tail, "advance": _advance, "seek": tiles.seek, "trans": _trans, "mma": _mma,
            "mma_wait": _mma_wait, "store": _store, "tma_reduce_add": _store, "smem_store": _smem_store,
            "chain_sync": _chain_sync, "smem_view": _smem_view, "slice": _slice, "store_drained": _store_drained,
            "wait_drained": _wait_drained}
