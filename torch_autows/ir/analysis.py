"""Queries over the tile IR: walking and rebuilding op bodies, the definitions and types of values, and the
small index expressions (``pid_m*128+64``, ``cdiv(K,64)``) the IR keeps as strings."""
from __future__ import annotations

import ast
from dataclasses import replace

from .core import Op, TileType

# ----------------------------------------------------------------------------------------------- walking


def walk(ops: tuple[Op, ...]):
    """Every op, depth first, loops before their bodies."""
    for o in ops:
        yield o
        if o.body:
            yield from walk(o.body)


def defs(ops: tuple[Op, ...]) -> dict[str, Op]:
    """Value name -> defining op (loop iter_args map to their loop)."""
    out: dict[str, Op] = {}
    for o in walk(ops):
        for r in o.results:
            out[r.name] = o
        for name in o.attr("iter_args", ()):
            out[name] = o
    return out


def value_types(ops: tuple[Op, ...]) -> dict[str, TileType]:
    """Value name -> its tile type (loop and tile_next iter_args take their result's type)."""
    out: dict[str, TileType] = {}
    for o in walk(ops):
        for r in o.results:
            out[r.name] = r.type
        if o.kind in ("loop", "tile_next"):
            for name, r in zip(o.attr("iter_args", ()), o.results):
                out[name] = r.type
    return out


def map_ops(ops: tuple[Op, ...], fn) -> tuple[Op, ...]:
    """Rebuild a body bottom-up: ``fn(op)`` sees loops with their bodies already mapped."""
    out = []
    for o in ops:
        if o.body:
            o = replace(o, body=map_ops(o.body, fn))
        out.append(fn(o))
    return tuple(out)


# ----------------------------------------------------------------------------------------------- expressions

_ALLOWED = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Name, ast.Load, ast.Constant, ast.Call, ast.Add, ast.Sub,
            ast.Mult, ast.FloorDiv, ast.Mod, ast.USub, ast.Compare, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.BoolOp,
            ast.And)


def deferred_stage_waits(ops: tuple[Op, ...]) -> frozenset[int]:
    """The ``store`` ops staged in a slot (``stage``) whose wait for TMA to have read it a later staged store of the
    same op list covers (ids): one follows with no ``release`` of a ring in between, so its ``store_wait(0)`` (which
    waits for every store before it) still comes before the slots go back to the producer. The staged stores of an
    epilogue in column chunks (each in the chunk of a slot its partition read) then wait once, after the last."""
    out: set[int] = set()

    def scan(seq: tuple[Op, ...]) -> None:
        pending: list[int] = []
        for x in seq:
            if x.kind == "store" and x.attr("stage"):
                out.update(pending)
                pending = [id(x)]
            elif x.kind in ("release", "release_tail") or x.body:
                pending = []
            if x.body:
                scan(x.body)

    scan(ops)
    return frozenset(out)


def check_expr(expr: str) -> set[str]:
    """Validate an index expression; return the names it uses (``cdiv``/``min``/``max`` are functions)."""
    tree = ast.parse(str(expr), mode="eval")
    names = set()
    for n in ast.walk(tree):
        if not isinstance(n, _ALLOWED):
            raise ValueError(f"expression {expr!r}: {type(n).__name__} not allowed")
        if isinstance(n, ast.Call) and not (isinstance(n.func, ast.Name) and n.func.id in ("cdiv", "min", "max")):
            raise ValueError(f"expression {expr!r}: only cdiv/min/max calls")
        if isinstance(n, ast.Name):
            names.add(n.id)
    return names - {"cdiv", "min", "max"}


def eval_expr(expr: str | int, env: dict[str, int]) -> int:
    """The value of an index expression with the scalars of ``env`` (an int is its own value)."""
    if isinstance(expr, int):
        return expr
    check_expr(expr)
    return eval(expr, {"__builtins__": {}, "cdiv": lambda a, b: -(-a // b), "min": min, "max": max}, env)


def add_offset(expr: str | int, delta: int) -> str | int:
    """``expr + delta`` kept readable (``pid_m*128`` + 64 -> ``pid_m*128+64``)."""
    if delta == 0:
        return expr
    if isinstance(expr, int):
        return expr + delta
    return f"{expr}+{delta}"
