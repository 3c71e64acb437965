"""What the Gluon emitters share: dtype names, index expressions, value names and the per-partition
context, whose layout inference gives every register value a distributed layout (the generation's MMA
accumulator layout for 2-D tiles, ``lowering.accumulator_layout``; its slices for rows and columns)."""
from __future__ import annotations

import ast

from ..ir import Op, Program, deferred_stage_waits, value_types, walk
from ..ir.kinds import kinds

GL_DTYPE = {"bf16": "gl.bfloat16", "fp16": "gl.float16", "f32": "gl.float32", "i32": "gl.int32"}
REDUCE = kinds(axes="reduce")  # reductions: a 2-D layout to its row or column slice


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


def dot_a_layout(parent: str) -> str:
    """Gluon source of wgmma's register A operand layout for an accumulator of layout ``parent`` (16-bit elements)."""
    return f"gl.DotOperandLayout(operand_index=0, parent={parent}, k_width=2)"


class Ctx:
    """What emitters need: the program, the partition being emitted, the generation's lowering module
    (``codegen/sm90.py``: its emitters and accumulator layout), layouts and barrier groups."""

    def __init__(self, program: Program, part, lowering):
        self.program = program
        self.part = part
        self.lowering = lowering
        self.groups = {g.name: g for g in program.groups}
        self.buffers = {b.name: b for b in program.buffers}
        self.stage_buf = {b.value: b for b in program.buffers if b.name.endswith("_stage")}
        self.layouts: dict[str, str] = {}  # value -> layout constexpr name
        self.layout_defs: dict[str, str] = {}  # constexpr name -> definition
        self.loop_stack: list[Op] = []
        self.types = value_types(part.body)  # value -> TileType in this partition
        self.deferred_waits = deferred_stage_waits(part.body)  # staged stores a later one's wait covers (ids)
        self._assign_layouts()

    def _mma_layout(self, n: int) -> str:
        name = f"MMA_N{n}"
        self.layout_defs[name] = self.lowering.accumulator_layout(self.part.warps, n)
        return name

    def _dot_a_layout(self, parent: str) -> str:
        """The name of wgmma's register A operand layout for an accumulator of layout ``parent``, defined."""
        name = f"{parent}_A"
        self.layout_defs[name] = dot_a_layout(parent)
        return name

    def _slice(self, axis: int, parent: str) -> str:
        name = f"{parent}_S{axis}"
        self.layout_defs[name] = f"gl.SliceLayout({axis}, {parent})"
        return name

    def _assign_layouts(self):
        """Register layouts: 2-D mma results and fresh tiles take the MMA accumulator layout of their
        width; reductions and expands move between a 2-D layout and its row/column slices; elementwise
        results follow their full-shaped operand; an ``smem_read`` that an mma takes as A reads straight into
        wgmma's A-operand layout of that mma's accumulator; unknowns are filled from their users. Iterated to a
        fixpoint (loop-carried values tie inits, iter_args and results together)."""
        ops = list(walk(self.part.body))
        types = self.types
        L = self.layouts

        def forward():
            for o in ops:
                rs = [r for r in o.results if r.type.space == "reg"]
                if o.kind in ("mma", "zeros", "col_split") or (o.kind == "full" and len(rs[0].type.shape) == 2):
                    for r in rs:  # a column chunk takes the accumulator layout of its width
                        L[r.name] = self._mma_layout(r.type.shape[1])
                elif o.kind in REDUCE and o.operands[0] in L:
                    L.setdefault(rs[0].name, self._slice(o.attr("axis"), L[o.operands[0]]))
                elif o.kind == "expand" and o.operands[0] in L:
                    L.setdefault(rs[0].name, L[o.operands[0]].rsplit("_S", 1)[0])
                elif o.kind in ("loop", "tile_next"):
                    for n, init, r in zip(o.attr("iter_args"), o.operands, o.results):
                        known = [L[x] for x in (init, n, r.name) if x in L]
                        for x in (init, n, r.name):
                            if known:
                                L.setdefault(x, known[0])
                    for n, y in zip(o.attr("iter_args"), o.body[-1].operands):
                        if y in L:
                            L.setdefault(n, L[y])
                elif len(rs) > 1 and len(rs) == len(o.operands):  # one result per operand (split_reduce)
                    for r, x in zip(rs, o.operands):
                        if x in L:
                            L.setdefault(r.name, L[x])
                elif rs and o.operands:  # elementwise: follow a same-shaped register operand
                    r = rs[0]
                    src = next((L[x] for x in o.operands if x in L and types.get(x) is not None and
                                types[x].shape == r.type.shape and types[x].space == "reg"), None)
                    if src is not None:
                        L.setdefault(r.name, src)

        reads = {r.name for o in ops if o.kind == "smem_read" for r in o.results}

        def backward():  # values no def fixes (1-D fills, bias vectors): take the layout their user needs
            for o in ops:
                if o.kind == "mma" and o.operands[0] in reads and o.results[0].name in L:
                    # an SMEM tile read to be an mma's A: read straight into wgmma's A-operand layout
                    L.setdefault(o.operands[0], self._dot_a_layout(L[o.results[0].name]))
                rs = [r for r in o.results if r.type.space == "reg"]
                if not rs or rs[0].name not in L:
                    continue
                if o.kind == "expand":
                    L.setdefault(o.operands[0], self._slice(o.attr("axis"), L[rs[0].name]))
                elif o.kind not in REDUCE and o.kind not in ("mma", "loop", "tile_next"):
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
