"""Sequential semantics: a Program's ``body`` run tile by tile over its grid with torch CPU tensors.

Works on a Program before partitioning (template output) or after any pass (analysis fields such as
chains, stages, partitions, buffers are ignored; a partitioned Program keeps its ``body``). Each tile
binds the grid's tile indices exactly as the generated kernel computes them from a linear tile id
(``tile_indices``), then evaluates the ops in order: loops run ``range(lb, ub)`` with their carried
values, ``yield`` hands the next values back. Each tile counts as its own CTA for the output race check
(``machine.GlobalWrites``): two tiles plainly storing one element is a ``global-race`` ``Violation``.
"""
from __future__ import annotations

import torch

from ..ir import Grid, Op, Program
from .machine import GlobalWrites, Violation
from .ops import TORCH_DTYPE, InterpError, apply, eval_index, one_thread


class Ctx:
    """What op semantics see: the kernel's tensors and the scalar environment for index expressions."""

    def __init__(self, tensors: dict[str, torch.Tensor], scalars: dict, writes: GlobalWrites | None = None,
                 writer: int = 0):
        self.tensors = tensors
        self.scalars = scalars
        self.writes, self.writer = writes, writer  # output writes of the launch, and this tile's id (ops.note_write)

    def race(self, msg: str, o: Op):
        raise Violation("global-race", msg, cta=self.writer, op=o)

    def eval(self, e):
        return eval_index(e, self.scalars)

    def tensor(self, name: str) -> torch.Tensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise InterpError(f"interp: no tensor given for argument {name!r}") from None


def split_inputs(program: Program, inputs: dict) -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors, scalars) from the caller's dict; every Arg must be present, tensors with the Arg dtype (an aliasing
    Arg, ``Arg.alias``, may be left out: it is its alias's tensor)."""
    tensors, scalars = {}, {}
    for a in program.args:
        if a.alias and a.name not in inputs:  # another block shape of an arg's tensor: that very tensor
            tensors[a.name] = tensors[a.alias]
            continue
        if a.name not in inputs:
            raise InterpError(f"interp: missing input for argument {a} of program {program.name}")
        x = inputs[a.name]
        if a.kind == "scalar":
            scalars[a.name] = x
            continue
        if not isinstance(x, torch.Tensor):
            raise InterpError(f"interp: argument {a.name} must be a torch tensor, got {type(x).__name__}")
        if x.dtype != TORCH_DTYPE[a.dtype]:
            raise InterpError(f"interp: argument {a.name} is {x.dtype}, the Program declares {a.dtype}")
        tensors[a.name] = x
    return tensors, scalars


def grid_extents(program: Program | Grid, scalars: dict) -> list[int]:
    """The extent of each tile index of the grid (a Program's, or a ``tile_loop``'s ``Grid``)."""
    grid = program.grid if isinstance(program, Program) else program
    return [int(eval_index(e, scalars)) for _, e in grid.tiles]


def num_tiles(program: Program | Grid, scalars: dict) -> int:
    n = 1
    for e in grid_extents(program, scalars):
        n *= e
    return n


def tile_indices(program: Program | Grid, scalars: dict, tile: int) -> dict[str, int]:
    """Linear tile id -> tile index names, grouped like codegen.emitters.tile_lines (L2-friendly order)."""
    grid = program.grid if isinstance(program, Program) else program
    names = [n for n, _ in grid.tiles]
    num = dict(zip(names, grid_extents(grid, scalars)))
    out: dict[str, int] = {}
    t = tile
    for i, n in enumerate(names[:-2]):
        inner = 1
        for m in names[i + 1:]:
            inner *= num[m]
        out[n] = t // inner
        t = t % inner
    if len(names) >= 2:
        m, n = names[-2], names[-1]
        g = grid.group
        group_size = g * num[n]
        first = (t // group_size) * g
        size = min(num[m] - first, g)
        out[m] = first + (t % group_size) % size
        out[n] = (t % group_size) // size
    else:
        out[names[0]] = t
    return out


def run_ops(ctx: Ctx, ops: tuple[Op, ...], env: dict) -> list | None:
    """Evaluate ``ops``; returns the operands of a terminating ``yield`` (None if there is none)."""
    for o in ops:
        if o.kind == "yield":
            return [env[x] for x in o.operands]
        if o.kind == "loop":
            run_loop(ctx, o, env)
            continue
        try:
            args = [env[x] for x in o.operands]
        except KeyError as e:
            raise InterpError(f"interp: %{e.args[0]} is used before it is defined") from None
        for r, val in zip(o.results, apply(ctx, o, args)):
            env[r.name] = val
    return None


def run_loop(ctx: Ctx, o: Op, env: dict) -> None:
    its = o.attr("iter_args", ())
    for name, init in zip(its, o.operands):
        env[name] = env[init]
    var = o.attr("var")
    for i in range(int(ctx.eval(o.attr("lb"))), int(ctx.eval(o.attr("ub")))):
        ctx.scalars[var] = i
        nxt = run_ops(ctx, o.body, env)
        for name, val in zip(its, nxt or ()):
            env[name] = val
    ctx.scalars.pop(var, None)
    for name, r in zip(its, o.results):
        env[r.name] = env[name]


def run_sequential(program: Program, inputs: dict) -> dict[str, torch.Tensor]:
    """Run ``program.body`` for every tile of the grid; out tensors in ``inputs`` are written in place
    and returned by name."""
    tensors, scalars = split_inputs(program, inputs)
    writes = GlobalWrites()
    with one_thread():
        for tile in range(num_tiles(program, scalars)):
            ctx = Ctx(tensors, {**scalars, **tile_indices(program, scalars, tile)}, writes, tile)
            run_ops(ctx, program.body, {})
    return {a.name: tensors[a.name] for a in program.args if a.out}
