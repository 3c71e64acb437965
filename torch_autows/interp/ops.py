"""Op semantics shared by both interpreters: a registry keyed by op kind, one function per kind.

A semantics function is ``fn(ctx, op, args) -> tensor | tuple[tensor, ...] | None``: ``args`` are the
operand values as torch CPU tensors (already read out of SMEM where the partitioned interpreter
holds them as slot references), ``ctx`` gives index expressions (``ctx.eval``) and the kernel's
tensors (``ctx.tensor``). Results are converted to the dtype of the op's result type and their shape
is checked against it. Register a new kind with ``@semantics("kind")``; an op kind nobody registered
raises ``InterpError`` naming it.

Global memory follows the hardware: a TMA ``load`` of a box reads the tensor at the coordinates and
fills whatever lies outside the tensor with zeros; a TMA ``store`` writes only the part of the box
inside the tensor (``tma_reduce_add`` adds that part); ``load_vec`` is a masked pointer load (``offset + i <
size``, else 0), ``load_ptr`` its 2-D form (rows ``row + r`` with ``r < rows_valid``, columns ``col + c`` with
``c < cols_valid``, leading dim ``ld``).
"""
from __future__ import annotations

import contextlib
import functools

import torch

from ..ir import Op, check_expr, format_op

TORCH_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16, "f32": torch.float32, "fp32": torch.float32,
               "i32": torch.int32, "i64": torch.int64, "i1": torch.bool, "fp8e4": torch.float8_e4m3fn}

SEMANTICS: dict = {}


class InterpError(RuntimeError):
    """The interpreter cannot run this Program (unknown op kind, bad inputs): not a schedule bug."""


def semantics(*kinds: str):
    """Register ``fn(ctx, op, args)`` as the meaning of each op kind in ``kinds``."""
    def deco(fn):
        for k in kinds:
            SEMANTICS[k] = fn
        return fn
    return deco


def lookup(o: Op):
    fn = SEMANTICS.get(o.kind)
    if fn is None:
        raise InterpError(f"interp: no semantics for op kind {o.kind!r} (in `{format_op(o)[0].strip()}`); "
                          f"register one with @semantics({o.kind!r}) in torch_autows/interp/ops.py")
    return fn


def apply(ctx, o: Op, args: list) -> list:
    """Run the registered semantics of ``o`` and coerce its results to the declared result types."""
    out = lookup(o)(ctx, o, args)
    if out is None:
        out = ()
    elif isinstance(out, torch.Tensor):
        out = (out,)
    if len(out) != len(o.results):
        raise InterpError(f"interp: {o.kind} produced {len(out)} values for {len(o.results)} results")
    res = []
    for r, t in zip(o.results, out):
        if tuple(t.shape) != tuple(r.type.shape):
            raise InterpError(f"interp: `{format_op(o)[0].strip()}` computed shape {tuple(t.shape)}, but %{r.name} "
                              f"is declared {r.type}")
        res.append(t.to(TORCH_DTYPE[r.type.dtype]))
    return res


@contextlib.contextmanager
def one_thread():
    """Run torch single-threaded: the interpreter's tiles are tiny, and intra-op threads waking for
    each one made runs 20-50x slower and erratic on a 2-core machine. The setting is restored after."""
    n = torch.get_num_threads()
    if n != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if n != 1:
            torch.set_num_threads(n)


# ------------------------------------------------------------------------------------------ expressions


@functools.lru_cache(maxsize=4096)
def _code(expr: str):
    check_expr(expr)
    return compile(expr, "<ir expr>", "eval")


_FUNCS = {"__builtins__": {}, "cdiv": lambda a, b: -(-a // b), "min": min, "max": max}


def eval_index(expr, env: dict):
    """``ir.eval_expr`` with the parsed expression cached (the interpreters evaluate the same few often)."""
    if isinstance(expr, (int, float)):
        return expr
    return eval(_code(str(expr)), _FUNCS, env)


# ------------------------------------------------------------------------------------------ global memory


def tma_load(t: torch.Tensor, coords: tuple[int, ...], shape: tuple[int, ...]) -> torch.Tensor:
    """The box ``shape`` at ``coords`` of ``t``; elements outside ``t`` read as zero (TMA OOB fill)."""
    if t.dim() != len(shape):
        raise InterpError(f"interp: a {len(shape)}-D box loaded from a {t.dim()}-D tensor")
    out = torch.zeros(shape, dtype=t.dtype)
    src, dst = [], []
    for c, n, size in zip(coords, shape, t.shape):
        lo, hi = max(c, 0), min(c + n, size)
        if hi <= lo:
            return out
        src.append(slice(lo, hi))
        dst.append(slice(lo - c, hi - c))
    out[tuple(dst)] = t[tuple(src)]
    return out


def tma_store(t: torch.Tensor, coords: tuple[int, ...], tile: torch.Tensor, add: bool = False) -> torch.Tensor:
    """Write ``tile`` at ``coords`` of ``t``, clipped at the tensor's bounds (TMA store; ``add``: add it instead, a
    TMA bulk reduce-add, in one indivisible step); returns the flat offsets of the elements written (for
    ``note_write``)."""
    if t.dim() != tile.dim():
        raise InterpError(f"interp: a {tile.dim()}-D tile stored to a {t.dim()}-D tensor")
    src, dst = [], []
    offs = torch.zeros((), dtype=torch.int64)
    for c, n, size, stride in zip(coords, tile.shape, t.shape, t.stride()):
        lo, hi = max(c, 0), min(c + n, size)
        if hi <= lo:
            return torch.zeros(0, dtype=torch.int64)
        dst.append(slice(lo, hi))
        src.append(slice(lo - c, hi - c))
        offs = offs.unsqueeze(-1) + torch.arange(lo, hi) * stride
    if add:
        t[tuple(dst)] += tile[tuple(src)].to(t.dtype)
    else:
        t[tuple(dst)] = tile[tuple(src)].to(t.dtype)
    return offs.reshape(-1)


def note_write(ctx, o: Op, name: str, offs: torch.Tensor, atomic: bool = False) -> None:
    """Record that the running CTA (``ctx.writer``) wrote flat elements ``offs`` of output ``name``
    (``machine.GlobalWrites``); a write that races another CTA's is reported through ``ctx.race``. A context
    without ``writes`` records nothing."""
    w = getattr(ctx, "writes", None)
    if w is None:
        return
    msg = w.record(name, ctx.tensor(name).numel(), offs, ctx.writer, atomic)
    if msg:
        ctx.race(msg, o)


def coords_of(ctx, o: Op) -> tuple[int, ...]:
    return tuple(int(ctx.eval(c)) for c in o.attr("coords"))


# ------------------------------------------------------------------------------------------ op kinds


@semantics("load")
def _load(ctx, o, args):
    r = o.results[0]
    t = ctx.tensor(o.attr("arg"))
    if t.dtype != TORCH_DTYPE[r.type.dtype]:
        raise InterpError(f"interp: tensor {o.attr('arg')} is {t.dtype}, the IR loads {r.type.dtype}")
    return tma_load(t, coords_of(ctx, o), r.type.shape)


def skipped(ctx, o: Op) -> bool:
    """A store after a split_reduce runs only in the CTA that summed the parts (its ``pred``)."""
    return bool(o.attr("pred")) and not ctx.scalars.get(o.attr("pred") + "_last")


@semantics("store")
def _store(ctx, o, args):
    if not skipped(ctx, o):
        note_write(ctx, o, o.attr("arg"), tma_store(ctx.tensor(o.attr("arg")), coords_of(ctx, o), args[0]))


def _split_order(ctx, msg: str, o: Op):
    """A split-K reduction out of order: a Violation in the partitioned interpreter, an error in the sequential one."""
    fail = getattr(ctx, "fail", None)
    if fail is None:
        raise InterpError(f"interp: {msg}")
    fail("split-order", msg, o)


@semantics("split_reduce")
def _split_reduce(ctx, o, args):
    """passes/split_k: write this part's tiles (one per accumulator) to their workspace slots, arrive once on the
    tile's counter; the last arriver resets the counter and sums each accumulator's slots in order. Slots start
    NaN (instances poison them) and are poisoned again after the sum, so a part summed before it was written is
    a ``split-order`` violation."""
    xs = [x.float() for x in args]
    A, (bm, bn) = len(xs), xs[0].shape
    S, part, tile = o.attr("splits"), int(ctx.eval(o.attr("part"))), int(ctx.eval(o.attr("index")))
    rows = max(0, min(bm, int(ctx.eval(o.attr("rows_valid")))))
    ws, locks = ctx.tensor(o.attr("ws")), ctx.tensor(o.attr("locks"))
    if (tile + 1) * A * S * bm * bn > ws.numel() or tile >= locks.numel():
        raise InterpError(f"interp: split_reduce of tile {tile} needs {(tile + 1) * A * S * bm * bn} workspace floats "
                          f"and {tile + 1} counters; got {ws.numel()} and {locks.numel()}")
    if not 0 <= part < S:
        _split_order(ctx, f"part {part} of output tile {tile} arrives on a counter of {S} parts", o)
    slots = ws[tile * A * S * bm * bn:(tile + 1) * A * S * bm * bn].view(A, S, bm, bn)
    for i, x in enumerate(xs):
        slots[i, part, :rows] = x[:rows]
    seen = int(locks[tile])
    locks[tile] = seen + 1
    last = seen == S - 1
    ctx.scalars[o.results[0].name + "_last"] = int(last)
    if not last:
        return tuple(torch.zeros_like(x) for x in xs)
    locks[tile] = 0
    missing = [j for j in range(S) if slots[:, j, :rows].isnan().any()]
    if missing:
        msg = (f"the last of {S} parts of output tile {tile} (part {part}) sums parts {missing} before they were "
               f"written: the counter's target does not match the parts that write")
        _split_order(ctx, msg, o)
    totals = []
    for i, x in enumerate(xs):
        total = torch.zeros_like(x)
        for j in range(S):
            total[:rows] += slots[i, j, :rows]
        totals.append(total)
    slots[:, :, :rows] = float("nan")
    return tuple(totals)


@semantics("smem_read")
def _smem_read(ctx, o, args):
    return args[0].clone()


def _memory(t: torch.Tensor) -> torch.Tensor:
    """The elements a pointer to ``t`` addresses, as a flat tensor: offset i is element i after t's first (a strided
    view reads through its base's memory, rows pitch apart, as the kernel's pointer does)."""
    if t.is_contiguous():
        return t.reshape(-1)
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if n > 0)
    return torch.as_strided(t, (span,), (1,))


@semantics("load_vec")
def _load_vec(ctx, o, args):
    n = o.results[0].type.shape[0]
    t = _memory(ctx.tensor(o.attr("arg")))
    offs = int(ctx.eval(o.attr("offset"))) + torch.arange(n)
    mask = offs < int(ctx.eval(o.attr("size")))
    if mask.any() and (offs[mask].min() < 0 or offs[mask].max() >= t.numel()):
        raise InterpError(f"interp: `{format_op(o)[0].strip()}` reads outside {o.attr('arg')} "
                          f"({t.numel()} elements): its mask lets offsets {offs[mask].min()}..{offs[mask].max()} in")
    out = torch.zeros(n, dtype=t.dtype)
    out[mask] = t[offs[mask]]
    return out


@semantics("load_ptr")
def _load_ptr(ctx, o, args):
    bm, bn = o.results[0].type.shape
    t = ctx.tensor(o.attr("arg")).reshape(-1)
    r, c = torch.arange(bm), torch.arange(bn)
    keep = (r < int(ctx.eval(o.attr("rows_valid"))))[:, None] & (c < int(ctx.eval(o.attr("cols_valid"))))[None, :]
    rows, cols = int(ctx.eval(o.attr("row"))) + r, int(ctx.eval(o.attr("col"))) + c
    if o.attr("row_mod") is not None:
        rows = rows % int(ctx.eval(o.attr("row_mod")))
    if o.attr("col_mod") is not None:
        cols = cols % int(ctx.eval(o.attr("col_mod")))
    offs = rows[:, None] * int(ctx.eval(o.attr("ld"))) + cols[None, :]
    if keep.any() and (offs[keep].min() < 0 or offs[keep].max() >= t.numel()):
        raise InterpError(f"interp: `{format_op(o)[0].strip()}` reads outside {o.attr('arg')} "
                          f"({t.numel()} elements): its mask lets offsets {offs[keep].min()}..{offs[keep].max()} in")
    out = torch.zeros((bm, bn), dtype=t.dtype)
    out[keep] = t[offs[keep]]
    return out


@semantics("zeros")
def _zeros(ctx, o, args):
    r = o.results[0].type
    return torch.zeros(r.shape, dtype=TORCH_DTYPE[r.dtype])


@semantics("cast")
def _cast(ctx, o, args):
    return args[0].to(TORCH_DTYPE[o.results[0].type.dtype])  # rounds to nearest even, like .to() in Gluon


@semantics("trans")
def _trans(ctx, o, args):
    return args[0].transpose(0, 1)


@semantics("mma")
def _mma(ctx, o, args):
    """acc + a @ b in fp32 (bf16/fp16 products are exact in fp32); no acc operand: use_acc=False."""
    prod = args[0].float() @ args[1].float()
    return prod + args[2].float() if len(args) > 2 else prod


@semantics("mma_wait")
def _mma_wait(ctx, o, args):
    return args[0]


@semantics("expand")
def _expand(ctx, o, args):
    return args[0].unsqueeze(o.attr("axis"))


_BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "max": torch.maximum}


@semantics(*_BINARY)
def _binary(ctx, o, args):
    a, b = args
    if a.dtype != b.dtype:
        b = b.to(a.dtype)
    return _BINARY[o.kind](a, b)


@semantics("exp2")
def _exp2(ctx, o, args):
    return torch.exp2(args[0].float())


@semantics("silu")
def _silu(ctx, o, args):
    return torch.nn.functional.silu(args[0].float())


def silu_grad(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """d silu(x) / dx = s * (1 + x * (1 - s)), s = sigmoid(x), in fp32 (torch's silu_backward's form)."""
    x, s = x.float(), s.float()
    return s * (1 + x * (1 - s))


@semantics("sigmoid")
def _sigmoid(ctx, o, args):
    return torch.sigmoid(args[0].float())


@semantics("silu_grad")
def _silu_grad(ctx, o, args):
    return silu_grad(*args)


@semantics("gelu")
def _gelu(ctx, o, args):  # torch's, in fp32 (approximate "tanh" or "none")
    return torch.nn.functional.gelu(args[0].float(), approximate=o.attr("approximate"))


def rotate_half(x: torch.Tensor, width: int) -> torch.Tensor:
    """RoPE's rotate-half of a [rows, cols] tile per group of ``width`` columns: cat(-x2, x1) of each group's halves,
    as the models write it (the ``rotate_half`` op's meaning, and the RoPE GEMM instances' reference)."""
    g = x.reshape(x.shape[0], -1, 2, width // 2)
    return torch.cat((-g[:, :, 1], g[:, :, 0]), dim=-1).reshape(x.shape)


@semantics("rotate_half")
def _rotate_half(ctx, o, args):
    return rotate_half(args[0], int(o.attr("width")))


@semantics("col_split")
def _col_split(ctx, o, args):
    return tuple(args[0].chunk(len(o.results), dim=1))


@semantics("neg")
def _neg(ctx, o, args):
    return -args[0]


@semantics("where")
def _where(ctx, o, args):
    c, a, b = args
    return torch.where(c.bool(), a, b.to(a.dtype))


@semantics("reduce_max")
def _reduce_max(ctx, o, args):
    return torch.amax(args[0], dim=o.attr("axis"))


@semantics("reduce_sum")
def _reduce_sum(ctx, o, args):
    return torch.sum(args[0].float(), dim=o.attr("axis"))
