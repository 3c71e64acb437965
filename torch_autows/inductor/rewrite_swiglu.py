"""Post-grad rewrite of a SwiGLU MLP's gate and up projections into one ``autows::gemm_swiglu``.

The Llama MLP computes ``down(silu(gate(h)) * up(h))``. After AOTAutograd and Inductor's decompositions the
post-grad graph holds, for the part before ``down``::

    g = mm(reshape(h), permute(W_gate))      u = mm(reshape(h), permute(W_up))
    s = silu(g)        (aten.silu, or x / (1 + exp(-x)), or x * sigmoid(x); for bf16/fp16 between a cast
                        to fp32 and a cast back; reshapes anywhere on the way)
    out = mul(s, u)    (either order, reshapes on either side)

Inductor would run two cuBLAS GEMMs writing g and u to memory and one pointwise kernel reading them back.
The rewrite replaces the whole pattern by one kernel that keeps g and u in registers (runtime/swiglu.py)
and writes only ``out``: a fusion across the GEMM boundary a library call cannot make.

A match needs: both GEMMs read the same activation (the same node, through reshapes, at the same shape);
the weights have one shape, stride and dtype; the output dtype is the GEMMs'; and every intermediate node is
used only inside the pattern, but for g and u themselves: a training graph saves them for the backward, and then the
site becomes ``autows::gemm_swiglu_save``, which writes them too (the backward graph reads them as the unfused graph's
did; its own GEMM and pointwise gradients are rewrite_swiglu_bwd.py's). Matched sites go through the same support
check and measured choice as a GEMM site (``support.swiglu_reason`` / ``swiglu_choice``); a site left alone logs why.
Runs before ``rewrite_gemm`` in the post-grad pass, so the two GEMMs it takes are not rewritten one by one.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.fx as fx

from . import support
from .rewrite_attention import val
from .rewrite_gemm import call_op, results

aten, prims = torch.ops.aten, torch.ops.prims
_RESHAPES = (aten.reshape.default, aten.view.default, aten._unsafe_view.default)
_CASTS = (prims.convert_element_type.default,)


@dataclasses.dataclass
class SwigluSite:
    out: fx.Node             # the mul whose value the fused op produces
    gate: fx.Node            # mm(a, w_gate)
    up: fx.Node              # mm(a, w_up)
    nodes: tuple[fx.Node, ...]  # every node of the pattern (erased after the rewrite)
    reason: str | None = None
    vendor: str | None = None
    save: bool = False       # the graph keeps gate and up (a training graph saves them): the op writes them too


def _strip(n, ops) -> tuple[object, list[fx.Node]]:
    """``n`` with the ops in ``ops`` (single-input views/casts) peeled off; the peeled nodes."""
    chain = []
    while isinstance(n, fx.Node) and n.op == "call_function" and n.target in ops:
        chain.append(n)
        n = n.args[0]
    return n, chain


def _silu_input(n) -> tuple[object, list[fx.Node]] | None:
    """(x, the silu's nodes) when ``n`` computes silu(x), else None. Forms: aten.silu(x); x / (1 + exp(-x))
    (Inductor's decomposition); x * sigmoid(x); each possibly under casts."""
    n, chain = _strip(n, _CASTS)
    if not isinstance(n, fx.Node) or n.op != "call_function":
        return None
    if n.target is aten.silu.default:
        return n.args[0], [*chain, n]
    if n.target is aten.div.Tensor and len(n.args) == 2:
        x, den = n.args
        if (isinstance(den, fx.Node) and den.target is aten.add.Tensor and len(den.args) == 2
                and den.args[1] == 1 and isinstance(den.args[0], fx.Node) and den.args[0].target is aten.exp.default):
            e = den.args[0]
            neg = e.args[0]
            if isinstance(neg, fx.Node) and neg.target is aten.neg.default and neg.args[0] is x:
                return x, [*chain, n, den, e, neg]
    if n.target is aten.mul.Tensor and len(n.args) == 2:
        for x, sg in (n.args, n.args[::-1]):
            if isinstance(sg, fx.Node) and sg.target is aten.sigmoid.default and sg.args[0] is x:
                return x, [*chain, n, sg]
    return None


def _mm_through(n) -> tuple[fx.Node | None, list[fx.Node]]:
    base, chain = _strip(n, _RESHAPES + _CASTS)
    if isinstance(base, fx.Node) and base.op == "call_function" and base.target is aten.mm.default:
        return base, chain
    return None, chain


def _same_input(x, y) -> bool:
    """The same tensor at the same shape: one node, or reshapes of one node."""
    if x is y:
        return True
    bx, _ = _strip(x, _RESHAPES)
    by, _ = _strip(y, _RESHAPES)
    vx, vy = val(x), val(y)
    return bx is by and vx is not None and vy is not None and tuple(vx.shape) == tuple(vy.shape)


def _match(mul: fx.Node) -> SwigluSite | None:
    if mul.op != "call_function" or mul.target is not aten.mul.Tensor or len(mul.args) != 2 or mul.kwargs:
        return None
    for s_side, u_side in (mul.args, mul.args[::-1]):
        got = _silu_input(s_side)
        if got is None:
            continue
        x, silu_nodes = got
        gate, g_chain = _mm_through(x)
        up, u_chain = _mm_through(u_side)
        if gate is None or up is None or gate is up:
            continue
        nodes = (*silu_nodes, *g_chain, *u_chain, gate, up)
        return SwigluSite(mul, gate, up, tuple(dict.fromkeys(nodes)))
    return None


def _check(s: SwigluSite) -> str | None:
    """Why a matched pattern cannot become one op (None: it can, subject to the support check). Uses of the gate
    and up GEMMs' own outputs outside the pattern (a training graph saves them for the backward) make it the op
    that writes them too (``save``); any other intermediate used outside stays unfused."""
    inside = set(s.nodes) | {s.out}
    for n in s.nodes:
        if any(u not in inside for u in n.users):
            if n is s.gate or n is s.up:
                s.save = True
                continue
            return f"%{n.name} is used outside the SwiGLU pattern (e.g. saved for a backward); fusing would drop it"
    (a, wg), (a2, wu) = s.gate.args[:2], s.up.args[:2]
    if not _same_input(a, a2):
        return "the gate and up GEMMs read different activations"
    vg, vu, vo, vm = val(wg), val(wu), val(s.out), val(s.gate)
    if None in (vg, vu, vo, vm):
        return "a node of the pattern has no fake value"
    if vg.shape != vu.shape or vg.stride() != vu.stride() or vg.dtype != vu.dtype:
        return "the gate and up weights differ in shape, strides or dtype"
    if vo.dtype != vm.dtype or vo.numel() != vm.numel():
        return f"the product is {vo.dtype} {tuple(vo.shape)}, not the GEMMs' {vm.dtype} {tuple(vm.shape)}"
    return None


def find_swiglu_sites(graph: fx.Graph) -> list[SwigluSite]:
    """Every SwiGLU pattern in the graph, with why it stays unfused (``reason``/``vendor``) where it does."""
    sites = []
    for n in graph.nodes:
        s = _match(n)
        if s is None:
            continue
        s.reason = _check(s)
        if s.reason is None:
            a, wg, wu = s.gate.args[0], s.gate.args[1], s.up.args[1]
            s.reason, s.vendor = support.swiglu_verdict(val(a), val(wg), val(wu), save=s.save)
        sites.append(s)
    return sites


def _sizes(site: SwigluSite, shape: list) -> list:
    """The sizes to reshape the fused [M, N] output to ``shape`` (the product's): where a size is symbolic, the
    size list of a view in the pattern with that shape, whose symbolic sizes are graph nodes (a raw SymInt in a
    node's arguments is not a graph value); the plain list where every size is an int or no view matches."""
    if all(isinstance(d, int) for d in shape):
        return shape
    want = [str(d) for d in shape]  # compared as text: == on SymInts would add a guard
    for n in site.nodes:
        v = val(n)
        if n.target in _RESHAPES and v is not None and [str(d) for d in v.shape] == want:
            return n.args[1]
    return shape


def rewrite_swiglu(graph: fx.Graph) -> list[SwigluSite]:
    """Replace every servable SwiGLU pattern by ``autows::gemm_swiglu``; log why the others stay."""
    if support.max_autotune_on():  # Inductor's own GEMM templates and fusions are in play: leave it the graph
        return []
    sites = find_swiglu_sites(graph)
    order = {n: i for i, n in enumerate(graph.nodes)}  # the pattern nodes' positions (they are never moved)
    for s in sites:
        if s.reason is None and s.save and any(order.get(u, len(order)) < order[s.out] for mm in (s.gate, s.up)
                                                for u in mm.users if u not in s.nodes and u is not s.out):
            s.reason = "a use of the gate or up projection comes before their product; the fused op writes them there"
        if s.reason is not None or s.vendor is not None:
            support.note_site("swiglu", s.reason or s.vendor)
            continue
        a, wg, wu = s.gate.args[0], s.gate.args[1], s.up.args[1]
        fn = torch.ops.autows.gemm_swiglu_save.default if s.save else torch.ops.autows.gemm_swiglu.default
        with graph.inserting_before(s.out):
            new = res = call_op(graph, fn, (a, wg, wu), s.out)
            if s.save:  # (product, gate, up): the graph's other uses of the GEMMs' outputs read the op's
                items = results(graph, new, 3)
                new = res = items[0]
                inside = frozenset(s.nodes)
                for mm, item in ((s.gate, items[1]), (s.up, items[2])):
                    mm.replace_all_uses_with(item, delete_user_cb=lambda user, inside=inside: user not in inside)
            fake, shape = val(new), list(val(s.out).shape)
            if fake is None or list(fake.shape) != shape:
                res = graph.call_function(aten.reshape.default, (new, _sizes(s, shape)))
                res.meta["val"] = val(s.out)
        s.out.replace_all_uses_with(res)
        graph.erase_node(s.out)
        for n in sorted(s.nodes, key=order.__getitem__, reverse=True):  # users before their inputs
            if not n.users:
                graph.erase_node(n)
        support.site_counters["swiglu.rewritten"] += 1
    graph.lint()
    return sites

