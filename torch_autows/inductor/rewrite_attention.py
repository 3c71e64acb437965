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

Modules: ``attention_nodes`` (the one-node recognisers and ``val``), ``attention_sites`` (``AttentionSite``,
``find_attention_sites``: matching and the reasons), this one (the rewrite); ``AttentionSite``,
``find_attention_sites`` and ``val`` are importable from here too.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from . import support
from .attention_nodes import val
from .attention_sites import AttentionSite, find_attention_sites

__all__ = ["AttentionSite", "find_attention_sites", "rewrite_attention", "val"]


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
