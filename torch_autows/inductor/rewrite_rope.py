"""Post-grad rewrite of a projection followed by rotary embedding into one ``autows::gemm_rope``.

``inductor/rope_sites.py`` finds ``add(mul(p, cos), mul(rotate_half(p), sin))`` with p the [B, H, S, D] view (reshape
to [B, S, H, D], permute [0, 2, 1, 3]) of ``mm``/``addmm``'s [M, N] output. Inductor would run cuBLAS writing the
projection and one pointwise kernel reading it back to write the rotated heads. The rewrite replaces the GEMM and
the rotation by one kernel that rotates the accumulator in fp32 before its one rounding (runtime/gemm_rope.py), then
the same reshape and permute on its output, so every user sees the [B, H, S, D] value it saw.

The tables go in as [P, D] of the projection's dtype (the graph's cast, then a reshape): [S, D] and [1, 1, S, D]
tables give P = S (every sequence at positions 0..S-1, rows m % S), [B, 1, S, D] ones P = B * S = M (a table row
per output row). A site is rewritten where the support check passes and the measured choice keeps the fused kernel
(``support.rope_verdict``: against cuBLAS then one pointwise RoPE kernel, at static sizes on an sm_90 GPU, and not at
decode's M <= 128 rows, where the op's host time per launch would show and the measurement times the GPU only); a
site left alone logs why. In a training graph the site is rewritten only where no value of the pattern is saved for the
backward (``rope_sites``: every node but the output used only inside the pattern); the backward graph keeps its
own path. Runs before ``rewrite_gemm`` in the post-grad pass, so the GEMM it takes is not rewritten first.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from . import support
from .rewrite_attention import val
from .rewrite_gemm import call_op, replay_views
from .rope_sites import RopeSite, find_rope_sites, kernel_table

aten, prims = torch.ops.aten, torch.ops.prims


def _operands(site: RopeSite) -> tuple:
    """(a, b, bias) of the site's GEMM: ``mm(a, b)`` or ``addmm(bias, a, b)``."""
    if site.gemm.target is aten.addmm.default:
        bias, a, b = site.gemm.args[:3]
        return a, b, bias
    a, b = site.gemm.args[:2]
    return a, b, None


def _bias_ok(bias) -> bool:
    v = val(bias) if isinstance(bias, fx.Node) else None
    return bias is None or (v is not None and v.dim() == 1)


def find_sites(graph: fx.Graph) -> list[RopeSite]:
    """``rope_sites.find_rope_sites`` with each servable site's verdict (``reason``, or ``vendor``: why the choice
    kept the default's path) recorded."""
    sites = find_rope_sites(graph)
    for s in sites:
        if s.reason is not None:
            continue
        a, b, bias = _operands(s)
        if not _bias_ok(bias):
            s.reason = "addmm's bias is not a 1-D [N] vector"
            continue
        y = val(s.gemm)
        tables = [kernel_table(val(t), y.dtype) for t in (s.cos, s.sin)]
        s.reason, s.vendor = support.rope_verdict(val(a), val(b), *tables, val(bias) if bias is not None else None)
    return sites


def _table(graph: fx.Graph, t: fx.Node, dtype: torch.dtype, d: int) -> fx.Node:
    """``t`` cast to ``dtype`` (where it is not) and reshaped to [P, D], inserted at the graph's insert point."""
    v = val(t)
    if v.dtype != dtype:
        t = call_op(graph, prims.convert_element_type.default, (t, dtype), t)
    return call_op(graph, aten.reshape.default, (t, [-1, d]), t)


def rewrite_rope(graph: fx.Graph) -> list[RopeSite]:
    """Replace every servable RoPE site by ``autows::gemm_rope`` and the site's reshape and permute; log why the
    others stay."""
    if support.max_autotune_on():  # Inductor's own GEMM templates and fusions are in play: leave it the graph
        return []
    sites = find_sites(graph)
    order = {n: i for i, n in enumerate(graph.nodes)}
    for s in sites:
        if s.reason is not None or s.vendor is not None:
            support.note_site("gemm_rope", s.reason or s.vendor)
            continue
        a, b, bias = _operands(s)
        dtype = val(s.gemm).dtype
        with graph.inserting_before(s.out):
            cos, sin = (_table(graph, t, dtype, s.head_dim) for t in (s.cos, s.sin))
            args = (a, b, cos, sin) + ((bias,) if bias is not None else ())
            new = call_op(graph, torch.ops.autows.gemm_rope.default, args, s.out)
            heads = replay_views(graph, new, s.views)  # [M, N] -> [B, S, H, D]
            res = call_op(graph, aten.permute.default, (heads, list(s.permute.args[1])), s.out)
        s.out.replace_all_uses_with(res)
        graph.erase_node(s.out)
        for n in sorted(s.nodes, key=order.__getitem__, reverse=True):  # users before their inputs
            if n is not s.out and not n.users:
                graph.erase_node(n)
        for n in dict.fromkeys(s.casts):  # the tables' casts, where no other site still reads them
            if not n.users:
                graph.erase_node(n)
        support.site_counters["gemm_rope.rewritten"] += 1
    graph.lint()
    return sites
