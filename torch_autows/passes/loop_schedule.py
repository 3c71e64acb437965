"""loop_schedule: a software-pipeline schedule for every loop: each body op's ``stage`` and ``order``.

Assumes: data_partition ran (ops carry chains); loop bodies end in ``yield``.
Guarantees: every non-yield op in a loop has ``stage`` and ``order``; a use is at a stage >= its
def's stage plus the def's latency; ``order`` is a topological order of the body, earlier stages
first (so the next step's asynchronous work is issued before this step's dependent work); an
``mma`` whose result only feeds the loop-carried accumulator, read next step only as the same mma's
accumulator, gets ``pending`` = how many async wgmma groups may stay in flight
(``options.mma_pending``, at most 1); every other mma (e.g. attention's P V, whose accumulator is
rescaled by softmax first) gets ``pending=0``.

With ``options.defer_mma`` (FA3's intra-warpgroup pipelining), an mma that accumulates into a
loop-carried value and whose A operand is computed in registers from another mma of the same step
(attention's P V after Q K^T and softmax) moves one stage later, together with the ops that only
feed its accumulator (the rescale): software_pipeline then issues step j's first mma and step j-1's
deferred mma back to back, so the tensor core runs P V under step j's softmax. The attention backward's
dV += P^T dO and dK += dS^T Q (the dQ kernel's dQ += dS K) match the same rule. A deferred mma gets ``pending=0``
(software_pipeline retires it in the step it is issued in).

Algorithm: ASAP list scheduling over the body's def-use DAG (loop-carried edges excluded) with
latencies in stages: a TMA load's data is consumed one stage later (its copy overlaps the step
before), everything else in the same stage; then, users first, an op without latency other than an mma moves to
its first user's stage (attention backward's lse2/delta pointer loads and their broadcasts: they read nothing of
a TMA load, but running them a stage early would only make the consumer's loop span two stages); an op with no
operands and no results (the chains' ``chain_sync``) runs in the latest stage of its chain's ops before it. The stage
distance of a cross-partition edge becomes the minimum ring depth memory_plan must give its buffer.
"""
from __future__ import annotations

from dataclasses import replace

from ..ir import Op, Program
from ..ir.kinds import LATENCY


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
        if not o.operands and not o.results:  # a barrier (chain_sync) orders its chain's work: it runs with it
            s = max([stage[j] for j in range(i) if j in stage and body[j].chain == o.chain], default=0)
        stage[i] = s
    carried = set(loop.body[-1].operands)
    users: dict[str, list[Op]] = {}
    for o in body:
        for x in o.operands:
            users.setdefault(x, []).append(o)
    for i in reversed(range(len(body))):  # register work without latency runs with its first user, not before
        o = body[i]
        if i in stage and not LATENCY.get(o.kind) and o.kind != "mma" and not o.body:
            later = [stage[index[u.results[0].name]] if u.results else stage[body.index(u)]
                     for r in o.results for u in users.get(r.name, ()) if u.kind != "yield"]
            stage[i] = max(stage[i], min(later, default=stage[i]))
    deferred = _deferred(body, index, users, loop) if opts.defer_mma else set()
    for i in deferred:
        stage[i] += 1
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
            # a deferred mma is retired in the step it is issued in (software_pipeline keeps no wgmma in flight
            # across the steps it pipelines)
            new = new.with_attrs(pending=min(opts.mma_pending, 1) if only_carried and acc_only and i not in deferred
                                 else 0)
        out.append(new)
    return replace(loop, body=tuple(out))


def _deferred(body: list[Op], index: dict[str, int], users: dict[str, list[Op]], loop: Op) -> set[int]:
    """Body indices of mmas that accumulate into a loop-carried value and whose A operand depends on
    another mma of the same step, plus the ops on the path from the carried value to that accumulator
    operand that nothing else reads (attention: the rescale ``acc * alpha``)."""
    def upstream_mma(x: str, seen: set[str]) -> bool:
        j = index.get(x)
        if j is None or x in seen or body[j].kind in ("load", "loop"):
            return False
        seen.add(x)
        return body[j].kind == "mma" or any(upstream_mma(y, seen) for y in body[j].operands)

    def path_to(x: str, it: str) -> set[int] | None:
        """Indices of the ops from iter_arg ``it`` to ``x`` (only read along the path), or None."""
        if x == it:
            return set()
        j = index.get(x)
        if j is None or body[j].kind in ("mma", "load", "loop", "get"):
            return None
        for y in body[j].operands:
            sub = path_to(y, it)
            if sub is not None:
                return sub | {j}
        return None

    carried = dict(zip(loop.body[-1].operands, loop.attr("iter_args")))
    out: set[int] = set()
    for i, o in enumerate(body):
        it = carried.get(o.results[0].name) if o.kind == "mma" else None
        if it is None or len(o.operands) != 3 or not upstream_mma(o.operands[0], set()):
            continue
        path = path_to(o.operands[2], it)
        if path is None:
            continue
        group = path | {i}
        readers = (u for j in path for u in users.get(body[j].results[0].name, []))
        if all(u.kind == "yield" or body.index(u) in group for u in readers):
            out |= group
    return out


def run(program: Program, options=None) -> Program:
    opts = options or program.options
    body = tuple(_schedule(o, opts) if o.kind == "loop" else o for o in program.body)
    return replace(program, body=body)
