"""Schedulers and the partitioned run loop.

Agents are the partitions of every simulated CTA plus one TMA engine per CTA (it lands in-flight
copies). Each step the policy picks one runnable agent: a partition runs up to its next op or
blocked wait, the TMA engine lands one copy. Policies:
    round_robin    agents in a fixed order, the next runnable after the last one picked
    random         seeded uniform choice, with a seeded "stickiness" so some runs take long bursts
    adversarial    the producer runs as far ahead as its barriers allow, the other partitions are
                   resumed in reverse order, one chosen consumer (by seed) is starved as long as
                   possible; the seed also picks whether TMA copies land eagerly or as late as possible
No runnable agent while a partition is unfinished is a deadlock; at the end every CTA checks that its
arrives and waits balanced (``CTA.finish``).
"""
from __future__ import annotations

import random

from ..ir import Grid, Program, format_op
from .cta import CTA
from .machine import Events, GlobalWrites, Violation
from .ops import InterpError, one_thread
from .partitioned import PartRun
from .sequential import num_tiles, split_inputs

POLICIES = ("round_robin", "random", "adversarial")
#: Violations after which the run can go on (the data is wrong, the control flow is intact): in recording
#: mode they are collected and the run continues, so their effect on the outputs can be seen.
RECOVERABLE = {"overwrite", "unfilled-read", "use-after-release", "wrong-phase", "over-arrive", "bad-release",
               "release-before-retire", "unbalanced", "global-race", "shared-fill"}


def walked_grid(program: Program) -> Grid:
    """The grid the partitions walk: their ``tile_loop``'s (passes/tile_loop; verify keeps every one equal to
    ``Program.grid``), or ``Program.grid`` for bodies from before that pass (each body is one tile's)."""
    for pt in program.partitions:
        for o in pt.body:
            if o.kind == "tile_loop":
                return Grid.of(o)
    return program.grid


def cta_tiles(grid: Grid, pid: int, nprog: int, tiles: int) -> list[int]:
    """The linear tile ids CTA ``pid`` of ``nprog`` walks, in order, as a ``tile_loop`` of ``grid`` says
    (codegen.emitters.tile_lines): persistent ``pid, pid + nprog, ...`` (serpentine: odd waves reversed), else
    the one tile ``pid``."""
    if not grid.persistent:
        return [pid]
    out = []
    for t in range(pid, tiles, nprog):
        if grid.serpentine:
            wave0 = t // nprog * nprog
            size = min(nprog, tiles - wave0)
            t = t + (t // nprog % 2) * (2 * wave0 + size - 1 - 2 * t)
        out.append(t)
    return out


class TmaAgent:
    name = "tma"
    produces = False

    def __init__(self, cta: CTA, policy):
        self.cta, self.policy = cta, policy

    @property
    def done(self) -> bool:
        return not self.cta.copies

    def runnable(self) -> bool:
        return bool(self.cta.copies)

    def step(self) -> None:
        copy = self.policy.pick_copy(self.cta.copies)
        self.cta.run.events.add(self.cta.run.step, self.cta.index, "tma", None, f"landed {copy.describe()}")
        self.cta.land(copy)


class Policy:
    name = "policy"

    def __init__(self, seed: int = 0):
        self.seed = seed
        self.rng = random.Random(seed)

    def setup(self, agents: list) -> None:
        self.agents = agents

    def pick(self, runnable: list):
        raise NotImplementedError

    def pick_copy(self, copies: list):
        return copies[0]

    def __str__(self) -> str:
        return f"{self.name}(seed={self.seed})"


class RoundRobin(Policy):
    name = "round_robin"

    def setup(self, agents):
        super().setup(agents)
        self.pos = {id(a): i for i, a in enumerate(agents)}
        self.last = -1

    def pick(self, runnable):
        n = len(self.agents)
        a = min(runnable, key=lambda a: (self.pos[id(a)] - self.last - 1) % n)
        self.last = self.pos[id(a)]
        return a


class RandomPolicy(Policy):
    name = "random"

    def setup(self, agents):
        super().setup(agents)
        self.sticky = self.rng.choice((0.0, 0.5, 0.9))
        self.last = None

    def pick(self, runnable):
        if self.last is not None and self.last in runnable and self.rng.random() < self.sticky:
            return self.last
        self.last = self.rng.choice(runnable)
        return self.last

    def pick_copy(self, copies):
        return self.rng.choice(copies)


class Adversarial(Policy):
    name = "adversarial"

    def setup(self, agents):
        super().setup(agents)
        parts = [a for a in agents if isinstance(a, PartRun)]
        names = list(dict.fromkeys(a.name for a in parts))
        consumers = [n for n in names if not any(a.produces for a in parts if a.name == n)]
        self.starved = consumers[self.seed % len(consumers)] if consumers else None
        self.eager_tma = (self.seed // max(len(consumers), 1)) % 2 == 0
        rank = {}
        for i, n in enumerate(reversed(names)):
            producer = any(a.produces for a in parts if a.name == n)
            rank[n] = 0 if producer else 1000 if n == self.starved else 10 + i
        tma_rank = 1 if self.eager_tma else 500

        def key(a):
            return (rank[a.name] if isinstance(a, PartRun) else tma_rank, -a.cta.index)

        self.order = {id(a): key(a) for a in agents}

    def pick(self, runnable):
        return min(runnable, key=lambda a: self.order[id(a)])

    def pick_copy(self, copies):
        return copies[-1] if self.seed % 2 else copies[0]

    def __str__(self) -> str:
        tma = "eager" if self.eager_tma else "late"
        return f"adversarial(seed={self.seed}: starve {self.starved}, TMA lands {tma})"


def make_policy(name: str, seed: int = 0) -> Policy:
    cls = {"round_robin": RoundRobin, "random": RandomPolicy, "adversarial": Adversarial}.get(name)
    if cls is None:
        raise ValueError(f"interp: unknown policy {name!r}; choose from {POLICIES}")
    return cls(seed)


class Run:
    """One execution of a partitioned Program over the whole grid under one policy."""

    def __init__(self, program: Program, inputs: dict, *, nprog: int = 2, policy: Policy | str = "round_robin",
                 seed: int = 0, events: int = 40, max_steps: int = 10_000_000, violations: list | None = None):
        if not program.partitions or not all(pt.body for pt in program.partitions):
            raise InterpError(f"interp: program {program.name} is not partitioned; run passes.pipeline first")
        self.program = program
        self.tensors, self.scalars = split_inputs(program, inputs)
        self.policy = make_policy(policy, seed) if isinstance(policy, str) else policy
        self.events = Events(events)
        self.step = 0
        self.max_steps = max_steps
        self.violations = violations
        self.writes = GlobalWrites()  # which CTA wrote each output element, and how (a ``global-race`` check)
        grid = walked_grid(program)
        tiles = num_tiles(grid, self.scalars)
        ctas = min(nprog, tiles) if grid.persistent else tiles
        self.ctas = [CTA(self, pid, cta_tiles(grid, pid, nprog, tiles)) for pid in range(ctas)]
        self.agents: list = []
        for cta in self.ctas:
            cta.parts = [PartRun(cta, pt) for pt in program.partitions]
            self.agents += cta.parts
        self.agents += [TmaAgent(cta, self.policy) for cta in self.ctas]

    def fail(self, kind, msg, **kw):
        v = Violation(kind, msg, step=self.step, policy=str(self.policy), events=self.events.lines(), **kw)
        if self.violations is not None and kind in RECOVERABLE:
            if len(self.violations) < 1000:
                self.violations.append(v)
            return
        raise v

    def execute(self) -> dict:
        with one_thread():
            return self._execute()

    def _execute(self) -> dict:
        self.policy.setup(self.agents)
        agents = self.agents
        while True:
            runnable = [a for a in agents if not a.done and a.runnable()]
            if not runnable:
                if all(a.done for a in agents):
                    break
                self._deadlock()
            (runnable[0] if len(runnable) == 1 else self.policy.pick(runnable)).step()
            self.step += 1
            if self.step > self.max_steps:
                self.fail("livelock", f"no end after {self.max_steps} steps")
        for cta in self.ctas:
            cta.finish()
        return {a.name: self.tensors[a.name] for a in self.program.args if a.out}

    def _deadlock(self):
        blocked = [a for a in self.agents if isinstance(a, PartRun) and not a.done]
        lines = []
        for a in blocked:
            w = a.waiting
            lines.append(f"cta{a.cta.index} {a.name} blocked at `{format_op(w.op)[0].strip()}`: waits for "
                         f"{w.bar.name} with parity {w.parity} (lap {w.lap}); {w.bar.state()}")
        w = blocked[0].waiting
        self.fail("deadlock", "every live partition is blocked and no TMA copy is in flight:\n    " +
                  "\n    ".join(lines), cta=blocked[0].cta.index, partition=blocked[0].name, op=w.op, group=w.group,
                  slot=w.slot, phase=f"lap {w.lap}, parity {w.parity}")


def run_partitioned(program: Program, inputs: dict, *, policy: Policy | str = "round_robin", seed: int = 0,
                    nprog: int = 2, events: int = 40, stats: dict | None = None,
                    violations: list | None = None) -> dict:
    """Run a Program after code_partition on ``nprog`` simulated persistent CTAs (one CTA per tile when
    not persistent) under a scheduling policy; raises ``Violation`` on a schedule bug. Out tensors in
    ``inputs`` are written in place and returned by name; ``stats`` (a dict) receives steps and CTAs.
    With a ``violations`` list, violations that leave the control flow intact (``RECOVERABLE``) are
    appended to it and the run goes on (their wrong data reaches the outputs); the rest still raise."""
    run = Run(program, inputs, nprog=nprog, policy=policy, seed=seed, events=events, violations=violations)
    out = run.execute()
    if stats is not None:
        stats.update(steps=run.step, ctas=len(run.ctas), policy=str(run.policy))
    return out
