"""Find attention in the Dynamo (torch-level) FX graph and rewrite it to ``torch.ops.autows.attention``.

Where: on the graph Dynamo hands to the backend, before AOTAutograd. ``backend.autows`` runs
``rewrite_attention`` on it directly; ``enable()`` / ``inductor_options()`` install the same rewrite as
Inductor's ``pre_grad_custom_pass`` (graph_passes.py), which sees the same torch-level graph. Why there and not
as a ``joint_custom_pre_pass`` pattern:

* one site, one node: SDPA is still ``F.scaled_dot_product_attention`` with its keyword arguments, and the
  explicit form is still ``matmul -> scale -> softmax -> matmul``. After AOTAutograd SDPA has become a
  device-specific aten op (flash / efficient / math, CPU vs CUDA) and the explicit form is decomposed and
  dtype-specialised, so joint-graph patterns need one traced pattern per dtype, device, variant and
  training/inference (Inductor's fuse_attention registers ~60) and must also match the backward half;
* autograd comes for free: AOTAutograd differentiates our custom op through its ``register_autograd``,
  so training, inference, ``mark_dynamic`` (SymInt shapes in the fake impl) and CUDA graphs share one path;
* the same matcher feeds ``explain()``, which reports on exactly the graph that is rewritten.
The price: a rewrite here is invisible to Inductor's own SDPA pattern fusion, which is what we want.

Sites served: SDPA with ``dropout_p == 0`` and no ``attn_mask`` (``is_causal``, ``scale``, ``enable_gqa``
kept), and ``matmul(q, k^T) -> [* or / by a number] -> softmax(-1) -> [casts, dropout(p=0 or eval)] ->
matmul(., v)`` with the scale on the scores, on q or on k (Inductor's fuse_attention forms without mask and
dropout, incl. Hugging Face's ``k.transpose(2, 3)`` and ``/ math.sqrt(d)``). A mask (SDPA's ``attn_mask``, or
``+ mask`` / ``masked_fill`` / ``where`` before the softmax) is accepted only when masks.py proves it is the
causal mask (Hugging Face materialises one under torch.compile); the site then runs with ``is_causal``.
A site is rewritten only where ``support.attention_reason`` is None (CUDA sm_90, or in tests
``support._pretend_target``); otherwise it stays as it is and the reason is logged once.
"""
from __future__ import annotations

import dataclasses
import math
import operator

import torch
import torch.fx as fx
import torch.nn.functional as F

from . import support
from .masks import evaluate_constant, is_causal_mask

_SDPA = F.scaled_dot_product_attention
_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_SDPA_DEFAULTS = (None, None, None, None, 0.0, False, None, False)
_MATMUL_FNS = (torch.matmul, operator.matmul)
_MATMUL_METHODS = ("matmul", "__matmul__")
_SOFTMAX_FNS = (torch.softmax, F.softmax, torch.special.softmax)
_DROPOUT_FNS = (F.dropout, torch.dropout)
_CAST_METHODS = ("to", "float", "half", "bfloat16", "type", "type_as", "contiguous")
_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


@dataclasses.dataclass
class AttentionSite:
    kind: str                       # "sdpa" | "explicit"
    node: fx.Node                   # the node whose value the site produces
    q: fx.Node | None = None
    k: fx.Node | None = None
    v: fx.Node | None = None
    is_causal: bool = False
    scale: float | None = None
    enable_gqa: bool = False
    k_is_transposed: bool = False   # explicit: the graph holds K^T, not K
    chain: tuple[fx.Node, ...] = ()  # explicit: nodes replaced by the op (dead afterwards)
    maybe_dead: tuple[fx.Node, ...] = ()  # q/k scalings and the k transpose: erased if unused afterwards
    reason: str | None = None       # None: autows can serve it
    vendor: str | None = None       # servable, but the vendor's kernel was chosen (runtime.choice): why
    choice: object = None           # support.SiteChoice of a servable site

    def summary(self) -> str:
        q = val(self.q)
        shape = "x".join(str(s) for s in q.shape) if q is not None else "?"
        scale = "default" if self.scale is None else f"{self.scale:.4g}"
        return f"q[{shape}] causal={self.is_causal} gqa={self.enable_gqa} scale={scale}"


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


def _check_shapes(site: AttentionSite, k) -> str | None:
    """Shape/dtype validity of a site; ``k`` is K's fake tensor (also when the graph holds K^T)."""
    q, v = val(site.q), val(site.v)
    if q is None or k is None or v is None:
        return "no shape information for q/k/v in the traced graph"
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return f"q/k/v must be 4-D [B, H, S, D]; got {q.dim()}-D/{k.dim()}-D/{v.dim()}-D"
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in _FLOATS:
        return f"dtypes q {q.dtype}, k {k.dtype}, v {v.dtype}: autows attention needs one of fp16/bf16/fp32"
    if not (support.same_size(q.shape[0], k.shape[0]) and support.same_size(k.shape[0], v.shape[0])):
        return "batch sizes of q, k, v differ (broadcasting is not served)"
    if not (support.same_size(q.shape[3], k.shape[3]) and support.same_size(k.shape[3], v.shape[3])):
        return f"head dims differ (q {q.shape[3]}, k {k.shape[3]}, v {v.shape[3]})"
    if not (support.same_size(k.shape[1], v.shape[1]) and support.same_size(k.shape[2], v.shape[2])):
        return "k and v shapes differ"
    hq, hkv = q.shape[1], k.shape[1]
    if not support.same_size(hq, hkv):
        if not site.enable_gqa:
            return f"q has {hq} heads and k/v {hkv} without enable_gqa"
        if not (isinstance(hq, int) and isinstance(hkv, int) and hq % hkv == 0):
            return f"q heads ({hq}) are not a multiple of k/v heads ({hkv})"
    out = val(site.node)
    if out is not None and out.dtype != q.dtype:
        return f"the attention output is {out.dtype} but q is {q.dtype}"
    return None


def _sdpa_site(n: fx.Node) -> AttentionSite:
    a = {name: _arg(n, i, name, d) for i, (name, d) in enumerate(zip(_SDPA_ARGS, _SDPA_DEFAULTS))}
    site = AttentionSite("sdpa", n, a["query"], a["key"], a["value"])
    mask_is_causal = False
    if a["attn_mask"] is not None:
        qv, kv = val(a["query"]), val(a["key"])
        mask_is_causal = (a["is_causal"] is False and qv is not None and kv is not None
                          and is_causal_mask(a["attn_mask"], qv.shape[-2], kv.shape[-2], kind="sdpa"))
    if a["attn_mask"] is not None and not mask_is_causal:
        site.reason = "SDPA with an attn_mask tensor that is not provably causal (only causal masks are served)"
    elif not isinstance(a["dropout_p"], (int, float)) or a["dropout_p"] != 0:
        site.reason = f"SDPA with dropout_p={a['dropout_p']} (autows attention has no dropout)"
    elif not isinstance(a["is_causal"], bool) or not isinstance(a["enable_gqa"], bool):
        site.reason = "is_causal / enable_gqa are not constants in the traced graph"
    elif a["scale"] is not None and _number(a["scale"]) is None:
        site.reason = _scale_reason(a["scale"])
    else:
        site.is_causal, site.enable_gqa = a["is_causal"] or mask_is_causal, a["enable_gqa"]
        site.scale = None if a["scale"] is None else float(a["scale"])
    return site


def _scale_reason(scale) -> str:
    """Why an SDPA ``scale`` that ``_number`` refuses is not served."""
    if isinstance(scale, (int, float)) and not isinstance(scale, bool):
        if scale == 0:
            return ("SDPA with scale=0.0 (uniform attention weights) is left to torch: the generated kernel is "
                    "not validated for a zero scale")
        if not math.isfinite(scale):
            return f"SDPA with a non-finite scale ({scale}); pass a finite scale"
    return f"scale {scale!r} is not a constant number in the traced graph"


def _walk_up(x) -> tuple[fx.Node, list[fx.Node], float, list[tuple]] | None:
    """From a softmax input up through casts, scalings and masks to the QK^T matmul:
    (matmul, nodes passed, scale, masks as (kind, mask node, fill, post)) or None.

    ``post`` is the product of the scalings applied to the scores after that mask (those met before it on
    the way up): the masked logit the softmax sees is ``fill * post``, which the causal proof must check.
    """
    passed, scale, masks = [], 1.0, []
    while isinstance(x, fx.Node):
        if _is(x, _MATMUL_FNS, _MATMUL_METHODS):
            return (x, passed, scale, masks) if len(x.args) == 2 else None
        s = _scaling(x)
        if s:
            passed.append(x)
            x, scale = s[0], scale * s[1]
        elif _is_cast(x):
            passed.append(x)
            x = x.args[0]
        elif _is_mask(x):
            passed.append(x)
            if x.target is torch.where:  # where(keep, scores, fill)
                masks.append(("where", x.args[0], _arg(x, 2, "other"), scale))
                x = x.args[1]
            elif x.target == "masked_fill" or x.target is torch.masked_fill:  # masked_fill(scores, drop, fill)
                masks.append(("masked_fill", _arg(x, 1, "mask"), _arg(x, 2, "value"), scale))
                x = x.args[0]
            else:  # add(scores, mask) or add(mask, scores): follow the side that reaches the matmul
                hits = [(i, r) for i, r in enumerate(map(_walk_up, x.args)) if r is not None]
                if len(hits) != 1:
                    return None
                i, (mm, more, sc, inner) = hits[0]
                inner = [(kind, m, fill, scale * post) for kind, m, fill, post in inner]
                return mm, passed + more, scale * sc, [*masks, ("add", x.args[1 - i], None, scale), *inner]
        else:
            return None
    return None


def _mask_reason(masks: list[tuple], qv, kv) -> tuple[bool, str | None]:
    """(is_causal, reason) from q's and K's fake tensors: one mask that is provably causal is served as is_causal.

    The proof covers the masked logits as the softmax sees them: the fill (or additive mask) times the
    scalings applied after the mask, so ``masked_fill(-65504) * 1e-4`` (masked weight exp(-6.5), not 0) is
    not causal.
    """
    if not masks:
        return False, None
    if len(masks) == 1 and qv is not None and kv is not None:
        kind, node, fill, post = masks[0]
        if isinstance(fill, fx.Node):
            f = evaluate_constant(fill)
            fill = float(f) if f is not None and f.numel() == 1 else None
        if is_causal_mask(node, qv.shape[-2], kv.shape[-2], kind=kind, fill=fill, post_scale=post):
            return True, None
    return False, ("explicit attention with a mask tensor that is not provably causal (add/masked_fill/where "
                   "before softmax); only causal masks are served")


def _explicit_site(sm: fx.Node) -> AttentionSite | None:
    """Match upward and downward from a softmax; None if this is not attention at all."""
    hit = _walk_up(sm.args[0] if sm.args else None)
    if hit is None:
        return None
    mm1, up, scale, masks = hit
    qq, kt = mm1.args
    down, y, dropout = [], sm, False
    while len(y.users) == 1:
        u = next(iter(y.users))
        identity = _identity_dropout(u)
        if _is_cast(u) or identity is not None:
            dropout |= identity is False
            down.append(u)
            y = u
            continue
        break
    final = [u for u in y.users if _is(u, _MATMUL_FNS, _MATMUL_METHODS) and u.args[0] is y]
    if not final:
        return None
    site = AttentionSite("explicit", final[0], v=final[0].args[1])
    maybe_dead = []
    s = _scaling(qq)
    if s:
        maybe_dead.append(qq)
        qq, scale = s[0], scale * s[1]
    s = _scaling(kt)
    if s:
        maybe_dead.append(kt)
        kt, scale = s[0], scale * s[1]
    k = _transposed_last2(kt)
    if k is not None:
        maybe_dead.append(kt)
        s = _scaling(k)
        if s:
            maybe_dead.append(k)
            k, scale = s[0], scale * s[1]
    site.q, site.k, site.k_is_transposed = qq, (k if k is not None else kt), k is None
    site.scale, site.chain, site.maybe_dead = scale, (mm1, *up[::-1], sm, *down), tuple(maybe_dead)
    kval = val(site.k) if not site.k_is_transposed or val(site.k) is None else val(site.k).transpose(-2, -1)
    site.is_causal, site.reason = _mask_reason(masks, val(site.q), kval)
    if site.reason is not None:
        pass
    elif masks and scale <= 0:  # a negative scale after the mask would turn -inf into +inf
        site.reason = f"explicit attention with a mask and a non-positive scale ({scale})"
    elif dropout:
        site.reason = "explicit attention with an active dropout (p > 0 while training)"
    elif any(len(n.users) != 1 for n in site.chain):
        site.reason = "intermediate attention scores/weights have other users (e.g. returned)"
    elif not _softmax_last_dim(sm):
        site.reason = "softmax is not over the last dim or upcasts to a dtype other than fp32"
    return site


def find_attention_sites(graph: fx.Graph) -> list[AttentionSite]:
    """All attention sites in ``graph``; each has ``reason=None`` when autows will serve it."""
    sites = []
    for n in graph.nodes:
        if n.op == "call_function" and n.target is _SDPA:
            site = _sdpa_site(n)
        elif _is(n, _SOFTMAX_FNS, ("softmax",)):
            site = _explicit_site(n)
            if site is None:
                continue
        else:
            continue
        kv = val(site.k)
        if site.k_is_transposed and kv is not None:
            kv = kv.transpose(-2, -1) if kv.dim() == 4 else None
        if site.reason is None:
            site.reason = _check_shapes(site, kv)
        if site.reason is None:
            site.reason = support.attention_reason(val(site.q), kv, val(site.v), site.is_causal, site.scale)
        if site.reason is None and kv is not None:
            site.choice = support.attention_choice(val(site.q), kv, val(site.v), site.is_causal, site.scale)
            site.vendor = site.choice.vendor_reason
        sites.append(site)
    return sites


def _fake_call(q, k, v, *args):
    fq = val(q)
    mode = getattr(fq, "fake_mode", None)
    if mode is None:
        return None
    try:
        with mode:
            kk = val(k) if isinstance(k, fx.Node) and val(k) is not None else None
            return torch.ops.autows.attention.default(fq, kk, val(v), *args)
    except Exception:
        return None


def rewrite_attention(graph: fx.Graph) -> list[AttentionSite]:
    """Replace every servable attention site by ``autows::attention``; log why the others stay. Returns all sites."""
    sites = find_attention_sites(graph)
    for site in sites:
        if site.reason is not None or site.vendor is not None:
            support.note_site("attention", site.reason or site.vendor)
            continue
        with graph.inserting_before(site.node):
            k = site.k
            if site.k_is_transposed:
                k = graph.call_method("transpose", (k, -2, -1))
                if val(site.k) is not None:
                    k.meta["example_value"] = val(site.k).transpose(-2, -1)
            args = (site.q, k, site.v, site.is_causal, site.scale, site.enable_gqa)
            call = graph.call_function(torch.ops.autows.attention.default, args)
            fake = _fake_call(*args)
            if fake is not None:
                call.meta["example_value"] = fake
            out = graph.call_function(operator.getitem, (call, 0))
            out.meta.update({key: site.node.meta[key] for key in ("stack_trace", "source_fn_stack")
                             if key in site.node.meta})
            if fake is not None:
                out.meta["example_value"] = fake[0]
        site.node.replace_all_uses_with(out)
        erased: set[fx.Node] = set()
        for n in (site.node, *reversed(site.chain), *site.maybe_dead):
            if n not in erased and not n.users and n.op != "placeholder":
                graph.erase_node(n)
                erased.add(n)
        support.site_counters["attention.rewritten"] += 1
    graph.lint()
    return sites
