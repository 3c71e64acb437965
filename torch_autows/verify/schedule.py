"""Loop schedules: from loop_schedule on, loop ops have distinct orders and stages that respect their defs'
latencies (``_check_schedule``); from software_pipeline on, a partition loop whose ops span two stages runs its
late ops one step behind (``_check_pipelined``)."""
from __future__ import annotations

from ..ir import Program, walk
from ..ir.kinds import LATENCY
from .base import _fail


def _check_schedule(p: Program, stage: str):
    for loop in (o for o in walk(p.body) if o.kind == "loop"):
        index = {r.name: o for o in loop.body for r in o.results}
        orders = [o.order for o in loop.body if o.kind != "yield"]
        if None in orders or sorted(orders) != list(range(len(orders))) and len(set(orders)) != len(orders):
            _fail(stage, "loop ops need distinct orders", loop)
        for o in loop.body:
            if o.kind == "yield":
                continue
            if o.stage is None:
                _fail(stage, "op in a loop has no stage", o)
            for x in o.operands:
                d = index.get(x)
                need = d.stage + LATENCY.get(d.kind, 0) if d is not None else 0
                if d is not None and o.stage < need:
                    _fail(stage, f"uses %{x} at stage {o.stage} before its def's stage {d.stage} + latency", o)
                if d is not None and d.order > o.order:
                    _fail(stage, f"ordered before the def of %{x}", o)


def _check_pipelined(p: Program, stage: str):
    """passes/software_pipeline: in a partition loop whose ops span two stages and that runs at least once, ops
    of the last stage read nothing of the current step's earlier stages (an early op's result, a ring slot got
    this step, or a wait retiring an early mma): they run one step behind, on carried values and lagged gets."""
    for pt in p.partitions:
        for loop in (o for o in walk(pt.body) if o.kind == "loop"):
            stages = {o.stage for o in loop.body if o.stage is not None}
            if len(stages) < 2 or loop.attr("min_trip", 0) < 1:
                continue
            last, early = max(stages), set()
            for o in loop.body:
                if (o.stage is not None and o.stage < last) or (o.kind == "get" and not o.attr("lag")) or \
                        (o.stage is None and o.operands and o.operands[0] in early):
                    early.update(r.name for r in o.results)
            for o in loop.body:
                bad = [x for x in o.operands if x in early] if o.stage == last else []
                if bad:
                    _fail(stage, f"{pt.name}: a stage-{last} op reads %{bad[0]} of the same step's earlier stage: a "
                          f"loop whose ops span two stages must be software pipelined (late ops one step behind)", o)
