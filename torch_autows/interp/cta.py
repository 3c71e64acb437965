"""One simulated CTA of a partitioned Program: its SMEM, barrier rings, TMA engine and checks.

The partitions (``partitioned.PartRun``) call in here for everything that touches shared state:
``write_slot`` / ``read_slot`` check a write or read of an SMEM slot against the fills, holds and
unretired async reads of every slot it overlaps; ``arrive_empty`` releases a ring slot; the TMA
engine lands in-flight copies (``land``); ``finish`` checks at kernel end that every arrive matched a
wait (no half phases, no unreleased fills, equal group counters in every partition).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..ir import Op, Program, format_op
from .machine import GroupSlot, MBarrier, Smem
from .ops import InterpError


@dataclass(eq=False)
class SlotRef:
    """A value living in an SMEM slot (``get`` result or a ``trans`` view of one): read at its use."""

    buf: str
    slot: int
    tag: object  # the group counter of the fill the reader waited for
    group: str | None
    trans: bool = False
    cols: tuple[int, int] | None = None  # a slice: columns [cols[0], cols[1]) of the slot (before ``trans``)


@dataclass(eq=False)
class TmaCopy:
    key: tuple[str, int]
    tag: int
    data: torch.Tensor
    bar: MBarrier
    nbytes: int
    part: str
    op: Op
    step: int

    def describe(self) -> str:
        return f"TMA load into {self.key[0]}[{self.key[1]}] (fill n={self.tag}) issued by {self.part} at #{self.step}"


def _overlap(a, b) -> bool:
    """Whether column spans ``a`` and ``b`` (lo, hi) share a column; None is every column."""
    return a is None or b is None or (a[0] < b[1] and b[0] < a[1])


class CTA:
    def __init__(self, run, index: int, tiles: list[int]):
        p: Program = run.program
        self.run, self.index, self.tiles = run, index, tiles
        self.smem = Smem(p)
        self.groups = {g.name: g for g in p.groups}
        self.ready = {g.name: [MBarrier(f"{g.name}.ready[{s}]", 1) for s in range(g.count)] for g in p.groups}
        self.empty = {g.name: [MBarrier(f"{g.name}.empty[{s}]", g.arrivals) for s in range(g.count)]
                      for g in p.groups}
        self.gslots = {(g.name, s): GroupSlot() for g in p.groups for s in range(g.count)}
        self.consumers = {g.name: set() for g in p.groups}
        self.group_bufs: dict[str, list[str]] = {g.name: [] for g in p.groups}
        self.readers: dict[str, set[str]] = {}  # ring buffer -> partitions that read it
        for c in p.channels:
            if c.group in self.consumers:
                self.consumers[c.group] |= set(c.dsts)
                self.group_bufs[c.group].append(c.buffer)
                self.readers.setdefault(c.buffer, set()).update(c.dsts)
        # rings whose every fill goes to one of several readers (tile consumers: one release per fill)
        self.exclusive = {g.name for g in p.groups if g.arrivals == 1 and len(self.consumers[g.name]) > 1}
        self.copies: list[TmaCopy] = []
        self.parts: list = []
        # ping-pong turn barriers (Program.turns, made by passes/ping_pong): one per turn-taking partition
        t = p.turns
        self.turns: list[MBarrier] = [MBarrier(f"{t.name}[{j}]", 1) for j in range(t.count)] if t else []
        self.turn_parts = set(t.partitions) if t else set()
        self.meetings: dict[str, MBarrier] = {}  # chain_sync barriers, by name

    def turn(self, i: int, o: Op) -> MBarrier:
        """Turn barrier ``i`` (``o``: the turn op naming it; one the program's turn group lacks is an error)."""
        if not 0 <= i < len(self.turns):
            raise InterpError(f"interp: `{format_op(o)[0].strip()}` names turn barrier {i}, but the program has "
                              f"{len(self.turns)} (Program.turns; passes/ping_pong makes it with the turn ops)")
        return self.turns[i]

    def meeting(self, name: str, o: Op) -> MBarrier:
        """The consumer chains' meeting barrier ``name`` (``chain_sync``), made at its first use with the op's
        ``count`` arrivals a phase; a ``chain_sync`` naming it with another count is an error."""
        bar = self.meetings.get(name)
        if bar is None:
            bar = self.meetings[name] = MBarrier(name, o.attr("count"))
        if bar.count != o.attr("count"):
            raise InterpError(f"interp: `{format_op(o)[0].strip()}` meets on {name} with count {o.attr('count')}, "
                              f"another chain_sync with {bar.count}: one count per barrier (the verifier checks it)")
        return bar

    def fail(self, kind, msg, part=None, op=None, **kw):
        self.run.fail(kind, msg, cta=self.index, partition=part, op=op, **kw)

    # ------------------------------------------------------------------------------------ SMEM access

    def check_write(self, key, who: str, part: str, o: Op, exempt=None, cols=None) -> None:
        """``who`` is about to write slot ``key`` (``cols``: only those columns): nothing may still read, fill or hold
        those bytes."""
        for k in [key, *self.smem.overlaps[key]]:
            st = self.smem.slots[k]
            where = f"{k[0]}[{k[1]}]" + ("" if k == key else f" (shares bytes with {key[0]}[{key[1]}])")
            reads = [r for r in st.reads if k != key or _overlap(cols, getattr(r, "cols", None))]
            if reads:
                self.fail("overwrite", f"{who} overwrites {where} while {reads[0].describe()} has not "
                          f"retired its read", part, o, slot=key[1])
            if st.inflight is not None and st.inflight is not exempt:
                self.fail("overwrite", f"{who} overwrites {where} while {st.inflight.describe()} has not landed",
                          part, o, slot=key[1])
            g = self.smem.group_of.get(k[0])
            if k != key and g is not None:  # bytes of another ring slot: do its readers still need them?
                gs = self.gslots[(g, k[1])]
                need = gs.outstanding & self.readers[k[0]]
                if need:
                    self.fail("overwrite", f"{who} overwrites {where}, which holds fill n={gs.fill} of group {g} "
                              f"not yet released by its reader(s) {sorted(need)}", part, o, group=g, slot=k[1])

    def store_slot(self, key, data: torch.Tensor, tag, cols=None) -> None:
        """``data`` into slot ``key`` (``cols``: into those columns only; the slot keeps its fill's tag for the others
        and records the write's tag for them, ``SlotState.cols``)."""
        st = self.smem.slots[key]
        if cols is None:
            st.view.copy_(data)
            st.tag, st.cols = tag, {}
        else:
            st.view[:, cols[0]:cols[1]].copy_(data)
            st.cols[cols] = tag
        for k in self.smem.overlaps[key]:
            self.smem.slots[k].tag = ("clobbered", key, tag)

    def read_slot(self, ref: SlotRef, part: str, o: Op) -> torch.Tensor:
        """The data of ``ref``'s slot, after checking it holds the fill its reader waited for."""
        key = (ref.buf, ref.slot)
        st = self.smem.slots.get(key)
        if st is None:
            self.fail("bad-slot", f"{ref.buf}[{ref.slot}] does not exist", part, o)
        g = ref.group
        phase = f"lap {ref.tag // self.groups[g].count}" if g and isinstance(ref.tag, int) else None
        if st.inflight is not None:
            self.fail("unfilled-read", f"{part} reads {ref.buf}[{ref.slot}] before its TMA fill landed "
                      f"({st.inflight.describe()}): the ready wait did not cover it", part, o, group=g,
                      slot=ref.slot, phase=phase)
        if st.tag != ref.tag:
            if st.tag is None:
                what = "it was never filled"
            elif isinstance(st.tag, tuple) and st.tag[0] == "smem_store":
                what = f"it holds register store n={st.tag[2]} of {st.tag[1]}"
            elif isinstance(st.tag, tuple):
                what = f"its bytes were overwritten by {st.tag[1][0]}[{st.tag[1][1]}]" if st.tag[0] == "clobbered" \
                    else "it holds another partition's register store"
            else:
                what = f"it holds fill n={st.tag} (a different phase of the ring)"
            self.fail("unfilled-read", f"{part} reads {ref.buf}[{ref.slot}] expecting fill n={ref.tag}, but {what}",
                      part, o, group=g, slot=ref.slot, phase=phase)
        if g is not None:
            gs = self.gslots[(g, ref.slot)]
            if g in self.exclusive and gs.fill == ref.tag and gs.owner != part:
                self.fail("shared-fill", f"{part} reads {ref.buf}[{ref.slot}] (fill n={ref.tag}), a fill of group {g} "
                          f"that {gs.owner or 'no partition'} waited for: each fill of this ring belongs to one "
                          f"consumer's tile", part, o, group=g, slot=ref.slot)
            if gs.fill == ref.tag and part not in gs.outstanding and part in self.consumers[g]:
                self.fail("use-after-release", f"{part} reads {ref.buf}[{ref.slot}] (fill n={ref.tag}) after "
                          f"releasing it: the producer may already refill it", part, o, group=g, slot=ref.slot)
        for c in st.cols:
            if _overlap(c, ref.cols):
                self.fail("unfilled-read", f"{part} reads {ref.buf}[{ref.slot}] expecting fill n={ref.tag}, but its "
                          f"columns {c[0]}..{c[1]} hold a staged store's tile since", part, o, group=g, slot=ref.slot,
                          phase=phase)
        data = st.view.clone()
        if ref.cols is not None:
            data = data[:, ref.cols[0]:ref.cols[1]]
        return data.transpose(0, 1) if ref.trans else data

    # ------------------------------------------------------------------------------------ rings

    def begin_fill(self, g: str, s: int, n: int, part: str, o: Op) -> None:
        gs = self.gslots[(g, s)]
        if gs.fill == n:
            return
        if gs.outstanding:
            self.fail("overwrite", f"{part} refills slot {s} of group {g} (fill n={n}) before "
                      f"{sorted(gs.outstanding)} released its fill n={gs.fill}", part, o, group=g, slot=s,
                      phase=f"lap {n // self.groups[g].count}")
        gs.fill, gs.outstanding, gs.owner = n, set(self.consumers[g]), None
        gs.fills += 1

    def claim(self, g: str, s: int, n: int, part: str, o: Op) -> None:
        """``part`` passed the ready wait of fill ``n`` in slot ``s``: on a ring whose fills each belong to one
        consumer (``exclusive``) the fill becomes ``part``'s, and only it releases it; a second claimer is a
        ``shared-fill`` violation (two tile consumers at one ring position)."""
        gs = self.gslots[(g, s)]
        if g not in self.exclusive or gs.fill != n:  # a wait on the wrong phase is reported by the wait
            return
        if gs.owner is not None and gs.owner != part:
            self.fail("shared-fill", f"{part} waited for fill n={n} of group {g} (slot {s}), which {gs.owner} "
                      f"already took: each fill goes to the one consumer whose tile it holds (their seeks disagree)",
                      part, o, group=g, slot=s)
            return
        gs.owner = part
        gs.outstanding &= {part}

    def arrive_empty(self, g: str, s: int, m: int, part, o: Op) -> None:
        """``part`` releases slot ``s`` of group ``g``, meaning its fill n=``m``."""
        gs = self.gslots[(g, s)]
        who = part.name
        if gs.fill != m:
            self.fail("bad-release", f"{who} releases slot {s} of group {g} as fill n={m}, but the slot holds "
                      f"fill n={gs.fill}: its counter is out of step with the producer's", who, o, group=g, slot=s)
        if who not in gs.outstanding:
            self.fail("over-arrive", f"{who} releases slot {s} of group {g} (fill n={m}) that it does not hold "
                      f"(released twice, or never received)", who, o, group=g, slot=s)
        for buf in self.group_bufs[g]:
            for r in self.smem.slots[(buf, s)].reads:
                if getattr(r, "owner", None) is part and r.value is None:
                    self.fail("release-before-retire", f"{who} releases slot {s} of group {g} while "
                              f"{r.describe()} still reads {buf}[{s}]", who, o, group=g, slot=s)
        gs.outstanding.discard(who)
        err = self.empty[g][s].arrive(who)
        if err:
            self.fail("over-arrive", err, who, o, group=g, slot=s)

    # ------------------------------------------------------------------------------------ TMA engine

    def land(self, copy: TmaCopy) -> None:
        self.copies.remove(copy)
        st = self.smem.slots[copy.key]
        self.check_write(copy.key, copy.describe(), copy.part, copy.op, exempt=copy)
        self.store_slot(copy.key, copy.data, copy.tag)
        st.inflight = None
        err = copy.bar.complete_tx(copy.nbytes)
        if err:
            self.fail("over-arrive", err, copy.part, copy.op, slot=copy.key[1])

    # ------------------------------------------------------------------------------------ kernel end

    def finish(self) -> None:
        """Every wait matched one arrive: equal counters, no unreleased fill, no half phase, equal turns."""
        turns = {pt.name: pt.turn_n for pt in self.parts if pt.turn_n or pt.name in self.turn_parts}
        if self.run.program.turns is not None and self.run.program.turns.scope == "mainloop":
            # tile consumers: one turn per tile each ran (the CTA's j-th tiles with j % t == c)
            want = {pt.name: len(range(pt.share[0], len(self.tiles), pt.share[1])) for pt in self.parts
                    if pt.share is not None}
            if turns != want:
                self.fail("unbalanced", f"main-loop turns at kernel end {turns}, but the tile consumers ran {want} "
                          f"tiles (one turn per tile)")
        elif len(set(turns.values())) > 1:
            self.fail("unbalanced", f"ping-pong turns differ at kernel end: {turns} (every compute partition must "
                      f"issue the same mma groups per tile)")
        for bar in self.meetings.values():  # every chain met as often as the others
            if bar.pending != bar.count:
                self.fail("unbalanced", f"half a meeting left at kernel end: {bar.state()} (every chain_sync partition "
                          f"must meet as often as the others)")
        for g, G in self.groups.items():
            counts = {pt.name: pt.counters[g] for pt in self.parts if g in pt.counters}
            # tile consumers end at their own last tile's end; the one that ran the CTA's last tile at the walkers'
            shares = {pt.name: counts.pop(pt.name) for pt in self.parts if pt.share is not None and pt.name in counts}
            if len(set(counts.values())) > 1 or (shares and counts and (
                    max(shares.values()) != max(counts.values()) or not self.tiles and any(shares.values()))):
                self.fail("unbalanced", f"group {g} counters differ at kernel end: {counts} (every acquire needs "
                          f"one wait_ready per consumer)" + (f"; tile consumers {shares} (the one that ran the "
                                                              f"CTA's last tile must end where the producer does)"
                                                              if shares else ""), group=g)
            for s in range(G.count):
                gs = self.gslots[(g, s)]
                if gs.outstanding:
                    self.fail("unbalanced", f"slot {s} of group {g}: fill n={gs.fill} never released by "
                              f"{sorted(gs.outstanding)} at kernel end", group=g, slot=s)
                for bar in (self.ready[g][s], self.empty[g][s]):
                    if bar.pending != bar.count or bar.tx:
                        self.fail("unbalanced", f"half a phase left at kernel end: {bar.state()}", group=g, slot=s)
                if self.empty[g][s].completed != gs.fills or self.ready[g][s].completed != gs.fills:
                    self.fail("unbalanced", f"slot {s} of group {g} was filled {gs.fills} times but "
                              f"{self.ready[g][s].state()} and {self.empty[g][s].state()}", group=g, slot=s)
