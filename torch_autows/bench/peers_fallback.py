"""Attention the generated kernels do not serve (head dim 80): ``torch_autows.ops.attention``'s fallback
(torch's fused SDPA kernel that returns the log-sum-exp, chosen as SDPA would) against plain
``F.scaled_dot_product_attention`` (torch's own pick, no lse). Shows what a user of the public op pays where the
kernel falls back."""
from __future__ import annotations

from .peers_attention import make_inputs, reference
from .runner import Bound, Peer, Suite


def _bind_sdpa(case, inp) -> Bound:
    import torch.nn.functional as F

    q, k, v, scale = inp["q"], inp["k"], inp["v"], inp["scale"]
    return Bound(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=case.causal, scale=scale,
                                                        enable_gqa=case.gqa))


def _bind_autows(case, inp) -> Bound:
    from torch_autows import ops

    q, k, v, scale = inp["q"], inp["k"], inp["v"], inp["scale"]
    return Bound(lambda: ops.attention(q, k, v, is_causal=case.causal, scale=scale, enable_gqa=case.gqa))


def all_peers() -> tuple[list[Peer], list[str]]:
    return [Peer("sdpa", _bind_sdpa, "F.scaled_dot_product_attention (torch's pick; no lse)"),
            Peer("autows", _bind_autows, "torch_autows.ops.attention: the fallback with lse (lse checked)")], []


def suite(cases: list, peers: list[Peer]) -> Suite:
    return Suite("fallback", cases, peers, make_inputs, reference)
