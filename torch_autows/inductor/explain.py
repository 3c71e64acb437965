"""``explain(model, *inputs)``: every attention and GEMM site Dynamo captures, and what autows does with it.

The model runs once under Dynamo with a capturing backend (each call gets a fresh code object, so the
user's compiled caches are untouched and no recompile budget is used up). The report uses the matchers
and support checks the compile uses (rewrite_attention.py, support.py) on the same torch-level graphs, so "autows"
in the report means the compile will rewrite that site. GEMM sites are the torch-level linear / matmul /
mm / bmm / addmm calls, described as the 2-D (or batched) GEMM they lower to; a GEMM whose only user adds a
tensor of its shape and dtype (``x + self.wo(o)``) is listed with ``+residual`` where rewrite_residual.py fuses
the add into its epilogue; one whose only user is a GELU (F.gelu / nn.GELU, tanh or exact) is listed with
``+gelu_tanh`` / ``+gelu`` where rewrite_activation.py fuses it (inference graphs); one whose output, as [B, H, S, D]
heads, is rotated as RoPE (``p * cos + cat(-x2, x1) * sin``) with ``+rope(D)`` where rewrite_rope.py fuses it (its
measured choice kept the fused kernel), else with why not. With max-autotune a served GEMM is a candidate that must
still win Inductor's benchmark.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import operator
import types

import torch
import torch.fx as fx
import torch.nn.functional as F

from . import support
from .rewrite_attention import find_attention_sites, val
from .rope_sites import kernel_table, table_reason

_LINEAR = (F.linear, torch._C._nn.linear)
_MATMUL = (torch.matmul, operator.matmul, torch.mm, torch.bmm, torch.addmm)
_MATMUL_METHODS = ("matmul", "__matmul__", "mm", "bmm", "addmm")
_counter = itertools.count()


@dataclasses.dataclass
class Site:
    graph: int
    kind: str       # "attention" | "gemm" | "swiglu" (two GEMMs and their silu-product as one kernel)
    form: str       # sdpa / explicit / linear / matmul / mm / bmm / addmm
    node: str
    shape: str
    kernel: str     # "autows" | "vendor" (servable; the vendor's kernel was chosen) | "fallback"
    why: str
    where: str = ""

    def line(self) -> str:
        where = f"  [{self.where}]" if self.where else ""
        return f"  {self.kind:<9} {self.form:<8} {self.node:<16} {self.shape:<34} -> {self.kernel}: {self.why}{where}"


@dataclasses.dataclass
class ExplainReport:
    sites: list[Site]
    graphs: int
    mode: str | None = None

    def count(self, kind: str, kernel: str | None = None) -> int:
        return sum(s.kind == kind and (kernel is None or s.kernel == kernel) for s in self.sites)

    def __str__(self) -> str:
        vendor = self.count("attention", "vendor") + self.count("gemm", "vendor") + self.count("swiglu", "vendor")
        fusions = f", {self.count('swiglu', 'autows')} SwiGLU fusion(s)" if self.count("swiglu") else ""
        rope = sum(s.kernel == "autows" and "+rope(" in s.shape for s in self.sites)
        fusions += f", {rope} RoPE fusion(s)" if rope else ""
        head = (f"autows explain: {self.graphs} graph(s); attention {self.count('attention', 'autows')}/"
                f"{self.count('attention')} sites served, GEMM {self.count('gemm', 'autows')}/"
                f"{self.count('gemm')} sites served{fusions} (mode={self.mode or 'default'})"
                + (f"; {vendor} servable site(s) kept on the vendor's faster kernel" if vendor else ""))
        return "\n".join([head, *(s.line() for s in self.sites)])


def _where(n: fx.Node) -> str:
    tb = (n.meta.get("stack_trace") or "").strip().splitlines()
    for line in reversed(tb):
        line = line.strip()
        if line.startswith("File "):
            parts = line.split(",")
            return f"{parts[0][5:].strip(chr(34)).rsplit('/', 1)[-1]}:{parts[1].strip()[5:]}" if len(parts) > 1 else ""
    return ""


def _shape(t) -> str:
    return "x".join(str(s) for s in t.shape) if isinstance(t, torch.Tensor) else "?"


def _gemm_request(n: fx.Node):
    """(form, a, b, bias) as the GEMM this torch-level call lowers to, on fake tensors; None if not a GEMM."""
    if n.op == "call_function" and n.target in _LINEAR:
        form, (x, w), bias = "linear", n.args[:2], (n.args[2] if len(n.args) > 2 else n.kwargs.get("bias"))
        a, b, bias = val(x), val(w), val(bias)
        if a is None or b is None:
            return None
        mode = getattr(a, "fake_mode", None)
        with mode if mode is not None else contextlib.nullcontext():
            return form, a.reshape(-1, a.shape[-1]), b.t(), bias
    is_fn = n.op == "call_function" and n.target in _MATMUL
    if not (is_fn or (n.op == "call_method" and n.target in _MATMUL_METHODS)):
        return None
    name = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", "matmul")
    form = {"__matmul__": "matmul", "addmm": "addmm"}.get(name, name)
    args = [val(x) for x in n.args[:3]]
    bias = None
    if form == "addmm":
        bias, args = args[0], args[1:]
    a, b = args[0], args[1] if len(args) > 1 else None
    if a is None or b is None:
        return None
    mode = getattr(a, "fake_mode", None)
    with mode if mode is not None else contextlib.nullcontext():
        if a.dim() == 2 and b.dim() == 2:
            return form, a, b, bias
        if a.dim() >= 3 and b.dim() == 2:
            return form, a.reshape(-1, a.shape[-1]), b, bias
        if a.dim() >= 3 and b.dim() == a.dim():
            return form, a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:]), None
    return None


_ADD = (operator.add, torch.add, operator.iadd)


def _residual_of(n: fx.Node, a):
    """(the residual as the [M, N] tensor the kernel reads, None) where the GEMM ``n``'s only user adds a contiguous
    tensor of its shape and dtype (what inductor/rewrite_residual.py fuses); (None, why not) for an add it cannot
    fuse; (None, None) for no add."""
    users = list(n.users)
    if len(users) != 1 or users[0].op != "call_function" or users[0].target not in _ADD or len(users[0].args) != 2 \
            or users[0].kwargs:
        return None, None
    r = next((x for x in users[0].args if x is not n), None)
    y, rv = val(n), val(r) if isinstance(r, fx.Node) else None
    if y is None or rv is None or rv.dtype != y.dtype or tuple(rv.shape) != tuple(y.shape):
        return None, "the residual is not a tensor of the GEMM's shape and dtype"
    if not rv.is_contiguous():
        return None, f"the residual has strides {tuple(rv.stride())}: the epilogue reads a contiguous [M, N] tensor"
    with getattr(rv, "fake_mode", None) or contextlib.nullcontext():
        return rv.reshape(-1, rv.shape[-1]), None


_GELU = (F.gelu, torch._C._nn.gelu)


def _activation_of(n: fx.Node) -> str | None:
    """"gelu_tanh" / "gelu" where the GEMM ``n``'s only user is a GELU of it (what rewrite_activation.py fuses in
    inference graphs), else None."""
    users = list(n.users)
    if len(users) != 1 or users[0].op != "call_function" or users[0].target not in _GELU or users[0].args[0] is not n:
        return None
    approx = users[0].kwargs.get("approximate", users[0].args[1] if len(users[0].args) > 1 else "none")
    return {"tanh": "gelu_tanh", "none": "gelu"}.get(approx)


_VIEWS = ("view", "reshape", "transpose", "permute")
_NEG = (operator.neg, torch.neg)


def _is(n, fns=(), methods=()) -> bool:
    return isinstance(n, fx.Node) and ((n.op == "call_function" and n.target in fns)
                                       or (n.op == "call_method" and n.target in methods))


def _untyped(n):
    """``n`` without ``.to(...)`` / ``.type_as(...)`` casts in front."""
    while _is(n, methods=("to", "type_as")):
        n = n.args[0]
    return n


def _rope_of(n: fx.Node, a):
    """(cos [P, D], sin [P, D] as the fused kernel reads them, None) where the GEMM ``n``'s output, through views
    and a transpose to [B, H, S, D], is rotated as the models write RoPE (``p * cos + cat(-x2, x1) * sin``; what
    inductor/rewrite_rope.py fuses, with its reasons for the near misses); (None, None, None) otherwise."""
    p = n
    while len(p.users) == 1 and _is(next(iter(p.users)), (torch.reshape, torch.transpose, torch.permute), _VIEWS):
        p = next(iter(p.users))
    y, pv = val(n), val(p)
    if p is n or y is None or pv is None or pv.dim() != 4:
        return None, None, None
    for add in {u for m in p.users for u in m.users if _is(u, _ADD) and len(u.args) == 2}:
        muls = [m for m in add.args if _is(m, _MUL) and len(m.args) == 2]
        mc = next((m for m in muls if p in m.args), None)
        ms = next((m for m in muls if m is not mc), None)
        if mc is None or ms is None:
            continue
        rot = next((x for x in ms.args if _is(x, (torch.cat,))), None)
        if rot is None or not rot.args[0] or not _is(rot.args[0][0], _NEG, ("neg",)):
            continue
        tables = [val(_untyped(next(x for x in m.args if x is not skip))) for m, skip in ((mc, p), (ms, rot))]
        if None in tables:
            return None, None, "the tables have no fake values"
        why = next(filter(None, (table_reason(t, tuple(pv.shape), y.dtype) for t in tables)), None)
        if why:
            return None, None, why
        return tuple(kernel_table(t, y.dtype) for t in tables) + (None,)
    return None, None, None


_SILU = (F.silu,)
_MUL = (operator.mul, torch.mul)


def _linear_of(n) -> fx.Node | None:
    """``n`` when it is a bias-free torch-level linear (the GEMMs the SwiGLU fusion takes), else None."""
    if isinstance(n, fx.Node) and n.op == "call_function" and n.target in _LINEAR:
        bias = n.args[2] if len(n.args) > 2 else n.kwargs.get("bias")
        return n if bias is None else None
    return None


def _swiglu_sites(gm: fx.GraphModule) -> list[tuple[fx.Node, fx.Node, fx.Node]]:
    """(mul, gate linear, up linear) for each ``silu(linear(x, Wg)) * linear(x, Wu)`` (silu as F.silu or
    nn.SiLU, or ``g * sigmoid(g)``) in a torch-level graph: what inductor/rewrite_swiglu.py fuses after
    lowering, where the graph needs no backward through it."""
    out = []
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target not in _MUL or len(n.args) != 2:
            continue
        for s, u in (n.args, n.args[::-1]):
            gate = None
            if isinstance(s, fx.Node) and s.op == "call_function" and s.target in _SILU:
                gate = _linear_of(s.args[0])
            elif isinstance(s, fx.Node) and s.op == "call_function" and s.target in _MUL and len(s.args) == 2:
                for g, sg in (s.args, s.args[::-1]):
                    if isinstance(sg, fx.Node) and sg.target is torch.sigmoid and sg.args[0] is g:
                        gate = _linear_of(g)
            up = _linear_of(u)
            if gate is not None and up is not None and gate.args[0] is up.args[0]:
                out.append((n, gate, up))
                break
    return out


def _swiglu_site(index: int, mul: fx.Node, gate: fx.Node, up: fx.Node) -> Site:
    a, wg, wu = val(gate.args[0]), val(gate.args[1]), val(up.args[1])
    mode = getattr(a, "fake_mode", None)
    with mode if mode is not None else contextlib.nullcontext():
        a2, bg, bu = a.reshape(-1, a.shape[-1]), wg.t(), wu.t()
    shape = f"silu([{_shape(a2)}]@[{_shape(bg)}])*([{_shape(a2)}]@[{_shape(bu)}])"
    reason = support.swiglu_reason(a2, bg, bu)
    if reason is not None:
        return Site(index, "swiglu", "linear", mul.name, shape, "fallback", reason, _where(mul))
    chosen = support.swiglu_choice(a2, bg, bu)
    why = chosen.vendor_reason or ("gate and up GEMMs and the silu-product fused into autows::gemm_swiglu "
                                   "(inference graphs; a graph that saves them for a backward keeps them)"
                                   + _chosen(chosen))
    return Site(index, "swiglu", "linear", mul.name, shape, "autows" if chosen.use_ours else "vendor", why,
                _where(mul))


def _chosen(chosen) -> str:
    """How the measured choice (runtime.choice) stands for a servable site: its decision, or per call."""
    if chosen is None:
        return ""
    return f"; chosen: {chosen.why}" if chosen.why else "; ours or the vendor's is chosen at run time per shape bucket"


def _sites_of(gm: fx.GraphModule, index: int, max_autotune: bool) -> list[Site]:
    out, in_attention = [], set()
    for s in find_attention_sites(gm.graph):
        if s.reason is None:
            in_attention.update(n for n in (s.node, *s.chain) if n.op != "placeholder")
        served = s.reason is None and s.vendor is None
        kernel = "autows" if served else "vendor" if s.reason is None else "fallback"
        out.append(Site(index, "attention", s.kind, s.node.name, s.summary(), kernel,
                        "autows::attention (generated kernel; backward via attention_grad)" + _chosen(s.choice)
                        if served else s.reason or s.vendor, _where(s.node)))
    fused = set()
    if not max_autotune:  # the SwiGLU rewrite runs with max-autotune off, like the GEMM rewrite
        for mul, gate, up in _swiglu_sites(gm):
            site = _swiglu_site(index, mul, gate, up)
            out.append(site)
            if site.kernel == "autows":
                fused.update((gate, up))
    for n in gm.graph.nodes:
        if n in in_attention or n in fused:
            continue
        req = _gemm_request(n)
        if req is None:
            continue
        form, a, b, bias = req
        bias = bias if isinstance(bias, torch.Tensor) and bias.dim() == 1 else None
        res, res_why = _residual_of(n, a) if a.dim() == 2 and not max_autotune else (None, None)
        if res is not None:
            res_why = support.gemm_reason(a, b, bias, residual=res)
            res = res if res_why is None else None
        act = _activation_of(n) if a.dim() == 2 and not max_autotune and res is None and res_why is None else None
        act_why = support.gemm_reason(a, b, bias, activation=act) if act else None
        act = act if act_why is None else None
        cos = sin = rope_why = None
        if a.dim() == 2 and not max_autotune and res is None and act is None:
            cos, sin, rope_why = _rope_of(n, a)
        if cos is not None:
            rope_why = support.rope_reason(a, b, cos, sin, bias)
            chosen = support.rope_choice(a, b, cos, sin, bias) if rope_why is None else None
            if chosen is not None and chosen.use_ours:  # the fused site, listed as such
                out.append(Site(index, "gemm", form, n.name, f"[{_shape(a)}]@[{_shape(b)}]"
                                + ("+bias" if bias is not None else "") + f"+rope({cos.shape[1]})", "autows",
                                "post-grad rewrite to autows::gemm_rope (the projection and its rotary embedding in "
                                "one kernel, where the graph saves neither for a backward)" + _chosen(chosen),
                                _where(n)))
                continue
            rope_why = rope_why or (chosen.vendor_reason if chosen is not None else None)
        reason = support.gemm_reason(a, b, bias)
        shape = (f"[{_shape(a)}]@[{_shape(b)}]" + ("+bias" if bias is not None else "")
                 + ("+residual" if res is not None else "") + (f"+{act}" if act else ""))
        kernel = "autows" if reason is None else "fallback"
        if reason is None and max_autotune:
            why = "ExternKernelChoice in Inductor's autotuning (used where it wins the benchmark)"
        elif reason is None:
            chosen = support.gemm_choice(a, b, bias, residual=res, activation=act or "none")
            kernel = "autows" if chosen.use_ours else "vendor"
            what = ("post-grad rewrite to autows::gemm_residual (bias and the residual add fused)" if res is not None
                    else f"post-grad rewrite to autows::gemm_act (bias and {act} fused; inference graphs: a graph that "
                         f"saves the GEMM's output for a backward keeps it)" if act
                    else "post-grad rewrite to autows::gemm/bmm (bias fused; other epilogues stay with Inductor)")
            why = chosen.vendor_reason or (what + _chosen(chosen)
                                           + (f"; residual add not fused: {res_why}" if res_why else "")
                                           + (f"; GELU not fused: {act_why}" if act_why else "")
                                           + (f"; RoPE not fused: {rope_why}" if rope_why else ""))
        out.append(Site(index, "gemm", form, n.name, shape, kernel, why if reason is None else reason, _where(n)))
    return out


def explain(model, *inputs, mode: str | None = None, print_report: bool = True, **kwargs) -> ExplainReport:
    """Run ``model(*inputs, **kwargs)`` once under Dynamo; report each attention/GEMM site: autows or fallback, and why.

    ``mode`` is the torch.compile mode you intend to use ("max-autotune" changes how GEMMs are served).
    """
    from torch._inductor import list_mode_options

    graphs: list[fx.GraphModule] = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def run(*a, **kw):
        return model(*a, **kw)

    # A fresh code object per call: Dynamo's cache for it dies with it; nothing of the user's is reset.
    fresh = types.FunctionType(run.__code__.replace(co_name=f"_autows_explain_{next(_counter)}"),
                               run.__globals__, closure=run.__closure__)
    torch.compile(fresh, backend=capture)(*inputs, **kwargs)
    opts = list_mode_options(mode or "default")
    from torch._inductor import config as ic

    max_autotune = bool(opts.get("max_autotune", ic.max_autotune)
                        or opts.get("max_autotune_gemm", ic.max_autotune_gemm))
    sites = [s for i, gm in enumerate(graphs) for s in _sites_of(gm, i, max_autotune)]
    report = ExplainReport(sites, len(graphs), mode)
    if print_report:
        print(report)
    return report
