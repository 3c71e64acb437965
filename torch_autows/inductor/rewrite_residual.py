"""Post-grad rewrite of a GEMM plus a residual add into one ``autows::gemm_residual``.

A transformer block's output projections add their result to the residual stream: ``h = x + self.wo(o)``
(and ``out = h + self.w2(...)``). After AOTAutograd the post-grad graph holds::

    y = mm(a, b)   or   addmm(bias, a, b)
    y3 = view(y, [B, S, N])            (zero or more view/reshape nodes)
    h = add(x, y3)   or   add(y3, x)

or, where Inductor's own patterns already folded a 2-D add into the GEMM (no view between them), ``addmm(x, a, b)``
with x a full [M, N] tensor (not a broadcast bias).

Inductor would run cuBLAS writing y and then a pointwise kernel reading y and x back. The rewrite replaces the
GEMM and the add by one kernel that adds x in its epilogue, in fp32 before the one rounding (runtime/gemm.py,
the template's residual epilogue), then the same views on its output.

A match needs: the add has no alpha and exactly two tensor operands; the GEMM's output (and every view after it)
has the add as its only user; x has the add's dtype and shape (no broadcast), the GEMM's dtype is the add's, and
x is contiguous (it is viewed as [M, N]); a 1-D bias of addmm is kept (alpha = beta = 1). Matched sites go through
``support.gemm_reason`` (with the residual) and the measured choice like any GEMM site; a site left alone logs
why. Forward and backward graphs alike (the op has a backward). Runs after the SwiGLU rewrite and before the GEMM
rewrite, so the GEMM it takes is not rewritten to ``autows::gemm`` first.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.fx as fx

from . import support
from .rewrite_attention import val
from .rewrite_gemm import call_op, replay_views

aten = torch.ops.aten
_VIEWS = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)


@dataclasses.dataclass
class ResidualSite:
    add: fx.Node                 # the add whose value the fused op (and the views after it) produce
    gemm: fx.Node                # mm or addmm
    views: tuple[fx.Node, ...]   # views from the GEMM's output to the add's operand, in order
    residual: fx.Node            # as found (an earlier site's rewrite may replace it: ``residual_now``)
    folded: bool = False         # addmm(x, a, b): the residual is the addmm's input (``add`` is the addmm)
    reason: str | None = None
    vendor: str | None = None

    def operands(self):
        """(a, b, bias) of the GEMM."""
        if self.folded:
            return self.gemm.args[1], self.gemm.args[2], None
        if self.gemm.target is aten.addmm.default:
            return self.gemm.args[1], self.gemm.args[2], self.gemm.args[0]
        return self.gemm.args[0], self.gemm.args[1], None

    def residual_now(self) -> fx.Node:
        """The add's other operand as the graph has it now (``h2 = h1 + mm2`` after ``h1 = x + mm1`` was fused)."""
        if self.folded:
            return self.gemm.args[0]
        ours = self.views[-1] if self.views else self.gemm
        return next(x for x in self.add.args if x is not ours)


def _gemm_under_views(n) -> tuple[fx.Node, list[fx.Node]] | None:
    """(mm/addmm, views in order) when ``n`` is a GEMM's output through single-user views, else None."""
    views = []
    while isinstance(n, fx.Node) and n.op == "call_function" and n.target in _VIEWS and len(n.users) == 1:
        views.append(n)
        n = n.args[0]
    if isinstance(n, fx.Node) and n.op == "call_function" and len(n.users) == 1 \
            and n.target in (aten.mm.default, aten.addmm.default):
        return n, views[::-1]
    return None


def _why_not(site: ResidualSite) -> str | None:
    g, r, out = val(site.gemm), val(site.residual), val(site.add)
    if g is None or r is None or out is None:
        return "no fake values on the GEMM, residual or add"
    if r.dtype != out.dtype or g.dtype != out.dtype:
        return f"the add mixes dtypes (GEMM {g.dtype}, residual {r.dtype}, sum {out.dtype}); the epilogue adds R of " \
               f"the GEMM's dtype"
    if len(r.shape) != len(out.shape) or not all(support.same_size(x, y) for x, y in zip(r.shape, out.shape)):
        return (f"the residual {tuple(r.shape)} broadcasts to the sum {tuple(out.shape)}; the epilogue adds an [M, N] "
                f"tensor")
    if not isinstance(g.shape[1], int):
        return "N is symbolic; the residual is viewed as [-1, N] with a static N"
    if site.gemm.target is aten.addmm.default:
        if site.gemm.kwargs.get("beta", 1) != 1 or site.gemm.kwargs.get("alpha", 1) != 1:
            return "addmm with alpha/beta != 1"
    if site.gemm.target is aten.addmm.default and not site.folded:
        bias = val(site.gemm.args[0])
        if bias is None or bias.dim() != 1 or bias.dtype != g.dtype:
            return "addmm with a bias that is not 1-D [N] of the output's dtype"
    if not r.is_contiguous():
        return f"the residual has strides {tuple(r.stride())}: the epilogue reads a contiguous [M, N] tensor"
    return None


def _residual_2d(site: ResidualSite):
    """The residual's fake value as the [M, N] tensor the kernel reads."""
    r = val(site.residual)
    mode = getattr(r, "fake_mode", None)
    if mode is None or r.dim() == 2:
        return r
    with mode:
        return r.view(-1, r.shape[-1])


def find_residual_sites(graph: fx.Graph) -> list[ResidualSite]:
    """Every ``add(GEMM [through views], x)`` and ``addmm(x 2-D, a, b)`` in a post-grad graph, with why it is not
    fused (``reason``/``vendor``)."""
    candidates = []
    for n in graph.nodes:
        if n.op == "call_function" and n.target is aten.addmm.default and isinstance(n.args[0], fx.Node) \
                and val(n.args[0]) is not None and val(n.args[0]).dim() == 2:
            candidates.append(ResidualSite(n, n, (), n.args[0], folded=True))
        if n.op != "call_function" or n.target is not aten.add.Tensor or len(n.args) != 2 or n.kwargs:
            continue
        for y, r in (n.args, n.args[::-1]):
            found = _gemm_under_views(y)
            if found is not None and isinstance(r, fx.Node) and found[0] is not r:
                candidates.append(ResidualSite(n, found[0], tuple(found[1]), r))
                break
    sites = []
    for site in candidates:
        site.reason = _why_not(site)
        if site.reason is None:
            a, b, bias = (val(x) if x is not None else None for x in site.operands())
            site.reason, site.vendor = support.gemm_verdict(a, b, bias, residual=_residual_2d(site))
        sites.append(site)
    return sites


def rewrite_residual(graph: fx.Graph) -> list[ResidualSite]:
    """Replace servable GEMM + residual adds by ``autows::gemm_residual`` (max-autotune off); log why others stay."""
    if support.max_autotune_on():
        return []
    sites = find_residual_sites(graph)
    fn = torch.ops.autows.gemm_residual.default
    for s in sites:
        if s.reason is not None or s.vendor is not None:
            support.note_site("gemm_residual", s.reason or s.vendor)
            continue
        a, b, bias = s.operands()
        n = val(s.gemm).shape[1]
        res = s.residual_now()
        with graph.inserting_before(s.add):  # after every operand: the add reads the residual and the GEMM's views
            r = res if val(s.residual).dim() == 2 else graph.call_function(aten.view.default, (res, [-1, n]))
            if r is not res:
                r.meta["val"] = _residual_2d(s)
            out = replay_views(graph, call_op(graph, fn, (a, b, r, bias, None), s.gemm), s.views)
        s.add.replace_all_uses_with(out)
        for dead in (s.add, *s.views[::-1], *(() if s.folded else (s.gemm,))):
            graph.erase_node(dead)
        support.site_counters["gemm_residual.rewritten"] += 1
    graph.lint()
    return sites
