"""data_partition: split the output tile along M into ``options.data_partition`` (1-3) independent chains,
after splitting the reduction loop across ``options.split_k`` CTAs (passes/split_k: the K axis).

Assumes: a Program before partitioning (no chains, stages or partitions yet); outputs leave through
``store`` ops; every op kind's row/column structure is known (``_operand_axes`` below).
Guarantees: every op that computes part of an output has ``chain`` = its chain index; with factor f > 1
the split values are renamed ``<name>_c<i>`` with the split dimension divided by f and load/store
coordinates offset; TMA ``load``s that no chain splits stay shared with ``chain=None``; cheap
non-load ops that both chains need are replicated, so chains share no values except those loads.

Algorithm: propagate "split along axis a" backwards from each store's operand (axis 0, rows) through
the ops (mma: rows come from A and the accumulator, not B; trans swaps axes; expand/reduce shift
them; loops tie results, yields, inits and iter_args together) to a fixpoint, then rebuild the body,
cloning every split or needed op once per chain.

An output that accumulates (``atomic_add_ptr``, ``tma_reduce_add``: adds into memory) whose value is an mma with its
contraction axis split on both operands (A along axis 1, B along axis 0; through unary ops and ``trans``: attention
backward's dQ = dS K, with dS and K split by the dK/dV rows) takes a *partial*: the mma and the ops after it keep
their full shape, are cloned per chain (each chain its share of the sum) and every chain adds its own partial, with
no row shift. A partial read by anything but an accumulating output is an error (it would be stored unsummed).

With ``options.dq_split`` (attention backward's reduce form at f > 1 chains, FA3's split dQ) such a partial is not
taken: the chains share their dS tiles instead. The mma must be ``trans(smem_store(dS)) @ K`` (K a split TMA load)
added by a ``tma_reduce_add``; chain i then meets the others once a step after its dS store (``chain_sync``, bar
``<dS>_meet``) and computes dQ^T's head-dim rows i*D/f.. over every key: for each chain x, ``trans(slice(K_x, i*D/f,
D/f)) @ dS_x`` (dS_x its own tile or ``smem_view`` of chain x's), summed in one accumulator [D/f, BM] (wgmma's M is
D/f, so D/f >= 64, and BM may be 32), reduced ``transposed`` at column i*D/f. Where D/f is under 64 and BM/f is a
multiple of 64 (d=64 with 128-query steps: FA3's d=64 tile) chain i computes dQ's query rows i*BM/f.. instead: for
each chain x, ``trans(slice(dS_x, i*BM/f, BM/f)) @ K_x`` (K_x whole: a chain reads another chain's K load as the
wgmma's B), summed in [BM/f, D], reduced at row i*BM/f. Either way a step adds BM x D of partials for all f chains'
keys instead of f of them. ``memory_plan`` gives a tile another chain views two copies (its owner rewrites a copy
two steps later, after a meeting the reader reaches only with its step's wgmmas retired).

With ``options.tile_consumers`` t > 1 (ping-pong over tiles) nothing is split: the whole tile is replicated into t
chains, each op but the TMA ``load``s cloned once per chain (values renamed ``<name>_c<i>``, shapes, coordinates
and row attributes unchanged), the loads shared (``chain=None``); chain c is the consumer that runs tiles c, c+t,
... of its CTA (passes/partition_schedule). Refused (PassError): data_partition > 1 (a tile is either split or
replicated), split_k > 1 (the parts of a tile differ in K steps, so a ring position could not be a tile's index
times its fills), a grid that is not persistent (a CTA has one tile: no one to alternate with), ``pingpong`` (its
turns assume every consumer runs every tile) and ``cross_tile`` (it overlaps a consumer's consecutive tiles).
"""
from __future__ import annotations

from dataclasses import replace

from ..ir import Op, Program, TileType, Value, add_offset, defs, op, value_types, walk
from ..ir.kinds import OPS
from . import PassError, split_k


def _output(o: Op) -> bool:
    """An output op (its operand splits along rows, axis 0)."""
    k = OPS.get(o.kind)
    return k is not None and k.output


def _operand_axes(o: Op, axis: int, types: dict[str, TileType]) -> dict[str, int | None]:
    """For an op whose result is split along ``axis``: operand -> axis it must be split along (None: not split);
    the rule is the kind's ``axes`` in the op table (ir/kinds.py)."""
    k = OPS.get(o.kind)
    rule = k.axes if k is not None else None
    if rule == "elementwise":
        return {x: (axis if types[x].shape[axis] != 1 else None) for x in o.operands}
    if rule == "columns":  # rows follow the operands; a column split would cut the chunks
        if axis != 0:
            raise PassError(f"data_partition: {o.kind} takes a part of its operand's columns; its result cannot be "
                            f"split along columns")
        return {x: 0 for x in o.operands}
    if rule == "mma":  # acc is optional (use_acc=False without it)
        a, b, *acc = o.operands
        out = {a: 0, b: None} if axis == 0 else {a: None, b: 1}
        out.update({x: axis for x in acc})
        return out
    if rule == "trans":
        return {o.operands[0]: 1 - axis}
    if rule == "expand":
        e = o.attr("axis")
        return {o.operands[0]: axis if axis < e else axis - 1}
    if rule == "reduce":
        r = o.attr("axis")
        return {o.operands[0]: axis if axis < r else axis + 1}
    if rule == "source":
        return {}
    raise PassError(f"data_partition: no split rule for op kind {o.kind!r} (give it ``axes`` in ir/kinds.py)")


def _accumulates(o: Op) -> bool:
    """An output that adds into memory (``accumulates`` in the op table): it may take a per-chain partial sum."""
    k = OPS.get(o.kind)
    return k is not None and k.output and k.accumulates


def _follows(x: str, dmap: dict, split: dict[str, int]) -> int | None:
    """The axis along which ``x`` is split or derives from a split value through unary same-shape ops and
    ``trans`` (None: neither)."""
    swapped = False
    while x not in split:
        d = dmap.get(x)
        if d is None or d.kind == "loop" or len(d.operands) != 1 or OPS[d.kind].axes not in ("elementwise", "trans"):
            return None
        swapped ^= OPS[d.kind].axes == "trans"
        x = d.operands[0]
    return 1 - split[x] if swapped else split[x]


def _partial_chain(o: Op, dmap: dict, split: dict[str, int], users: dict) -> list[str] | None:
    """The values from an accumulating output's operand back to the mma whose contraction axis the chains split
    (A along axis 1, B along axis 0): each chain then adds its own full-shape partial sum (BACKWARD.md §3, Break 1).
    None when there is no such mma: the output splits along rows as any other."""
    chain = [o.operands[0]]
    d = dmap.get(chain[0])
    while d is not None and d.kind != "mma" and len(d.operands) == 1 and OPS[d.kind].axes == "elementwise":
        chain.append(d.operands[0])
        d = dmap.get(chain[-1])
    if d is None or d.kind != "mma" or len(d.operands) != 2:
        return None
    if _follows(d.operands[0], dmap, split) != 1 or _follows(d.operands[1], dmap, split) != 0:
        return None
    for x in chain:  # a partial is summed only by the memory it is added into
        for u in users.get(x, ()):
            if not (_accumulates(u) or any(r.name in chain for r in u.results)):
                raise PassError(f"data_partition: %{x} is a partial sum (each chain's share of a split contraction) "
                                f"read by `{u.kind}`: a partial sum would be stored; only accumulating outputs "
                                f"(atomic_add_ptr, tma_reduce_add) may take it")
    return chain


def _dq_split_targets(body: tuple[Op, ...], partial: set[str], f: int) -> dict[str, tuple[Op, Op, Op]]:
    """``dq_split``: dQ mma result -> (its reduce, the ``trans`` of the dS tile it reads, that tile's smem_store); a
    PassError where the partial sums are not that shape."""
    dmap, types = defs(body), value_types(body)
    users: dict[str, list[Op]] = {}
    for o in walk(body):
        for x in o.operands:
            users.setdefault(x, []).append(o)
    out = {}
    for o in walk(body):
        if not (_accumulates(o) and o.operands[0] in partial):
            continue
        x = o.operands[0]
        mma = dmap[x]
        tr = dmap.get(mma.operands[0])
        st = dmap.get(tr.operands[0]) if tr is not None and tr.kind == "trans" else None
        kd = dmap.get(mma.operands[1])
        why = ("it is not added by a tma_reduce_add" if o.kind != "tma_reduce_add" else
               "its operand is not an mma's result" if mma.kind != "mma" else
               "the mma's A is not a trans view of an smem_store tile" if st is None or st.kind != "smem_store" else
               "the mma's B is not a TMA load" if kd is None or kd.kind != "load" else
               "the dS view or the mma result has other readers" if len(users[tr.results[0].name]) != 1
               or len(users[x]) != 1 else
               f"neither D/f = {types[x].shape[1]}/{f} nor BM/f = {types[x].shape[0]}/{f} is a multiple of 64 "
               f"(wgmma's M)" if _dq_split_axis(types[x].shape, f) is None else None)
        if why:
            raise PassError(f"data_partition: dq_split with %{x}: {why}; the split dQ takes "
                            f"tma_reduce_add(mma(trans(smem_store(dS)), K_load)) with D/f or BM/f a multiple of 64 "
                            f"(set dq_split=False for a partial sum per chain)")
        out[x] = (o, tr, st)
    if not out:
        raise PassError("data_partition: dq_split, but no chain adds a partial sum to split (it serves the attention "
                        "backward's reduce form at data_partition > 1)")
    return out


def _dq_split_axis(shape: tuple[int, ...], f: int) -> int | None:
    """The axis of dQ [BM, D] the chains split (1: head-dim columns, 0: query rows) so that each chain's wgmma M is a
    multiple of 64: the columns where D/f allows (dQ^T's rows), else the rows (dQ's); None where neither does."""
    if shape[1] % (64 * f) == 0:
        return 1
    if shape[0] % (64 * f) == 0 and shape[1] % 8 == 0:
        return 0
    return None


def _dq_split_ops(mma: Op, reduce: Op, tr: Op, types, f: int) -> dict[str, list[list[Op]]]:
    """Per chain, the ops that replace ``tr`` (the meeting), ``mma`` (dQ's share over every chain's keys) and
    ``reduce`` (at the chain's columns or rows): see the module docstring."""
    x, (dss, k) = mma.results[0].name, (tr.operands[0], mma.operands[1])
    dss_t, k_t, q_t = types[dss], types[k], types[x]
    BM, D = q_t.shape
    rows = k_t.shape[0] // f
    by_cols = _dq_split_axis(q_t.shape, f) == 1
    out: dict[str, list[list[Op]]] = {"trans": [], "mma": [], "reduce": []}
    for i in range(f):
        out["trans"].append([replace(op("chain_sync", bar=f"{dss}_meet", count=f), chain=i)])
        ops, acc = [], []
        for c in range(f):
            ds = f"{dss}_c{i}" if c == i else f"{dss}_c{c}_v{i}"  # chain c's dS^T: the own tile, or a view of c's
            view = [] if c == i else [op("smem_view", [Value(ds, replace(dss_t, shape=(rows, BM)))], [f"{dss}_c{c}"],
                                         step_of=f"{dss}_c{i}")]
            t = "t" if by_cols else ""
            name = f"{x}{t}_c{i}" if c == f - 1 else f"{x}{t}{c}_c{i}"
            if by_cols:  # dQ^T's head-dim rows i*w..: trans(K_c's columns) @ dS^T_c
                w = D // f
                ks = Value(f"{k}_c{c}_d{i}", replace(k_t, shape=(rows, w)))
                kt = Value(f"{k}t_c{c}_d{i}", replace(k_t, shape=(w, rows)))
                ops += [op("slice", [ks], [f"{k}_c{c}"], start=i * w, size=w), op("trans", [kt], [ks.name]), *view,
                        op("mma", [Value(name, replace(q_t, shape=(w, BM)))], [kt.name, ds, *acc])]
            else:  # dQ's query rows i*h..: trans(dS^T_c's query columns) @ K_c (whole)
                h = BM // f
                sl = Value(f"{ds}_q{i}", replace(dss_t, shape=(rows, h)))
                st = Value(f"{ds}_q{i}t", replace(dss_t, shape=(h, rows)))
                ops += [*view, op("slice", [sl], [ds], start=i * h, size=h), op("trans", [st], [sl.name]),
                        op("mma", [Value(name, replace(q_t, shape=(h, D)))], [st.name, f"{k}_c{c}", *acc])]
            acc = [name]
        out["mma"].append([replace(o, chain=i) for o in ops])
        c0, c1 = reduce.attr("coords")
        red = replace(reduce, operands=tuple(acc), chain=i)
        out["reduce"].append([red.with_attrs(coords=(c0, add_offset(c1, i * (D // f))), transposed=True) if by_cols
                              else red.with_attrs(coords=(add_offset(c0, i * (BM // f)), c1))])
    return out


def _split_axes(body: tuple[Op, ...]) -> tuple[dict[str, int], set[str]]:
    """(value -> axis the chains split it along, partial values): from the outputs' rows, then for each
    accumulating output either a partial (``_partial_chain``) or a row split as well."""
    dmap = defs(body)
    split: dict[str, int] = {}
    _propagate(body, [(o.operands[0], 0) for o in walk(body) if _output(o) and not _accumulates(o)], split)
    users: dict[str, list[Op]] = {}
    for o in walk(body):
        for x in o.operands:
            users.setdefault(x, []).append(o)
    partial: set[str] = set()
    for o in walk(body):
        if not _accumulates(o) or o.operands[0] in partial:
            continue
        chain = _partial_chain(o, dmap, split, users)
        if chain is None:
            _propagate(body, [(o.operands[0], 0)], split)
            continue
        partial.update(chain)
        mma = dmap[chain[-1]]
        _propagate(body, [(mma.operands[0], 1), (mma.operands[1], 0)], split)
    return split, partial


def _propagate(body: tuple[Op, ...], work: list[tuple[str, int]], split: dict[str, int]) -> None:
    """Add ``work``'s (value, axis) splits to ``split`` and everything they imply, to a fixpoint."""
    types = value_types(body)
    dmap = defs(body)
    while work:
        v, axis = work.pop()
        if split.get(v) == axis:
            continue
        if v in split:
            raise PassError(f"data_partition: %{v} would be split along axes {split[v]} and {axis}")
        split[v] = axis
        d = dmap[v]
        if d.kind == "loop":  # tie loop result / iter_arg / init / yield together
            i = list(d.attr("iter_args")).index(v) if v in d.attr("iter_args") else \
                [r.name for r in d.results].index(v)
            y = d.body[-1]
            for w in (d.results[i].name, d.attr("iter_args")[i], d.operands[i], y.operands[i]):
                work.append((w, axis))
            continue
        for x, ax in _operand_axes(d, axis, types).items():
            if ax is not None:
                work.append((x, ax))


def _replicate(program: Program, opts) -> Program:
    """The tile body once per tile consumer (``options.tile_consumers``), loads shared (see the module docstring)."""
    t = opts.tile_consumers
    why = [w for w, bad in (("data_partition > 1", opts.data_partition != 1), ("split_k > 1", opts.split_k != 1),
                            ("a grid that is not persistent", not program.grid.persistent),
                            ("pingpong", opts.pingpong), ("cross_tile", opts.cross_tile)) if bad]
    if not isinstance(t, int) or t < 1 or why:
        raise PassError(f"data_partition: tile_consumers={t!r} with {', '.join(why) or 'a count below 1'}: consumers "
                        f"taking turns over tiles run whole tiles of a persistent walk; use tile_consumers=1, or "
                        f"data_partition=1, split_k=1, persistent, no pingpong and no cross_tile")
    shared = {r.name for o in walk(program.body) if o.kind == "load" for r in o.results}

    def rn(x: str, i: int) -> str:
        return x if x in shared else f"{x}_c{i}"

    def clone(o: Op, i: int) -> Op:
        return replace(o, results=tuple(Value(rn(r.name, i), r.type) for r in o.results),
                       operands=tuple(rn(x, i) for x in o.operands), chain=i)

    def rebuild(ops: tuple[Op, ...]) -> tuple[Op, ...]:
        out: list[Op] = []
        for o in ops:
            if o.kind == "load":
                out.append(o)
            elif o.kind == "loop":  # one loop; each carried value once per chain, in data_partition's order
                its = o.attr("iter_args")
                out.append(replace(o, operands=tuple(rn(x, i) for x in o.operands for i in range(t)),
                                   results=tuple(Value(rn(r.name, i), r.type) for r in o.results for i in range(t)),
                                   body=rebuild(o.body)).with_attrs(iter_args=tuple(rn(n, i) for n in its
                                                                                    for i in range(t))))
            elif o.kind == "yield":
                out.append(replace(o, operands=tuple(rn(x, i) for x in o.operands for i in range(t))))
            else:
                out += [clone(o, i) for i in range(t)]
        return tuple(out)

    return replace(program, body=rebuild(program.body))


def run(program: Program, options=None) -> Program:
    opts = options or program.options
    if opts.tile_consumers != 1:
        return _replicate(program, opts)
    f = opts.data_partition
    if f not in (1, 2, 3):
        raise PassError(f"data_partition: factor {f} not supported; use 1, 2 or 3")
    if opts.split_k > 1 and f > 1:
        raise PassError(f"data_partition: split_k={opts.split_k} with {f} chains: the chains would share one "
                        f"reduction counter; use data_partition=1 with split_k")
    program = split_k.run(program, opts)  # the K axis across CTAs first; then the tile's rows across chains
    split, partial = _split_axes(program.body)
    types = value_types(program.body)
    swap: dict[int, list[list[Op]]] = {}  # id of a replaced op -> its replacement per chain (dq_split)
    if opts.dq_split:
        if f == 1:
            raise PassError("data_partition: dq_split shares dS between chains; it needs data_partition > 1")
        dmap0 = defs(program.body)
        for x, (red, tr, _st) in _dq_split_targets(program.body, partial, f).items():
            new = _dq_split_ops(dmap0[x], red, tr, types, f)
            swap.update({id(tr): new["trans"], id(dmap0[x]): new["mma"], id(red): new["reduce"]})
    for v, ax in split.items():
        if types[v].shape[ax] % f:
            raise PassError(f"data_partition: %{v} dim {types[v].shape[ax]} not divisible by {f}")
    dmap = defs(program.body)
    # Values the chains need that are not split: replicate them per chain, except shared TMA loads.
    needed: set[str] = set()
    work = [x for v in (*split, *partial) for x in (dmap[v].operands if dmap[v].kind != "loop" else ())]
    while work:
        x = work.pop()
        if x in split or x in needed or x in partial:
            continue
        d = dmap[x]
        if d.kind == "load":
            continue
        needed.add(x)
        work += list(d.operands)

    def rename(x: str, i: int) -> str:
        if f == 1 or (x not in split and x not in needed and x not in partial):
            return x
        return f"{x}_c{i}"

    def clone(o: Op, i: int) -> Op:
        results = []
        for r in o.results:
            t = r.type
            if r.name in split:
                ax = split[r.name]
                t = replace(t, shape=tuple(d // f if j == ax else d for j, d in enumerate(t.shape)))
            results.append(Value(rename(r.name, i), t))
        new = replace(o, results=tuple(results), operands=tuple(rename(x, i) for x in o.operands), chain=i)
        if o.kind == "load" and o.results[0].name in split:
            ax = split[o.results[0].name]
            step = o.results[0].type.shape[ax] // f
            coords = tuple(add_offset(c, i * step) if j == ax else c for j, c in enumerate(o.attr("coords")))
            new = new.with_attrs(coords=coords)
        if o.kind == "load_vec" and o.results[0].name in split:
            new = new.with_attrs(offset=add_offset(o.attr("offset"), i * o.results[0].type.shape[0] // f))
        if o.kind in ("store", "tma_reduce_add") and o.operands[0] in split:  # a partial keeps its coords
            ax = split[o.operands[0]]
            step = types[o.operands[0]].shape[ax] // f
            coords = tuple(add_offset(c, i * step) if j == ax else c for j, c in enumerate(o.attr("coords")))
            new = new.with_attrs(coords=coords)
        rows = o.results[0].type.shape[0] if o.results else types[o.operands[0]].shape[0]
        step = i * (rows // f)
        if step and not any(x in partial for x in o.operands):  # row-indexed attrs follow the chain's rows
            for a, how in OPS[o.kind].row_attrs if o.kind in OPS else ():
                v = o.attr(a)
                new = new.with_attrs(**{a: add_offset(v, step) if how == "offset" else f"{v}-{step}"})
        return new

    def rebuild(ops: tuple[Op, ...]) -> tuple[Op, ...]:
        out: list[Op] = []
        for o in ops:
            if o.kind == "loop":
                its = o.attr("iter_args")
                inits, names, results = [], [], []
                for n, init, r in zip(its, o.operands, o.results):
                    copies = range(f) if n in split or n in needed else [None]
                    for i in copies:
                        inits.append(rename(init, i) if i is not None else init)
                        names.append(rename(n, i) if i is not None else n)
                        t = r.type
                        if r.name in split:
                            ax = split[r.name]
                            t = replace(t, shape=tuple(d // f if j == ax else d for j, d in enumerate(t.shape)))
                        results.append(Value(rename(r.name, i) if i is not None else r.name, t))
                out.append(replace(o, operands=tuple(inits), results=tuple(results), body=rebuild(o.body))
                           .with_attrs(iter_args=tuple(names)))
            elif o.kind == "yield":  # operands follow the loop's iter_args order, cloned the same way
                ops_ = []
                for x in o.operands:
                    ops_ += [rename(x, i) for i in range(f)] if (x in split or x in needed) else [x]
                out.append(replace(o, operands=tuple(ops_)))
            elif id(o) in swap:
                out += [x for i in range(f) for x in swap[id(o)][i]]
            elif _output(o) or any(r.name in split or r.name in needed or r.name in partial for r in o.results):
                out += [clone(o, i) for i in range(f)]
            else:
                out.append(o)
        return tuple(out)

    body = rebuild(program.body)
    return replace(program, body=body)
