"""Post-grad rewrite of the SwiGLU MLP's backward at its first GEMM into one ``autows::gemm_swiglu_bwd``.

In a training graph the Llama MLP ``down(silu(G) * U)`` saves G and U (the gate and up projections) for its
backward, which computes ``dh = mm(dy, W_down)`` and then, pointwise, the product's gradients
``du = dh * silu(G)`` and ``dG = dh * U * silu'(G)`` (Inductor's decompositions: silu as ``x / (1 + exp(-x))``,
its derivative through ``sigmoid``, bf16/fp16 values between casts to fp32 and back, reshapes anywhere). The
default runs a cuBLAS GEMM that writes dh and a pointwise kernel that reads it back; the fused op keeps dh in
registers and writes only the two gradients (runtime/swiglu_bwd.py). The forward's side is rewrite_swiglu.py's: in a
training graph its fused op also writes G and U, which this op then reads.

**Matching by the graph's own numbers.** The gradients' expressions take many equivalent shapes (operand orders,
where the casts sit, sigmoid written out or not), so the region is found by structure and recognised by value:

1. dh is an ``aten.mm`` whose every use is a pointwise op or view (``_POINTWISE``) of the same number of elements.
2. The region is everything those uses reach forward through such ops; its *exits* are its nodes used outside it
   (or graph outputs); the region is then closed backward over the exits' inputs until non-pointwise nodes, the
   *leaves*. A site has exactly two exits and three leaves: dh and two [M, N] tensors of dh's dtype, G and U.
3. Every node of the region is evaluated in float64 on flat random probes (reshapes and views of same-sized tensors
   keep the element order, and casts between floating dtypes only round, so both are the identity here): each exit
   must equal ``dh * silu(G)`` or ``dh * U * silu'(G)`` to float64 rounding, for one order of the two non-dh leaves.
   This is a check of the real-number function the graph computes (the fused kernel computes the same one, rounding
   once at the end), so any other function, however close (another activation, a missing term, a constant off by
   1%, a swapped operand), is left alone with the reason logged.

Matched sites go through the same support check and measured choice as a GEMM site (``support.swiglu_bwd_verdict``).
Runs before the other GEMM rewrites in the post-grad pass (the dh GEMM is part of the site).
"""
from __future__ import annotations

import dataclasses

import torch
import torch.fx as fx

from . import support
from .rewrite_attention import val
from .rewrite_gemm import call_op, results

aten, prims = torch.ops.aten, torch.ops.prims
#: Elementwise ops a region may hold (evaluated with their own aten implementations on the probes).
_ELEMENTWISE = frozenset({aten.mul.Tensor, aten.add.Tensor, aten.sub.Tensor, aten.div.Tensor, aten.neg.default,
                          aten.exp.default, aten.sigmoid.default, aten.silu.default, aten.reciprocal.default,
                          aten.rsub.Scalar, prims.convert_element_type.default, aten._to_copy.default})
#: Views that keep a contiguous tensor's element order (the identity on flat probes).
_VIEWS = frozenset({aten.reshape.default, aten.view.default, aten._unsafe_view.default})
#: Casts: the identity on float64 probes where they cast to a floating dtype (the graph's roundings).
_CASTS = frozenset({prims.convert_element_type.default, aten._to_copy.default})
_POINTWISE = _ELEMENTWISE | _VIEWS
_ACTIVATIONS = (aten.sigmoid.default, aten.exp.default, aten.silu.default)
#: Probe elements, and how far a graph's exit may be from the gradient, relative to its largest element (float64
#: evaluation: only the order of operations differs, ~1e-15).
_PROBES = 512
_TOL = 1e-9


@dataclasses.dataclass
class SwigluBwdSite:
    dh: fx.Node              # mm(dy, w)
    dg: fx.Node | None       # the exit computing dG
    du: fx.Node | None       # the exit computing du
    g: fx.Node | None        # the saved gate projection (a leaf)
    u: fx.Node | None        # the saved up projection (a leaf)
    reason: str | None = None
    vendor: str | None = None


def _pointwise(n) -> bool:
    return isinstance(n, fx.Node) and n.op == "call_function" and n.target in _POINTWISE


def _numel(n) -> int | None:
    v = val(n)
    return None if v is None else v.numel()


def _region(dh: fx.Node) -> tuple[set, list, list]:
    """(region nodes, exits, leaves) of the pointwise work hanging off dh's pointwise uses."""
    forward, todo = set(), [u for u in dh.users if _pointwise(u)]
    while todo:
        n = todo.pop()
        if n not in forward:
            forward.add(n)
            todo += [u for u in n.users if _pointwise(u)]
    region, todo = set(forward), [x for n in forward for x in n.all_input_nodes]
    while todo:  # close backward: the silu of G and the casts of U are the region's too
        n = todo.pop()
        if n in region or n is dh or not _pointwise(n):
            continue
        region.add(n)
        todo += n.all_input_nodes
    exits = [n for n in region if any(u not in region for u in n.users)]
    leaves = list(dict.fromkeys(x for n in region for x in n.all_input_nodes if x not in region))
    return region, exits, leaves


def _evaluate(region: set, order: dict, values: dict) -> dict:
    """Every region node's value on flat float64 probes (``values``: the leaves'), in graph order; views and casts to
    floating dtypes are the identity (ValueError on a cast to another kind of dtype)."""
    out = dict(values)
    for n in sorted(region, key=order.__getitem__):
        args = [out[a] if isinstance(a, fx.Node) else a for a in n.args]
        if n.target in _CASTS:
            to = n.args[1] if len(n.args) > 1 else n.kwargs.get("dtype")
            if not (isinstance(to, torch.dtype) and to.is_floating_point):
                raise ValueError(f"%{n.name} casts to {to}")
            out[n] = args[0]
        elif n.target in _VIEWS:
            out[n] = args[0]
        else:
            kwargs = {k: out[a] if isinstance(a, fx.Node) else a for k, a in n.kwargs.items()}
            out[n] = n.target(*args, **kwargs)
    return out


def _close(x: torch.Tensor, ref: torch.Tensor) -> bool:
    return bool(((x.double() - ref).abs() <= _TOL * ref.abs().max().clamp_min(1e-30)).all())


def _recognise(dh: fx.Node, region: set, exits: list, leaves: list, order: dict):
    """(dG exit, du exit, G, U) where the region computes the SwiGLU gradients, else a reason."""
    others = [x for x in leaves if x is not dh]
    if len(others) != 2:
        return f"the gradients read {len(others)} tensors beside dh (the SwiGLU backward's read G and U)"
    vd = val(dh)
    for x in others:
        vx = val(x)
        if vx is None or vx.dtype != vd.dtype or vx.numel() != vd.numel():
            return f"%{x.name} is not a saved projection of dh's size and dtype"
    gen = torch.Generator().manual_seed(0)
    probes = {x: torch.randn(_PROBES, generator=gen, dtype=torch.float64) * 3 for x in (dh, *others)}
    try:
        got = _evaluate(region, order, probes)
    except Exception as e:  # an op that does not run on CPU probes (a device move, say): not this pattern
        return f"the pointwise work after dh could not be evaluated on probes ({type(e).__name__}: {e})"
    dhf = probes[dh]
    for g, u in (others, others[::-1]):
        gf, uf = probes[g], probes[u]
        s = torch.sigmoid(gf)
        want_du, want_dg = dhf * gf * s, dhf * uf * s * (1 + gf * (1 - s))
        for e_dg, e_du in (exits, exits[::-1]):
            if _close(got[e_dg], want_dg) and _close(got[e_du], want_du):
                return e_dg, e_du, g, u
    return "the pointwise work after dh is not the SwiGLU product's gradients (another activation or form)"


def _why_not(dh: fx.Node, region: set) -> str | None:
    """Why a candidate region (it has an activation) cannot be one site whatever it computes."""
    if not all(isinstance(d, int) for d in val(dh).shape):  # first: comparing symbolic sizes would add guards
        return "symbolic sizes: the fusion is kept only where measured at compile time, which needs static sizes"
    if not all(_pointwise(u) for u in dh.users):
        return "dh is also used outside the pointwise work after it (e.g. saved or returned); fusing would drop it"
    if any(_numel(n) != _numel(dh) for n in region):
        return "a pointwise node after dh broadcasts (another number of elements than dh)"
    return None


def find_swiglu_bwd_sites(graph: fx.Graph) -> list[SwigluBwdSite]:
    """Every dh GEMM of a SwiGLU backward in the graph, with why it stays unfused (``reason``/``vendor``). A
    candidate is an ``aten.mm`` whose pointwise work (its region) has an activation (a sigmoid or an exp) and two
    results; others (the forward's gate and up GEMMs, whose region ends in the one product; a language model head's
    softmax gradient) are not reported."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    sites = []
    for n in graph.nodes:
        if n.op != "call_function" or n.target is not aten.mm.default or val(n) is None:
            continue
        region, exits, leaves = _region(n)
        if len(exits) != 2 or not any(x.target in _ACTIVATIONS for x in region):
            continue  # not two results (a forward's product; a softmax's gradient), or no activation: not this kind
        rec = _why_not(n, region) or _recognise(n, region, exits, leaves, order)
        if isinstance(rec, str):
            sites.append(SwigluBwdSite(n, None, None, None, None, reason=rec))
            continue
        site = SwigluBwdSite(n, *rec)
        dy, w = n.args[:2]
        site.reason, site.vendor = support.swiglu_bwd_verdict(val(dy), val(w), val(site.g), val(site.u))
        sites.append(site)
    return sites


def _as_2d(graph: fx.Graph, n: fx.Node, shape: list) -> fx.Node:
    """``n`` reshaped to [M, N] (dh's shape) where it is not."""
    if list(val(n).shape) == shape:
        return n
    r = graph.call_function(aten.reshape.default, (n, shape))
    r.meta["val"] = val(n).reshape(shape)
    return r


def rewrite_swiglu_bwd(graph: fx.Graph) -> list[SwigluBwdSite]:
    """Replace every servable SwiGLU backward site by ``autows::gemm_swiglu_bwd``; log why the others stay."""
    if support.max_autotune_on():  # Inductor's own GEMM templates and fusions are in play: leave it the graph
        return []
    sites = find_swiglu_bwd_sites(graph)
    for s in sites:
        if s.reason is not None or s.vendor is not None:
            support.note_site("swiglu_bwd", s.reason or s.vendor)
            continue
        order = {n: i for i, n in enumerate(graph.nodes)}
        dy, w = s.dh.args[:2]
        last = max((s.dh, s.g, s.u), key=order.__getitem__)  # the fused op goes after dh and both saved tensors
        if min(order[u] for e in (s.dg, s.du) for u in e.users) <= order[last]:
            support.note_site("swiglu_bwd", "a saved projection is computed after the gradients are used")
            continue
        shape = list(val(s.dh).shape)
        with graph.inserting_before(last.next):  # in order, after ``last``
            g2, u2 = _as_2d(graph, s.g, shape), _as_2d(graph, s.u, shape)
            fused = call_op(graph, torch.ops.autows.gemm_swiglu_bwd.default, (dy, w, g2, u2), s.dh)
            outs = results(graph, fused, 2)
        for item, exit_ in zip(outs, (s.dg, s.du)):
            res = item
            want = val(exit_)
            if list(want.shape) != shape:
                with graph.inserting_before(item.next):
                    res = graph.call_function(aten.reshape.default, (item, list(exit_.args[1]) if exit_.target in
                                                                     _VIEWS else list(want.shape)))
                    res.meta["val"] = want
            exit_.replace_all_uses_with(res)
        graph.eliminate_dead_code()
        support.site_counters["swiglu_bwd.rewritten"] += 1
    graph.lint()
    return sites
