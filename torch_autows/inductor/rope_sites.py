"""Find RoPE on a projection's output in post-grad graphs: the sites a GEMM with the RoPE epilogue
(templates.gemm ``GemmRequest.rope``, runtime/gemm_rope.py) serves. ``inductor/rewrite_rope.py`` rewrites them.

The Llama q/k projections followed by rotary embedding, ``apply_rope(self.wq(x).view(B, S, H, D).transpose(1, 2),
cos, sin)`` with ``rotate_half(x) = cat(-x2, x1)``, reach the post-grad graph as::

    y = mm(a, w)                           (addmm with a bias too)
    p = permute(reshape*(y) -> [B, S, H, D], [0, 2, 1, 3])
    x1, x2 = split(p, D/2, -1)             (chunk; or slice(p, -1, 0, D/2) and slice(p, -1, D/2, ...))
    r = cat([neg(x2), x1], -1)
    out = add(mul(p, c), mul(r, s))        (either order of each mul and of the add)

where c and s are the cos/sin tables broadcast over batch and heads: [S, D], or [B or 1, 1, S, D] (Hugging Face's
unsqueezed position embeddings), through casts to the projection's dtype. A site records the GEMM, its views, the
permute, the tables as the graph has them (before any cast), the head dim, and why it could not be served (None:
it could): the tables must broadcast as above with the projection's dtype or be cast to it, D even, every node
between the GEMM and the add used only inside the pattern (the tables and their casts are inputs: the q and k sites
of a layer may share them).
"""
from __future__ import annotations

import dataclasses
import math
import operator

import torch
import torch.fx as fx

from . import support
from .attention_nodes import val

aten, prims = torch.ops.aten, torch.ops.prims
_RESHAPES = (aten.reshape.default, aten.view.default, aten._unsafe_view.default)
_GEMMS = (aten.mm.default, aten.addmm.default)


@dataclasses.dataclass
class RopeSite:
    out: fx.Node                 # the add whose value a fused GEMM (and the same reshapes and permute) would produce
    gemm: fx.Node                # mm or addmm
    views: tuple[fx.Node, ...]   # the reshapes from the GEMM's [M, N] to [B, S, H, D], in order
    permute: fx.Node             # [B, S, H, D] -> [B, H, S, D]
    cos: fx.Node                 # the tables as the graph has them (before a cast to the projection's dtype)
    sin: fx.Node
    head_dim: int
    reason: str | None = None    # why it cannot be served (None: it can)
    vendor: str | None = None    # why the measured choice keeps the default's path (inductor/rewrite_rope.py)
    nodes: tuple[fx.Node, ...] = ()  # every node of the pattern, the GEMM to the add
    casts: tuple[fx.Node, ...] = ()  # the tables' casts the muls read (inputs, which other sites may share)


def _call(n, *targets) -> bool:
    return isinstance(n, fx.Node) and n.op == "call_function" and n.target in targets


def _uncast(n):
    """``n`` without casts (convert_element_type) in front: the tables as the model made them."""
    while _call(n, prims.convert_element_type.default):
        n = n.args[0]
    return n


def _halves(r) -> tuple[fx.Node, fx.Node, fx.Node] | None:
    """(p, x1, x2) when ``r`` is ``cat([neg(x2), x1], -1)`` with x1, x2 the two halves of one node p."""
    if not _call(r, aten.cat.default) or len(r.args[0]) != 2:
        return None
    dim = r.args[1] if len(r.args) > 1 else r.kwargs.get("dim", 0)
    neg, x1 = r.args[0]
    if not _call(neg, aten.neg.default) or val(r) is None or dim not in (-1, val(r).dim() - 1):
        return None
    x2 = neg.args[0]
    if _call(x1, operator.getitem) and _call(x2, operator.getitem) and x1.args[0] is x2.args[0] \
            and x1.args[1] == 0 and x2.args[1] == 1:
        split = x1.args[0]
        if _call(split, aten.split.Tensor, aten.split_with_sizes.default) and len(split.users) == 2:
            return split.args[0], x1, x2
        return None
    if _call(x1, aten.slice.Tensor) and _call(x2, aten.slice.Tensor) and x1.args[0] is x2.args[0]:
        p = x1.args[0]
        d = val(p).shape[-1] if val(p) is not None else None
        last = (-1, val(p).dim() - 1) if val(p) is not None else (-1,)
        s1, s2 = (tuple(x.args[1:4]) + (None,) * (4 - len(x.args)) for x in (x1, x2))
        if d and s1[0] in last and s2[0] in last and s1[1] == 0 and s1[2] == d // 2 and s2[1] == d // 2 \
                and (s2[2] is None or s2[2] >= d):
            return p, x1, x2
    return None


def _projection(p) -> tuple[fx.Node, tuple[fx.Node, ...], fx.Node] | None:
    """(GEMM, reshapes, permute) when ``p`` is ``permute(reshape*(mm or addmm), [0, 2, 1, 3])``."""
    if not _call(p, aten.permute.default) or list(p.args[1]) != [0, 2, 1, 3]:
        return None
    views, n = [], p.args[0]
    while _call(n, *_RESHAPES):
        views.append(n)
        n = n.args[0]
    if not _call(n, *_GEMMS) or not views:
        return None
    return n, tuple(views[::-1]), p


def table_reason(table: torch.Tensor, heads: tuple, dtype: torch.dtype) -> str | None:
    """Why ``table`` (cos or sin as the model has it) is not a RoPE table the epilogue serves for [B, H, S, D]
    ``heads`` of a ``dtype`` projection: it must broadcast as [S, D] or [B, 1, S, D] and be of ``dtype`` or fp32 (then
    cast); None when it is. Shared by the rewrite's matcher and explain()."""
    B, H, S, D = heads
    shape = tuple(table.shape)
    if shape not in ((S, D), (1, 1, S, D), (B, 1, S, D)):
        return f"table {shape} does not broadcast as [S, D] or [B, 1, S, D] over [B, H, S, D] = {tuple(heads)}"
    if table.dtype not in (dtype, torch.float32):
        return f"table of {table.dtype}: the epilogue reads tables of the projection's dtype {dtype} (or fp32 cast)"
    return None


def kernel_table(table: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A fake [P, D] table of ``dtype``: what ``autows::gemm_rope`` reads for ``table`` once the rewrite has cast it and
    reshaped it to rows (P = S for [S, D] and [1, 1, S, D] tables, B * S for [B, 1, S, D] ones)."""
    d = table.shape[-1]
    rows = math.prod(support._hint(s) for s in table.shape[:-1])
    return support.fake_tensor((rows, d), (d, 1), dtype, table.device)


def _why_not(site: RopeSite, nodes: list[fx.Node]) -> str | None:
    y, out = val(site.gemm), val(site.out)
    if y is None or out is None:
        return "no fake values on the GEMM or the output"
    B, H, S, D = out.shape
    if D % 2:
        return f"head dim {D} is odd"
    for t in (site.cos, site.sin):
        v = val(t)
        why = "no fake value on a table" if v is None else table_reason(v, tuple(out.shape), y.dtype)
        if why:
            return why
    inside = set(nodes)
    for n in nodes:
        if n is site.out:
            continue
        outside = [u for u in n.users if u not in inside]
        if outside:
            return f"{n.name} is also used outside the pattern (by {outside[0].name}): its value would have to be kept"
    return None


def find_rope_sites(graph: fx.Graph) -> list[RopeSite]:
    """Every ``add(mul(p, cos), mul(rotate_half(p), sin))`` with p a projection's [B, H, S, D] view, with why it
    could not be served (``reason``)."""
    sites = []
    for n in graph.nodes:
        if not _call(n, aten.add.Tensor) or len(n.args) != 2 or n.kwargs:
            continue
        muls = n.args
        if not all(_call(m, aten.mul.Tensor) and len(m.args) == 2 for m in muls):
            continue
        found = None
        for mc, ms in (muls, muls[::-1]):
            for r, s in (ms.args, ms.args[::-1]):
                halves = _halves(r)
                if halves is None:
                    continue
                p = halves[0]
                if p in mc.args:
                    c = mc.args[1] if mc.args[0] is p else mc.args[0]
                    found = (mc, ms, r, s, c, *halves)
                    break
            if found:
                break
        if found is None:
            continue
        mc, ms, r, s, c, p, x1, x2 = found
        proj = _projection(p)
        if proj is None:
            continue
        gemm, views, permute = proj
        site = RopeSite(n, gemm, views, permute, _uncast(c), _uncast(s), val(p).shape[-1] if val(p) is not None else 0)
        split = [x1.args[0]] if _call(x1, operator.getitem) else []
        nodes = [gemm, *views, permute, *split, x1, x2, r.args[0][0], r, mc, ms, n]  # r.args[0][0]: the neg
        site.nodes = tuple(dict.fromkeys(x for x in nodes if isinstance(x, fx.Node)))
        site.casts = tuple(x for x in (c, s) if _call(x, prims.convert_element_type.default))
        site.reason = _why_not(site, list(site.nodes))
        sites.append(site)
    return sites
