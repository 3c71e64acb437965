"""Gluon code generator: a partitioned Program -> warp-specialized Gluon source for sm_90.

Input: a Program after code_partition (partitions with bodies, buffers with counts/offsets, barrier
groups). Output: Python source of a module with one ``@gluon.jit`` function per partition and a
``kernel`` that allocates SMEM and mbarriers and calls ``gl.warp_specialize`` (first consumer as the
default partition, other consumers and the producer as workers with their warps and registers).

Every op is emitted by the function registered for its kind in ``EMITTERS``; each emitted block
starts with a comment holding the IR op and its partition, so a reader of the Gluon finds its origin.
Per partition and barrier group a counter ``<g>_n`` walks the ring: slot ``n % count``, phase
``(n // count) & 1`` (the producer waits for ``empty`` with the opposite phase: a fresh barrier
counts as released).
"""
from __future__ import annotations

import ast

from ..ir import Op, Program, TileType, format_op, walk

GL_DTYPE = {"bf16": "gl.bfloat16", "fp16": "gl.float16", "f32": "gl.float32", "i32": "gl.int32"}
EMITTERS = {}


def emitter(*kinds):
    def deco(fn):
        for k in kinds:
            EMITTERS[k] = fn
        return fn
    return deco


class _ExprRewriter(ast.NodeTransformer):
    def visit_Call(self, node):
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id == "cdiv":
            node.func = ast.Attribute(ast.Name("gl", ast.Load()), "cdiv", ast.Load())
        return node


def expr(e) -> str:
    """An IR index expression as Gluon source."""
    if isinstance(e, int):
        return str(e)
    return ast.unparse(_ExprRewriter().visit(ast.parse(e, mode="eval")))


def v(name: str) -> str:
    return f"v_{name}"


class Ctx:
    """What emitters need: the program, the partition being emitted, layouts and barrier groups."""

    def __init__(self, program: Program, part):
        self.program = program
        self.part = part
        self.groups = {g.name: g for g in program.groups}
        self.buffers = {b.name: b for b in program.buffers}
        self.stage_buf = {b.value: b for b in program.buffers if b.name.endswith("_stage")}
        self.layouts: dict[str, str] = {}  # value -> layout constexpr name
        self.layout_defs: dict[str, str] = {}  # constexpr name -> definition
        self.loop_stack: list[Op] = []
        self._assign_layouts()

    def _mma_layout(self, n: int) -> str:
        name = f"MMA_N{n}"
        self.layout_defs[name] = (f"gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[{self.part.warps}, 1], "
                                  f"instr_shape=[16, {min(n, 256)}, 16])")
        return name

    def _slice(self, axis: int, parent: str) -> str:
        name = f"{parent}_S{axis}"
        self.layout_defs[name] = f"gl.SliceLayout({axis}, {parent})"
        return name

    def _assign_layouts(self):
        """Register layouts: 2-D mma results and fresh tiles take the wgmma accumulator layout of their
        width; reductions and expands move between a 2-D layout and its row/column slices; elementwise
        results follow their full-shaped operand; unknowns are filled from their users. Iterated to a
        fixpoint (loop-carried values tie inits, iter_args and results together)."""
        ops = list(walk(self.part.body))
        types = {r.name: r.type for o in ops for r in o.results}
        for o in ops:
            if o.kind == "loop":
                for n, r in zip(o.attr("iter_args"), o.results):
                    types[n] = r.type
        L = self.layouts

        def forward():
            for o in ops:
                rs = [r for r in o.results if r.type.space == "reg"]
                if o.kind in ("mma", "zeros") or (o.kind == "full" and len(rs[0].type.shape) == 2):
                    L[rs[0].name] = self._mma_layout(rs[0].type.shape[1])
                elif o.kind in ("reduce_max", "reduce_sum") and o.operands[0] in L:
                    L.setdefault(rs[0].name, self._slice(o.attr("axis"), L[o.operands[0]]))
                elif o.kind == "expand" and o.operands[0] in L:
                    L.setdefault(rs[0].name, L[o.operands[0]].rsplit("_S", 1)[0])
                elif o.kind == "loop":
                    for n, init, r in zip(o.attr("iter_args"), o.operands, o.results):
                        known = [L[x] for x in (init, n, r.name) if x in L]
                        for x in (init, n, r.name):
                            if known:
                                L.setdefault(x, known[0])
                    for n, y in zip(o.attr("iter_args"), o.body[-1].operands):
                        if y in L:
                            L.setdefault(n, L[y])
                elif rs and o.operands:  # elementwise: follow a same-shaped register operand
                    r = rs[0]
                    src = next((L[x] for x in o.operands if x in L and types.get(x) is not None and
                                types[x].shape == r.type.shape and types[x].space == "reg"), None)
                    if src is not None:
                        L.setdefault(r.name, src)

        def backward():  # values no def fixes (1-D fills, bias vectors): take the layout their user needs
            for o in ops:
                rs = [r for r in o.results if r.type.space == "reg"]
                if not rs or rs[0].name not in L:
                    continue
                if o.kind == "expand":
                    L.setdefault(o.operands[0], self._slice(o.attr("axis"), L[rs[0].name]))
                elif o.kind not in ("mma", "reduce_max", "reduce_sum", "loop"):
                    for x in o.operands:
                        t = types.get(x)
                        if t is not None and t.space == "reg" and len(t.shape) == len(rs[0].type.shape):
                            L.setdefault(x, L[rs[0].name])

        for _ in range(16):
            before = dict(L)
            forward()
            if L == before:
                backward()
            if L == before:
                break

    def slot(self, g: str) -> str:
        return f"{g}_s"


def _emit_ops(ctx: Ctx, ops, indent: int) -> list[str]:
    lines = []
    pad = "    " * indent
    for o in ops:
        fn = EMITTERS.get(o.kind)
        if fn is None:
            raise NotImplementedError(f"codegen: no Gluon emitter for op kind {o.kind!r}")
        head = format_op(o)[0].strip()
        if o.kind not in ("yield",):
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


@emitter("mask")
def _mask(ctx, o, indent):
    r = o.results[0]
    L = ctx.layouts[r.name]
    bm, bn = r.type.shape
    rows, cols = f"{v(r.name)}_rows", f"{v(r.name)}_cols"
    keep = f"{cols}[None, :] < {expr(o.attr('kv_len'))}"
    out = [f"{cols} = {expr(o.attr('col'))} + gl.arange(0, {bn}, layout={ctx._slice(0, L)})"]
    if o.attr("causal"):
        out.append(f"{rows} = {expr(o.attr('row'))} + gl.arange(0, {bm}, layout={ctx._slice(1, L)})")
        keep = f"({keep}) & ({cols}[None, :] <= {rows}[:, None])"
    out.append(f"{v(r.name)} = gl.where({keep}, {v(o.operands[0])}, float(\"-inf\"))")
    return out


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
    x = o.operands[0]
    L = ctx.layouts[x]
    t = next(r.type for op_ in walk(ctx.part.body) for r in op_.results if r.name == x)
    bm, bn = t.shape
    n = v(x)
    return [f"{n}_r = gl.arange(0, {bm}, layout={ctx._slice(1, L)})",
            f"{n}_c = gl.arange(0, {bn}, layout={ctx._slice(0, L)})",
            f"{n}_p = {o.attr('arg')}_ptr + (({expr(o.attr('row'))} + {n}_r).to(gl.int64) * {expr(o.attr('ld'))})"
            f"[:, None] + {n}_c[None, :]",
            f"gl.store({n}_p, {n}, mask=({n}_r < {expr(o.attr('rows_valid'))})[:, None])"]


@emitter("store_vec")
def _store_vec(ctx, o, indent):
    x = o.operands[0]
    n = v(x)
    t = next(r.type for op_ in walk(ctx.part.body) for r in op_.results if r.name == x)
    return [f"{n}_i = gl.arange(0, {t.shape[0]}, layout={ctx.layouts[x]})",
            f"gl.store({o.attr('arg')}_ptr + {expr(o.attr('offset'))} + {n}_i, {n}, "
            f"mask={n}_i < {expr(o.attr('valid'))})"]


@emitter("acquire")
def _acquire(ctx, o, indent):
    g = ctx.groups[o.attr("group")]
    return [f"{g.name}_s = {g.name}_n % {g.count}",
            f"mbarrier.wait({g.name}_empty.index({g.name}_s), (({g.name}_n // {g.count}) & 1) ^ 1)",
            f"mbarrier.expect({g.name}_ready.index({g.name}_s), {g.nbytes})"]


@emitter("load")
def _load(ctx, o, indent):
    g = o.attr("group")
    coords = ", ".join(expr(c) for c in o.attr("coords"))
    return [f"tma.async_copy_global_to_shared({o.attr('arg')}_desc, [{coords}], {g}_ready.index({g}_s), "
            f"{o.attr('buffer')}.index({g}_s))"]


@emitter("advance")
def _advance(ctx, o, indent):
    return [f"{o.attr('group')}_n += 1"]


@emitter("wait_ready")
def _wait_ready(ctx, o, indent):
    g = ctx.groups[o.attr("group")]
    return [f"{g.name}_s = {g.name}_n % {g.count}",
            f"mbarrier.wait({g.name}_ready.index({g.name}_s), ({g.name}_n // {g.count}) & 1)"]


@emitter("get")
def _get(ctx, o, indent):
    return [f"{v(o.results[0].name)} = {o.attr('buffer')}.index({o.attr('group')}_s)"]


def _trip_from_start(ctx) -> str:
    loop = ctx.loop_stack[-1]
    return f"({loop.attr('var')} - {expr(loop.attr('lb'))})"


@emitter("release")
def _release(ctx, o, indent):
    g = ctx.groups[o.attr("group")]
    lag = o.attr("lag", 0)
    if lag == 0:
        return [f"mbarrier.arrive({g.name}_empty.index({g.name}_s))"]
    return [f"mbarrier.arrive({g.name}_empty.index(({g.name}_n + {g.count - lag}) % {g.count}), "
            f"pred={_trip_from_start(ctx)} >= {lag})"]


@emitter("release_tail")
def _release_tail(ctx, o, indent):
    g = ctx.groups[o.attr("group")]
    out = []
    for j in range(1, o.attr("lag") + 1):
        out.append(f"mbarrier.arrive({g.name}_empty.index(({g.name}_n + {g.count - j}) % {g.count}), "
                   f"pred=_trip >= {j})")
    return out


@emitter("trans")
def _trans(ctx, o, indent):
    return [f"{v(o.results[0].name)} = {v(o.operands[0])}.permute((1, 0))"]


@emitter("mma")
def _mma(ctx, o, indent):
    res = o.results[0]
    L = ctx.layouts[res.name]
    a, b = o.operands[:2]
    a_src = v(a)
    if a in ctx.layouts:  # A from registers: wgmma takes it in the dot-operand layout of the accumulator
        a_src = f"gl.convert_layout({v(a)}, gl.DotOperandLayout(operand_index=0, parent={L}, k_width=2))"
    r = v(res.name)
    if len(o.operands) == 3:
        call = f"warpgroup_mma({a_src}, {v(b)}, {_as(ctx, o.operands[2], L)}, is_async=True)"
    else:
        call = (f"warpgroup_mma({a_src}, {v(b)}, gl.zeros({list(res.type.shape)}, gl.float32, {L}), "
                f"use_acc=False, is_async=True)")
    return [f"{r} = {call}", f"{r} = warpgroup_mma_wait(num_outstanding={o.attr('pending', 0)}, deps=({r},))"]


@emitter("mma_wait")
def _mma_wait(ctx, o, indent):
    return [f"{v(o.results[0].name)} = warpgroup_mma_wait(num_outstanding={o.attr('pending', 0)}, "
            f"deps=({v(o.operands[0])},))"]


@emitter("load_vec")
def _load_vec(ctx, o, indent):
    r = o.results[0]
    n = r.type.shape[0]
    offs = f"{v(r.name)}_offs"
    return [f"{offs} = {expr(o.attr('offset'))} + gl.arange(0, {n}, layout={ctx.layouts[r.name]})",
            f"{v(r.name)} = gl.load({o.attr('arg')}_ptr + {offs}, mask={offs} < {expr(o.attr('size'))}, "
            f"other=0.0).to({GL_DTYPE[r.type.dtype]})"]


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


@emitter("cast")
def _cast(ctx, o, indent):
    return [f"{v(o.results[0].name)} = {v(o.operands[0])}.to({GL_DTYPE[o.results[0].type.dtype]})"]


@emitter("store")
def _store(ctx, o, indent):
    buf = ctx.stage_buf[o.operands[0]].name
    coords = ", ".join(expr(c) for c in o.attr("coords"))
    return ["tma.store_wait(0)  # the previous TMA store out of this staging tile has finished reading it",
            f"{buf}.store({v(o.operands[0])})",
            "fence_async_shared()",
            f"tma.async_copy_shared_to_global({o.attr('arg')}_desc, [{coords}], {buf})"]


@emitter("loop")
def _loop(ctx, o, indent):
    its = o.attr("iter_args")
    out = [f"{v(n)} = {v(x)}" for n, x in zip(its, o.operands)]
    lb, ub = expr(o.attr("lb")), expr(o.attr("ub"))
    out.append(f"for {o.attr('var')} in range({lb}, {ub}):")
    ctx.loop_stack.append(o)
    body = _emit_ops(ctx, o.body, 1)
    ctx.loop_stack.pop()
    out += [ln[0:] for ln in body] or ["    pass"]
    out += [f"{v(r.name)} = {v(n)}" for n, r in zip(its, o.results)]
    out.append(f"_trip = {ub} - {lb}")
    return out


@emitter("yield")
def _yield(ctx, o, indent):
    loop = ctx.loop_stack[-1]
    its = loop.attr("iter_args")
    if not its:
        return []
    return [f"{', '.join(v(n) for n in its)} = {', '.join(v(x) for x in o.operands)}"]


# ------------------------------------------------------------------------------------------- module level


def _params(program: Program) -> list[str]:
    out = []
    for a in program.args:
        out.append({"tensor": f"{a.name}_desc", "ptr": f"{a.name}_ptr", "scalar": a.name}[a.kind])
    return out


def _shared_params(program: Program) -> list[str]:
    return [b.name for b in program.buffers] + [f"{g.name}_{k}" for g in program.groups for k in ("ready", "empty")]


def _tile_lines(program: Program) -> list[str]:
    """Linear tile id -> tile indices, grouped along the second-to-last index for L2 reuse."""
    g = program.grid
    names = [n for n, _ in g.tiles]
    lines = [f"num_{n} = {expr(e)}" for n, e in g.tiles]
    lines.append("num_tiles = " + " * ".join(f"num_{n}" for n in names))
    body = ["t = tile"]
    for n in names[:-2]:
        inner = " * ".join(f"num_{m}" for m in names[names.index(n) + 1:])
        body += [f"{n} = t // ({inner})", f"t = t % ({inner})"]
    if len(names) >= 2:
        m, n = names[-2], names[-1]
        body += [f"group_size = {g.group} * num_{n}",
                 f"first = (t // group_size) * {g.group}",
                 f"size = min(num_{m} - first, {g.group})",
                 f"{m} = first + (t % group_size) % size",
                 f"{n} = (t % group_size) // size"]
    else:
        body.append(f"{names[0]} = t")
    return lines, body


def _partition_fn(program: Program, part) -> list[str]:
    ctx = Ctx(program, part)
    params = _params(program) + _shared_params(program)
    groups = sorted({o.attr("group") for o in walk(part.body) if o.attr("group")})
    has_store = any(o.kind == "store" for o in walk(part.body))
    body = [f"    {g}_n = 0" for g in groups]
    pre, tile = _tile_lines(program)
    body += ["    " + ln for ln in pre]
    if program.grid.persistent:
        body.append("    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):")
        ind = 2
    else:
        body.append("    tile = gl.program_id(0)")
        ind = 1
    body += ["    " * ind + ln for ln in tile]
    body += _emit_ops(ctx, part.body, ind)  # emitters may add layouts: declare them after emitting
    lines = ["@gluon.jit", f"def {part.name}({', '.join(params)}):",
             f"    # partition {part.name}: {part.warps} warps, {part.regs} registers"]
    lines += [f"    {name}: gl.constexpr = {d}" for name, d in sorted(ctx.layout_defs.items())]
    lines += body
    if has_store:
        lines.append("    tma.store_wait(0)")
    return lines


def _kernel_fn(program: Program) -> list[str]:
    params = _params(program)
    lines = ["@gluon.jit", f"def kernel({', '.join(params)}):"]
    roots = {}
    desc_of = {}
    for o in walk(program.body):
        if o.kind in ("load", "store"):
            x = o.results[0].name if o.kind == "load" else o.operands[0]
            desc_of[x] = o.attr("arg")
    rings = {c.buffer for c in program.channels}
    for b in sorted(program.buffers, key=lambda b: (b.offset, -b.nbytes, b.name)):
        shape = [b.count, *b.type.shape] if b.name in rings else list(b.type.shape)
        layout = f"{desc_of[b.value]}_desc.layout"
        root = roots.get(b.offset)
        lines.append(f"    # buffer {b.name}: {b.type} x{b.count} at byte {b.offset}")
        if root is None:
            roots[b.offset] = b.name
            lines.append(f"    {b.name} = gl.allocate_shared_memory({GL_DTYPE[b.type.dtype]}, {shape}, {layout})")
        else:
            lines.append(f"    {b.name} = {root}._reinterpret({GL_DTYPE[b.type.dtype]}, {shape}, {layout})"
                         f"  # reuses {root}: lifetimes do not overlap")
    for g in program.groups:
        lines.append(f"    # barriers {g.name}: {g.count} slots of {g.nbytes} B, {g.arrivals} releasing partitions "
                     f"({', '.join(g.channels)})")
        for k in ("ready", "empty"):
            lines.append(f"    {g.name}_{k} = gl.allocate_shared_memory(gl.int64, [{g.count}, 1], "
                         f"mbarrier.MBarrierLayout())")
        lines.append(f"    for i in gl.static_range({g.count}):")
        lines.append(f"        mbarrier.init({g.name}_ready.index(i), count=1)")
        lines.append(f"        mbarrier.init({g.name}_empty.index(i), count={g.arrivals})")
    args = ", ".join(_params(program) + _shared_params(program))
    parts = program.partitions
    calls = ", ".join(f"({p.name}, ({args}))" for p in parts)
    lines.append(f"    gl.warp_specialize([{calls}],")
    lines.append(f"                       {[p.warps for p in parts[1:]]}, {[p.regs for p in parts[1:]]})")
    return lines


HEADER = '''"""Generated by torch_autows from Program {name}. Do not edit: change the template or the passes.

Partitions: {parts}. SMEM plan: {smem} bytes.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                             warpgroup_mma_wait)
'''


def generate(program: Program) -> str:
    """Gluon module source for a partitioned Program; ``kernel`` is its entry point."""
    if not program.partitions or not all(p.body for p in program.partitions):
        raise ValueError("codegen: program is not partitioned; run passes.pipeline first")
    parts = ", ".join(f"{p.name} ({p.warps} warps, {p.regs} regs)" for p in program.partitions)
    out = [HEADER.format(name=program.name, parts=parts, smem=program.smem_bytes)]
    for p in program.partitions:
        out += ["", ""] + _partition_fn(program, p)
    out += ["", ""] + _kernel_fn(program)
    return "\n".join(out) + "\n"


def block_shapes(program: Program) -> dict[str, tuple[tuple[int, ...], str]]:
    """Tensor arg -> (TMA block shape, dtype) of the tiles loaded from or stored to it."""
    out = {}
    for o in walk(program.body):
        if o.kind in ("load", "store"):
            t: TileType = o.results[0].type if o.kind == "load" else None
            if t is None:
                t = next(r.type for x in walk(program.body) for r in x.results if r.name == o.operands[0])
            shape = tuple(t.shape)
            prev = out.get(o.attr("arg"))
            if prev is not None and prev[0] != shape:
                raise ValueError(f"codegen: arg {o.attr('arg')} is accessed with blocks {prev[0]} and {shape}")
            out[o.attr("arg")] = (shape, t.dtype)
    return out
