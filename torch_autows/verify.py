"""IR invariants per pipeline stage. ``check(program, stage)`` raises ``VerifyError`` naming the op.

Stages are ``passes.pipeline.STAGES`` ("template" and the name of each pass in PIPELINE); each stage's
checks include those of the stages before it. From the template on: accumulating outputs add f32 into an f32
out arg nothing else touches (``_check_accumulate``). From code_partition on: rings balance (``_check_code``) and
ping-pong turns are consistent (``_check_turns``: none before ping_pong makes Program.turns, but the tile consumers'
main-loop turns, which code_partition makes); from
software_pipeline on: a partition loop whose ops span two stages runs its late ops one step behind
(``_check_pipelined``); from tile_loop on: every partition body is one ``tile_loop`` walking ``Program.grid``
(``_check_tile_loops``); from cross_tile on: a ``cross_tile`` walk's carried values are defined on both paths (the
first tile's head and the next tile's step) and nothing else crosses between tiles (``_check_cross_tile``).

It stays beside ``passes/`` rather than in ``ir/``: its checks are selected by the pipeline's stage names and
read pass analyses (``passes.buffers.value_partition``), a layer above the IR.
"""
from __future__ import annotations

from .ir import Grid, Program, check_expr, defs, format_op, value_types, walk
from .ir.kinds import LATENCY, OPS, STRUCTURAL
from .passes.buffers import value_partition
from .passes.pipeline import STAGES


class VerifyError(AssertionError):
    pass


def _fail(stage: str, msg: str, o=None):
    where = f"\n  at: {format_op(o)[0].strip()}" if o is not None else ""
    raise VerifyError(f"[{stage}] {msg}{where}")


def check(program: Program, stage: str = STAGES[-1]) -> None:
    """The invariants that hold after ``stage`` (default: the pipeline's last), or ``VerifyError``."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; the stages are {', '.join(STAGES)}")
    level = STAGES.index(stage)
    _check_ssa(program, stage)
    for first, checks in _FROM_STAGE:
        if level >= STAGES.index(first):
            for c in checks:
                c(program, stage)


#: Attributes that hold index expressions (load/store coordinates, pointer rows and bounds, loop bounds).
_EXPR_ATTRS = ("coords", "offset", "size", "lb", "ub", "row", "col", "ld", "rows_valid", "cols_valid", "valid",
               "per_tile")


def _check_ssa(p: Program, stage: str):
    seen: set[str] = set()
    names = {a.name for a in p.args} | {n for n, _ in p.grid.tiles}

    def visit(ops, scope, loop_vars):
        for o in ops:
            _check_kind(o, stage)
            for x in o.operands:
                if x not in scope:
                    _fail(stage, f"%{x} used before it is defined", o)
            for key in _EXPR_ATTRS:
                val = o.attr(key)
                for e in (val if isinstance(val, tuple) else (val,)) if val is not None else ():
                    bad = check_expr(str(e)) - names - loop_vars
                    if bad:
                        _fail(stage, f"expression {e!r} uses unknown names {sorted(bad)}", o)
            if o.kind == "loop":
                inner = set(scope) | set(o.attr("iter_args"))
                if o.body and o.body[-1].kind != "yield":
                    _fail(stage, "loop body must end in yield", o)
                if len(o.body[-1].operands) != len(o.attr("iter_args")) or len(o.results) != len(o.operands):
                    _fail(stage, "loop iter_args, inits, results and yield operands differ in number", o)
                visit(o.body, inner, loop_vars | {o.attr("var")})
            for r in o.results:
                if r.name in seen:
                    _fail(stage, f"%{r.name} defined twice", o)
                seen.add(r.name)
                scope.add(r.name)

    visit(p.body, set(), set())


def _check_kind(o, stage: str):
    """The op's kind is in the op table (ir/kinds.py) and its operand and result counts are in the kind's ranges."""
    k = OPS.get(o.kind)
    if k is None:
        _fail(stage, f"unknown op kind {o.kind!r}: add an OpKind for it to torch_autows/ir/kinds.py", o)
    for what, n, (lo, hi) in (("operands", len(o.operands), k.operands), ("results", len(o.results), k.results)):
        if n < lo or (hi is not None and n > hi):
            _fail(stage, f"{o.kind} takes {lo}..{'' if hi is None else hi} {what}, not {n}", o)


def _check_chains(p: Program, stage: str):
    dmap = defs(p.body)
    for o in walk(p.body):
        if o.kind in STRUCTURAL or o.chain is None:
            continue
        for x in o.operands:
            d = dmap.get(x)
            if d is None or d.kind == "loop":
                continue
            if d.chain is None and d.kind != "load":
                _fail(stage, f"chain {o.chain} reads %{x}, a shared value that is not a read-only load", o)
            if d.chain is not None and d.chain != o.chain:
                _fail(stage, f"chain {o.chain} reads %{x} of chain {d.chain}: chains must be independent", o)


def _check_split(p: Program, stage: str):
    """passes/split_k: each split_reduce's part count is the extent of its grid index (a counter target that
    differs lets the last arriver sum parts not written yet, or never sum); its workspace and counters are
    args of the right dtypes; a store's ``pred`` names a split_reduce result computed before it, and every
    output op writing a value computed from one has a ``pred``."""
    extents = dict(p.grid.tiles)
    reduced: set[str] = set()
    derived: set[str] = set()  # values computed from a split_reduce result: only the summing CTA may store them
    for o in walk(p.body):
        if any(x in derived for x in o.operands):
            derived.update(r.name for r in o.results)
            if OPS[o.kind].output and o.attr("pred") is None:
                _fail(stage, f"{o.kind} writes a value computed from a split_reduce without its pred: every CTA "
                      f"of the split would store", o)
        if o.kind == "split_reduce":
            if extents.get(o.attr("part")) != str(o.attr("splits")):
                _fail(stage, f"split_reduce sums {o.attr('splits')} parts but grid index {o.attr('part')!r} has "
                      f"extent {extents.get(o.attr('part'))!r}", o)
            args = {a.name: a for a in p.args}
            for name, dt in ((o.attr("ws"), "f32"), (o.attr("locks"), "i32")):
                if name not in args or args[name].kind != "ptr" or args[name].dtype != dt:
                    _fail(stage, f"split_reduce needs a ptr<{dt}> arg {name!r}", o)
            reduced.add(o.results[0].name)  # the first result carries the summing CTA's flag (the stores' pred)
            derived.update(r.name for r in o.results)
        if o.attr("pred") is not None and o.attr("pred") not in reduced:
            _fail(stage, f"{o.kind} is predicated on %{o.attr('pred')}, which is not a split_reduce result before it",
                  o)


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


def _check_partitions(p: Program, stage: str):
    names = {pt.name for pt in p.partitions}
    for o in walk(p.body):
        if o.kind in STRUCTURAL:
            continue
        if o.partition not in names:
            _fail(stage, f"op has partition {o.partition!r}, not one of {sorted(names)}", o)
    regs = sum(pt.regs * 32 * max(4, pt.warps) for pt in p.partitions)
    a = p.arch
    if regs > a.regs_per_sm:
        _fail(stage, f"partitions need {regs} registers, more than the {a.regs_per_sm} of an SM")
    for pt in p.partitions:
        if pt.regs % a.reg_granularity or not a.min_regs_per_thread <= pt.regs <= a.max_regs_per_thread:
            _fail(stage, f"partition {pt.name}: {pt.regs} registers; setmaxnreg takes multiples of "
                  f"{a.reg_granularity} in {a.min_regs_per_thread}..{a.max_regs_per_thread}")
    _check_tile_shares(p, stage)


def _check_tile_shares(p: Program, stage: str):
    """Tile consumers (``Partition.tiles``): t >= 2 partitions of a persistent grid share out every tile, indices
    0..t-1 once each; the producer (it loads) walks every tile."""
    shares = {pt.name: pt.tiles for pt in p.partitions if pt.tiles is not None}
    if not shares:
        return
    counts = {t for _, t in shares.values()}
    t = max(counts)
    if len(counts) != 1 or t < 2 or sorted(c for c, _ in shares.values()) != list(range(t)):
        _fail(stage, f"tile shares {shares}: t >= 2 partitions must take the tiles j with j % t == 0, 1, ..., t-1")
    if not p.grid.persistent:
        _fail(stage, f"tile shares {shares} on a grid that is not persistent (a CTA has one tile)")
    loaders = {o.partition for o in walk(p.body) if o.kind == "load"}
    if loaders & set(shares):
        _fail(stage, f"partitions {sorted(loaders & set(shares))} load and share the tiles: the producer fills the "
              f"rings for every tile")


def _check_channels(p: Program, stage: str):
    dmap = defs(p.body)
    chans = {(c.value, d) for c in p.channels for d in c.dsts}
    for o in walk(p.body):
        if o.kind in STRUCTURAL:
            continue
        for x in o.operands:
            for src in value_partition(x, dmap):
                if src != o.partition and (x, o.partition) not in chans:
                    _fail(stage, f"%{x} crosses from {src} to {o.partition} without a channel", o)


def _check_memory(p: Program, stage: str):
    for b in p.buffers:
        if b.count is None or b.offset is None or b.count < 1:
            _fail(stage, f"buffer {b.name} has no count/offset")
    if p.smem_bytes is None or p.smem_bytes > p.arch.smem_limit:
        _fail(stage, f"SMEM {p.smem_bytes} B exceeds the limit {p.arch.smem_limit} B")
    for i, a in enumerate(p.buffers):
        for b in p.buffers[i + 1:]:
            overlap = a.offset < b.offset + b.nbytes and b.offset < a.offset + a.nbytes
            if overlap and a.offset != b.offset:
                _fail(stage, f"buffers {a.name} and {b.name} overlap at different offsets")


def _check_code(p: Program, stage: str):
    groups = {g.name: g for g in p.groups}
    for c in p.channels:
        if c.group not in groups:
            _fail(stage, f"channel {c.name} has no barrier group")
    for pt in p.partitions:
        if not pt.body:
            _fail(stage, f"partition {pt.name} has no body")
        count = {}
        for o in walk(pt.body):
            g = o.attr("group")
            if g is None:
                continue
            if g not in groups:
                _fail(stage, f"unknown barrier group {g}", o)
            count.setdefault(g, {"acquire": 0, "wait_ready": 0, "release": 0, "advance": 0})
            if o.kind in count[g]:
                count[g][o.kind] += 1
        for g, c in count.items():
            if c["acquire"] + c["wait_ready"] != c["advance"]:
                _fail(stage, f"{pt.name}: group {g} waits {c['acquire'] + c['wait_ready']} times per step but "
                      f"advances {c['advance']} times: phases would drift")
            if c["wait_ready"] != c["release"]:
                _fail(stage, f"{pt.name}: group {g} is waited on {c['wait_ready']} times but released "
                      f"{c['release']} times: a slot would never be freed")
    sharing = {pt.name for pt in p.partitions if pt.tiles is not None}
    for g in groups.values():
        consumers = {pt.name for pt in p.partitions for o in walk(pt.body)
                     if o.kind == "release" and o.attr("group") == g.name}
        one_each = g.arrivals == 1 and consumers and consumers <= sharing  # a fill is its tile's consumer's
        if len(consumers) != g.arrivals and not one_each:
            _fail(stage, f"group {g.name} expects {g.arrivals} releasing partitions, found {sorted(consumers)}")
    for pt in p.partitions:
        body = pt.body[0].body if len(pt.body) == 1 and pt.body[0].kind == "tile_loop" else pt.body
        seeks = [o for o in walk(body) if o.kind == "seek"]
        waited = sorted({o.attr("group") for o in walk(body) if o.kind == "wait_ready"})
        head = [o.attr("group") for o in body[:len(seeks)] if o.kind == "seek"]
        if pt.tiles is None and seeks:
            _fail(stage, f"{pt.name} walks every tile but seeks its ring position", seeks[0])
        if pt.tiles is not None and (sorted(head) != waited or len(head) != len(seeks)):
            _fail(stage, f"{pt.name} runs every {pt.tiles[1]}th tile: its tile body must start with one seek per ring "
                  f"it reads ({waited}), found seeks of {[o.attr('group') for o in seeks]} (its counter would "
                  f"stay at another consumer's fills)")


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


def _turn_shape(ops, part: str, stage: str, scope: str = "mma") -> tuple:
    """The turns one op list takes, loops (with their bounds) nested; scope "mma": every mma inside a turn, every
    turn_wait followed by its turn_pass before anything else waits or a loop starts; scope "mainloop" (tile
    consumers): every ring wait inside a turn taken in the tile body's own op list."""
    if scope == "mainloop":
        return _main_loop_turns(ops, part, stage)
    shape: list = []
    inside = None
    for o in ops:
        if o.kind == "turn_wait":
            if inside is not None:
                _fail(stage, f"{part} waits for a turn twice without passing it", o)
            inside = o
            shape.append("turn")
        elif o.kind == "turn_pass":
            if inside is None:
                _fail(stage, f"{part} passes a turn it did not wait for", o)
            inside = None
        elif o.kind == "mma" and inside is None:
            _fail(stage, f"{part} takes ping-pong turns but issues this mma outside a turn", o)
        elif o.kind == "tile_loop":  # the whole body, per tile: its turns are the partition's
            shape += _turn_shape(o.body, part, stage)
        elif o.kind == "loop":
            if inside is not None:
                _fail(stage, f"{part} starts a loop inside a turn", o)
            inner = _turn_shape(o.body, part, stage)
            if inner:
                shape.append((o.attr("lb"), o.attr("ub"), inner))
    if inside is not None:
        _fail(stage, f"{part} waits for a turn it never passes", inside)
    return tuple(shape)


def _main_loop_turns(ops, part: str, stage: str) -> tuple:
    """Scope "mainloop": per tile one turn at the tile body's top level, every ``wait_ready`` between its
    ``turn_wait`` and ``turn_pass`` (passes/code_partition); the turns it takes per tile."""
    body = ops[0].body if len(ops) == 1 and ops[0].kind == "tile_loop" else ops
    inside, shape = None, []
    for o in body:
        if o.kind in ("turn_wait", "turn_pass"):
            if (o.kind == "turn_wait") == (inside is not None):
                _fail(stage, f"{part}: turn_wait and turn_pass must alternate in its tile body", o)
            inside = o if o.kind == "turn_wait" else None
            shape += ["turn"] if o.kind == "turn_wait" else []
            continue
        nested = [x for x in walk((o,)) if x.kind in ("turn_wait", "turn_pass")]
        if nested:
            _fail(stage, f"{part}: a main-loop turn is taken in the tile body's own ops, not inside a loop", nested[0])
        if inside is None and any(x.kind == "wait_ready" for x in walk((o,))):
            _fail(stage, f"{part} shares the tiles but waits on a ring outside its turn: it could wait a lap early "
                  f"(the other consumer's fills are not landed yet)", o)
    if inside is not None:
        _fail(stage, f"{part} waits for a turn it never passes", inside)
    return tuple(shape)


def _check_turns(p: Program, stage: str):
    """passes/ping_pong: turn ops only with Program.turns; each of its partitions waits on its own barrier and
    passes to the next, every mma inside a turn, wait and pass paired in each op list; all take the same turns
    per tile (in loops with equal bounds), so no turn barrier is left a phase behind."""
    t = p.turns
    turn_ops = {pt.name: [o for o in walk(pt.body) if o.kind in ("turn_wait", "turn_pass")] for pt in p.partitions}
    if t is None:
        for name, ops in turn_ops.items():
            if ops:
                _fail(stage, f"{name} takes ping-pong turns, but the program has no turn barriers (Program.turns)",
                      ops[0])
        return
    names = [pt.name for pt in p.partitions]
    sharing = tuple(pt.name for pt in p.partitions if pt.tiles is not None)
    if t.scope not in ("mma", "mainloop") or (t.scope == "mainloop") != bool(sharing) or \
            (sharing and t.partitions != sharing):
        _fail(stage, f"turns {t.name} (scope {t.scope!r}) over {t.partitions}: the tile consumers {sharing} take "
              f"main-loop turns (scope 'mainloop', all of them in order), other programs mma turns (scope 'mma')")
    if len(t.partitions) < 2 or len(set(t.partitions)) != t.count or not set(t.partitions) <= set(names):
        _fail(stage, f"turns {t.name}: {t.partitions} must be two or more distinct partitions of {names}")
    shapes = {}
    for pt in p.partitions:
        if pt.name not in t.partitions:
            if turn_ops[pt.name]:
                _fail(stage, f"{pt.name} takes turns but is not in turns {t.name} {t.partitions}",
                      turn_ops[pt.name][0])
            continue
        me = t.partitions.index(pt.name)
        for o in turn_ops[pt.name]:
            want = {"turns": t.count, "me" if o.kind == "turn_wait" else "to": me if o.kind == "turn_wait"
                    else (me + 1) % t.count}
            if any(o.attr(k) != v for k, v in want.items()):
                _fail(stage, f"{pt.name} is turn partition {me} of {t.count}: its {o.kind} needs {want}", o)
        shapes[pt.name] = _turn_shape(pt.body, pt.name, stage, t.scope)
        if not shapes[pt.name]:
            _fail(stage, f"{pt.name} is in turns {t.name} but never takes a turn: the others would wait for it")
    if len(set(shapes.values())) > 1:
        _fail(stage, f"the partitions of turns {t.name} take different turns per tile ({shapes}): the turn "
              f"barriers would drift a phase apart")


def _check_tile_loops(p: Program, stage: str):
    """passes/tile_loop: every partition body is exactly one ``tile_loop`` whose grid is ``Program.grid``, and no
    tile_loop is nested (codegen and the interpreter walk the tiles once, from it)."""
    for pt in p.partitions:
        if len(pt.body) != 1 or pt.body[0].kind != "tile_loop":
            _fail(stage, f"{pt.name}: the body must be exactly one tile_loop (passes/tile_loop wraps it), found "
                  f"{[o.kind for o in pt.body]}")
        tl = pt.body[0]
        try:
            grid = Grid.of(tl)
        except (TypeError, ValueError) as e:
            _fail(stage, f"{pt.name}: tile_loop attributes do not describe a grid ({e})", tl)
        if grid != p.grid:
            _fail(stage, f"{pt.name}: tile_loop walks {grid}, but the program's is {p.grid}", tl)
        if tl.attr("share") != pt.tiles:
            _fail(stage, f"{pt.name}: tile_loop share {tl.attr('share')} differs from the partition's tiles "
                  f"{pt.tiles}", tl)
        nested = next((o for o in walk(tl.body) if o.kind == "tile_loop"), None)
        if nested is not None:
            _fail(stage, f"{pt.name}: a tile_loop inside the tile_loop", nested)


def _names(ops) -> set[str]:
    """Every value ``ops`` define (results and nested iter_args)."""
    return {n for o in walk(ops) for n in [r.name for r in o.results] + list(o.attr("iter_args", ()))}


def _reads(ops) -> set[str]:
    return {x for o in walk(ops) for x in o.operands}


def _check_cross_tile(p: Program, stage: str):
    """passes/cross_tile: a ``tile_next`` only as the one top-level ``tile_next`` of a ``cross_tile`` tile_loop; its
    inits are defined by the first tile's head before it, its yields by its own body, iter_args, inits, results
    and yields agree in number; its body reads only its own values and iter_args (a value of the first tile would
    be stale from the second on), the ops after it read only its results and their own values, and the previous
    tile's indices (``<index>_prev``) are read only inside it."""
    prev = {f"{n}_prev" for n, _ in p.grid.tiles}
    for pt in p.partitions:
        tl = pt.body[0]
        nexts = [i for i, o in enumerate(tl.body) if o.kind == "tile_next"]
        nested = [o for o in walk(tl.body) if o.kind == "tile_next"]
        if not tl.attr("cross_tile"):
            if nested:
                _fail(stage, f"{pt.name}: a tile_next in a tile_loop without cross_tile", nested[0])
            continue
        if len(nexts) != 1 or len(nested) != 1:
            _fail(stage, f"{pt.name}: a cross_tile tile_loop holds exactly one tile_next at its top level", tl)
        i = nexts[0]
        nx = tl.body[i]
        head, tail = tl.body[:i], tl.body[i + 1:]
        its = nx.attr("iter_args", ())
        if not nx.body or nx.body[-1].kind != "yield" or not (
                len(its) == len(nx.operands) == len(nx.results) == len(nx.body[-1].operands)):
            _fail(stage, f"{pt.name}: tile_next iter_args, inits, results and yield operands differ in number", nx)
        missing = [x for x in nx.operands if x not in _names(head)]
        if missing:
            _fail(stage, f"{pt.name}: tile_next carries %{missing[0]}, which the first tile's head does not define", nx)
        inner = _names(nx.body[:-1]) | set(its)
        bad = [x for x in nx.body[-1].operands if x not in _names(nx.body[:-1])]
        if bad:
            _fail(stage, f"{pt.name}: tile_next yields %{bad[0]}, which the next tile's step does not define", nx)
        stale = sorted(_reads(nx.body) - inner)
        if stale:
            _fail(stage, f"{pt.name}: tile_next reads %{stale[0]} of the first tile: carry it as an iter_arg", nx)
        after = _reads(tail) - _names(tail) - {r.name for r in nx.results}
        if after:
            _fail(stage, f"{pt.name}: an op after tile_next reads %{sorted(after)[0]} from before it (the first "
                  f"tile's value): read tile_next's result", nx)
        for o in walk((*head, *tail)):
            for _, val in o.attrs:
                for e in (val if isinstance(val, tuple) else (val,)):
                    if isinstance(e, str) and any(n in e for n in prev):
                        _fail(stage, f"{pt.name}: the previous tile's indices are read outside tile_next", o)


#: The checks that hold from a stage on (after ``_check_ssa``, which holds at every stage), in pipeline order.
def _check_accumulate(p: Program, stage: str):
    """An accumulating output (``atomic_add_ptr``) adds an f32 tile into an f32 ``ptr`` out arg that no other op
    of the program reads or writes: a read would see a sum other CTAs are still adding to, a plain store would race
    the adds."""
    types = value_types(p.body)
    args = {a.name: a for a in p.args}
    targets = {o.attr("arg"): o for o in walk(p.body) if OPS[o.kind].accumulates}
    for name, o in targets.items():
        a = args.get(name)
        if a is None or a.kind != "ptr" or a.dtype != "f32" or not a.out:
            _fail(stage, f"{o.kind} adds into {name!r}, which must be an f32 ptr out arg", o)
        if types[o.operands[0]].dtype != "f32":
            _fail(stage, f"{o.kind} adds a {types[o.operands[0]].dtype} tile; cast it to f32 first", o)
    for o in walk(p.body):
        if o.attr("arg") in targets and not OPS[o.kind].accumulates:
            _fail(stage, f"{o.kind} touches {o.attr('arg')!r}, which atomic adds accumulate into: only adds may "
                  f"touch it in the kernel (read the sum after it ends)", o)


_FROM_STAGE = (("template", (_check_accumulate,)), ("data_partition", (_check_chains, _check_split)),
               ("loop_schedule", (_check_schedule,)),
               ("partition_schedule", (_check_partitions,)), ("buffers", (_check_channels,)),
               ("memory_plan", (_check_memory,)), ("code_partition", (_check_code, _check_turns)),
               ("software_pipeline", (_check_pipelined,)), ("tile_loop", (_check_tile_loops,)),
               ("cross_tile", (_check_cross_tile,)))

