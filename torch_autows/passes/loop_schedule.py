"""loop_schedule: a software-pipeline schedule for every loop: each body op's ``stage`` and ``order``.

Assumes: data_partition ran (ops carry chains); loop bodies end in ``yield``.
Guarantees: every non-yield op in a loop has ``stage`` and ``order``; a use is at a stage >= its
def's stage plus the def's latency; ``order`` is a topological order of the body, earlier stages
first (so the next step's asynchronous work is issued before this step's dependent work); an
``mma`` whose result only feeds the loop-carried accumulator, read next step only as the same mma's
accumulator, gets ``pending`` = how many async wgmma groups may stay in flight
(``options.mma_pending``, at most 1); every other mma (e.g. attention's P V, whose accumulator is
rescaled by softmax first) gets ``pending=0``.

Algorithm: ASAP list scheduling over the body's def-use DAG (loop-carried edges excluded) with
latencies in stages: a TMA load's data is consumed one stage later (its copy overlaps the step
before), everything else in the same stage. The stage distance of a cross-partition edge becomes
the minimum ring depth memory_plan must give its buffer.
"""
from __future__ import annotations

from dataclasses import replace

from ..ir import Op, Program

LATENCY = {"load": 1}


def _schedule(loop: Op, opts) -> Op:
    body = list(loop.body)
    index = {r.name: i for i, o in enumerate(body) for r in o.results}
    stage: dict[int, int] = {}
    for i, o in enumerate(body):
        if o.kind == "yield":
            continue
        s = 0
        for x in o.operands:
            j = index.get(x)
            if j is not None:
                s = max(s, stage[j] + LATENCY.get(body[j].kind, 0))
        stage[i] = s
    carried = set(loop.body[-1].operands)
    users: dict[str, list[Op]] = {}
    for o in body:
        for x in o.operands:
            users.setdefault(x, []).append(o)
    ranked = sorted(stage, key=lambda i: (stage[i], i))
    order = {i: n for n, i in enumerate(ranked)}
    out = []
    for i, o in enumerate(body):
        if o.kind == "yield":
            out.append(o)
            continue
        if o.body:
            o = _schedule(o, opts)
        new = replace(o, stage=stage[i], order=order[i])
        if o.kind == "mma":
            # async only if the result is just carried to the next step, where it is nothing but the
            # accumulator of this mma again (wgmma on one accumulator is ordered; any other reader
            # would see registers the tensor core is still writing)
            r = o.results[0].name
            only_carried = r in carried and all(u.kind == "yield" for u in users.get(r, []))
            its = dict(zip(loop.body[-1].operands, loop.attr("iter_args")))
            it = its.get(r)
            acc_only = it is not None and len(o.operands) == 3 and o.operands[2] == it and \
                all(u is o or (u.kind == "mma" and u.operands[2:] == (it,)) for u in users.get(it, []))
            new = new.with_attrs(pending=min(opts.mma_pending, 1) if only_carried and acc_only else 0)
        out.append(new)
    return replace(loop, body=tuple(out))


def run(program: Program, options=None) -> Program:
    opts = options or program.options
    body = tuple(_schedule(o, opts) if o.kind == "loop" else o for o in program.body)
    return replace(program, body=body)
