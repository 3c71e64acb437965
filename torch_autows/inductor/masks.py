"""Recognise attention masks that are just the causal mask, so those sites are served with ``is_causal``.

Hugging Face models always build a mask tensor under ``torch.compile`` (its "skip the mask" shortcut is off
while tracing), and GPT-style code often masks explicitly with ``masked_fill`` / ``where`` on a triangle.
A mask is taken as causal only when it is provably the top-left causal mask for the traced shapes:

* the mask is computed from constants only: no graph input among its ancestors, no symbolic size
  (with ``mark_dynamic`` sizes nothing is proven and the site stays with Inductor);
* that subgraph is evaluated once at compile time (on real tensors, outside any fake mode) and its value
  compared with ``tril(ones(Sq, Skv))``: a boolean mask keeps exactly that triangle, an additive float
  mask is 0 there and -inf (or <= half the dtype's lowest value, as HF's ``finfo.min``) elsewhere.

Static shapes make Dynamo specialise the graph on those sizes, so a proof for the traced shapes holds
for every call of that graph. Anything else (padding masks, sliding windows, masks passed in by the
caller) is not causal here and the site keeps its reason.
"""
from __future__ import annotations

import math

import torch
import torch.fx as fx

_MAX_NUMEL = 1 << 26  # evaluate masks up to 64M elements (an 8k x 8k bool mask)


def _ancestors(node: fx.Node) -> list[fx.Node] | None:
    """``node`` and its inputs, topologically ordered; None if any is a graph input or a module call."""
    seen, order, stack = set(), [], [(node, False)]
    while stack:
        n, done = stack.pop()
        if done:
            order.append(n)
            continue
        if n in seen:
            continue
        seen.add(n)
        if n.op in ("placeholder", "call_module", "get_attr", "output"):
            return None
        stack.append((n, True))
        stack.extend((i, False) for i in n.all_input_nodes)
    return order


def evaluate_constant(node: fx.Node) -> torch.Tensor | None:
    """The value of a tensor node computed from constants only; None if it depends on inputs or fails."""
    v = node.meta.get("val", node.meta.get("example_value"))
    if not isinstance(v, torch.Tensor) or any(not isinstance(s, int) for s in v.shape) or v.numel() > _MAX_NUMEL:
        return None
    nodes = _ancestors(node)
    if nodes is None:
        return None
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for n in nodes:
        env[n] = g.node_copy(n, lambda x: env[x])
    g.output(env[node])
    try:
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily(), torch.no_grad():
            out = fx.GraphModule(torch.nn.Module(), g)()
    except Exception:
        return None
    return out if isinstance(out, torch.Tensor) else None


def _causal_keep(sq: int, skv: int, device) -> torch.Tensor:
    return torch.ones(sq, skv, dtype=torch.bool, device=device).tril()


def keep_is_causal(keep: torch.Tensor, sq: int, skv: int) -> bool:
    """``keep`` (True = attend), broadcastable to [..., Sq, Skv], is exactly the top-left causal triangle."""
    if keep.dim() < 2 or tuple(keep.shape[-2:]) != (sq, skv):
        return False
    return bool((keep == _causal_keep(sq, skv, keep.device)).all())


def additive_is_causal(mask: torch.Tensor, sq: int, skv: int, post_scale: float = 1.0) -> bool:
    """An additive float mask: 0 on the causal triangle, -inf (or a huge negative) above it.

    ``post_scale``: the positive factor the masked scores are multiplied by before the softmax. The huge
    negative (at most half the mask dtype's lowest value) must stay at least as negative as the weakest value
    accepted unscaled after it: <= max(that bound, float16's lowest), so finfo(float32).min * 0.3 passes and
    finfo(float16).min * 1e-4 (weight exp(-6.5), not 0) does not. -inf stays -inf.
    """
    if not mask.is_floating_point() or not post_scale > 0:
        return False
    low = torch.finfo(mask.dtype).min / 2
    zero = mask == 0
    scaled_low = max(low, torch.finfo(torch.float16).min)
    neg = ((mask <= low) & (mask.double() * post_scale <= scaled_low)) | (mask == -math.inf)
    return bool((zero | neg).all()) and keep_is_causal(zero, sq, skv)


def fill_masks_everything(fill, post_scale: float = 1.0) -> bool:
    """A ``masked_fill`` / ``where`` fill whose masked logit ``fill * post_scale`` has softmax weight 0:
    -inf, or at most float16's lowest (-65504), as HF's ``finfo.min`` fills, after the scalings that follow
    the mask. A non-positive ``post_scale`` never qualifies (it would turn -inf into +inf or nan)."""
    if not isinstance(fill, (int, float)) or isinstance(fill, bool) or not post_scale > 0:
        return False
    return fill == -math.inf or fill * post_scale <= torch.finfo(torch.float16).min


def is_causal_mask(mask_node, sq, skv, *, kind: str, fill=None, post_scale: float = 1.0) -> bool:
    """Whether the mask of one attention site is the causal mask.

    kind: "sdpa" (bool: True keeps; float: additive), "add" (additive), "masked_fill" (True masks, with
    ``fill`` -inf/huge negative) or "where" (``where(mask, scores, fill)``: True keeps). ``post_scale`` is
    the product of the scalings applied to the masked scores before the softmax (explicit forms only).
    """
    if not (isinstance(sq, int) and isinstance(skv, int)) or not isinstance(mask_node, fx.Node):
        return False
    m = evaluate_constant(mask_node)
    if m is None:
        return False
    if kind in ("masked_fill", "where"):
        if not fill_masks_everything(fill, post_scale):
            return False
        keep = ~m if kind == "masked_fill" else m
        return m.dtype == torch.bool and keep_is_causal(keep, sq, skv)
    if m.dtype == torch.bool:
        return kind == "sdpa" and keep_is_causal(m, sq, skv)
    return additive_is_causal(m, sq, skv, post_scale)
