"""The partitioned interpreter's handlers of the barrier ops (``partitioned.HANDLERS`` maps the op kinds to them):
a ring's ``acquire``, ``wait_ready``, ``get``, ``load``, ``release``, ``release_tail`` and ``advance`` on its
group's counter and slot (passes/code_partition, software_pipeline), ping-pong's ``turn_wait`` and
``turn_pass`` (passes/ping_pong), and the consumer chains' per-step meeting ``chain_sync``. ``pr`` is the running
``partitioned.PartRun``; the shared barriers and SMEM are its ``cta.CTA``'s."""
from __future__ import annotations

from ..ir import Op
from .cta import SlotRef, TmaCopy
from .ops import InterpError, apply


def _group(pr, o: Op):
    g = o.attr("group")
    if g not in pr.cta.groups:
        raise InterpError(f"interp: `{o.kind}` names unknown barrier group {g!r}")
    return g, pr.cta.groups[g]


def _this_step(pr, o: Op):
    """(group, BarrierGroup, fill number, slot, lap) of the group's counter; the slot becomes the one
    that this step's gets, loads and releases use."""
    g, G = _group(pr, o)
    n = pr.counters[g]
    s, lap = n % G.count, n // G.count
    pr.slotvar[g] = (s, n)
    pr.stale.pop(g, None)
    return g, G, n, s, lap


def _acquire(pr, o: Op):
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


def _wait_ready(pr, o: Op):
    g, _, n, s, lap = _this_step(pr, o)
    bar = pr.cta.ready[g][s]
    yield from pr.wait(bar, lap & 1, o, g, s, lap)
    pr.log(o, f"{bar.name} passed, phase {bar.completed}; slot {s}, fill n={n}")
    if bar.completed != lap + 1:
        pr.fail("wrong-phase", f"{pr.name} waited for fill n={n} of slot {s} ({bar.name} phase {lap}) but the "
                f"wait passed with {bar.completed} completed phases: the parity matched a different phase",
                o, group=g, slot=s, phase=f"lap {lap}, parity {lap & 1}")
    pr.cta.claim(g, s, n, pr.name, o)


def _slotvar(pr, o: Op, g: str):
    if g in pr.stale:
        s, n, step = pr.stale[g]
        pr.fail("stale-slot", f"{pr.name} uses the slot of group {g} at fill n={pr.counters[g]} without an "
                f"acquire/wait_ready for that fill: the last one set slot {s} for fill n={n}, and advance() at "
                f"#{step} moved the counter past it (codegen would reuse {g}_s: an old or not yet landed slot)",
                o, group=g, slot=s)
    if g not in pr.slotvar:
        pr.fail("no-wait", f"{pr.name} uses the slot of group {g} before any acquire/wait_ready set it", o, group=g)
    return pr.slotvar[g]


def _ago(pr, g: str, G, lag: int) -> tuple[int, int]:
    """(slot, fill number) of the step ``lag`` steps before the group's counter (codegen: (n + count - lag) %
    count)."""
    n = pr.counters[g] - lag
    return n % G.count, n


def _get(pr, o: Op):
    g, G = _group(pr, o)
    lag = o.attr("lag", 0)
    if lag:  # a deferred reader: the slot of ``lag`` steps ago
        s, n = _ago(pr, g, G, lag)
    else:
        s, n = _slotvar(pr, o, g)
    pr.env[o.results[0].name] = SlotRef(o.attr("buffer"), s, n, g)


def _load(pr, o: Op):
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


def _release(pr, o: Op):
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


def _release_tail(pr, o: Op):
    g, G = _group(pr, o)
    if "_trip" not in pr.scalars:
        raise InterpError("interp: release_tail before any loop (codegen reads `_trip`)")
    for j in range(1, o.attr("lag") + 1):
        if pr.scalars["_trip"] >= j:
            s, m = _ago(pr, g, G, j)
            pr.log(o, f"arrive {g}.empty[{s}] (fill n={m})")
            pr.cta.arrive_empty(g, s, m, pr, o)


def _advance(pr, o: Op):
    g, _ = _group(pr, o)
    if g in pr.slotvar:  # the slot belongs to the fill just passed: the next step needs its own wait
        pr.stale[g] = (*pr.slotvar.pop(g), pr.run.step)
    pr.counters[g] += 1


def _turn_wait(pr, o: Op):
    me, k = o.attr("me"), pr.turn_n
    bar = pr.cta.turn(me, o)
    parity = (k & 1) ^ (1 if me == 0 else 0)
    yield from pr.wait(bar, parity, o, "turn", me, k)
    want = k if me == 0 else k + 1  # partition 0's k-th group follows the last one's (k-1)-th pass
    if bar.completed != want:
        pr.fail("wrong-phase", f"{pr.name} waited for its turn {k} on {bar.name} ({want} passes) but the wait "
                f"passed with {bar.completed}: the parity matched a different turn", o)
    pr.log(o, f"{bar.name} passed: turn {k}")


def _turn_pass(pr, o: Op):
    err = pr.cta.turn(o.attr("to"), o).arrive(pr.name)
    if err:
        pr.fail("over-arrive", err, o)
    pr.turn_n += 1


def _chain_sync(pr, o: Op):
    """Arrive on the meeting barrier ``bar`` (``count`` arrivals per phase), then wait until its phase k completes, k
    this partition's meetings so far (codegen: ``mbarrier.arrive``; ``mbarrier.wait(bar, bar_n & 1)``; ``bar_n +=
    1``). A partition that arrives twice in a phase is an ``over-arrive``; one that passes on another phase's parity a
    ``wrong-phase``; one that never meets leaves the others waiting (the scheduler's deadlock)."""
    name, k = o.attr("bar"), pr.counters[o.attr("bar")]
    bar = pr.cta.meeting(name, o)
    err = bar.arrive(pr.name)
    if err:
        pr.fail("over-arrive", err, o)
    yield from pr.wait(bar, k & 1, o, name, 0, k)
    if bar.completed != k + 1:
        pr.fail("wrong-phase", f"{pr.name} waited for meeting {k} on {bar.name} ({k + 1} phases) but the wait passed "
                f"with {bar.completed}: the parity matched a different meeting", o)
    pr.log(o, f"{bar.name} passed: meeting {k}")
    pr.counters[name] += 1


def _store_drained(pr, o: Op):
    """This partition's TMA stores have read their staging tiles (``tma.store_wait(0)``: written to memory now), then
    an arrive on ``bar`` (``count`` arrivals a phase, one per storing partition; passes/code_partition)."""
    pr.store_wait(0)
    err = pr.cta.meeting(o.attr("bar"), o).arrive(pr.name)
    if err:
        pr.fail("over-arrive", err, o)
    pr.log(o, f"stores drained: arrive {o.attr('bar')}")


def _wait_drained(pr, o: Op):
    """In the enclosing loop's first trip only: the k-th wait (k: this partition's waits so far) passes once ``bar``
    has completed k phases (the stores of the CTA's previous k tiles; parity ``(k & 1) ^ 1``, so a fresh barrier
    passes the first). It passing with another count is a ``wrong-phase``."""
    if not pr.loops:
        raise InterpError("interp: wait_drained outside a loop (it waits in the filling loop's first trip)")
    var, lb = pr.loops[-1]
    if pr.scalars[var] != lb:
        pr.log(o, "not the loop's first trip")
        return
    name, k = o.attr("bar"), pr.counters[o.attr("bar")]
    bar = pr.cta.meeting(name, o)
    yield from pr.wait(bar, (k & 1) ^ 1, o, name, 0, k)
    if bar.completed != k:
        pr.fail("wrong-phase", f"{pr.name} waited for the stores of {k} tiles on {bar.name} but the wait passed with "
                f"{bar.completed} phases: the parity matched a different tile", o)
    pr.log(o, f"{bar.name} passed: the stores of {k} tiles drained")
    pr.counters[name] += 1
