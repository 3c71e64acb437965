"""Post-grad rewrite of aten.mm / addmm / bmm to ``autows::gemm`` / ``autows::bmm`` when max-autotune is off.

Which path serves a GEMM:

* max-autotune on (``mode="max-autotune"``, ``max_autotune_gemm``): nothing here. Our kernel is one more
  ``ExternKernelChoice`` in Inductor's mm/addmm/bmm autotuning (choices.py); it is used only for shapes
  where it wins the benchmark against cuBLAS and Inductor's Triton templates, and a Triton template that
  wins keeps its fused epilogue.
* max-autotune off: Inductor would call cuBLAS (an extern kernel) for every mm/addmm/bmm; Triton GEMM
  templates, the only GEMMs Inductor fuses epilogues into, are not used at all. This pass swaps that
  extern call for ours where ``support.gemm_reason`` is None, so no fusion Inductor would have made is lost.

Epilogues, explicitly: a 1-D bias is fused into our kernel: ``addmm(bias, a, b)`` (Inductor keeps bf16/fp16
addmm fused) and ``add(mm(a, b), bias)`` (what Inductor's ``unfuse_bias_add_to_pointwise`` leaves for fp32 on
GPU, meaning the bias add would have run inside the next pointwise kernel). Every other pointwise epilogue
(activation, residual add, cast) stays in the graph and Inductor fuses it into its own pointwise kernels, as
it would have after cuBLAS. A 2-D bias, ``alpha``/``beta`` != 1 or a dtype change in the add are left to
Inductor with a logged reason.

The ops inserted here are lowered to direct ``extern_kernels.autows_*`` calls (lowering.py, externs.py), the same
calls max-autotune makes when our choice wins, so no dispatcher sits between Inductor's wrapper and the
launcher.

Runs in ``post_grad_custom_post_pass``: after Inductor's own post-grad patterns (mm_plus_mm, addmm
(un)fusion), so we only take what is still a plain GEMM; on forward and backward graphs alike.
"""
from __future__ import annotations

import dataclasses
import operator

import torch
import torch.fx as fx

from . import lowering, support
from .rewrite_attention import val

aten = torch.ops.aten


@dataclasses.dataclass
class GemmSite:
    node: fx.Node
    a: fx.Node
    b: fx.Node
    bias: fx.Node | None = None
    fused: tuple[fx.Node, ...] = ()   # add(mm, bias): the mm that becomes dead
    reason: str | None = None
    vendor: str | None = None  # servable, but the vendor's kernel was chosen (runtime.choice): why


def _is_bias(mm_val, bias) -> bool:
    b = val(bias)
    return (b is not None and b.dim() == 1 and mm_val is not None and b.dtype == mm_val.dtype
            and support.same_size(b.shape[0], mm_val.shape[1]))


def _site(n: fx.Node) -> GemmSite | None:
    if n.op != "call_function":
        return None
    if n.target in (aten.mm.default, aten.bmm.default):
        return GemmSite(n, n.args[0], n.args[1])
    if n.target is aten.addmm.default:
        bias, a, b = n.args[:3]
        site = GemmSite(n, a, b, bias)
        if n.kwargs.get("beta", 1) != 1 or n.kwargs.get("alpha", 1) != 1:
            site.reason = "addmm with alpha/beta != 1"
        elif not _is_bias(val(n), bias):
            site.reason = "addmm with a bias that is not 1-D [N] of the output's dtype"
        return site
    if n.target is aten.add.Tensor and len(n.args) == 2 and not n.kwargs:
        for mm, bias in (n.args, n.args[::-1]):
            if (isinstance(mm, fx.Node) and mm.target is aten.mm.default and len(mm.users) == 1
                    and isinstance(bias, fx.Node) and _is_bias(val(mm), bias)
                    and val(n) is not None and val(n).dtype == val(mm).dtype):
                return GemmSite(n, mm.args[0], mm.args[1], bias, fused=(mm,))
    return None


def find_gemm_sites(graph: fx.Graph) -> list[GemmSite]:
    """Post-grad GEMM sites; bias adds first so that their mm is taken with the bias, not alone."""
    sites, taken = [], set()
    for n in graph.nodes:
        s = _site(n)
        if s is not None and s.fused:
            sites.append(s)
            taken.update(s.fused)
    for n in graph.nodes:
        s = _site(n)
        if s is not None and not s.fused and n not in taken:
            sites.append(s)
    for s in sites:
        if s.reason is None:
            s.reason, s.vendor = support.gemm_verdict(val(s.a), val(s.b), val(s.bias))
    return sites


def rewrite_gemms(graph: fx.Graph) -> list[GemmSite]:
    """Replace servable GEMMs by our ops (max-autotune off only); log why the others stay."""
    if support.max_autotune_on():
        return []
    lowering.register()  # Inductor lowers the inserted ops to direct extern calls
    sites = find_gemm_sites(graph)
    for s in sites:
        if s.reason is not None or s.vendor is not None:
            support.note_site("gemm", s.reason or s.vendor)
            continue
        is_bmm = s.node.target is aten.bmm.default
        fn = torch.ops.autows.bmm.default if is_bmm else torch.ops.autows.gemm.default
        a, b, bias = _operands(s)
        args = (a, b, None) if is_bmm else (a, b, bias, None)
        with graph.inserting_before(s.node):
            new = call_op(graph, fn, args, s.node)
        s.node.replace_all_uses_with(new)
        graph.erase_node(s.node)
        for dead in s.fused:
            if not dead.users:
                graph.erase_node(dead)
        support.site_counters["gemm.rewritten"] += 1
    graph.lint()
    return sites


def _operands(s: GemmSite):
    """(a, b, bias) as the graph has them now: an operand that was itself a GEMM site rewritten earlier
    (``x @ w1 @ w2``) is the new node by now, while ``s.a`` / ``s.b`` still name the erased one."""
    src = s.fused[0] if s.fused else s.node
    if src.target is aten.addmm.default:
        return src.args[1], src.args[2], src.args[0]
    if s.fused:
        return src.args[0], src.args[1], next(x for x in s.node.args if x is not src)
    return src.args[0], src.args[1], None


def call_op(graph: fx.Graph, fn, args: tuple, source: fx.Node) -> fx.Node:
    """``fn(*args)`` inserted at ``graph``'s insert point, with ``source``'s stack trace and sequence number (what
    the profiler and explain() name it by) and its fake value (``meta["val"]``) where the args have one."""
    new = graph.call_function(fn, args)
    new.meta.update({k: source.meta[k] for k in ("stack_trace", "seq_nr") if k in source.meta})
    fake = fake_call(fn, args)
    if fake is not None:
        new.meta["val"] = fake
    return new


def results(graph: fx.Graph, node: fx.Node, count: int) -> list[fx.Node]:
    """The ``count`` results of the multi-output op ``node`` as ``getitem`` nodes at ``graph``'s insert point, each with
    its part of ``node``'s fake value where it has one."""
    items = [graph.call_function(operator.getitem, (node, i)) for i in range(count)]
    if "val" in node.meta:
        for i, item in enumerate(items):
            item.meta["val"] = node.meta["val"][i]
    return items


def replay_views(graph: fx.Graph, node: fx.Node, views) -> fx.Node:
    """``views`` (view/reshape nodes, in the order they were applied) applied again to ``node``, each with its own
    size arguments (graph nodes where sizes are symbolic) and value; ``node`` itself where there are none."""
    for v in views:
        node = graph.call_function(v.target, (node, *v.args[1:]), dict(v.kwargs))
        node.meta.update({k: v.meta[k] for k in ("val",) if k in v.meta})
    return node


def fake_call(fn, args):
    """``fn`` applied to the fake values of ``args`` (graph nodes) in their fake mode: the new node's ``val``."""
    fakes = [val(a) if isinstance(a, fx.Node) else a for a in args]
    mode = getattr(fakes[0], "fake_mode", None)
    if mode is None:
        return None
    with mode:
        return fn(*fakes)
