"""The simulated hardware of one CTA: mbarriers with phases, SMEM as real bytes, slot bookkeeping.

``MBarrier`` follows PTX: a phase completes when its pending arrivals reach 0 and its transaction
count is 0; ``expect`` adds bytes and arrives; ``wait(parity)`` passes while the current phase's
parity differs from ``parity`` (parity waits cannot tell phase k from k+2: the interpreter also
keeps the full phase count, so a wait satisfied by the wrong phase is reported).

``Smem`` is one byte array with every buffer slot a typed view at ``offset + slot * tile bytes``, so
buffers that share bytes (memory_plan reuse) really alias. Per slot it records the fill tag (the
group counter value of the TMA fill that wrote it), an in-flight TMA write, and unretired async
reads (wgmma operands, TMA stores); per ring slot (group, slot) the consumers that have not yet
released its current fill. Writes check all of that against every overlapping slot.
"""
from __future__ import annotations

import collections
import re
from dataclasses import dataclass, field

import torch

from ..ir import Op, Program, format_op
from .ops import TORCH_DTYPE

_ANN = re.compile(r" \[(?:chain|partition|stage|order)=[^\]]*\]$")  # pass annotations: noise in a trace


class Violation(AssertionError):
    """A schedule bug found by the interpreter, with where it happened and the events before it."""

    def __init__(self, kind: str, message: str, *, cta=None, partition=None, op: Op | None = None, group=None,
                 slot=None, phase=None, step=None, policy=None, events=()):
        self.kind, self.message, self.cta, self.partition, self.op = kind, message, cta, partition, op
        self.policy = policy
        self.group, self.slot, self.phase, self.step, self.events = group, slot, phase, step, list(events)
        super().__init__(self.trace())

    def trace(self) -> str:
        lines = [f"violation [{self.kind}]: {self.message}"]
        where = [f"{k}={v}" for k, v in (("step", self.step), ("cta", self.cta), ("partition", self.partition),
                                          ("group", self.group), ("slot", self.slot), ("phase", self.phase),
                                          ("policy", self.policy))
                 if v is not None]
        if where:
            lines.append("  at " + " ".join(where))
        if self.op is not None:
            lines.append(f"  op: {format_op(self.op)[0].strip()}")
        if self.events:
            lines.append(f"  last {len(self.events)} events:")
            lines += ["    " + e for e in self.events]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.trace()


class Events:
    """A ring of the last ``n`` events, formatted only when a violation prints them."""

    def __init__(self, n: int = 40):
        self.ring: collections.deque = collections.deque(maxlen=n)

    def add(self, step, cta, who, o: Op | None, detail: str = "") -> None:
        last = self.ring[-1] if self.ring else None
        if detail and last is not None and last[:4] == (step, cta, who, o):  # a detail for the op just logged
            detail = f"{last[4]}; {detail}" if last[4] else detail
            self.ring[-1] = (step, cta, who, o, detail)
            return
        self.ring.append((step, cta, who, o, detail))

    def lines(self) -> list[str]:
        out = []
        for step, cta, who, o, detail in self.ring:
            text = _ANN.sub("", format_op(o)[0].strip()) if o is not None else ""
            if len(text) > 100:
                text = text[:97] + "..."
            sep = "  -- " if text and detail else ""
            out.append(f"#{step} cta{cta} {who}: {text}{sep}{detail}")
        return out


class MBarrier:
    __slots__ = ("name", "count", "pending", "tx", "completed", "arrivers")

    def __init__(self, name: str, count: int):
        self.name, self.count = name, count
        self.pending, self.tx, self.completed = count, 0, 0
        self.arrivers: list[str] = []

    def passes(self, parity: int) -> bool:
        return (self.completed & 1) != parity

    def _maybe_complete(self) -> None:
        if self.pending == 0 and self.tx == 0:
            self.completed += 1
            self.pending = self.count
            self.arrivers = []

    def arrive(self, who: str) -> str | None:
        """Arrive once; returns an error text for an over-arrival (None when fine)."""
        if self.pending == 0:
            return f"{self.name} over-arrived by {who}: its phase {self.completed} already has all " \
                   f"{self.count} arrivals (waiting for {self.tx} transaction bytes)"
        if who in self.arrivers and self.count > 1:
            return f"{who} arrived twice on {self.name} in phase {self.completed} " \
                   f"(arrivals so far: {self.arrivers}); each releasing partition arrives once per phase"
        self.pending -= 1
        self.arrivers.append(who)
        self._maybe_complete()
        return None

    def expect(self, nbytes: int, who: str) -> str | None:
        self.tx += nbytes
        return self.arrive(who)

    def complete_tx(self, nbytes: int) -> str | None:
        self.tx -= nbytes
        if self.tx < 0 and self.pending == 0:
            return f"{self.name} received {-self.tx} transaction bytes more than its expect"
        self._maybe_complete()
        return None

    def state(self) -> str:
        return f"{self.name}: phase {self.completed} (parity {self.completed & 1}), " \
               f"{self.count - self.pending}/{self.count} arrivals, {self.tx} tx bytes pending"


@dataclass
class SlotState:
    lo: int
    hi: int
    view: torch.Tensor
    tag: object = None  # None: never written; int: the group counter of its fill; tuple: other writer
    inflight: object = None  # the TMA copy writing it, until it lands
    reads: list = field(default_factory=list)  # unretired async reads (objects with .describe())
    # columns (lo, hi) of the slot a staged store wrote since its fill (an epilogue in column chunks), with that
    # write's tag: the rest of the slot still holds the fill ``tag`` names
    cols: dict = field(default_factory=dict)


@dataclass
class GroupSlot:
    fill: int | None = None  # group counter value of the current fill
    outstanding: set = field(default_factory=set)  # consumers that have not released it
    fills: int = 0
    owner: str | None = None  # a ring whose fills each go to one consumer (tile consumers): who waited for it


class Smem:
    """Every buffer slot of a partitioned Program as an aliasing view into one byte array."""

    def __init__(self, program: Program):
        size = max([b.offset + b.nbytes for b in program.buffers] or [0])
        self.mem = torch.full((size,), 0xFF, dtype=torch.uint8)  # 0xFFFF is NaN in bf16 / fp16: garbage
        self.slots: dict[tuple[str, int], SlotState] = {}
        self.group_of: dict[str, str] = {}
        for c in program.channels:
            if c.group is not None:
                self.group_of[c.buffer] = c.group
        for b in program.buffers:
            if b.count is None or b.offset is None:
                raise ValueError(f"interp: buffer {b.name} has no count/offset; run memory_plan first")
            step = b.type.nbytes
            for s in range(b.count):
                lo = b.offset + s * step
                view = self.mem[lo:lo + step].view(TORCH_DTYPE[b.type.dtype]).view(b.type.shape)
                self.slots[(b.name, s)] = SlotState(lo, lo + step, view)
        keys = list(self.slots)
        self.overlaps: dict[tuple[str, int], list[tuple[str, int]]] = {k: [] for k in keys}
        for i, a in enumerate(keys):
            for b in keys[i + 1:]:
                sa, sb = self.slots[a], self.slots[b]
                if sa.lo < sb.hi and sb.lo < sa.hi:
                    self.overlaps[a].append(b)
                    self.overlaps[b].append(a)


class GlobalWrites:
    """Who wrote each element of the kernel's outputs in one launch, and how: a plain store (``store``,
    ``store_ptr``, ``store_vec``) or an atomic add (``atomic_add_ptr``). Two writers (CTAs; tiles in the
    sequential interpreter) may both add to an element, but an element one of them stores plainly must have no
    other writer: its final value would depend on which ran last (a ``global-race``)."""

    NONE, MANY = -1, -2

    def __init__(self):
        self.plain: dict[str, torch.Tensor] = {}  # arg -> writer of each element by plain store (-1: none)
        self.atomic: dict[str, torch.Tensor] = {}  # arg -> writer of each element by atomic add (-2: several)

    def _table(self, d: dict, name: str, numel: int) -> torch.Tensor:
        t = d.get(name)
        if t is None:
            t = d[name] = torch.full((numel,), self.NONE, dtype=torch.int64)
        return t

    def record(self, name: str, numel: int, offs: torch.Tensor, writer: int, atomic: bool) -> str | None:
        """Note that ``writer`` wrote elements ``offs`` (flat) of output ``name``; a message if that races."""
        if offs.numel() == 0:
            return None
        plain, adds = self._table(self.plain, name, numel), self._table(self.atomic, name, numel)
        p, a = plain[offs], adds[offs]
        other_plain = (p != self.NONE) & (p != writer)
        clash = other_plain if atomic else other_plain | ((a != self.NONE) & (a != writer))
        if clash.any():
            i = int(clash.nonzero()[0])
            was = int(p[i]) if bool(other_plain[i]) else int(a[i])
            how = "plain store" if bool(other_plain[i]) else "atomic add"
            by = "several writers" if was == self.MANY else f"writer {was}"
            return (f"element {int(offs[i])} of {name} is written by writer {writer} "
                    f"({'atomic add' if atomic else 'plain store'}) and by {by} ({how}) in one launch: a plain "
                    f"store must be the only write of its element (accumulate with atomic_add_ptr, or give each "
                    f"CTA its own rows)")
        if atomic:
            adds[offs] = torch.where((a == self.NONE) | (a == writer), torch.full_like(a, writer),
                                     torch.full_like(a, self.MANY))
        else:
            plain[offs] = writer
        return None
