"""The invariants of every stage: values are defined once and before their uses, index expressions name only
args, grid indices and loop variables, and each op's kind is in the op table with operand and result counts in
its ranges."""
from __future__ import annotations

from ..ir import Program, check_expr
from ..ir.kinds import OPS
from .base import _fail

#: Attributes that hold index expressions (load/store coordinates, pointer rows and bounds, loop bounds).
_EXPR_ATTRS = ("coords", "offset", "size", "lb", "ub", "row", "col", "ld", "rows_valid", "cols_valid", "valid",
               "row_mod", "col_mod", "per_tile")


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
