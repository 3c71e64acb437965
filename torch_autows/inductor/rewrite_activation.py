"""Post-grad rewrite of a GEMM followed by GELU into one ``autows::gemm_act``.

GPT-2's MLP runs ``c_fc`` (nn.Linear) then nn.GELU(approximate="tanh"). Inductor decomposes the GELU before its
post-grad passes, so the post-grad graph holds (16-bit model)::

    y = addmm(bias, a, b)   or   mm(a, b)   or   add(mm(a, b) [views], bias)
    y3 = view(y, [B, S, N])                       (zero or more view/reshape nodes)
    x = convert_element_type(y3, float32)
    ... 0.5 * x * (1 + tanh(0.79788 * (x + 0.044715 * x^3)))   or   0.5 * x * (1 + erf(x * 0.70711))
    out = convert_element_type(..., bfloat16)

(or ``aten.gelu(y3, approximate=...)`` where it was not decomposed). Inductor would run cuBLAS writing y and then
a pointwise kernel reading y back and writing out. The rewrite replaces the GEMM and the whole region by one
kernel that applies the GELU in fp32 in its epilogue before the one rounding (templates/gemm.py's activation),
then the same views on its output.

(or ``aten.gelu(y3, approximate=...)`` where it was not decomposed; or, for a GELU written out in the model as
HF GPT-2's ``gelu_new`` is, the same math on the 16-bit values without the casts).

How a region is recognised: from each ``tanh`` / ``erf`` / ``gelu`` node, along its single-user chain of pointwise
ops and casts, the first node whose ancestors (pointwise ops and casts, back to the first other node) read exactly
one tensor and compute a GELU of it, decided by evaluating them on probe values (fp32, casts as the identity) against
``F.gelu`` with ``approximate="tanh"`` and ``"none"``: any algebraically equal form matches, anything else is left
alone; the cast right after it belongs to the region. The tensor read must be the GEMM's output (through views, or
a separate bias add of mm). Every region node but the last must have its users inside the region: a value used
elsewhere (saved for a backward in a training graph) leaves the site alone, so the rewrite runs on inference graphs
only (the op has no backward), as the SwiGLU rewrite. The kernel applies the GELU in fp32 as Inductor's pointwise
kernel does (it computes 16-bit math in fp32 too).

Matched sites go through ``support.gemm_reason`` and ``support.gemm_choice`` with the activation (symbolic sizes or
prior mode: left to Inductor); a site left alone logs why. Runs after the SwiGLU rewrite and before the residual and
GEMM rewrites, so the GEMM it takes is not rewritten to ``autows::gemm`` first.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.fx as fx

from . import support
from .rewrite_attention import val
from .rewrite_gemm import call_op, replay_views

aten, prims = torch.ops.aten, torch.ops.prims
_VIEWS = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)
_CASTS = (prims.convert_element_type.default, aten._to_copy.default)
#: The pointwise ops a decomposed GELU is made of (with scalar constants): nothing that reads another tensor.
_POINTWISE = (aten.mul.Tensor, aten.add.Tensor, aten.sub.Tensor, aten.div.Tensor, aten.tanh.default,
              aten.erf.default, aten.pow.Tensor_Scalar, aten.gelu.default, aten.neg.default, aten.exp.default,
              aten.sigmoid.default, aten.reciprocal.default, aten.rsub.Scalar, aten.mul.Scalar, aten.add.Scalar)
_SEEDS = (aten.tanh.default, aten.erf.default, aten.gelu.default)
_PROBE = torch.cat([torch.linspace(-12.0, 12.0, 961), torch.tensor([-300.0, -40.0, 40.0, 300.0])])


@dataclasses.dataclass
class ActivationSite:
    out: fx.Node                     # the region's last node (its value: gelu of the GEMM's output)
    gemm: fx.Node                    # mm or addmm
    activation: str | None           # "gelu_tanh" | "gelu" (None: not a GELU)
    region: tuple[fx.Node, ...]      # the activation's nodes (pointwise ops and casts, or one aten.gelu)
    views: tuple[fx.Node, ...] = ()  # every view between the GEMM and the region (and a separate bias add)
    bias_add: fx.Node | None = None  # add(mm [views], bias) where the bias add is a separate node
    bias: fx.Node | None = None      # that add's bias
    reason: str | None = None
    vendor: str | None = None

    def operands(self):
        """(a, b, bias) of the GEMM."""
        if self.gemm.target is aten.addmm.default:
            return self.gemm.args[1], self.gemm.args[2], self.gemm.args[0]
        return self.gemm.args[0], self.gemm.args[1], self.bias

    def dead(self) -> list[fx.Node]:
        """Every node the fused op replaces, users before their inputs."""
        nodes = {*self.region, *self.views, self.gemm, *((self.bias_add,) if self.bias_add is not None else ())}
        order = {n: i for i, n in enumerate(self.out.graph.nodes)}
        return sorted(nodes, key=order.__getitem__, reverse=True)


def _is(n, targets) -> bool:
    return isinstance(n, fx.Node) and n.op == "call_function" and n.target in targets


def _strip_views(n) -> tuple[object, list[fx.Node]]:
    """(the node under single-user views, those views)."""
    views = []
    while _is(n, _VIEWS) and len(n.users) == 1:
        views.append(n)
        n = n.args[0]
    return n, views


def _bias_add(n) -> tuple[fx.Node, fx.Node, list[fx.Node]] | None:
    """(mm, bias, views between them) where ``n`` is ``add(mm [single-user views], bias [N])``, else None."""
    if not (_is(n, (aten.add.Tensor,)) and len(n.args) == 2 and not n.kwargs):
        return None
    for y, b in (n.args, n.args[::-1]):
        g, views = _strip_views(y)
        if _is(g, (aten.mm.default,)) and len(g.users) == 1 and isinstance(b, fx.Node) and val(b) is not None \
                and val(b).dim() == 1:
            return g, b, views
    return None


def _ancestors(end: fx.Node) -> tuple[set[fx.Node], fx.Node] | None:
    """(the pointwise and cast nodes ``end`` is computed by, the one tensor they read); None where they read more
    than one (a bias add of a GEMM is that tensor, not part of the region)."""
    nodes, inputs, todo = set(), set(), [end]
    while todo:
        n = todo.pop()
        if n in nodes or n in inputs:
            continue
        if _is(n, _POINTWISE + _CASTS) and _bias_add(n) is None:
            nodes.add(n)
            todo += [x for x in (*n.args, *n.kwargs.values()) if isinstance(x, fx.Node)]
        else:
            inputs.add(n)
    return (nodes, next(iter(inputs))) if len(inputs) == 1 else None


def _which(nodes: set[fx.Node], inp: fx.Node, end: fx.Node) -> str | None:
    """"gelu_tanh" / "gelu" where ``nodes`` compute F.gelu of ``inp`` at ``end`` on the probe values (tanh
    approximation / exact; evaluated in fp32, casts as the identity), else None."""
    env = {inp: _PROBE}
    order = {n: i for i, n in enumerate(end.graph.nodes)}
    try:
        for n in sorted(nodes, key=order.__getitem__):
            args = [env[x] if isinstance(x, fx.Node) else x for x in n.args]
            kwargs = {k: env[x] if isinstance(x, fx.Node) else x for k, x in n.kwargs.items()}
            env[n] = args[0] if n.target in _CASTS else n.target(*args, **kwargs)
        got = env[end]
        for name, approx in (("gelu_tanh", "tanh"), ("gelu", "none")):
            if torch.allclose(got, torch.nn.functional.gelu(_PROBE, approximate=approx), rtol=1e-5, atol=1e-6):
                return name
    except Exception:  # an op or shape the probe cannot run: not a GELU we know
        return None
    return None


def _region(seed: fx.Node):
    """(the region's input, its output, its nodes, the activation or None, why it cannot be fused) for the
    pointwise region through ``seed``: the first node on the single-user chain from ``seed`` whose ancestors compute
    a GELU of one tensor (then the cast right after it, if any), else the whole chain; None where nothing on it
    reads one tensor only."""
    chain = [seed]
    while len(chain[-1].users) == 1 and _is(next(iter(chain[-1].users)), _POINTWISE + _CASTS):
        chain.append(next(iter(chain[-1].users)))
    last = None
    for cand in chain:
        found = _ancestors(cand)
        if found is None:
            continue
        nodes, inp = found
        act = _which(nodes, inp, cand)
        last = (inp, cand, nodes, act)
        if act is not None:
            user = next(iter(cand.users)) if len(cand.users) == 1 else None
            if _is(user, _CASTS):  # the cast back to the GEMM's dtype
                nodes, cand = nodes | {user}, user
                last = (inp, cand, nodes, act)
            break
    if last is None:
        return None
    inp, out, nodes, act = last
    why = next((f"%{n.name} is used outside the GELU (e.g. saved for a backward); fusing would drop it"
                for n in nodes - {out} if any(u not in nodes for u in n.users)), None)
    return inp, out, nodes, act, why


def _match(seed: fx.Node) -> ActivationSite | None:
    """The site of a GELU region fed by a GEMM (through views, maybe a separate bias add); None where the region is
    not fed by a GEMM (nothing for this rewrite, nothing to log)."""
    found = _region(seed)
    if found is None:
        return None
    src, out, region, act, why = found
    n, views, ok = src, [], all(u in region for u in src.users)  # the region may read it more than once
    while _is(n, _VIEWS):
        views.append(n)
        n = n.args[0]
        ok = ok and len(n.users) == 1
    bias_add = bias = None
    got = _bias_add(n)
    if got is not None:
        bias_add, (n, bias, pre) = n, got
        views += pre
    if not (_is(n, (aten.mm.default, aten.addmm.default)) and ok):
        if _is(n, (aten.mm.default, aten.addmm.default)):  # a GEMM whose output (or a view) has other users
            return ActivationSite(out, n, None, tuple(region), reason=f"%{n.name}'s output is used outside the GELU "
                                  f"(e.g. saved for a backward); fusing would drop it")
        return None
    site = ActivationSite(out, n, act, tuple(region), tuple(views), bias_add, bias, why)
    if site.reason is None and site.activation is None:
        site.reason = "the pointwise ops after this GEMM are not F.gelu (tanh or exact)"
    return site


def _why_not(site: ActivationSite) -> str | None:
    g, out = val(site.bias_add if site.bias_add is not None else site.gemm), val(site.out)
    if g is None or out is None:
        return "no fake values on the GEMM or the GELU"
    if g.dtype not in (torch.float16, torch.bfloat16):
        return f"a {g.dtype} GEMM: the activation epilogue is the generated kernel's, which takes 16-bit operands"
    if out.dtype != g.dtype:
        return f"the GELU's result is {out.dtype}, not the GEMM's {g.dtype}; the epilogue writes the GEMM's dtype"
    if site.gemm.target is aten.addmm.default:
        if site.gemm.kwargs.get("beta", 1) != 1 or site.gemm.kwargs.get("alpha", 1) != 1:
            return "addmm with alpha/beta != 1"
    _, _, bias = site.operands()
    if bias is not None and (val(bias) is None or val(bias).dim() != 1 or val(bias).dtype != g.dtype):
        return "a bias that is not 1-D [N] of the output's dtype"
    return None


def find_activation_sites(graph: fx.Graph) -> list[ActivationSite]:
    """Every GELU of a GEMM's output in a post-grad graph, with why it is not fused (``reason``/``vendor``)."""
    sites, taken = [], set()
    for n in graph.nodes:
        if not _is(n, _SEEDS) or n in taken:
            continue
        site = _match(n)
        if site is None:
            continue
        taken.update(site.region)  # (a region with two seeds is one site)
        site.reason = site.reason or _why_not(site)
        if site.reason is None:
            a, b, bias = (val(x) if x is not None else None for x in site.operands())
            site.reason, site.vendor = support.gemm_verdict(a, b, bias, activation=site.activation)
        sites.append(site)
    return sites


def rewrite_activation(graph: fx.Graph) -> list[ActivationSite]:
    """Replace servable GEMM + GELU regions by ``autows::gemm_act`` (max-autotune off); log why others stay."""
    if support.max_autotune_on():
        return []
    sites = find_activation_sites(graph)
    fn = torch.ops.autows.gemm_act.default
    for s in sites:
        if s.reason is not None or s.vendor is not None:
            support.note_site("gemm_act", s.reason or s.vendor)
            continue
        a, b, bias = s.operands()
        with graph.inserting_before(s.out):
            new = call_op(graph, fn, (a, b, s.activation, bias, None), s.gemm)
            res = replay_views(graph, new, s.views[::-1])  # the GEMM's views, from the GEMM up
            if res is not new:
                res.meta["val"] = val(s.out)
        s.out.replace_all_uses_with(res)
        for dead in s.dead():
            graph.erase_node(dead)
        support.site_counters["gemm_act.rewritten"] += 1
    graph.lint()
    return sites
