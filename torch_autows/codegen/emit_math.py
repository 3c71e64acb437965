"""Emitters of register math: constants (``zeros``, ``full``), elementwise ops (``add``, ``sub``, ``mul``,
``max``, ``mulc``, ``exp2``, ``silu``, ``sigmoid``, ``silu_grad``, ``gelu``, ``neg``, ``where``, ``cast``),
reductions (``reduce_max``, ``reduce_sum``), the attention epilogue's guarded math (``fin0``, ``div0``, ``lse``) and
``expand``."""
from __future__ import annotations

from .context import GL_DTYPE, expr, v
from .emit_base import _as, emitter


def zeros_expr(ctx, r) -> str:
    """``gl.zeros`` of value ``r``'s shape, dtype and layout."""
    return f"gl.zeros({list(r.type.shape)}, {GL_DTYPE[r.type.dtype]}, {ctx.layouts[r.name]})"


@emitter("zeros")
def _zeros(ctx, o, indent):
    r = o.results[0]
    return [f"{v(r.name)} = {zeros_expr(ctx, r)}"]


def _float(x) -> str:
    return f'float("{x}")' if isinstance(x, str) else repr(float(x))


@emitter("full")
def _full(ctx, o, indent):
    r = o.results[0]
    return [f"{v(r.name)} = gl.full({list(r.type.shape)}, {_float(o.attr('value'))}, {GL_DTYPE[r.type.dtype]}, "
            f"{ctx.layouts[r.name]})"]


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


@emitter("sigmoid")
def _sigmoid(ctx, o, indent):  # 1 / (1 + 2^(-x log2 e)): 1 / inf = 0 for very negative x, no NaN
    return [f"{v(o.results[0].name)} = 1.0 / (1.0 + gl.exp2({v(o.operands[0])} * -1.4426950408889634))"]


@emitter("silu_grad")
def _silu_grad(ctx, o, indent):  # s (1 + x (1 - s)) from x and s = sigmoid(x)
    x, s = (v(a) for a in o.operands)
    return [f"{v(o.results[0].name)} = {s} * (1.0 + {x} * (1.0 - {s}))"]


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


@emitter("rotate_half")
def _rotate_half(ctx, o, indent):
    # register-only in wgmma's accumulator layout (passes/README.md, "RoPE in a projection's epilogue"): a thread
    # holding column c of a head also holds c + width/2, so the halves pair up through reshape/permute/split/join and
    # the final convert_layout back to the tile's layout moves nothing
    x, r = v(o.operands[0]), v(o.results[0].name)
    bm, bn = o.results[0].type.shape
    w = int(o.attr("width"))
    if bn % w or w % 2:
        raise ValueError(f"codegen: rotate_half of {bn} columns in groups of {w}: the tile must hold whole even groups")
    shape = [bm, 2, w // 2] if bn == w else [bm, bn // w, 2, w // 2]
    perm = (0, 2, 1) if bn == w else (0, 1, 3, 2)
    return [f"{r}_x1, {r}_x2 = gl.split(gl.permute(gl.reshape({x}, {shape}), {perm}))  # the halves of each head",
            f"{r} = gl.convert_layout(gl.reshape(gl.permute(gl.join(-{r}_x2, {r}_x1), {perm}), [{bm}, {bn}]), "
            f"{ctx.layouts[o.results[0].name]})  # cat(-x2, x1) per head, back in the tile's layout"]


def _halves(x: str, bm: int, bn: int) -> str:
    """Gluon of a register tile's two column halves (the top column bit to a size-2 axis, split off)."""
    return f"gl.split(gl.permute(gl.reshape({x}, [{bm}, 2, {bn // 2}]), (0, 2, 1)))"


@emitter("col_split")
def _col_split(ctx, o, indent):
    # register-only in wgmma's accumulator layout: the top column bits are register bits, so halving the columns
    # log2(n) times and converting each chunk to the layout of its width moves nothing (as rotate_half)
    x, (bm, bn) = v(o.operands[0]), ctx.types[o.operands[0]].shape
    n = len(o.results)
    if n & (n - 1) or bn % n:
        raise ValueError(f"codegen: col_split of {bn} columns into {n} chunks: a power of two of equal chunks")
    lines, level = [], [x]
    w = bn
    while len(level) < n:
        nxt = []
        for i, piece in enumerate(level):
            a, b = f"{x}_h{w // 2}_{2 * i}", f"{x}_h{w // 2}_{2 * i + 1}"
            lines.append(f"{a}, {b} = {_halves(piece, bm, w)}")
            nxt += [a, b]
        level, w = nxt, w // 2
    return lines + [f"{v(r.name)} = gl.convert_layout({piece}, {ctx.layouts[r.name]})  # columns {i * w}..{(i + 1) * w}"
                    for i, (r, piece) in enumerate(zip(o.results, level))]


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
