"""Node predicates of the attention matcher on the Dynamo (torch-level) FX graph: ``val`` (a node's fake tensor,
also what the post-grad rewrites read), the call and argument helpers, and the recognisers of one node each: a
constant scaling (``x * c``, ``x / c``), a dtype cast, an additive or filling mask, a dropout that does nothing, a
transpose of the last two dims, a softmax over the last dim. ``attention_sites`` chains them into sites."""
from __future__ import annotations

import math
import operator

import torch
import torch.fx as fx
import torch.nn.functional as F

_SOFTMAX_FNS = (torch.softmax, F.softmax, torch.special.softmax)
_DROPOUT_FNS = (F.dropout, torch.dropout)
_CAST_METHODS = ("to", "float", "half", "bfloat16", "type", "type_as", "contiguous")


def val(n):
    """The fake tensor of an FX node (Dynamo: example_value; AOT/post-grad: val)."""
    if not isinstance(n, fx.Node):
        return None
    v = n.meta.get("val", n.meta.get("example_value"))
    return v if isinstance(v, torch.Tensor) else None


def _is(n, fns=(), methods=()) -> bool:
    return isinstance(n, fx.Node) and ((n.op == "call_function" and n.target in fns)
                                       or (n.op == "call_method" and n.target in methods))


def _arg(n: fx.Node, i: int, name: str, default=None):
    if len(n.args) > i:
        return n.args[i]
    return n.kwargs.get(name, default)


def _number(x) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        if _is(x, (torch.full,)) and tuple(_arg(x, 0, "size", (1,))) == () and not x.args[2:]:
            return _number(_arg(x, 1, "fill_value"))  # GPT-2 style: w / torch.full([], sqrt(d))
        return None
    return float(x) if math.isfinite(x) and x != 0 else None


def _scaling(n) -> tuple[fx.Node, float] | None:
    """``x * c``, ``c * x``, ``x / c`` with c a number: (x, factor)."""
    if _is(n, (operator.mul, torch.mul), ("mul", "__mul__")) and len(n.args) == 2 and not n.kwargs:
        a, b = n.args
        if isinstance(a, fx.Node) and _number(b) is not None:
            return a, _number(b)
        if isinstance(b, fx.Node) and _number(a) is not None:
            return b, _number(a)
    if (_is(n, (operator.truediv, torch.div, torch.true_divide), ("div", "__truediv__", "true_divide"))
            and len(n.args) == 2 and not n.kwargs and isinstance(n.args[0], fx.Node)):
        c = _number(n.args[1])
        if c is not None:
            return n.args[0], 1.0 / c
    return None


def _is_cast(n) -> bool:
    if not _is(n, (), _CAST_METHODS):
        return False
    if n.target == "to":  # dtype only: .to(other_tensor) / .to(device) are not casts we can drop
        return all(isinstance(a, torch.dtype) for a in n.args[1:]) and set(n.kwargs) <= {"dtype", "copy",
                                                                                        "non_blocking"}
    return True


def _is_mask(n) -> bool:
    if _is(n, (operator.add, torch.add), ("add", "__add__")):
        return sum(isinstance(a, fx.Node) and val(a) is not None for a in n.args) == 2
    return _is(n, (torch.masked_fill, torch.where), ("masked_fill",))


def _identity_dropout(n) -> bool | None:
    """True: a dropout that does nothing (p == 0 or not training); False: an active one; None: not dropout."""
    if not _is(n, _DROPOUT_FNS):
        return None
    p = _arg(n, 1, "p", 0.5)
    training = _arg(n, 2, "training" if n.target is F.dropout else "train", True)
    return (isinstance(p, (int, float)) and p == 0) or training is False


def _transposed_last2(n) -> fx.Node | None:
    """``x.transpose(-2, -1)`` / ``x.transpose(2, 3)`` / ``x.permute(0, 1, 3, 2)`` of a 4-D x: x."""
    x = n.args[0] if isinstance(n, fx.Node) and n.args else None
    xv = val(x)
    if xv is None or xv.dim() != 4:
        return None
    if _is(n, (torch.transpose,), ("transpose",)) and len(n.args) == 3:
        if {d % 4 for d in n.args[1:] if isinstance(d, int)} == {2, 3}:
            return x
    if _is(n, (torch.permute,), ("permute",)):
        perm = n.args[1] if len(n.args) == 2 and isinstance(n.args[1], (list, tuple)) else n.args[1:]
        if [d % 4 if isinstance(d, int) else d for d in perm] == [0, 1, 3, 2]:
            return x
    return None


def _softmax_last_dim(n) -> bool:
    if not _is(n, _SOFTMAX_FNS, ("softmax",)):
        return False
    dim = _arg(n, 1, "dim")
    v = val(n)
    if v is None or not isinstance(dim, int) or dim % v.dim() != v.dim() - 1:
        return False
    dtype = n.kwargs.get("dtype", n.args[3] if n.target is F.softmax and len(n.args) > 3 else None)
    return dtype in (None, torch.float32, v.dtype)
