"""Attention site recognition on the Dynamo (torch-level) FX graph: ``find_attention_sites`` returns an
``AttentionSite`` per SDPA call (``_sdpa_site``) and per explicit ``matmul -> scale -> softmax -> matmul`` chain
(``_explicit_site``, walking up from the softmax with ``_walk_up``), each with the reason autows cannot serve it
(arguments, masks proved causal or not by masks.py, shapes and dtypes, ``support.attention_reason``) or its
``support.attention_choice``. Which sites are served and why: rewrite_attention.py's docstring; the graph
rewrite itself is ``rewrite_attention.rewrite_attention``."""
from __future__ import annotations

import dataclasses
import math
import operator

import torch
import torch.fx as fx
import torch.nn.functional as F

from . import support
from .attention_nodes import (
    _SOFTMAX_FNS,
    _arg,
    _identity_dropout,
    _is,
    _is_cast,
    _is_mask,
    _number,
    _scaling,
    _softmax_last_dim,
    _transposed_last2,
    val,
)
from .masks import evaluate_constant, is_causal_mask

_SDPA = F.scaled_dot_product_attention
_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_SDPA_DEFAULTS = (None, None, None, None, 0.0, False, None, False)
_MATMUL_FNS = (torch.matmul, operator.matmul)
_MATMUL_METHODS = ("matmul", "__matmul__")
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
    if not support.same_size(q.shape[3], k.shape[3]):  # v's may differ (the output takes it), as in SDPA
        return f"head dims of q ({q.shape[3]}) and k ({k.shape[3]}) differ"
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
