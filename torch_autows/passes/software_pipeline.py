"""software_pipeline: a partition loop whose ops span two compute stages runs its late ops one step behind.

Assumes: code_partition ran: each partition's loops are lowered one step after another, with their sync
ops (wait_ready/get/release/advance per ring; loop ops keep their ``stage``; a loop that may run zero
times has ``min_trip`` < 1). In a loop with deferred ops every mma is synchronous (``pending`` 0:
loop_schedule gives more only to an mma whose accumulator nothing else reads, not to attention's P V,
whose accumulator is rescaled first), so its releases have lag 0 and code_partition put nothing after
it (no wgmma to retire, no ``release_tail``); a loop with deferred ops that holds async wgmma across
steps is refused (PassError: no template makes one).
Guarantees: every partition loop whose ops span two stages (loop_schedule deferred an mma) and that
runs at least once (``loop.min_trip`` >= 1) is software pipelined: a prologue runs the early ops of the
first step, the loop (from lb+1) runs step j's early ops and step j-1's late ops — step j's leading mmas (its
first mma and the mmas right after it that read none of them: the forward's Q K^T alone, the backward's S^T and
dP^T; with ``Options.lead_chains`` also the mmas chained onto them as accumulator: a split head dim's Q K^T pieces)
and step j-1's deferred mmas are issued back to back (``wait=False``), then an ``mma_wait`` retires each
leading mma right before its first reader (or the release of a ring it reads), with ``pending`` = the mmas issued
after it (a chained piece another leading mma accumulates onto gets none: the chain's last wait retires it, and a
wait on it while that wgmma runs would make ptxas serialize every wgmma, step_overlap.accumulated_into), and the
deferred ones (pending=0) at the end of the step — and an epilogue runs the last step's late
ops. Values early ops hand to late ops are carried as extra iter_args
(``<x>_prev``, the last step's as ``<x>_last``); late ops read their ring slot with ``get {lag=1}``, and
the slot of step j-1 is released in step j (``release {lag=1, guard=False}``), the last one after the
epilogue. Inside the loop, late ops read no value of the current step's early ops or of its ring slots
(verify checks this). Other loops, and a loop that may run zero times (its steps stay in order:
correct, without the overlap), are left as they are. Uses after an ``mma_wait`` read its result
(code_partition.renamed_after_waits).

The loops left alone get ``step_overlap``'s rule (its docstring): where a step has an mma issued with ``pending=0``
whose next mma does not depend on it, the step's mmas are issued ``wait=False``, each retired before its first
reader and all at the step's end, with the rings' releases moved after the waits that retire their slots.

Why after code_partition: the pipelined loop's sync ops are made from the lowered loop's: the gets
late ops read are re-issued one step later (``lag=1``), the releases of their rings move one step
later, and the ring advances stay at the end of the step, so each ring's waits and releases keep
balancing. Lowering first gives those ops, and a complete program before the rewrite (the IR after
code_partition runs in the interpreter as it is). Loops nested in loops are pipelined innermost first.
The result is what pipelining inside code_partition's lowering gave (the generated Gluon is byte for byte
the same): the loop code_partition hands over is the one that lowering pipelined, nothing follows it,
and the uses after each new ``mma_wait`` are renamed as code_partition renames them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ..ir import Op, Program, Value, op
from . import PassError
from .code_partition import renamed_after_waits
from .step_overlap import accumulated_into, overlapped, retire_plan, slot_groups


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
            raise PassError(f"software_pipeline: early op reads a deferred value: {o.kind} {o.operands}")
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


def _leading_mmas(early: list[Op], first: Op, chains: bool = False) -> list[Op]:
    """The step's first mma and the mmas issued after it, before any reader of their results, that read none of
    them (independent work for the tensor core to run back to back), matched by identity in ``early``; with
    ``chains`` also the mmas that read one of them only as their accumulator (a K-split chain: a head dim in column
    pieces, ``Options.split_d``; wgmma on one accumulator is ordered, so no wait lies between them)."""
    run, defs = [first], {first.results[0].name}
    started = False
    for o in early:
        if o is first:
            started = True
            continue
        if not started:
            continue
        chained = (chains and o.kind == "mma" and len(o.operands) == 3 and o.operands[2] in defs
                   and not any(x in defs for x in o.operands[:2]))
        if any(x in defs for x in o.operands) and not chained:
            break
        if o.kind == "mma":
            run.append(o)
            defs.add(o.results[0].name)
    return run


def _pipeline(loop: Op, chains: bool = False) -> list[Op] | None:
    """Prologue, pipelined loop and epilogue for a lowered partition loop with deferred ops (see the
    module docstring), or None when the loop has none."""
    sp = _split(loop)
    if sp is None:
        return None
    first = next((o for o in sp.early if o.kind == "mma"), None)
    if first is None:
        raise PassError("software_pipeline: a loop defers ops to a later stage but issues no mma before them; "
                        "only an mma fed by another mma of its step is deferred: schedule it without defer_mma")
    held = [o for o in sp.body if (o.kind == "mma" and o.attr("pending", 0) > 0) or o.attr("lag", 0) > 0]
    if held:
        raise PassError(f"software_pipeline: a loop with deferred ops keeps async wgmma in flight across steps "
                        f"({held[0].kind} {held[0].attrs}); pipelining retires every mma in its step: give its "
                        f"mmas pending=0 (loop_schedule does unless the accumulator is only carried)")
    stores = [o for o in sp.early if o.kind in ("smem_store", "store", "tma_reduce_add")]
    if stores:
        st = stores[0]
        what = st.results[0].name if st.results else st.operands[0]
        raise PassError(f"software_pipeline: a loop with deferred ops writes {st.kind} %{what} in its early ops; the "
                        f"prologue's copy would have no SMEM buffer of its own (buffers ran before): defer_mma serves "
                        f"steps without SMEM stores (the backward's separate form)")
    y, its, var = loop.body[-1], loop.attr("iter_args"), loop.attr("var")
    lb, ub = loop.attr("lb"), loop.attr("ub")
    late_mmas = [o for o in sp.late if o.kind == "mma"]

    # prologue: the early ops of step lb
    pro = dict(zip(its, loop.operands))
    prologue = [_renamed(_subst(o, var, str(lb)), pro, "_pro") for o in sp.early]

    # steady state: step j's early ops; right after its leading mmas are issued (the first, and the mmas after it
    # that read none of them: attention backward's S^T and dP^T), step j-1's late ops are issued; each leading
    # mma is retired right before its first reader, the late mmas before the ring advances
    run = [m.results[0].name for m in _leading_mmas(sp.early, first, chains)]
    slots = slot_groups(sp.early)  # a ring's release waits for the leading mmas reading its slot
    names = {x: x + "_prev" for x in sp.carried}
    names.update({x: x + "_prev" for x in sp.lagged})
    steady: list[Op] = []
    unretired: list[Op] = []  # the leading mmas issued and not yet waited for, in issue order
    late_issued = 0  # the deferred mmas issued so far this step (after the leading ones)

    into = accumulated_into(sp.early)

    def retire(upto: int) -> None:
        """Waits for the first ``upto`` unretired leading mmas (FIFO: an mma retires with every one issued before it;
        ``pending`` counts what was issued after it), and for the mmas accumulating onto them, without a wait of
        their own for those a later one accumulates onto (step_overlap.accumulated_into); later uses read the waits'
        results."""
        nonlocal unretired
        last, own = retire_plan([m.results[0].name for m in unretired], upto - 1, into)
        for k in own:
            r = unretired[k].results[0]
            steady.append(op("mma_wait", [Value(r.name + "_r", r.type)], [r.name],
                             pending=len(unretired) - k - 1 + late_issued))
            names[r.name] = r.name + "_r"
        unretired = unretired[last + 1:]

    for o in sp.early:
        leading = o.kind == "mma" and o.results[0].name in run
        if unretired and not leading:
            need = [k for k, m in enumerate(unretired) if m.results[0].name in o.operands
                    or o.kind == "release" and o.attr("group") in {slots.get(x) for x in m.operands}]
            retire(len(unretired) if o.kind == "mma" else (max(need) + 1 if need else 0))  # an mma waits at issue
        o = replace(o, operands=tuple(names.get(x, x) if x not in sp.lagged else x for x in o.operands))
        if leading:
            steady.append(o.with_attrs(wait=False))
            unretired.append(o)
            if o.results[0].name == run[-1]:
                steady += [_lagged_get(sp, x, x + "_prev") for x in sp.lagged]
                for d in sp.late:
                    d = replace(d, operands=tuple(names.get(x, x) for x in d.operands))
                    steady.append(d.with_attrs(wait=False, pending=0) if d.kind == "mma" else d)
                late_issued = len(late_mmas)
                if len(run) == 1:  # one leading mma (the forward's Q K^T): retired right after the late issue
                    retire(1)
        else:
            steady.append(o)
    retire(len(unretired))  # leading mmas nothing in the step read: retired before the late ones below
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


def _pipelined(ops: tuple[Op, ...], chains: bool = False) -> tuple[Op, ...]:
    """``ops`` with every loop that spans two stages pipelined, loops inside loops first."""
    out: list[Op] = []
    for o in ops:
        if o.kind != "loop":
            out.append(o)
            continue
        o = replace(o, body=_pipelined(o.body, chains))
        piped = _pipeline(o, chains)
        out += [o] if piped is None else piped
    return tuple(out)


def run(program: Program, options=None) -> Program:
    """Every partition's loops that span two stages, pipelined (see the module docstring); in the others, mmas
    without a data dependency between them overlap within the step (``step_overlap``)."""
    chains = (options or program.options).lead_chains
    parts = tuple(replace(p, body=renamed_after_waits(overlapped(_pipelined(p.body, chains))))
                  for p in program.partitions)
    return replace(program, partitions=parts)
