"""Per-op Gluon emitters that any generation shares: ``EMITTERS[kind](ctx, op, indent) -> lines``,
registered with ``@emitter``.

Elementwise math, reductions, masks, loops, register loads and stores, ring counters and slot
indexing are plain Gluon and live here. What a GPU generation lowers its own way (the MMA, TMA
copies, mbarrier waits and arrivals) lives in that generation's module (``codegen/sm90.py``), whose
``EMITTERS`` ``emit_ops`` consults first. Each emitted block is preceded by a comment holding the IR
op and its partition (``emit_ops``), so a reader of the generated Gluon finds where every line came from.
"""
from __future__ import annotations

from ..ir import Grid, format_op, walk
from .context import GL_DTYPE, Ctx, expr, v

EMITTERS = {}


def emitter(*kinds, table: dict | None = None):
    """Register the decorated function as the emitter of ``kinds`` in ``table`` (default: the shared
    ``EMITTERS``; a generation's module passes its own)."""
    def deco(fn):
        for k in kinds:
            (EMITTERS if table is None else table)[k] = fn
        return fn
    return deco


def emit_ops(ctx: Ctx, ops, indent: int) -> list[str]:
    lines = []
    pad = "    " * indent
    for o in ops:
        fn = ctx.lowering.EMITTERS.get(o.kind) or EMITTERS.get(o.kind)
        if fn is None:
            raise NotImplementedError(f"codegen: no Gluon emitter for op kind {o.kind!r} on {ctx.program.arch.name}; "
                                      f"add one to codegen/emitters.py or codegen/{ctx.program.arch.name}.py")
        head = format_op(o)[0].strip()
        if o.kind not in ("yield", "tile_loop"):  # the tile walk's lines say what they are
            lines.append(f"{pad}# {head}  <{ctx.part.name}>")
        lines += [pad + ln if ln else ln for ln in fn(ctx, o, indent)]
    return lines


@emitter("zeros")
def _zeros(ctx, o, indent):
    r = o.results[0]
    return [f"{v(r.name)} = gl.zeros({list(r.type.shape)}, {GL_DTYPE[r.type.dtype]}, {ctx.layouts[r.name]})"]


def _float(x) -> str:
    return f'float("{x}")' if isinstance(x, str) else repr(float(x))


@emitter("full")
def _full(ctx, o, indent):
    r = o.results[0]
    return [f"{v(r.name)} = gl.full({list(r.type.shape)}, {_float(o.attr('value'))}, {GL_DTYPE[r.type.dtype]}, "
            f"{ctx.layouts[r.name]})"]


def _as(ctx, x: str, layout: str) -> str:
    """Operand ``x`` in ``layout`` (a register shuffle through SMEM only where they differ)."""
    return v(x) if ctx.layouts.get(x) == layout else f"gl.convert_layout({v(x)}, {layout})"


def mask_guard(o, bm: int, bn: int) -> str:
    """A uniform condition, true for every block the mask can change: the block crosses the key
    length (``col + bn > kv_len``), the query length if given, or, causal, the diagonal (its last key is
    past its first query). Every other block keeps all of its scores, so the mask is skipped there.
    ``keys_on_rows`` (the transposed frame): keys are rows from ``row``, queries columns from ``col``."""
    row, col, kv = expr(o.attr("row")), expr(o.attr("col")), expr(o.attr("kv_len"))
    (k0, nk), (q0, nq) = ((row, bm), (col, bn)) if o.attr("keys_on_rows") else ((col, bn), (row, bm))
    cond = f"({k0} + {nk} > {kv})"
    if o.attr("q_len") is not None:
        cond += f" | ({q0} + {nq} > {expr(o.attr('q_len'))})"
    if o.attr("causal"):
        cond += f" | ({k0} + {nk - 1} > {q0})"
    return cond


def _mask_keep(ctx, o, L: str, bm: int, bn: int) -> tuple[list[str], str]:
    """(lines, keep condition) of the general mask: key < kv_len, query < q_len (if given), causal key <= query,
    in either frame (``keys_on_rows``)."""
    n = v(o.results[0].name)
    lines = [f"{n}_r = {expr(o.attr('row'))} + gl.arange(0, {bm}, layout={ctx._slice(1, L)})",
             f"{n}_c = {expr(o.attr('col'))} + gl.arange(0, {bn}, layout={ctx._slice(0, L)})"]
    keys, queries = (f"{n}_r[:, None]", f"{n}_c[None, :]") if o.attr("keys_on_rows") else \
        (f"{n}_c[None, :]", f"{n}_r[:, None]")
    keep = [f"({keys} < {expr(o.attr('kv_len'))})"]
    if o.attr("q_len") is not None:
        keep.append(f"({queries} < {expr(o.attr('q_len'))})")
    if o.attr("causal"):
        keep.append(f"({keys} <= {queries})")
    return lines, " & ".join(keep)


@emitter("mask")
def _mask(ctx, o, indent):
    r = o.results[0]
    L = ctx.layouts[r.name]
    bm, bn = r.type.shape
    x, lim = v(r.name), f"{v(r.name)}_lim"
    if o.attr("keys_on_rows") or o.attr("q_len") is not None:
        body, keep = _mask_keep(ctx, o, L, bm, bn)
        body.append(f"{x} = gl.where({keep}, {v(o.operands[0])}, float(\"-inf\"))")
        if not ctx.program.options.skip_mask:
            return body
        return [f"{x} = {v(o.operands[0])}", f"if {mask_guard(o, bm, bn)}:"] + ["    " + ln for ln in body]
    # one compare per score: column c of the block is kept iff c < limit of its row
    kv = expr(o.attr("kv_len"))
    body = []
    if o.attr("causal"):  # top-left causal: key <= query, and key < kv_len
        body.append(f"{lim} = gl.minimum({expr(o.attr('row'))} + 1 + gl.arange(0, {bm}, layout={ctx._slice(1, L)}), "
                    f"{kv}) - {expr(o.attr('col'))}")
        keep = f"gl.arange(0, {bn}, layout={ctx._slice(0, L)})[None, :] < {lim}[:, None]"
    else:
        body.append(f"{lim} = {kv} - {expr(o.attr('col'))}")
        keep = f"gl.arange(0, {bn}, layout={ctx._slice(0, L)})[None, :] < {lim}"
    body.append(f"{x} = gl.where({keep}, {v(o.operands[0])}, float(\"-inf\"))")
    if not ctx.program.options.skip_mask:
        return body
    # only blocks on the diagonal or the key tail are masked (a uniform branch; the rest skip the ALU work)
    return [f"{x} = {v(o.operands[0])}", f"if {mask_guard(o, bm, bn)}:"] + ["    " + ln for ln in body]


@emitter("mulc")
def _mulc(ctx, o, indent):
    return [f"{v(o.results[0].name)} = {v(o.operands[0])} * {expr(o.attr('c'))}"]


@emitter("reduce_max", "reduce_sum")
def _reduce(ctx, o, indent):
    fn = "gl.max" if o.kind == "reduce_max" else "gl.sum"
    return [f"{v(o.results[0].name)} = {fn}({v(o.operands[0])}, axis={o.attr('axis')})"]


@emitter("fin0")
def _fin0(ctx, o, indent):
    x = v(o.operands[0])
    return [f"{v(o.results[0].name)} = gl.where({x} == float(\"-inf\"), 0.0, {x})  # fully masked row: no -inf - -inf"]


@emitter("div0")
def _div0(ctx, o, indent):
    r = o.results[0]
    a, b = (_as(ctx, x, ctx.layouts[r.name]) for x in o.operands)
    return [f"{v(r.name)} = gl.where({b} == 0.0, 0.0, {a} / gl.where({b} == 0.0, 1.0, {b}))"]


@emitter("lse")
def _lse(ctx, o, indent):
    m, l_ = (v(x) for x in o.operands)
    return [f"{v(o.results[0].name)} = gl.where({l_} == 0.0, float(\"-inf\"), "
            f"({m} + gl.log2(gl.where({l_} == 0.0, 1.0, {l_}))) * 0.6931471805599453)"]


@emitter("store_ptr")
def _store_ptr(ctx, o, indent):
    n, index = _tile_index(ctx, o)
    rows, cols = f"({expr(o.attr('row'))} + {n}_r)", f"({expr(o.attr('col', 0))} + {n}_c)"
    if o.attr("transposed"):  # element (r, c) to (col + c) * ld + row + r: the tile's rows walk the target's columns
        addr = f"({cols}.to(gl.int64) * ({expr(o.attr('ld'))}))[None, :] + {rows}[:, None]"
    else:
        addr = f"({rows}.to(gl.int64) * ({expr(o.attr('ld'))}))[:, None] + {cols}[None, :]"
    lines = [*index,
             f"{n}_p = {o.attr('arg')}_ptr + {addr}",
             f"gl.store({n}_p, {n}, mask={_store_mask(n, o)})"]
    if o.attr("pred"):  # after a split_reduce: only the CTA that summed the parts stores the tile
        return [f"if {v(o.attr('pred'))}_last:"] + ["    " + ln for ln in lines]
    return lines


@emitter("atomic_add_ptr")
def _atomic_add_ptr(ctx, o, indent):
    # store_ptr's elements; a relaxed fp32 red.global.add per element (the adds of other CTAs commute with it). The
    # tile's first row is a 64-bit scalar base and the elements i32 offsets from it: with ``ld`` a constant, a thread's
    # offsets differ by constants and share one address register (per-element 64-bit addresses, as store_ptr
    # computes them, hold two registers per element and spill in the backward's loop)
    n, index = _tile_index(ctx, o)
    ld = expr(o.attr("ld"))
    return [*index,
            f"{n}_base = {o.attr('arg')}_ptr + ({expr(o.attr('row'))}).to(gl.int64) * ({ld})",
            f"{n}_p = {n}_base + ({n}_r * ({ld}))[:, None] + ({expr(o.attr('col', 0))} + {n}_c)[None, :]",
            f"gl.atomic_add({n}_p, {n}, mask={_store_mask(n, o)}, sem=\"relaxed\", scope=\"gpu\")"]


def _tile_index(ctx, o) -> tuple[str, list[str]]:
    """The stored register tile's name and the lines of its row and column indices (``<name>_r``, ``<name>_c``) in
    its layout's slices: what store_ptr and atomic_add_ptr address elements from."""
    x = o.operands[0]
    L = ctx.layouts[x]
    bm, bn = next(r.type for op_ in walk(ctx.part.body) for r in op_.results if r.name == x).shape
    n = v(x)
    return n, [f"{n}_r = gl.arange(0, {bm}, layout={ctx._slice(1, L)})",
               f"{n}_c = gl.arange(0, {bn}, layout={ctx._slice(0, L)})"]


def _store_mask(n: str, o) -> str:
    """store_ptr's mask: rows below ``rows_valid``, and (a tile wider than the tensor) columns below ``cols_valid``."""
    rows = f"({n}_r < {expr(o.attr('rows_valid'))})[:, None]"
    if o.attr("cols_valid") is None:
        return rows
    return f"{rows} & ({n}_c < {expr(o.attr('cols_valid'))})[None, :]"


@emitter("store_vec")
def _store_vec(ctx, o, indent):
    x = o.operands[0]
    n = v(x)
    t = next(r.type for op_ in walk(ctx.part.body) for r in op_.results if r.name == x)
    return [f"{n}_i = gl.arange(0, {t.shape[0]}, layout={ctx.layouts[x]})",
            f"gl.store({o.attr('arg')}_ptr + {expr(o.attr('offset'))} + {n}_i, {n}, "
            f"mask={n}_i < {expr(o.attr('valid'))})"]


@emitter("advance")
def _advance(ctx, o, indent):
    return [f"{o.attr('group')}_n += 1"]


@emitter("seek")
def _seek(ctx, o, indent):
    # a tile consumer's ring position: the first fill of the CTA's j-th tile (j from the walk's ``tile``)
    return [f"{o.attr('group')}_n = (tile - gl.program_id(0)) // gl.num_programs(0) * ({expr(o.attr('per_tile'))})"]


def _ago(g, lag: int) -> str:
    """The ring slot of ``lag`` steps before the group's counter."""
    return f"({g.name}_n + {g.count - lag}) % {g.count}"


@emitter("get")
def _get(ctx, o, indent):
    lag = o.attr("lag", 0)
    if lag:  # the slot of ``lag`` steps ago (a deferred reader); it is not released yet
        return [f"{v(o.results[0].name)} = {o.attr('buffer')}.index({_ago(ctx.groups[o.attr('group')], lag)})"]
    return [f"{v(o.results[0].name)} = {o.attr('buffer')}.index({o.attr('group')}_s)"]


@emitter("trans")
def _trans(ctx, o, indent):
    return [f"{v(o.results[0].name)} = {v(o.operands[0])}.permute((1, 0))"]


@emitter("load_vec")
def _load_vec(ctx, o, indent):
    r = o.results[0]
    n = r.type.shape[0]
    offs = f"{v(r.name)}_offs"
    return [f"{offs} = {expr(o.attr('offset'))} + gl.arange(0, {n}, layout={ctx.layouts[r.name]})",
            f"{v(r.name)} = gl.load({o.attr('arg')}_ptr + {offs}, mask={offs} < {expr(o.attr('size'))}, "
            f"other=0.0).to({GL_DTYPE[r.type.dtype]})"]


@emitter("load_ptr")
def _load_ptr(ctx, o, indent):
    # in the layout its user needs (the accumulator's: no shuffle before the add), masked rows and columns read 0
    r = o.results[0]
    L = ctx.layouts[r.name]
    bm, bn = r.type.shape
    n = v(r.name)
    return [f"{n}_r = gl.arange(0, {bm}, layout={ctx._slice(1, L)})",
            f"{n}_c = gl.arange(0, {bn}, layout={ctx._slice(0, L)})",
            f"{n}_p = {o.attr('arg')}_ptr + (({expr(o.attr('row'))} + {n}_r).to(gl.int64) * ({expr(o.attr('ld'))}))"
            f"[:, None] + ({expr(o.attr('col'))} + {n}_c)[None, :]",
            f"{n}_m = ({n}_r < {expr(o.attr('rows_valid'))})[:, None] & "
            f"({n}_c < {expr(o.attr('cols_valid'))})[None, :]",
            f"{n} = gl.load({n}_p, mask={n}_m, other=0.0).to({GL_DTYPE[r.type.dtype]})"]


@emitter("expand")
def _expand(ctx, o, indent):
    return [f"{v(o.results[0].name)} = gl.expand_dims({v(o.operands[0])}, {o.attr('axis')})"]


_BINARY = {"add": "{} + {}", "sub": "{} - {}", "mul": "{} * {}", "max": "gl.maximum({}, {})"}


@emitter(*_BINARY)
def _binary(ctx, o, indent):
    r = o.results[0].name
    L = ctx.layouts.get(r)
    # a broadcast operand ([BM, 1] / [1, BN]) from another accumulator layout is moved into ours
    args = [_as(ctx, x, L) if L and ctx.layouts.get(x, L).rsplit("_S", 1)[0] != L.rsplit("_S", 1)[0] else v(x)
            for x in o.operands]
    return [f"{v(r)} = " + _BINARY[o.kind].format(*args)]


@emitter("exp2")
def _exp2(ctx, o, indent):
    return [f"{v(o.results[0].name)} = gl.exp2({v(o.operands[0])})"]


@emitter("silu")
def _silu(ctx, o, indent):  # x * sigmoid(x) = x / (1 + e^-x); e^-x = 2^(-x log2 e): inf for very negative x -> -0
    x = v(o.operands[0])
    return [f"{v(o.results[0].name)} = {x} / (1.0 + gl.exp2({x} * -1.4426950408889634))"]


@emitter("gelu")
def _gelu(ctx, o, indent):
    # tanh form: 0.5 x (1 + tanh(u)) = x sigmoid(2u) = x / (1 + 2^(-2u log2 e)), u = sqrt(2/pi) (x + 0.044715 x^3)
    # (Gluon has no tanh): large |u| gives x / 1 or x / inf = -0, never inf/inf. erf form: 0.5 x (1 + erf(x / sqrt 2))
    x, r = v(o.operands[0]), v(o.results[0].name)
    if o.attr("approximate") == "tanh":  # -2 log2(e) sqrt(2/pi) = -2.302208198144325
        return [f"{r} = {x} / (1.0 + gl.exp2(({x} + 0.044715 * {x} * {x} * {x}) * -2.302208198144325))"]
    if o.attr("approximate") == "none":
        return [f"{r} = 0.5 * {x} * (1.0 + gl.erf({x} * 0.7071067811865476))"]
    raise ValueError(f"gelu: approximate {o.attr('approximate')!r} has no emitter; use 'tanh' or 'none'")


@emitter("neg")
def _neg(ctx, o, indent):
    return [f"{v(o.results[0].name)} = -{v(o.operands[0])}"]


@emitter("where")
def _where(ctx, o, indent):  # as interp: a nonzero condition keeps a; b takes a's dtype
    c, a, b = (v(x) for x in o.operands)
    return [f"{v(o.results[0].name)} = gl.where({c} != 0, {a}, {b}.to({GL_DTYPE[o.results[0].type.dtype]}))"]


@emitter("cast")
def _cast(ctx, o, indent):
    return [f"{v(o.results[0].name)} = {v(o.operands[0])}.to({GL_DTYPE[o.results[0].type.dtype]})"]


@emitter("split_reduce")
def _split_reduce(ctx, o, indent):
    # see passes/split_k: partials -> workspace slots; barrier; one arrival on the tile's counter; the last
    # arriver resets the counter and sums each accumulator's slots in order 0..S-1 (deterministic)
    xs, rs = o.operands, o.results
    L = ctx.layouts[xs[0]]
    bm, bn = rs[0].type.shape
    if any(r.type.shape != (bm, bn) or ctx.layouts[x] != L for x, r in zip(xs, rs)):
        raise ValueError(f"codegen: split_reduce of {', '.join(xs)}: the accumulators differ in shape or layout")
    n, S, A = v(rs[0].name), o.attr("splits"), len(xs)
    locks = f"{o.attr('locks')}_ptr"

    def at(i: int) -> str:  # accumulator i's first slot: its S parts follow one another
        return f"{n}_ws + {i * S * bm * bn}" if i else f"{n}_ws"

    def load(i: int) -> str:
        return (f"gl.load({at(i)} + j * {bm * bn} + {n}_off, mask={n}_keep, other=0.0, "
                f"cache_modifier=\".cg\")  # from L2: other SMs wrote it")
    return [f"{n}_tile = {expr(o.attr('index'))}  # the output tile's counter and workspace slots",
            f"{n}_r = gl.arange(0, {bm}, layout={ctx._slice(1, L)})",
            f"{n}_c = gl.arange(0, {bn}, layout={ctx._slice(0, L)})",
            f"{n}_off = ({n}_r * {bn})[:, None] + {n}_c[None, :]",
            f"{n}_keep = ({n}_r < {expr(o.attr('rows_valid'))})[:, None] & ({n}_c < {bn})[None, :]",
            f"{n}_ws = {o.attr('ws')}_ptr + {n}_tile.to(gl.int64) * {A * S * bm * bn}",
            *(f"gl.store({at(i)} + ({expr(o.attr('part'))}) * {bm * bn} + {n}_off, {v(x)}, mask={n}_keep)"
              for i, x in enumerate(xs)),
            "gl.thread_barrier()  # every thread's partial is written before the arrival",
            f"{n}_seen = gl.atomic_add({locks} + {n}_tile, 1, sem=\"acq_rel\", scope=\"gpu\")",
            "gl.thread_barrier()  # the other parts' writes are visible to every thread after the acquire",
            f"{n}_last = {n}_seen == {S - 1}",
            *(f"{v(r.name)} = gl.zeros({[bm, bn]}, gl.float32, {L})" for r in rs),
            f"if {n}_last:",
            f"    for j in range({S}):  # in slot order: the sum does not depend on who came last",
            *(f"        {v(r.name)} = {v(r.name)} + {load(i)}" for i, r in enumerate(rs)),
            f"    gl.atomic_xchg({locks} + {n}_tile, 0, sem=\"relaxed\", scope=\"gpu\")  # zero for the next launch"]


@emitter("loop")
def _loop(ctx, o, indent):
    its = o.attr("iter_args")
    out = [f"{v(n)} = {v(x)}" for n, x in zip(its, o.operands)]
    lb, ub = expr(o.attr("lb")), expr(o.attr("ub"))
    out.append(f"for {o.attr('var')} in range({lb}, {ub}):")
    ctx.loop_stack.append(o)
    body = emit_ops(ctx, o.body, 1)
    ctx.loop_stack.pop()
    out += [ln[0:] for ln in body] or ["    pass"]
    out += [f"{v(r.name)} = {v(n)}" for n, r in zip(its, o.results)]
    out.append(f"_trip = {ub} - ({lb})")
    return out


@emitter("yield")
def _yield(ctx, o, indent):
    loop = ctx.loop_stack[-1]
    its = loop.attr("iter_args")
    if not its:
        return []
    return [f"{', '.join(v(n) for n in its)} = {', '.join(v(x) for x in o.operands)}"]


def tile_lines(grid) -> tuple[list[str], list[str]]:
    """(before the walk, per tile) lines of a grid: the tile counts, then linear tile id ``tile`` -> tile
    indices, grouped along the second-to-last index for L2 reuse (persistent serpentine: odd waves reversed)."""
    names = [n for n, _ in grid.tiles]
    lines = [f"num_{n} = {expr(e)}" for n, e in grid.tiles]
    lines.append("num_tiles = " + " * ".join(f"num_{n}" for n in names))
    body = ["t = tile"]
    if grid.persistent and grid.serpentine:  # odd waves reversed: wave w holds tiles [w*P, w*P + size)
        body += ["wave0 = (t // gl.num_programs(0)) * gl.num_programs(0)",
                 "wave_size = min(gl.num_programs(0), num_tiles - wave0)",
                 "t = t + ((t // gl.num_programs(0)) % 2) * (2 * wave0 + wave_size - 1 - 2 * t)"]
    for n in names[:-2]:
        inner = " * ".join(f"num_{m}" for m in names[names.index(n) + 1:])
        body += [f"{n} = t // ({inner})", f"t = t % ({inner})"]
    if len(names) >= 2:
        m, n = names[-2], names[-1]
        body += [f"group_size = {grid.group} * num_{n}",
                 f"first = (t // group_size) * {grid.group}",
                 f"size = min(num_{m} - first, {grid.group})",
                 f"{m} = first + (t % group_size) % size",
                 f"{n} = (t % group_size) // size"]
    else:
        body.append(f"{names[0]} = t")
    return lines, body


@emitter("tile_loop")
def _tile_loop(ctx, o, indent):
    """The CTA's walk over its output tiles (passes/tile_loop): persistent ``for tile in range(pid, num_tiles,
    nprog)``, else ``tile = pid``; the tile indices; the body once per tile; then the stores drained. A
    ``cross_tile`` walk (passes/cross_tile) runs its body once, on the CTA's first tile (if it has one); the
    body's ``tile_next`` walks the rest."""
    grid = Grid.of(o)
    pre, per_tile = tile_lines(grid)
    out = list(pre)
    if o.attr("cross_tile"):
        # the first tile, peeled: its head runs before the walk. A loop of at most one trip, not an ``if``: with the
        # ``if``, llc hoists more scalars the partitions share (ctaid, cdiv(Sq, 128), ...) above the warp dispatch,
        # they live through every partition and ptxas spills them (12-124 bytes, sm_90a; a heuristic, measured)
        out.append("for tile in range(gl.program_id(0), gl.minimum(gl.program_id(0) + 1, num_tiles)):")
        out += ["    " + ln for ln in per_tile] + emit_ops(ctx, o.body, 1)
    elif grid.persistent and o.attr("share"):  # a tile consumer: the CTA's j-th tiles with j % t == c
        c, t = o.attr("share")
        first = "gl.program_id(0)" + (f" + {c} * gl.num_programs(0)" if c else "")
        out.append(f"for tile in range({first}, num_tiles, {t} * gl.num_programs(0)):")
        inner = 1
    elif grid.persistent:
        out.append("for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):")
        inner = 1
    else:
        out.append("tile = gl.program_id(0)")
        inner = 0
    if not o.attr("cross_tile"):
        out += ["    " * inner + ln for ln in per_tile]
        out += emit_ops(ctx, o.body, inner)
    if any(x.kind == "store" for x in walk(o.body)):
        out.append("tma.store_wait(0)")
    return out


@emitter("tile_next")
def _tile_next(ctx, o, indent):
    """passes/cross_tile: the CTA's tiles after its first, the previous tile's indices kept as ``<index>_prev``
    and its values carried in the iter_args (the enclosing ``cross_tile`` tile_loop bound the first tile)."""
    grid = Grid.of(ctx.part.body[0])  # the enclosing tile_loop (a partition body is one)
    its = o.attr("iter_args")
    out = [f"{v(n)} = {v(x)}" for n, x in zip(its, o.operands)]
    out.append("for tile in range(gl.program_id(0) + gl.num_programs(0), num_tiles, gl.num_programs(0)):")
    out += [f"    {n}_prev = {n}" for n, _ in grid.tiles]
    out += ["    " + ln for ln in tile_lines(grid)[1]]
    ctx.loop_stack.append(o)
    out += emit_ops(ctx, o.body, 1)
    ctx.loop_stack.pop()
    out += [f"{v(r.name)} = {v(n)}" for n, r in zip(its, o.results)]
    return out
